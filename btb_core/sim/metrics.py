"""Run results: the per-request table, run metrics, transfers and per-replica time series."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

#: Columns of :attr:`SimResult.requests`, in order (units in the names).
REQUEST_COLUMNS = (
    "request_id", "arrival_s", "replica", "input_length", "output_length", "queue_wait_s",
    "reuse_tier", "reused_tokens", "hit_hbm_tokens", "hit_dram_tokens", "hit_disk_tokens",
    "recomputed_tokens", "load_s", "prefill_s", "ttft_s", "e2e_s", "finish_s",
)


@dataclass
class SimResult:
    """What :func:`btb_core.sim.simulate` returns.

    Attributes
    ----------
    requests : pandas.DataFrame
        One row per request, columns :data:`REQUEST_COLUMNS`: ``queue_wait_s`` (arrival to
        admission), ``reuse_tier`` (slowest tier its reused prefix came from: none/hbm/dram/disk),
        ``reused_tokens`` (prefix tokens not recomputed) split by tier, ``load_s`` (tier load time),
        ``prefill_s`` (admission to first token: load + prefill, interleaved with other work under
        ``chunked``), ``ttft_s`` (arrival to first token), ``e2e_s`` (arrival to last token).
    metrics : dict
        Run metrics (see :func:`run_metrics`).
    transfers : pandas.DataFrame
        One row per RDMA copy: src, dst, blocks, bytes, request_s, start_s, end_s, landed_blocks,
        served_requests.
    queue_samples : pandas.DataFrame
        ``time_s, replica, queue_length`` at every change of a waiting queue.
    busy_intervals : pandas.DataFrame
        ``replica, start_s, end_s`` of every operation a replica ran.
    """

    requests: pd.DataFrame
    metrics: dict
    transfers: pd.DataFrame
    queue_samples: pd.DataFrame
    busy_intervals: pd.DataFrame
    num_replicas: int
    block_tokens: int
    info: dict = field(default_factory=dict)

    def queue_length_series(self, bin_s: float = 1.0, end_s: float | None = None) -> pd.DataFrame:
        """Per-replica waiting-queue length per time bin (the maximum within the bin).

        Returns a long table ``time_s`` (bin start), ``replica``, ``queue_length``.
        """
        end_s = self._end(end_s)
        edges = np.arange(0.0, end_s + bin_s, bin_s)
        frames = []
        qs = self.queue_samples
        for r in range(self.num_replicas):
            s = qs[qs["replica"] == r]
            t = s["time_s"].to_numpy()
            q = s["queue_length"].to_numpy()
            # value in force at each bin start, and max of changes inside the bin
            idx = np.searchsorted(t, edges[:-1], side="right") - 1
            start_val = np.where(idx >= 0, q[np.clip(idx, 0, None)] if len(q) else 0, 0)
            bins = np.searchsorted(edges, t, side="right") - 1
            peak = start_val.astype(np.int64).copy()
            if len(q):
                ok = (bins >= 0) & (bins < len(peak))
                np.maximum.at(peak, bins[ok], q[ok])
            frames.append(pd.DataFrame({"time_s": edges[:-1], "replica": r, "queue_length": peak}))
        return pd.concat(frames, ignore_index=True)

    def busy_fraction_series(self, bin_s: float = 1.0, end_s: float | None = None) -> pd.DataFrame:
        """Per-replica fraction of each time bin spent running operations.

        Returns a long table ``time_s`` (bin start), ``replica``, ``busy_fraction`` in [0, 1].
        """
        end_s = self._end(end_s)
        edges = np.arange(0.0, end_s + bin_s, bin_s)
        frames = []
        bi = self.busy_intervals
        for r in range(self.num_replicas):
            s = bi[bi["replica"] == r].sort_values("start_s")
            st = s["start_s"].to_numpy()
            en = s["end_s"].to_numpy()
            cum = np.concatenate([[0.0], np.cumsum(en - st)])

            def busy_until(t):
                k = np.searchsorted(st, t, side="right")  # intervals starting at or before t
                prev = np.clip(k - 1, 0, None)
                partial = np.where(k > 0, np.minimum(t - st[prev] if len(st) else 0.0,
                                                     (en - st)[prev] if len(st) else 0.0), 0.0)
                return cum[np.clip(k - 1, 0, None)] * (k > 0) + partial

            b = busy_until(edges) if len(st) else np.zeros_like(edges)
            frac = np.diff(b) / bin_s
            frames.append(pd.DataFrame({"time_s": edges[:-1], "replica": r,
                                        "busy_fraction": np.clip(frac, 0.0, 1.0)}))
        return pd.concat(frames, ignore_index=True)

    def _end(self, end_s):
        if end_s is not None:
            return float(end_s)
        return float(self.requests["finish_s"].max()) if len(self.requests) else 0.0


def _percentiles(x: np.ndarray, prefix: str) -> dict:
    if len(x) == 0:
        return {f"{prefix}_{k}_s": float("nan") for k in ("mean", "p50", "p90", "p95", "p99")}
    p50, p90, p95, p99 = np.percentile(x, [50, 90, 95, 99])
    return {f"{prefix}_mean_s": float(x.mean()), f"{prefix}_p50_s": float(p50),
            f"{prefix}_p90_s": float(p90), f"{prefix}_p95_s": float(p95), f"{prefix}_p99_s": float(p99)}


def run_metrics(requests: pd.DataFrame, transfers: pd.DataFrame, cost, busy_s: np.ndarray) -> dict:
    """Run metrics from the per-request and transfer tables.

    Keys: ``requests``; ``ttft_{mean,p50,p90,p95,p99}_s``; ``e2e_mean_s``; ``queue_wait_mean_s``;
    ``hit_fraction`` (reused / prompt tokens) and ``hit_fraction_{hbm,dram,disk}``;
    ``prompt_tokens``, ``recomputed_prefill_tokens``; ``recomputed_prefill_gpu_s`` (GPU-seconds of
    prefill actually run = prefill time x GPUs per replica) and ``prefill_gpu_s_saved`` (versus
    recomputing every prompt from scratch); ``rdma_bytes``, ``rdma_copies``, ``copies_unused``
    (copies that served no request); ``makespan_s``; ``busy_fraction_mean``.
    """
    m = {"requests": int(len(requests))}
    m.update(_percentiles(requests["ttft_s"].to_numpy(), "ttft"))
    m["e2e_mean_s"] = float(requests["e2e_s"].mean()) if len(requests) else float("nan")
    m["queue_wait_mean_s"] = float(requests["queue_wait_s"].mean()) if len(requests) else float("nan")
    prompt = float(requests["input_length"].sum())
    m["prompt_tokens"] = int(prompt)
    denom = prompt if prompt > 0 else 1.0
    m["hit_fraction"] = float(requests["reused_tokens"].sum()) / denom
    for tier in ("hbm", "dram", "disk"):
        m[f"hit_fraction_{tier}"] = float(requests[f"hit_{tier}_tokens"].sum()) / denom
    m["recomputed_prefill_tokens"] = int(requests["recomputed_tokens"].sum())
    gpus = int(cost.node.num_gpus)
    new = requests["recomputed_tokens"].to_numpy()
    cached = requests["reused_tokens"].to_numpy()
    # the cost model's formulas are plain arithmetic, so they take whole columns at once
    ran = cost.prefill_s(new.astype(np.float64), cached.astype(np.float64))
    full = cost.prefill_s(requests["input_length"].to_numpy(np.float64), np.zeros(len(new)))
    m["recomputed_prefill_gpu_s"] = float(ran.sum() * gpus)
    m["prefill_gpu_s_saved"] = float((full - ran).sum() * gpus)
    m["rdma_bytes"] = int(transfers["bytes"].sum()) if len(transfers) else 0
    m["rdma_copies"] = int(len(transfers))
    m["copies_unused"] = int((transfers["served_requests"] == 0).sum()) if len(transfers) else 0
    makespan = float(requests["finish_s"].max()) if len(requests) else 0.0
    m["makespan_s"] = makespan
    m["busy_fraction_mean"] = float(np.mean(busy_s) / makespan) if makespan > 0 else 0.0
    return m


def session_metrics(sessions: pd.DataFrame) -> dict:
    """Run metrics of a per-session table (:func:`btb_core.sessions.session_table`).

    Keys: ``sessions``, ``session_turns_mean``, ``session_duration_{mean,p50,p95}_s`` (first arrival
    to last finish), ``session_ttft_mean_s`` (mean over sessions of their mean TTFT) and
    ``session_output_tokens_per_s_mean`` (over sessions with a positive duration).
    """
    d = sessions["duration_s"].to_numpy()
    m = {"sessions": int(len(sessions)),
         "session_turns_mean": float(sessions["turns"].mean()) if len(sessions) else float("nan")}
    if len(d):
        p50, p95 = np.percentile(d, [50, 95])
        m.update({"session_duration_mean_s": float(d.mean()), "session_duration_p50_s": float(p50),
                  "session_duration_p95_s": float(p95)})
    else:
        m.update({k: float("nan") for k in ("session_duration_mean_s", "session_duration_p50_s",
                                             "session_duration_p95_s")})
    m["session_ttft_mean_s"] = float(sessions["ttft_mean_s"].mean()) if len(d) else float("nan")
    tps = sessions["output_tokens_per_s"].dropna()
    m["session_output_tokens_per_s_mean"] = float(tps.mean()) if len(tps) else float("nan")
    return m


def _columns_frame(cols, names) -> pd.DataFrame:
    """A table from equal-length columns (lists, or typed ``array.array`` s: float64 and int64);
    typed as a list of row tuples would be (an empty table has object columns, as
    ``pd.DataFrame([], columns=names)``)."""
    if not len(cols[0]):
        return pd.DataFrame([], columns=names)
    return pd.DataFrame(dict(zip(names, (_as_numpy(c) for c in cols))))


def _as_numpy(c):
    if isinstance(c, array):
        return np.frombuffer(c, dtype=c.typecode).copy()
    return c


_TIERS = ("none", "hbm", "dram", "disk")
_TIER_CODE = {t: k for k, t in enumerate(_TIERS)}


class RequestColumns:
    """Finished requests' figures as typed columns, one slot per trace row (8 bytes a value,
    instead of a record object per request kept to the end of the run).

    Parameters
    ----------
    n : int
        Rows of the trace.
    cluster_events : bool
        Also keep ``retries`` (runs with cluster events).
    fixed : tuple of numpy.ndarray, optional
        ``(arrival_s, input_length, output_length)`` of every row, known before the run (shape
        ``(n,)``): those columns are filled now (``output_length`` raised to 1, as the simulator's
        requests have it) and :meth:`record` does not write them again. Not for closed-loop runs,
        where a turn's ``arrival_s`` is its release time.

    Attributes
    ----------
    arrival_s, admit_s, load_s, first_token_s, finish_s : array.array of float64
        Seconds; ``finish_s`` is -1.0 until the request finishes.
    replica : array.array of int32
    input_length, output_length, reused_tokens, hit_hbm, hit_dram, hit_disk, retries :
        array.array of int64 (``retries`` empty without cluster events).
    reuse_tier : array.array of int8
        Index into ``("none", "hbm", "dram", "disk")``.
    """

    __slots__ = ("arrival_s", "replica", "input_length", "output_length", "admit_s", "reuse_tier",
                 "reused_tokens", "hit_hbm", "hit_dram", "hit_disk", "load_s", "first_token_s",
                 "finish_s", "retries", "fixed")

    def __init__(self, n: int, cluster_events: bool = False, fixed=None) -> None:
        def zeros(code):
            a = array(code)
            a.frombytes(bytes(a.itemsize * n))
            return a

        self.arrival_s = zeros("d")
        self.replica = zeros("i")
        self.input_length = zeros("q")
        self.output_length = zeros("q")
        self.admit_s = zeros("d")
        self.reuse_tier = zeros("b")
        self.reused_tokens = zeros("q")
        self.hit_hbm = zeros("q")
        self.hit_dram = zeros("q")
        self.hit_disk = zeros("q")
        self.load_s = zeros("d")
        self.first_token_s = zeros("d")
        self.finish_s = array("d", [-1.0]) * n
        self.retries = zeros("q") if cluster_events else array("q")
        self.fixed = fixed is not None
        if self.fixed:
            arrival_s, input_length, output_length = fixed
            self.column("arrival_s")[:] = np.asarray(arrival_s, dtype=np.float64)
            self.column("input_length")[:] = np.asarray(input_length, dtype=np.int64)
            self.column("output_length")[:] = np.maximum(np.asarray(output_length, dtype=np.int64), 1)

    def record(self, job) -> None:
        """Store a finished request's figures (``job``: a :class:`~btb_core.sim.replica.Job`)."""
        req = job.req
        i = req.index
        if not self.fixed:
            self.arrival_s[i] = req.arrival_s
            self.input_length[i] = req.input_length
            self.output_length[i] = req.output_length
        self.replica[i] = job.replica
        self.admit_s[i] = job.admit_s
        self.reuse_tier[i] = _TIER_CODE[job.reuse_tier]
        self.reused_tokens[i] = job.reused_tokens
        self.hit_hbm[i] = job.hit_hbm
        self.hit_dram[i] = job.hit_dram
        self.hit_disk[i] = job.hit_disk
        self.load_s[i] = job.load_s
        self.first_token_s[i] = job.first_token_s
        self.finish_s[i] = job.finish_s
        if self.retries:
            self.retries[i] = job.retries

    def column(self, name: str) -> np.ndarray:
        """One column as a numpy array (a view of the stored values)."""
        a = getattr(self, name)
        return np.frombuffer(a, dtype=a.typecode) if len(a) else np.zeros(0, a.typecode)


def build_result(sim) -> SimResult:
    """Assemble a :class:`SimResult` from a finished :class:`~btb_core.sim.engine.Simulator`."""
    res = sim.results
    n = len(res.finish_s)
    col = res.column
    arrival, admit = col("arrival_s"), col("admit_s")
    first, finish = col("first_token_s"), col("finish_s")
    input_length, reused = col("input_length"), col("reused_tokens")
    # one frame in REQUEST_COLUMNS order, derived columns computed on the arrays
    df = pd.DataFrame({
        "request_id": sim._rows[3].tolist(),
        "arrival_s": arrival.copy(),
        "replica": col("replica").copy(),
        "input_length": input_length.copy(),
        "output_length": col("output_length").copy(),
        "queue_wait_s": admit - arrival,
        "reuse_tier": pd.Categorical.from_codes(col("reuse_tier"), categories=list(_TIERS)),
        "reused_tokens": reused.copy(),
        "hit_hbm_tokens": col("hit_hbm").copy(),
        "hit_dram_tokens": col("hit_dram").copy(),
        "hit_disk_tokens": col("hit_disk").copy(),
        "recomputed_tokens": input_length - reused,
        "load_s": col("load_s").copy(),
        "prefill_s": first - admit,
        "ttft_s": first - arrival,
        "e2e_s": finish - arrival,
        "finish_s": finish.copy(),
    })
    tr = pd.DataFrame(
        [(t.tid, t.src, t.dst, t.num_blocks, t.bytes, t.request_s, t.start_s, t.end_s,
          t.landed_blocks, t.served) for t in sim.transfers],
        columns=["transfer_id", "src", "dst", "blocks", "bytes", "request_s", "start_s", "end_s",
                 "landed_blocks", "served_requests"])
    qs = _columns_frame(sim.queue_samples, ["time_s", "replica", "queue_length"])
    bi = _columns_frame(sim.busy_intervals, ["replica", "start_s", "end_s"])
    # busy seconds per replica, summed in event order
    busy = np.bincount(bi["replica"].to_numpy(), weights=(bi["end_s"] - bi["start_s"]).to_numpy(),
                       minlength=sim.num_replicas)
    metrics = run_metrics(df, tr, sim.cost, busy)
    metrics["events"] = int(sim.events)
    if getattr(sim, "cluster_events", ()):
        df["retries"] = col("retries").copy()
        metrics["retries"] = int(sim.retries)
        metrics["cluster_events"] = len(sim.event_log)
    if getattr(sim, "paged", False):
        pre = np.zeros(n, np.int64)
        for i, k in sim._n_preempt.items():
            pre[i] = k
        df["preemptions"] = pre
        metrics["preemptions"] = int(sim.preemptions)
        metrics["preempted_kv_tokens"] = int(sim.preempted_tokens)
        metrics["preemption_recomputed_tokens"] = int(sim.recomputed_after_preemption)
    plan = getattr(sim, "sessions", None)
    if plan is not None:
        from ..sessions import session_table

        df["session_id"] = plan.session
        df["turn"] = plan.turn
        metrics.update(session_metrics(session_table(df)))
    peaks = {
        "peak_hbm_blocks": max(r.cache.peak_hbm_blocks for r in sim.replicas),
        "peak_dram_blocks": max(r.cache.peak_dram_blocks for r in sim.replicas),
        "hbm_capacity_blocks": sim.capacity_blocks,
    }
    return SimResult(df, metrics, tr, qs, bi, sim.num_replicas, sim.block_tokens, info=peaks)
