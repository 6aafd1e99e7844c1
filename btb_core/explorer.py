"""The threshold explorer behind notebook 05: one window, cache_aware vs BTB at given X / Y / Z / M.

:func:`explore` is a pure function of its arguments (same inputs and seed, same output), so the
ipywidgets sliders of notebook 05 and a headless papermill run draw from the same code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from .btb_config import DEFAULT_BTB, BTBConfig
from .errors import ConfigError


@dataclass
class Exploration:
    """Result of :func:`explore`.

    Attributes
    ----------
    summary : DataFrame
        One row per policy: ttft_mean_s, ttft_p95_s, rdma_copies, copies_unused,
        recomputed_prefill_tokens; plus ``speedup_vs_cache_aware``.
    requests : DataFrame
        policy, request_id, arrival_s, replica, ttft_s.
    queue : DataFrame
        BTB's per-replica queue length per ``bin_s`` bin (time_s, replica, queue_length).
    transfers : DataFrame
        BTB's copies (src, dst, start_s, end_s, served_requests).
    """

    summary: pd.DataFrame
    requests: pd.DataFrame
    queue: pd.DataFrame
    transfers: pd.DataFrame


def scale_arrivals(window, arrival_scale: float):
    """The window with arrival times divided by ``arrival_scale`` (2 = twice the request rate)."""
    if not arrival_scale > 0:
        raise ConfigError(f"arrival_scale must be > 0, got {arrival_scale!r}")
    if arrival_scale == 1.0:
        return window
    # same rows and interned ids; only the clock changes (order is preserved)
    table = window.table.assign(arrival_s=window.table["arrival_s"] / arrival_scale)
    return dataclasses.replace(window, table=table, name=f"{window.name}x{arrival_scale:g}")


def explore(window, btb: BTBConfig = DEFAULT_BTB, replicas: int = 4, arrival_scale: float = 1.0,
            setup: str = "70b_h100x4", scheduler: str = "chunked", seed: int = 0,
            bin_s: float = 1.0) -> Exploration:
    """Replay ``window`` with ``cache_aware`` and with ``btb`` (X, Y, Z, M) on a fresh cluster.

    Parameters
    ----------
    window : Trace
        One window (e.g. a synthetic window of a Bursted dataset).
    btb : BTBConfig
        BTB's X (arrivals), Y (prefix tokens), Z (seconds), M (copies per active prefix); default
        the reference study's (:data:`~btb_core.btb_config.DEFAULT_BTB`).
    replicas : int
        Replicas in the cluster.
    arrival_scale : float
        Request-rate multiplier (arrival times are divided by it).

    Returns
    -------
    Exploration
    """
    from .routers import make_router
    from .sim import ClusterConfig, simulate

    if not isinstance(btb, BTBConfig):
        raise ConfigError(f"explore: btb must be a BTBConfig, got {type(btb).__name__}")

    trace = scale_arrivals(window, arrival_scale)
    cluster = ClusterConfig.from_setup(setup, num_replicas=int(replicas), scheduler=scheduler)
    rows, reqs = [], []
    btb_res = None
    for policy, params in (("cache_aware", {}), ("btb", btb.as_params())):
        res = simulate(trace, make_router(policy, **params), cluster, seed=seed, progress=False)
        m = res.metrics
        rows.append({"policy": policy, "ttft_mean_s": m["ttft_mean_s"], "ttft_p95_s": m["ttft_p95_s"],
                     "rdma_copies": m["rdma_copies"], "copies_unused": m["copies_unused"],
                     "recomputed_prefill_tokens": m["recomputed_prefill_tokens"]})
        r = res.requests[["request_id", "arrival_s", "replica", "ttft_s"]].copy()
        r.insert(0, "policy", policy)
        reqs.append(r)
        if policy == "btb":
            btb_res = res
    summary = pd.DataFrame(rows)
    base = summary.loc[summary.policy == "cache_aware", "ttft_mean_s"].iloc[0]
    summary["speedup_vs_cache_aware"] = base / summary["ttft_mean_s"]
    queue = btb_res.queue_length_series(bin_s=bin_s)
    transfers = btb_res.transfers[["src", "dst", "start_s", "end_s", "served_requests"]].copy()
    return Exploration(summary, pd.concat(reqs, ignore_index=True), queue, transfers)


def pick_window(windows, kind: str = "synthetic", index: int = 0):
    """The ``index``-th window of ``kind`` from ``load_windows`` output ``(id, kind, trace)``."""
    chosen = [w for w in windows if w[1] == kind]
    if not chosen:
        raise ConfigError(f"no {kind} window among {len(windows)} windows")
    return chosen[min(index, len(chosen) - 1)]


__all__ = ["Exploration", "explore", "pick_window", "scale_arrivals"]
