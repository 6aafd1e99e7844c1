"""Real engine vs simulator: calibrate, replay per policy, simulate the same arrivals, compare.

:func:`validate` runs the whole study on 1-2 real vLLM CPU servers (see :mod:`.server`):

1. calibration, for each server count ``n`` run, on the first ``n`` servers at the same time
   (:func:`.calibrate.measure_concurrent`: two servers on one machine slow each other down while
   both compute, so a run on ``n`` servers is compared with the cost model fitted to the
   calibration measured with ``n`` servers busy), and the fitted cost models
   (:func:`.calibrate.fit_by_busy`);
2. per policy: a cold prefix cache (a new text salt, plus ``/reset_prefix_cache``), a replay of the
   trace routed by the policy through a :class:`.replay.LiveView` (:func:`.replay.replay`);
3. the simulator on the same requests, with the arrivals at the moments they were sent and the
   replica each was sent to (so each request is compared with itself), on a cluster of the
   engine's block size (32), step budget (2,048 tokens), running cap, KV space, blocks reusable
   when scheduled (``reuse_on="scheduled"``) and the fitted cost model; the simulated TTFT is the
   simulator's plus the fitted front-end latency;
4. the simulator once more with the policy itself routing (the study's setting), for the policy's
   mean TTFT and the fraction of requests it routes as the real run did.

Error figures (per policy): ``cached_tokens_match_fraction`` (share of requests whose simulated
reused tokens equal the engine's ``cached_tokens``), ``ttft_mean_rel_error`` and
``ttft_p90_rel_error`` (``|sim / real - 1|`` of the mean and 90th percentile of TTFT),
``ttft_median_request_rel_error`` (median over requests of ``|sim / real - 1|``). Each policy is
replayed ``replay_repeats`` times (default 3) in rounds (every policy once, then again; each run
simulated on its own send times and replicas); the mean and p90 errors are the median run's,
the pooled figures are kept as ``*_pooled`` (:func:`pool_runs`), and ``ttft_mean_real_cv`` gives
the real engine's run-to-run noise. With ``recalibrate`` (default) a calibration pass follows each
round and the fit uses every pass; ``info["calibration_pass_speed"]`` and
``info["calibration_drift"]`` say how far the machine's speed moved between them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..paths import DATA_DIR
from ..routers import make_router
from ..routers.base import Router
from ..sim import ClusterConfig, simulate
from ..trace import load_trace, make_trace
from . import calibrate as cal
from .replay import replay
from .server import (ENGINE_BLOCK_TOKENS, ENGINE_CHUNK_TOKENS, ENGINE_MAX_RUNNING, EngineCluster,
                     require_engine)

#: The validation trace shipped in ``data/`` (provenance in ``data/README.md``).
DEFAULT_TRACE = DATA_DIR / "traces" / "engine_validation" / "engine_validation.jsonl"
#: A measured run shipped with the project (``btb validate-engine --out``), shown by notebook 07
#: where the engine is not installed; provenance in its ``SOURCE.md``.
SHIPPED_RESULT = DATA_DIR / "engine_validation" / "measured"
#: Policies compared by default (the ones whose view a gateway in front of real servers has).
DEFAULT_POLICIES = ("round_robin", "least_load", "cache_aware", "kv_aware")
#: Policies that can route the real servers (their routers run on :class:`.replay.LiveView`,
#: which has no cost model and cannot copy KV: ``btb`` and ``btb_adaptive`` need both, and
#: ``sglang_gateway`` routes through the gateway's own stand-in workers).
ENGINE_POLICIES = ("round_robin", "random", "power_of_two", "least_load", "cache_aware",
                   "kv_aware", "llm_d")
#: Goals of the validation (issue text; reported in the README).
GOALS = {"cached_tokens_match_fraction": 0.99, "ttft_mean_rel_error": 0.05,
         "ttft_p90_rel_error": 0.10, "ttft_median_request_rel_error": 0.10}


class FixedAssignment(Router):
    """Sends request ``i`` to ``replicas[i]`` (replays a real run's routing in the simulator)."""

    name = "fixed_assignment"

    def __init__(self, replicas) -> None:
        self.replicas = [int(r) for r in replicas]

    def route(self, request) -> int:
        return self.replicas[request.index]


def load_validation_trace(path=None):
    """Load a trace for the engine (default :data:`DEFAULT_TRACE`, JSONL with 32-token blocks).

    A Mooncake-format JSONL file is read with 32-token blocks unless it is the 512-token Mooncake
    release; other formats keep their block size, which must be a multiple of 32.

    Raises
    ------
    ConfigError
        The block size is not a multiple of the engine's 32 tokens.
    """
    path = Path(path) if path else DEFAULT_TRACE
    trace = load_trace(path, block_tokens=ENGINE_BLOCK_TOKENS if path.suffix == ".jsonl" else None)
    if trace.block_tokens % ENGINE_BLOCK_TOKENS:
        raise ConfigError(f"{path}: block_tokens={trace.block_tokens} is not a multiple of the "
                          f"engine's {ENGINE_BLOCK_TOKENS}-token KV blocks")
    return trace


def engine_blocks(trace, arrival_s=None):
    """The trace with ``block_tokens`` = 32 (each id split into ``block_tokens / 32`` chained
    sub-ids) and, optionally, new arrival times; the simulator's view of what the engine saw."""
    bt = int(trace.block_tokens)
    m = bt // ENGINE_BLOCK_TOKENS
    t = trace.table
    if m == 1:
        ids = [list(map(int, h)) for h in t["hash_ids"]]
    else:
        ids = []
        for h, n in zip(t["hash_ids"], t["input_length"]):
            sub = [int(b) * m + k for b in h for k in range(m)]
            ids.append(sub[:-(-int(n) // ENGINE_BLOCK_TOKENS)])
    arr = t["arrival_s"].to_numpy() if arrival_s is None else np.asarray(arrival_s, dtype=float)
    return make_trace(arr, t["input_length"].to_numpy(), t["output_length"].to_numpy(), ids,
                      block_tokens=ENGINE_BLOCK_TOKENS, name=f"{getattr(trace, 'name', 'trace')}@32",
                      request_id=t["request_id"].to_numpy())


def engine_cluster_config(fitted: cal.FittedEngine, num_replicas: int) -> ClusterConfig:
    """The simulator's cluster matching the engine (see the module docstring)."""
    return ClusterConfig(cost=fitted.cost, num_replicas=num_replicas, scheduler="chunked",
                         chunk_tokens=ENGINE_CHUNK_TOKENS, max_running=ENGINE_MAX_RUNNING,
                         hbm_kv_capacity_bytes=fitted.kv_capacity_bytes, dram_capacity_bytes=0,
                         reuse_on="scheduled", setup_name="vllm-cpu-tiny")


def compare(real: pd.DataFrame, trace, fitted: cal.FittedEngine, num_replicas: int,
            speed_factor: float | None = None) -> pd.DataFrame:
    """Per-request real vs simulated (same arrivals, same replicas). Columns: the real run's, plus
    ``sim_ttft_s``, ``sim_cached_tokens``, ``cached_match``, ``ttft_rel_error``; with a
    ``speed_factor`` (:func:`speed_probe`; ``None``: no correction) the simulation uses
    ``fitted.scaled(speed_factor)`` and the columns add ``speed_factor`` and
    ``sim_ttft_unscaled_s`` (with ``fitted`` as is)."""
    sim_trace = engine_blocks(trace, real["sent_s"].to_numpy())

    def sim_ttft(fit):
        res = simulate(sim_trace, FixedAssignment(real["replica"]), engine_cluster_config(fit, num_replicas))
        return res.requests, res.requests["ttft_s"].to_numpy() + fit.frontend_s

    df = real.copy()
    if speed_factor is not None:
        df["speed_factor"] = float(speed_factor)
        df["sim_ttft_unscaled_s"] = sim_ttft(fitted)[1]
        fitted = fitted.scaled(speed_factor)
    sim, df["sim_ttft_s"] = sim_ttft(fitted)
    df["sim_cached_tokens"] = sim["reused_tokens"].to_numpy()
    df["cached_match"] = df["sim_cached_tokens"] == df["cached_tokens"]
    df["ttft_rel_error"] = df["sim_ttft_s"] / df["ttft_s"] - 1.0
    return df


def summarise(df: pd.DataFrame) -> dict:
    """Error figures of one per-request comparison (see the module docstring)."""
    real, sim = df["ttft_s"].to_numpy(), df["sim_ttft_s"].to_numpy()
    p90r, p90s = float(np.quantile(real, 0.9)), float(np.quantile(sim, 0.9))
    return {"requests": int(len(df)),
            "cached_tokens_match_fraction": float(df["cached_match"].mean()),
            "cached_tokens_real": int(df["cached_tokens"].sum()),
            "cached_tokens_sim": int(df["sim_cached_tokens"].sum()),
            "ttft_mean_real_s": float(real.mean()), "ttft_mean_sim_s": float(sim.mean()),
            "ttft_mean_rel_error": abs(float(sim.mean()) / float(real.mean()) - 1.0),
            "ttft_p90_real_s": p90r, "ttft_p90_sim_s": p90s,
            "ttft_p90_rel_error": abs(p90s / p90r - 1.0),
            "ttft_median_request_rel_error": float(np.median(np.abs(df["ttft_rel_error"]))),
            **_unscaled(df, real)}


def _unscaled(df: pd.DataFrame, real: np.ndarray) -> dict:
    """The mean and p90 errors without the speed correction (when there was one)."""
    if "sim_ttft_unscaled_s" not in df:
        return {}
    sim = df["sim_ttft_unscaled_s"].to_numpy()
    return {"speed_factor": float(df["speed_factor"].mean()),
            "unscaled_ttft_mean_rel_error": abs(float(sim.mean()) / float(real.mean()) - 1.0),
            "unscaled_ttft_p90_rel_error": abs(float(np.quantile(sim, 0.9))
                                               / float(np.quantile(real, 0.9)) - 1.0)}


def pool_runs(frames, summaries) -> dict:
    """One summary of a policy's repeated real runs (``frames``: :func:`score_run` tables, one per
    repeat; ``summaries``: their :func:`summarise` dicts).

    Each request is compared with the simulation of its own run (same send times, same
    replicas). ``ttft_mean_rel_error`` and ``ttft_p90_rel_error`` are ``|median over runs of (sim /
    real) - 1|`` of each run's mean and 90th percentile: the median of repeated runs, as
    benchmarks on a noisy machine report, so that one run caught in a slow spell of the machine
    (README section 14: whole replays 45-160% slower than the runs around them, with the same
    inputs) does not decide the figure; with one or two runs it is that run's error or the mean of
    the two. The same figures over all runs' requests pooled stay as
    ``ttft_mean_rel_error_pooled`` and ``ttft_p90_rel_error_pooled``, each run's signed mean error
    as ``ttft_mean_signed_error_runs`` (a list); the other figures are :func:`summarise` of the
    pooled requests (``unscaled_*`` too). Added: ``replay_repeats`` and
    ``ttft_mean_real_cv``, the coefficient of variation (sample standard deviation over mean) of
    the per-repeat real mean TTFT: the real engine's own run-to-run noise on this machine, below
    which no simulator error is meaningful (NaN with one repeat). ``sim_policy_*`` figures are
    averaged over repeats, ``replay_wall_s`` and ``host_steal_s`` summed.
    """
    out = summarise(pd.concat(list(frames), ignore_index=True))
    means = np.array([s["ttft_mean_real_s"] for s in summaries], dtype=float)
    mean_ratio = np.array([s["ttft_mean_sim_s"] / s["ttft_mean_real_s"] for s in summaries])
    p90_ratio = np.array([s["ttft_p90_sim_s"] / s["ttft_p90_real_s"] for s in summaries])
    out["ttft_mean_rel_error_pooled"] = out["ttft_mean_rel_error"]
    out["ttft_p90_rel_error_pooled"] = out["ttft_p90_rel_error"]
    out["ttft_mean_rel_error"] = abs(float(np.median(mean_ratio)) - 1.0)
    out["ttft_p90_rel_error"] = abs(float(np.median(p90_ratio)) - 1.0)
    out["ttft_mean_signed_error_runs"] = [round(float(r) - 1.0, 4) for r in mean_ratio]
    out["replay_repeats"] = len(summaries)
    out["ttft_mean_real_cv"] = (float(np.std(means, ddof=1) / np.mean(means))
                                if len(means) > 1 else float("nan"))
    for key in ("sim_policy_ttft_mean_s", "sim_policy_same_replica_fraction"):
        if all(key in s for s in summaries):
            out[key] = float(np.mean([s[key] for s in summaries]))
    for key in ("replay_wall_s", "host_steal_s"):
        if all(key in s for s in summaries):
            out[key] = float(sum(s[key] for s in summaries))
    return out


def host_steal_s(stat_path: str = "/proc/stat") -> float | None:
    """CPU seconds the hypervisor has taken from this virtual machine's CPUs since boot (the
    ``steal`` column of the ``cpu`` line of ``/proc/stat``, in clock ticks of
    ``os.sysconf("SC_CLK_TCK")``; Linux ``proc(5)``), or None where there is no such file.

    :func:`validate` records it before and after each recorded replay (``host_steal_s`` per run,
    summed over a policy's runs): a replay slowed by the host, not by the engine, shows it.
    """
    try:
        with open(stat_path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


#: The speed probe's requests (:func:`speed_probe`): a cold prompt of one full step, and 64 new
#: tokens after 2,048 cached (the validation trace's two kinds of work).
PROBE_COLD_LENGTHS = (2048,)
PROBE_CACHED_POINTS = ((2048, 64),)


def speed_probe(ports, fitted: cal.FittedEngine, salt: int) -> float:
    """How much slower the servers of ``ports`` run now than ``fitted`` says: the median over
    the probe's requests (:data:`PROBE_COLD_LENGTHS`, :data:`PROBE_CACHED_POINTS`, one of each
    per server, every server at once) of measured / fitted TTFT. About 1.5 s.

    A shared virtual machine's speed moves over minutes (measured here on 2026-12-01: the drift
    check after the replays found the servers 68% and 19% slower than their calibration a few
    minutes earlier in two runs, -0.1% and +1.1% in two others). With ``speed_correction``,
    :func:`validate` probes just before and after each recorded replay and simulates that run
    with the fit scaled by the mean of the two (:meth:`.calibrate.FittedEngine.scaled`): the
    machine's speed at the time of the run, which the simulator cannot know, measured on requests
    that are not the replay's. It cannot follow changes within a replay.
    """
    return speed_of(probe_rows(ports, salt), fitted)


def probe_rows(ports, salt: int, cold_lengths=PROBE_COLD_LENGTHS,
               cached_points=PROBE_CACHED_POINTS, decode_tokens: int = 2) -> pd.DataFrame:
    """A few calibration requests, one of each point per server, every server of ``ports`` at
    once (no warm-up, no arrival rounds): the cold and cached rows of
    :func:`.calibrate.measure_concurrent`."""
    rows = cal.measure_concurrent(ports, repeats=1, cold_lengths=cold_lengths,
                                  cached_points=cached_points, decode_tokens=decode_tokens,
                                  salt=salt, warmup=False, arrival_rounds=0)
    return rows[rows["kind"].isin(("cold", "cached"))]


def measured_over_fitted(rows: pd.DataFrame, fitted: cal.FittedEngine) -> np.ndarray:
    """Measured / fitted TTFT of calibration rows (cold and cached ones; others are left out)."""
    rows = rows[rows["kind"].isin(("cold", "cached"))]
    pred = fitted.predict_ttft_s(rows["new_tokens"].to_numpy(), rows["cached_tokens"].to_numpy())
    return rows["ttft_s"].to_numpy() / pred


def speed_of(rows: pd.DataFrame, fitted: cal.FittedEngine) -> float:
    """The median over ``rows``' cold and cached requests of measured / fitted TTFT: how fast the
    engine ran when they were measured, against the fit (1.10 = 10% slower)."""
    return float(np.median(measured_over_fitted(rows, fitted)))


def drift_of(rows: pd.DataFrame, fitted: cal.FittedEngine, busy_servers: int) -> dict:
    """``calibration_drift`` (:func:`speed_of` ``rows`` - 1), ``drift_requests`` and
    ``drift_busy_servers`` of calibration rows measured at the end of a validation."""
    return {"calibration_drift": speed_of(rows, fitted) - 1.0,
            "drift_requests": int(rows["kind"].isin(("cold", "cached")).sum()),
            "drift_busy_servers": int(busy_servers)}


#: Calibration points re-measured after the replays (:func:`measure_drift`).
DRIFT_COLD_LENGTHS = (1024, 2048)
DRIFT_CACHED_POINTS = ((4096, 1024),)


def measure_drift(ports, fitted: cal.FittedEngine, salt: int) -> dict:
    """Re-measure a few calibration points on every server of ``ports`` at once, after the
    replays, and compare them with the fit used for that server count.

    A shared machine's speed changes over minutes (other tenants, the host's placement of the
    virtual cores); a change between calibration and replay is an error of the testbed that the
    simulator cannot see. Returns ``calibration_drift`` (median over the re-measured requests of
    measured / fitted TTFT, minus 1: positive = the engine ran slower at the end than the fit
    says), ``drift_requests`` and ``drift_busy_servers``.
    """
    ports = list(ports)
    return drift_of(probe_rows(ports, salt, DRIFT_COLD_LENGTHS, DRIFT_CACHED_POINTS,
                               decode_tokens=32), fitted, len(ports))


@dataclass
class ValidationResult:
    """What :func:`validate` returns (tables are pandas DataFrames)."""

    calibration: pd.DataFrame
    fitted: cal.FittedEngine
    requests: pd.DataFrame                 # per request, all runs: + policy, num_replicas
    summary: pd.DataFrame                  # one row per (num_replicas, policy)
    info: dict = field(default_factory=dict)
    fits: dict = field(default_factory=dict)  # {servers busy during calibration: FittedEngine}

    def fitted_for(self, num_servers: int) -> cal.FittedEngine:
        """The fit used for runs on ``num_servers`` servers (see :func:`.calibrate.calibration_for`)."""
        if not self.fits:
            return self.fitted
        return self.fits[cal.count_for(self.fits, num_servers)]

    def as_json(self) -> dict:
        """JSON-able dict: ``policies`` {policy: figures} for the largest replica count, ``runs``
        (every row of :attr:`summary`), ``fit``, ``goals``, ``info``."""
        top = self.summary[self.summary["num_replicas"] == self.summary["num_replicas"].max()]
        pol = {row["policy"]: {k: _clean(v) for k, v in row.items() if k != "policy"}
               for row in top.to_dict("records")}
        return {"policies": pol, "runs": [{k: _clean(v) for k, v in r.items()}
                                          for r in self.summary.to_dict("records")],
                "fit": self.fitted.as_dict(),
                "fits": {str(k): f.as_dict() for k, f in sorted(self.fits.items())},
                "goals": GOALS, "info": self.info}


def load_result(directory) -> ValidationResult:
    """Read what ``btb validate-engine --out DIR`` wrote (``calibration.csv``, ``requests.csv``,
    ``summary.json``) back into a :class:`ValidationResult`."""
    d = Path(directory)
    out = json.loads((d / "summary.json").read_text())
    fits = {int(k): cal.FittedEngine.from_dict(v) for k, v in out.get("fits", {}).items()}
    return ValidationResult(pd.read_csv(d / "calibration.csv"),
                            cal.FittedEngine.from_dict(out["fit"]),
                            pd.read_csv(d / "requests.csv"), pd.DataFrame(out["runs"]), out["info"],
                            fits)


def save_result(result: ValidationResult, directory) -> Path:
    """Write a result as ``calibration.csv``, ``requests.csv`` and ``summary.json`` (atomically)."""
    from ..fileio import atomic_write_bytes, jsonable

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(d / "calibration.csv", result.calibration.to_csv(index=False).encode())
    atomic_write_bytes(d / "requests.csv", result.requests.to_csv(index=False).encode())
    atomic_write_bytes(d / "summary.json",
                       (json.dumps(jsonable(result.as_json()), indent=2) + "\n").encode())
    return d


def _clean(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


REAL_COLUMNS = ("request_id", "replica", "arrival_s", "sent_s", "input_length", "output_length",
                "ttft_s", "e2e_s", "cached_tokens", "prompt_tokens")


def score_run(real: pd.DataFrame, trace, fitted: cal.FittedEngine, num_replicas: int, policy: str,
              seed: int = 0, speed_factor: float | None = None) -> tuple[pd.DataFrame, dict]:
    """Per-request comparison and summary of one real run (see the module docstring;
    ``speed_factor`` as in :func:`compare`)."""
    df = compare(real[list(REAL_COLUMNS)], trace, fitted, num_replicas, speed_factor)
    df.insert(0, "policy", policy)
    df.insert(1, "num_replicas", num_replicas)
    summary = summarise(df)
    if speed_factor is not None:
        fitted = fitted.scaled(speed_factor)
    sim_pol = simulate(engine_blocks(trace, real["sent_s"].to_numpy()), make_router(policy),
                       engine_cluster_config(fitted, num_replicas), seed=seed).requests
    summary["sim_policy_ttft_mean_s"] = float(sim_pol["ttft_s"].mean() + fitted.frontend_s)
    summary["sim_policy_same_replica_fraction"] = float(
        (sim_pol["replica"].to_numpy() == real["replica"].to_numpy()).mean())
    return df, summary


def rescore(result: "ValidationResult", trace=None, seed: int = 0, *,
            context_term: bool = True, arrival_term: bool = True,
            speed_correction: bool = True, points: str | None = None) -> "ValidationResult":
    """Refit the cost model to ``result.calibration`` and redo every comparison from the real
    columns of ``result.requests`` (no engine needed; the simulator is deterministic).
    ``trace`` defaults to the first ``len`` requests of :data:`DEFAULT_TRACE`;
    ``context_term=False`` refits without the cached-context term, ``arrival_term=False``
    without the arrival overhead (see :func:`.calibrate.fit_cost`), ``speed_correction=False``
    ignores the runs' measured ``speed_factor`` (:func:`speed_probe`), to see what each changes.
    ``points`` (:data:`.calibrate.FIT_POINTS`) defaults to the result's own
    (``info["calibration_points"]``; ``"rows"`` for results made before it was recorded)."""
    if points is None:
        points = result.info.get("calibration_points", "rows")
    fits = cal.fit_by_busy(result.calibration, context_term=context_term,
                           arrival_term=arrival_term, points=points)
    rows, frames = [], []
    reqs = result.requests
    if "repeat" not in reqs:
        reqs = reqs.assign(repeat=0)
    for (n, policy), both in reqs.groupby(["num_replicas", "policy"], sort=False):
        runs, sums = [], []
        for rep, real in both.groupby("repeat", sort=True):
            real = real.reset_index(drop=True)
            tr = trace if trace is not None else head(load_validation_trace(), len(real))
            f = None
            if speed_correction and "speed_factor" in real:
                known = real["speed_factor"].dropna()
                f = float(known.iloc[0]) if len(known) else 1.0   # a run without a probe: as measured
            df, summary = score_run(real, tr, fits[cal.count_for(fits, int(n))], int(n), policy, seed, f)
            df.insert(2, "repeat", int(rep))
            runs.append(df)
            sums.append(summary)
        pooled = pool_runs(runs, sums)
        prev = result.summary
        old = (prev[(prev["num_replicas"] == n) & (prev["policy"] == policy)]
               if {"num_replicas", "policy"} <= set(prev.columns) else prev.iloc[:0])
        for key in ("replay_wall_s", "host_steal_s"):
            if key in old and len(old):
                pooled[key] = float(old[key].iloc[0])
        frames.extend(runs)
        rows.append({"num_replicas": int(n), "policy": policy, **pooled})
    top = int(result.requests["num_replicas"].max())
    return ValidationResult(result.calibration, fits[cal.count_for(fits, top)],
                            pd.concat(frames, ignore_index=True), pd.DataFrame(rows),
                            dict(result.info), fits)


def head(trace, n: int):
    """The first ``n`` requests of ``trace`` (same block size)."""
    t = trace.table.iloc[:int(n)]
    return make_trace(t["arrival_s"].to_numpy(), t["input_length"].to_numpy(),
                      t["output_length"].to_numpy(), [list(map(int, h)) for h in t["hash_ids"]],
                      block_tokens=int(trace.block_tokens), name=f"{getattr(trace, 'name', 'trace')}[:{n}]",
                      request_id=t["request_id"].to_numpy())


#: Arrival-overhead rounds of each calibration pass measured between replay rounds
#: (:func:`validate` with ``recalibrate``); the first pass has :data:`.calibrate.ARRIVAL_ROUNDS`.
PASS_ARRIVAL_ROUNDS = 2


def pass_speed(calibration: pd.DataFrame, fitted: cal.FittedEngine) -> list[float]:
    """Per calibration pass (column ``pass``; one pass without it), the median over its cold and
    cached requests of measured / fitted TTFT: how fast the machine ran during each pass relative
    to the fit (1.10 = that pass measured 10% slower)."""
    if "pass" not in calibration:
        calibration = calibration.assign(**{"pass": 0})
    return [speed_of(g, fitted) for _, g in calibration.groupby("pass", sort=True)]


def validate(trace=None, replicas=(2,), policies=DEFAULT_POLICIES, *, repeats: int = 2,
             replay_repeats: int = 3, seed: int = 0, max_requests: int | None = None,
             quick_calibration: bool = False, calibration: pd.DataFrame | None = None,
             recalibrate: bool = True, drift_check: bool = True, warmup_replays: int = 2,
             speed_correction: bool = False, api_cores=None, log=print) -> ValidationResult:
    """Run the validation (module docstring) and return per-request and summary tables.

    Parameters
    ----------
    trace : btb_core.trace.Trace or path, optional
        Default :data:`DEFAULT_TRACE`.
    replicas : sequence of int
        Server counts to run (each 1 or 2); ``max(replicas)`` servers start once and a count of
        ``n`` uses the first ``n``.
    policies : sequence of str
        Router policy names (see :data:`btb_core.routers.POLICIES`; ``btb`` needs copies and is
        refused).
    repeats : int
        Calibration repeats per point in the first calibration pass (before the replays).
    replay_repeats : int
        Real runs per (server count, policy), each on a cold prefix cache, in rounds (every
        policy once, then again); the summary takes the median over runs of each run's error
        and reports the engine's run-to-run noise (:func:`pool_runs`). Default 3: on the 2-core
        machine this project is tested on, a whole run of a policy was now and then 45-160%
        slower than the runs around it with the same inputs (README section 14), and the
        median of three leaves one such run out.
    max_requests : int, optional
        Replay only the first ``max_requests`` requests of the trace.
    quick_calibration : bool
        Calibrate on :data:`.calibrate.QUICK_COLD_LENGTHS` / ``QUICK_CACHED_POINTS`` (fewer,
        shorter requests) instead of the defaults.
    calibration : DataFrame, optional
        Reuse an earlier calibration instead of measuring (rows without ``busy_servers`` count
        as measured on one server); no passes are measured between rounds then.
    recalibrate : bool
        After each round of replays, measure one more calibration pass on the same servers (the
        plan once, :data:`PASS_ARRIVAL_ROUNDS` arrival rounds, ~30 s; column ``pass`` of the
        calibration, 0 = before the replays), and fit the cost model after the replays to every
        pass, each point at the median of its repeats (:data:`.calibrate.FIT_POINTS`). The
        calibration then spans the same minutes as the replays it is compared with: on the
        2-core test machine one run's fits of single passes ranged over 25% in TTFT between
        passes 80 s apart, and a calibration measured only before the replays put another run's
        simulator 20-24% above the engine for three of its four policies. Default on.
    warmup_replays : int
        Unrecorded replays of the trace (``round_robin``, texts of their own, prefix caches reset
        after) on each server count before the recorded ones (default 2). A fresh engine pays
        one-time costs for every new step shape; over eight back-to-back recorded runs of the
        validation trace on one server without it, the real mean TTFT fell from 3.28 to 3.00 s
        (9%), the first runs being the slowest; after one warm-up replay, the first recorded run
        was still the slowest run of its policy in four of five runs on 2026-12-02 (2.61-4.96 s
        against 1.69-2.46 s for ``round_robin``'s later runs). The simulator models a warm
        engine.
    speed_correction : bool
        Probe the servers' speed just before and after each recorded replay (:func:`speed_probe`,
        ~3 s a run) and simulate the run with the fit scaled by the mean of the two; the
        summary then also gives ``speed_factor`` and the errors without the correction
        (``unscaled_ttft_mean_rel_error``, ``unscaled_ttft_p90_rel_error``). Off by default: on
        the noisy machine it was tried on (16 runs, probes 0.92-1.14), it took the per-run error
        from 8.6% to 8.0% rms, within that machine's noise (README section 14).
    drift_check : bool
        Report how far the engine's speed moved from the first calibration pass by the end
        (``info["calibration_drift"]``: the last pass against a fit of the first, with
        ``recalibrate``; else a few calibration points re-measured after the replays,
        :func:`measure_drift`). With ``recalibrate`` also ``info["calibration_pass_speed"]``:
        each pass's speed against the fit used (:func:`pass_speed`), per server count.
    api_cores : None, "spare" or list of int
        Where the servers' API servers run (:class:`~.server.EngineCluster`): None (default) on
        their engine's core; ``"spare"`` on a core no engine uses, when the machine has one (one
        server on a 2-core machine; with ``replicas=(1, 2)`` two servers start, so there is none
        and the log says so), for calibration and replays alike; or one core per server.
        ``info["api_cores"]`` records where they ran (None: on the engine's core).
    log : callable
        One-line progress messages (``None`` for silence).

    Raises
    ------
    EngineNotInstalled, EngineError, ConfigError
    """
    if trace is None or isinstance(trace, (str, Path)):
        trace = load_validation_trace(trace)
    for p in policies:
        make_router(p)  # unknown names raise ConfigError before any server starts
        if p not in ENGINE_POLICIES:
            why = ("copies KV between replicas, which the real servers here do not support"
                   if p.startswith("btb") else
                   "routes through the SGLang gateway's own stand-in workers, not these servers"
                   if p == "sglang_gateway" else "is not supported on the real engine")
            raise ConfigError(f"policy {p!r} {why}; choose from {', '.join(ENGINE_POLICIES)}")
    if int(replay_repeats) < 1:
        raise ConfigError(f"replay_repeats must be >= 1, got {replay_repeats!r}")
    if (not isinstance(warmup_replays, (int, np.integer)) or isinstance(warmup_replays, bool)
            or warmup_replays < 0):
        raise ConfigError(f"warmup_replays must be an integer >= 0, got {warmup_replays!r}")
    for n in replicas:
        if n not in (1, 2):
            raise ConfigError(f"--replicas {n}: must be 1 or 2 (one core per server)")
    if max_requests is not None:
        trace = head(trace, max_requests)
    say = log or (lambda *_: None)
    t_start = time.perf_counter()
    rows, frames = [], []
    salt = 1_000 * (seed + 1)
    n_servers = max(replicas)
    points = "median"
    plan = ({"cold_lengths": cal.QUICK_COLD_LENGTHS, "cached_points": cal.QUICK_CACHED_POINTS}
            if quick_calibration else {})
    recalibrate = bool(recalibrate) and calibration is None
    pass_speeds: dict = {}
    drift: dict = {}
    require_engine()   # says how to install it, before anything claims to start
    say(f"starting {n_servers} vLLM CPU server(s) (one core each) ...")
    with EngineCluster(n_servers, api_cores=api_cores) as cluster:
        say(f"servers ready on ports {cluster.ports} after {time.perf_counter() - t_start:.0f} s"
            + ("" if all(c is None for c in cluster.api_cores) else
               f"; API servers moved to core(s) {cluster.api_cores}"))
        if cluster.api_note:
            say(cluster.api_note)
        api_used = list(cluster.api_cores)
        if calibration is None:
            frames_cal = []
            for k, n in enumerate(sorted(set(replicas))):
                say(f"calibrating TTFT vs prompt length and cached context on {n} server(s) at "
                    "once ...")
                c = cal.measure_concurrent(cluster.ports[:n], repeats=repeats,
                                           salt=10_000 + 100_000 * k,
                                           **plan, **({"arrival_rounds": 1} if quick_calibration else {}))
                frames_cal.append(c.assign(**{"pass": 0}))
            calibration = pd.concat(frames_cal, ignore_index=True)
        else:
            points = "rows" if "pass" not in calibration else "median"
        for n in replicas:
            ports = cluster.ports[:n]
            fit0 = cal.fit_for(calibration, n, points)   # the first pass's fit (for the drift)
            for w in range(int(warmup_replays)):
                say(f"{n} server(s): warm-up replay {w + 1}/{warmup_replays} (not recorded) ...")
                cluster.reset_prefix_caches()
                replay(trace, make_router("round_robin"), ports, salt=500_000 + 1_000 * n + w,
                       seed=seed)
            # repeats interleaved across policies (all policies once, then again): a slow spell
            # of the machine falls on several policies rather than on all runs of one
            done = []
            for rep in range(int(replay_repeats)):
                for policy in policies:
                    salt += 1
                    probes = None
                    if speed_correction:
                        before = probe_rows(ports, salt=700_000 + 10 * salt)
                    cluster.reset_prefix_caches()
                    t0, steal0 = time.perf_counter(), host_steal_s()
                    real = replay(trace, make_router(policy), ports, salt=salt, seed=seed)
                    wall, steal1 = time.perf_counter() - t0, host_steal_s()
                    if speed_correction:
                        probes = (before, probe_rows(ports, salt=700_000 + 10 * salt + 5))
                    steal = (steal1 - steal0 if steal0 is not None and steal1 is not None
                             else float("nan"))
                    done.append((rep, policy, real, wall, steal, probes))
                    tag = f" run {rep + 1}/{replay_repeats}" if replay_repeats > 1 else ""
                    say(f"{n} server(s) {policy:12s}{tag}: TTFT mean real "
                        f"{real['ttft_s'].mean():.3f} s, host steal {steal:.2f} s")
                if recalibrate:
                    say(f"{n} server(s): calibration pass {rep + 1} of {replay_repeats} "
                        f"(after round {rep + 1}) ...")
                    k = sorted(set(replicas)).index(n)
                    # texts of their own: each pass uses salts within 100,000 of its base
                    c = cal.measure_concurrent(ports, repeats=1, warmup=False,
                                               salt=2_000_000 + 100_000 * (100 * k + rep),
                                               arrival_rounds=(1 if quick_calibration
                                                               else PASS_ARRIVAL_ROUNDS), **plan)
                    calibration = pd.concat([calibration, c.assign(**{"pass": rep + 1})],
                                            ignore_index=True)
            fitted = cal.fit_for(calibration, n, points)   # every pass of this server count
            say(f"fit ({n} server(s)): " + ", ".join(f"{a}={v:.4g}" for a, v in fitted.as_dict().items()))
            mine = cal.calibration_for(calibration, n)
            if recalibrate:
                pass_speeds[str(n)] = [round(v, 4) for v in pass_speed(mine, fitted)]
                say(f"{n} server(s): speed of each calibration pass against the fit: "
                    + ", ".join(f"{v:.3f}" for v in pass_speeds[str(n)]))
            runs = {p: [] for p in policies}
            sums = {p: [] for p in policies}
            for rep, policy, real, wall, steal, probes in done:
                factor = None
                if probes is not None:
                    before, after = (speed_of(r, fitted) for r in probes)
                    factor = 0.5 * (before + after)
                    say(f"{n} server(s) {policy:12s}: speed probe {before:.3f} before, "
                        f"{after:.3f} after (measured / fitted TTFT)")
                df, summary = score_run(real, trace, fitted, n, policy, seed, factor)
                df.insert(2, "repeat", rep)
                summary["replay_wall_s"] = wall
                summary["host_steal_s"] = steal
                runs[policy].append(df)
                sums[policy].append(summary)
                tag = f" run {rep + 1}/{replay_repeats}" if replay_repeats > 1 else ""
                say(f"{n} server(s) {policy:12s}{tag}: cached match "
                    f"{summary['cached_tokens_match_fraction']:.3f}, TTFT mean real "
                    f"{summary['ttft_mean_real_s']:.3f} s sim {summary['ttft_mean_sim_s']:.3f} s, "
                    f"p90 err {summary['ttft_p90_rel_error']:.3f}")
            for policy in policies:
                frames.extend(runs[policy])
                rows.append({"num_replicas": n, "policy": policy,
                             **pool_runs(runs[policy], sums[policy])})
            if drift_check and recalibrate and n == n_servers:
                last = mine[mine["pass"] == mine["pass"].max()]
                drift = drift_of(last, fit0, n)
        if drift_check and not recalibrate:
            say("re-measuring calibration points (speed drift since calibration) ...")
            drift = measure_drift(cluster.ports[:n_servers], cal.fit_for(calibration, n_servers, points),
                                  salt=900_000 + salt)
        if drift:
            say(f"calibration drift: {drift['calibration_drift']:+.1%} (measured / fitted TTFT - 1, "
                f"{n_servers} server(s) busy, the end against the start)")
    fits = cal.fit_by_busy(calibration, points=points)
    info = {"trace": getattr(trace, "name", "trace"), "trace_requests": int(len(trace.table)),
            "block_tokens": ENGINE_BLOCK_TOKENS, "chunk_tokens": ENGINE_CHUNK_TOKENS,
            "replay_repeats": int(replay_repeats), "warmup_replays": int(warmup_replays),
            "speed_correction": bool(speed_correction), "recalibrate": recalibrate,
            "calibration_points": points, "api_cores": api_used,
            **({"calibration_pass_speed": pass_speeds} if pass_speeds else {}), **drift,
            "wall_s": time.perf_counter() - t_start}
    return ValidationResult(calibration, fits[cal.count_for(fits, max(replicas))],
                            pd.concat(frames, ignore_index=True), pd.DataFrame(rows), info, fits)


__all__ = ["DEFAULT_POLICIES", "DEFAULT_TRACE", "ENGINE_POLICIES", "DRIFT_CACHED_POINTS", "DRIFT_COLD_LENGTHS",
           "SHIPPED_RESULT", "FixedAssignment", "GOALS", "ValidationResult",
           "compare", "engine_blocks", "engine_cluster_config", "load_result", "load_validation_trace",
           "host_steal_s", "measure_drift", "pool_runs", "save_result", "speed_probe", "PROBE_COLD_LENGTHS",
           "PROBE_CACHED_POINTS", "PASS_ARRIVAL_ROUNDS", "drift_of", "measured_over_fitted", "speed_of",
           "pass_speed", "probe_rows",
           "head", "rescore", "score_run", "summarise", "validate"]
