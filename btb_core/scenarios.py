"""Small hand-built traces that show each router's best and worst case, and a runner for them.

Three shapes (notebook 03, ``tests/test_router_scenarios.py``):

- ``unrelated``: every prompt is its own; nothing to reuse, so only balance matters (least-load's
  best case, and cache-aware degenerates to least-load);
- ``trickle``: one long prefix arriving at a steady, slow rate; every request can reuse the first
  one's KV on the same replica (cache-aware's best case, least-load's worst: it scatters the prefix
  over cold replicas);
- ``burst``: the same long prefix arriving many times within seconds, each with its own suffix
  (the Bursted-ART job shape, ``DESIGN.md`` section 2): least-load scatters it and every replica
  recomputes the prefix; cache-aware piles it on the one holder; BTB copies it and spreads it.

Block ids are plain integers that are chained by construction: the prefix's ids are shared and each
request's suffix ids are its own. Arrivals are evenly spaced (no randomness) unless a
``numpy.random.Generator`` is passed for jitter.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

import numpy as np
import pandas as pd

from .errors import ConfigError
from .trace import make_trace

#: Tokens per block of the scenarios (the Mooncake trace block, ``trace.MOONCAKE_BLOCK_TOKENS``).
SCENARIO_BLOCK_TOKENS = 512
#: Burst prefix (tokens): the reference study's 65,536-token job prefix (``DESIGN.md`` section 2).
BURST_PREFIX_TOKENS = 65_536


@dataclass(frozen=True)
class ScenarioSpec:
    """Shape of one hand-built trace.

    Attributes
    ----------
    kind : {"unrelated", "trickle", "burst"}
    num_requests : int >= 1
    span_s : float >= 0
        Arrivals are evenly spaced over ``[start_s, start_s + span_s]``.
    prefix_tokens : int >= 0
        Shared prefix length (``trickle``/``burst``; ignored for ``unrelated``); a multiple of
        ``block_tokens``.
    suffix_tokens : int >= 1
        Each request's own tokens after the prefix (for ``unrelated``: the whole prompt).
    output_tokens : int >= 1
    start_s : float >= 0
    block_tokens : int >= 1
    jitter_s : float >= 0
        Uniform jitter added to each arrival when a generator is passed to :func:`build`.
    num_prefixes : int >= 1
        Distinct shared prefixes (concurrent jobs); request ``i`` uses prefix ``i mod
        num_prefixes`` (``trickle``/``burst``).

    Raises
    ------
    ConfigError
        On any value outside the ranges above; the message names the field and the value.
    """

    kind: str
    num_requests: int = 64
    span_s: float = 8.0
    prefix_tokens: int = BURST_PREFIX_TOKENS
    suffix_tokens: int = 256
    output_tokens: int = 1
    start_s: float = 0.0
    block_tokens: int = SCENARIO_BLOCK_TOKENS
    jitter_s: float = 0.0
    num_prefixes: int = 1

    def __post_init__(self) -> None:
        def bad(field, why):
            raise ConfigError(f"ScenarioSpec.{field}={getattr(self, field)!r}: {why}")

        if self.kind not in ("unrelated", "trickle", "burst"):
            bad("kind", "must be 'unrelated', 'trickle' or 'burst'")
        for field, low in (("num_requests", 1), ("suffix_tokens", 1), ("output_tokens", 1),
                           ("block_tokens", 1), ("prefix_tokens", 0), ("num_prefixes", 1)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                bad(field, f"must be an integer >= {low}")
        for field in ("span_s", "start_s", "jitter_s"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and 0.0 <= value < float("inf")):
                bad(field, "must be a finite number >= 0")
        if self.prefix_tokens % self.block_tokens:
            bad("prefix_tokens", f"must be a multiple of block_tokens={self.block_tokens}")


def build(spec: ScenarioSpec, rng: np.random.Generator | None = None, name: str | None = None):
    """Build the :class:`btb_core.trace.Trace` of ``spec``.

    Parameters
    ----------
    spec : ScenarioSpec
    rng : numpy.random.Generator, optional
        Only used for ``spec.jitter_s > 0``.
    name : str, optional
        Trace name (default ``spec.kind``).

    Returns
    -------
    Trace
        ``num_requests`` rows; ``hash_ids`` chained; ``group_id`` 0 for prefix sharers.
    """
    n = spec.num_requests
    bt = spec.block_tokens
    arrival = spec.start_s + (np.linspace(0.0, spec.span_s, n) if n > 1 else np.zeros(1))
    if spec.jitter_s > 0 and rng is not None:
        arrival = np.sort(arrival + rng.uniform(0.0, spec.jitter_s, n))
    prefix_tokens = 0 if spec.kind == "unrelated" else spec.prefix_tokens
    prefix_blocks = prefix_tokens // bt
    input_length = prefix_tokens + spec.suffix_tokens
    suffix_blocks = ceil(spec.suffix_tokens / bt)
    k = spec.num_prefixes if prefix_blocks else 1
    prefixes = [list(range(1 + j * prefix_blocks, 1 + (j + 1) * prefix_blocks)) for j in range(k)]
    next_id = k * prefix_blocks + 1
    hash_ids = []
    for i in range(n):
        hash_ids.append(prefixes[i % k] + list(range(next_id, next_id + suffix_blocks)))
        next_id += suffix_blocks
    group = [i % k if prefix_blocks else -1 for i in range(n)]
    return make_trace(arrival.tolist(), [input_length] * n, [spec.output_tokens] * n, hash_ids,
                      block_tokens=bt, name=name or spec.kind, group_id=group)


def standard_specs(num_requests: int = 48, span_s: float = 6.0, trickle_interval_s: float = 10.0,
                   prefix_tokens: int = BURST_PREFIX_TOKENS) -> dict[str, ScenarioSpec]:
    """The three shapes of notebook 03 at one size.

    ``unrelated``: ``num_requests`` prompts of ``prefix_tokens + 256`` tokens, none shared, over
    ``span_s`` (the same compute as a burst without any reuse). ``trickle``: ``num_requests // 4``
    requests of the shared prefix, one every ``trickle_interval_s`` (slower than one prefill, so
    each can reuse the last). ``burst``: ``num_requests`` requests of the shared prefix over
    ``span_s``.
    """
    trickle_n = max(2, num_requests // 4)
    return {
        "unrelated": ScenarioSpec("unrelated", num_requests, span_s, prefix_tokens,
                                  suffix_tokens=prefix_tokens + 256),
        "trickle": ScenarioSpec("trickle", trickle_n, trickle_interval_s * (trickle_n - 1),
                                prefix_tokens),
        "burst": ScenarioSpec("burst", num_requests, span_s, prefix_tokens),
    }


def run(trace, policy: str, cluster, seed: int = 0, **router_params):
    """Simulate ``trace`` under ``policy`` (a :data:`btb_core.routers.POLICIES` name).

    Returns the :class:`btb_core.sim.SimResult` with the router object in ``result.info["router"]``.
    """
    from .routers import make_router
    from .sim import simulate

    router = make_router(policy, **router_params)
    result = simulate(trace, router, cluster, seed=seed)
    result.info["router"] = router
    return result


def summarize(results: dict) -> pd.DataFrame:
    """One row per ``(scenario, policy)`` of ``{(scenario, policy): SimResult}``.

    Columns: ``scenario, policy, requests, ttft_mean_s, ttft_p50_s, ttft_p99_s,
    recomputed_prefill_tokens, reused_tokens, replicas_used, max_queue_length, copies``.
    """
    rows = []
    for (scenario, policy), res in results.items():
        req = res.requests
        rows.append({
            "scenario": scenario,
            "policy": policy,
            "requests": len(req),
            "ttft_mean_s": float(req["ttft_s"].mean()),
            "ttft_p50_s": float(req["ttft_s"].quantile(0.5)),
            "ttft_p99_s": float(req["ttft_s"].quantile(0.99)),
            "recomputed_prefill_tokens": int(req["recomputed_tokens"].sum()),
            "reused_tokens": int(req["reused_tokens"].sum()),
            "replicas_used": int(req["replica"].nunique()),
            "max_queue_length": int(res.queue_samples["queue_length"].max())
            if len(res.queue_samples) else 0,
            "copies": int(len(res.transfers)),
        })
    return pd.DataFrame(rows)


def frame_times(result, num_frames: int = 8, end_s: float | None = None) -> list[float]:
    """Frame times for :func:`copy_frames`: ``num_frames`` evenly spaced over ``[0, end_s]`` plus,
    when the run made copies, the middle of the first copy and the landing of the last one, so the
    "in flight" and "landed" moments always appear. Sorted, rounded to 1 ms."""
    end = float(result.requests["finish_s"].max()) if end_s is None else float(end_s)
    times = set(np.round(np.linspace(0.0, end, max(1, num_frames)), 3).tolist())
    tr = result.transfers
    if len(tr):
        first = tr.sort_values("request_s").iloc[0]
        times.add(round(float(first["request_s"] + first["end_s"]) / 2.0, 3))
        times.add(round(float(tr["end_s"].max()), 3))
    return sorted(times)


def copy_frames(result, times, bin_s: float = 0.25) -> pd.DataFrame:
    """Snapshots for a time slider: at each time, each replica's queue length and copy role.

    Parameters
    ----------
    result : SimResult
        A run (typically ``btb`` on the burst).
    times : sequence of float
        Frame times in seconds (see :func:`frame_times`).
    bin_s : float
        Queue-length series bin (the value shown is the bin's maximum).

    Returns
    -------
    pandas.DataFrame
        ``frame, time_s, replica, queue_length, copy_state`` with ``copy_state`` in
        ``{"none", "source", "in flight", "landed"}``: a replica that sent a copy by then is a
        ``source``; a destination is ``in flight`` from the copy's request until it lands.
    """
    times = [float(t) for t in times]
    if not times:
        raise ConfigError("copy_frames: times is empty")
    end = max(times) + bin_s
    series = result.queue_length_series(bin_s=bin_s, end_s=end)
    tr = result.transfers
    rows = []
    for f, t in enumerate(times):
        at = series[series["time_s"] <= t]
        last = at[at["time_s"] == at["time_s"].max()] if len(at) else at
        qlen = dict(zip(last["replica"], last["queue_length"]))
        for r in range(result.num_replicas):
            state = "none"
            if len(tr):
                mine = tr[tr["dst"] == r]
                if (mine["end_s"] <= t).any():
                    state = "landed"
                elif (mine["request_s"] <= t).any():
                    state = "in flight"
                elif ((tr["src"] == r) & (tr["request_s"] <= t)).any():
                    state = "source"
            rows.append({"frame": f, "time_s": t, "replica": r,
                         "queue_length": int(qlen.get(r, 0)), "copy_state": state})
    return pd.DataFrame(rows)


__all__ = ["BURST_PREFIX_TOKENS", "SCENARIO_BLOCK_TOKENS", "ScenarioSpec", "build", "copy_frames",
           "frame_times", "run", "standard_specs", "summarize"]
