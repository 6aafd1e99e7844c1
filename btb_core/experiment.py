"""Replay a Bursted dataset window by window for each policy x setup x scheduler (the study's result).

As in the reference study, every window is replayed on a fresh cluster (empty caches, idle
replicas) with the window's arrivals re-based to 0; optionally all windows also run as one
continuous trace. Results are pooled per (setup, scheduler, policy) over two request sets:

- ``"bursted"``: every request of every window (normal and synthetic);
- ``"normal"``: the requests of normal windows only, the control in which BTB must be inert.

Each row of the results table carries TTFT mean / p50 / p95 / p99, the speedup versus
``cache_aware`` on the same setup, scheduler and dataset, and the cost ledger (RDMA bytes, copies,
copies that served no request, recomputed prefill tokens and GPU-seconds, GPU-seconds saved versus
recomputing every prompt and versus ``cache_aware``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import ConfigError

BASELINE_POLICY = "cache_aware"
LEDGER_SUM = ("rdma_bytes", "rdma_copies", "copies_unused", "recomputed_prefill_tokens",
              "recomputed_prefill_gpu_s", "prefill_gpu_s_saved", "prompt_tokens")


def repeated(names) -> list:
    """The names that occur more than once in ``names``, sorted (``[]`` when none does)."""
    names = list(names)
    return sorted({n for n in names if names.count(n) > 1})


def check_names(policies=(), setups=(), schedulers=(), where: str = "") -> None:
    """Raise ConfigError naming the first unknown policy, setup or scheduler (and the valid ones),
    or the ones given more than once (each would be replayed again, with the same result)."""
    from .routers import POLICIES
    from .sim import SCHEDULERS
    from .cost import REFERENCE_SETUP
    from .specs import SETUPS

    for kind, names, valid in (("policy", policies, sorted(POLICIES)),
                               ("setup", setups, sorted([*SETUPS, REFERENCE_SETUP])),
                               ("scheduler", schedulers, list(SCHEDULERS))):
        for name in names:
            if name not in valid:
                raise ConfigError(f"{where}unknown {kind} {name!r}; choose from {', '.join(valid)}")
        twice = repeated(names)
        if twice:
            raise ConfigError(f"{where}{kind} {', '.join(twice)} given more than once (each would be "
                              f"replayed again, with the same result)")


# ------------------------------------------------------------------ windows
def window_kind(window) -> str:
    """``"synthetic"`` if any row of the window comes from a synthetic job or decoy, else ``"normal"``.

    Uses a ``window_kind`` column when present, else the ``metadata`` field ``window_kind``,
    else ``source`` values (``"synthetic"``, ``"job"``, ``"decoy"``, ``"burst"`` mark synthetic rows).
    """
    tab = window.table
    if "window_kind" in tab.columns:
        return str(tab["window_kind"].iloc[0])
    if "metadata" in tab.columns and len(tab):
        meta = tab["metadata"].iloc[0]
        if isinstance(meta, str):
            try:
                meta = json.loads(meta)
            except ValueError:
                meta = None
        if isinstance(meta, dict) and "window_kind" in meta:
            return str(meta["window_kind"])
    if "source" in tab.columns:
        src = tab["source"].astype(str).str.lower()
        if src.str.contains("synthetic|job|decoy|burst").any():
            return "synthetic"
    return "normal"


@lru_cache(maxsize=4)
def _split_windows(dataset: str, split: str | None, files_signature: tuple):
    """The split's :class:`~btb_core.trace.stream.SplitWindows` (cached per process and per
    state of the dataset's files: ``files_signature``)."""
    from .trace.stream import SplitWindows

    return SplitWindows(dataset, split)


def _files_signature(dataset: str) -> tuple:
    """``(name, size, mtime_ns)`` of every file in the dataset directory (recursively): a dataset
    rebuilt in place (``btb synth --overwrite``) while a process (a notebook kernel) is running gets
    a new signature, so its windows are read again instead of served from the cache."""
    out = []
    for f in sorted(Path(dataset).rglob("*")):
        if f.is_file():
            st = f.stat()
            out.append((str(f.relative_to(dataset)), st.st_size, st.st_mtime_ns))
    return tuple(out)


def split_windows(dataset, split: str | None = "test"):
    """The windows of a Bursted dataset split, read one at a time
    (:class:`btb_core.trace.stream.SplitWindows`: ids, kinds, rows per window at rest; a window's
    trace on demand). Scanned once per process and per state of the dataset's files (cached; a
    dataset rewritten in place is scanned again)."""
    key = _dataset_key(dataset)
    return _split_windows(key, split, _files_signature(key))


def _dataset_key(dataset) -> str:
    path = Path(dataset)
    if not path.exists():
        raise FileNotFoundError(f"{dataset}: no such Bursted dataset directory")
    if not path.is_dir():
        raise ConfigError(f"{dataset}: expected a Bursted dataset directory (the output of `btb synth`), "
                          f"got a file")
    return str(path.resolve())


def _check_max_windows(max_windows) -> None:
    if max_windows is not None and (isinstance(max_windows, bool) or not isinstance(max_windows, int)
                                    or max_windows < 1):
        raise ConfigError(f"max_windows = {max_windows!r}: must be an integer >= 1, or None for every window")


def load_windows(dataset, split: str | None = "test", max_windows: int | None = None):
    """Windows of a Bursted dataset split, as ``(window_id, kind, Trace)`` in dataset order.

    Each window's arrivals start at 0. Every returned window is held in memory: a replay that
    needs one window at a time uses :func:`split_windows` (as :func:`run_experiment` does).
    """
    _check_max_windows(max_windows)
    src = split_windows(dataset, split)
    n = len(src) if max_windows is None else min(max_windows, len(src))
    if not n:
        raise ConfigError(f"{dataset}: split {split!r} has no windows")
    return [(src.ids[k], src.kinds[k], src.window(k)) for k in range(n)]


_LAST_WINDOW: list = [None]   # (SplitWindows, index, Trace): the window this process replays now


def _window(src, k: int):
    """Window ``k`` of ``src``, kept while consecutive cells replay it (one window per process)."""
    last = _LAST_WINDOW[0]
    if last is not None and last[0] is src and last[1] == k:
        return last[2]
    _LAST_WINDOW[0] = None          # drop the previous window before reading the next
    tr = src.window(k)
    _LAST_WINDOW[0] = (src, k, tr)
    return tr


def window_by_id(dataset, split: str | None, window_id: str):
    """``(kind, Trace)`` of one window (for workers that replay a single cell)."""
    src = split_windows(dataset, split)
    k = src.ids.index(window_id)
    return src.kinds[k], _window(src, k)


# ------------------------------------------------------------------ one cell
@dataclass(frozen=True)
class Cell:
    """One replay: a policy with parameters on one setup x scheduler x replica count x window."""

    setup: str
    scheduler: str
    policy: str
    window: str
    replicas: int = 4
    params: tuple = ()          # sorted (name, value) pairs
    seed: int = 0
    label: str = ""             # policy label in results (default: policy name)
    attention: bool = True      # False = the published linear cost model (no attention FLOPs)

    def key(self) -> str:
        """A stable string id (for resumable sweeps)."""
        p = ",".join(f"{k}={v}" for k, v in self.params)
        lin = "" if self.attention else "|linear"
        return f"{self.setup}|{self.scheduler}|{self.replicas}|{self.policy}[{p}]|{self.window}|{self.seed}{lin}"


def run_cell(cell: Cell, window_trace, with_requests: bool = True) -> dict:
    """Replay ``window_trace`` for ``cell``; returns metrics (and the per-request table)."""
    from .routers import make_router
    from .sim import ClusterConfig, simulate

    cluster = ClusterConfig.from_setup(cell.setup, num_replicas=cell.replicas, scheduler=cell.scheduler,
                                       attention=cell.attention)
    router = make_router(cell.policy, **dict(cell.params))
    res = simulate(window_trace, router, cluster, seed=cell.seed, progress=False)
    out = {"metrics": res.metrics}
    if with_requests:
        req = res.requests[["request_id", "arrival_s", "replica", "reuse_tier", "reused_tokens",
                            "queue_wait_s", "ttft_s", "e2e_s"]].copy()
        req["row_kind"] = _window_row_kinds(window_trace).copy()
        out["requests"] = req
    return out


_LAST_KINDS: list = [None]   # (weak reference to a Trace, its row kinds)


def _window_row_kinds(window) -> np.ndarray:
    """:func:`row_kinds` of ``window``, parsed once for all the cells replayed on it in a row
    (parsing every row's metadata JSON took ~50 ms per 4,120-row window, ~10% of a cell). Holds
    the window weakly, so a replay still holds one window at a time."""
    import weakref

    last = _LAST_KINDS[0]
    if last is not None and last[0]() is window:
        return last[1]
    _LAST_KINDS[0] = None
    kinds = row_kinds(window)
    _LAST_KINDS[0] = (weakref.ref(window), kinds)
    return kinds


def row_kinds(window) -> np.ndarray:
    """Per-row kind from the Bursted ``metadata`` JSON (``base``, ``background``, ``job``,
    ``decoy``...), in trace order; ``"unknown"`` where a row has none."""
    from .synth import row_kinds as kinds

    tab = window.table
    if "metadata" not in tab.columns:
        return np.full(len(tab), "unknown", dtype=object)
    return kinds(tab).to_numpy(dtype=object)


def background_control(result: "ExperimentResult") -> pd.DataFrame:
    """TTFT of the *background* rows of synthetic windows (base traffic sharing the cluster with
    the bursts), per setup x scheduler x policy, with the change vs ``cache_aware``.

    This is the control that can show harm: BTB's copies and warm routing share NICs and replicas
    with this traffic. Needs a dataset built with ``background_rows > 0``.
    """
    req = result.requests
    bg = req[(req["kind"] == "synthetic") & (req["row_kind"] == "background")]
    if bg.empty:
        raise ConfigError("no background rows in synthetic windows: build the dataset with "
                          "background_rows > 0 (btb synth --background-rows N)")
    rows = []
    for (setup, sched, pol), g in bg.groupby(["setup", "scheduler", "policy"], sort=False):
        t = g["ttft_s"].to_numpy()
        rows.append({"setup": setup, "scheduler": sched, "policy": pol, "requests": len(t),
                     "ttft_mean_s": float(t.mean()), "ttft_p95_s": float(np.percentile(t, 95))})
    out = pd.DataFrame(rows)
    base = out[out.policy == BASELINE_POLICY].set_index(["setup", "scheduler"])["ttft_mean_s"]
    out["ttft_mean_change_vs_cache_aware"] = [
        r.ttft_mean_s / base.get((r.setup, r.scheduler), np.nan) - 1 for r in out.itertuples()]
    return out


# ------------------------------------------------------------------ the experiment
@dataclass
class ExperimentResult:
    """Pooled results (``results``), per-window metrics (``windows``) and per-request TTFTs
    (``requests``: setup, scheduler, policy, window, kind, request_id, arrival_s, replica,
    ttft_s, ...)."""

    results: pd.DataFrame
    windows: pd.DataFrame
    requests: pd.DataFrame
    info: dict = field(default_factory=dict)


def pool(requests: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Pool per-request TTFTs and per-window ledgers into the results table (see module docstring)."""
    rows = []
    keys = ["setup", "scheduler", "policy"]
    for (setup, sched, pol), req in requests.groupby(keys, sort=False, observed=True):
        win = windows[(windows.setup == setup) & (windows.scheduler == sched) & (windows.policy == pol)]
        for dataset, kinds in (("bursted", None), ("normal", ("normal",))):
            r = req if kinds is None else req[req["kind"].isin(kinds)]
            w = win if kinds is None else win[win["kind"].isin(kinds)]
            if not len(r):
                continue
            t = r["ttft_s"].to_numpy()
            p50, p95, p99 = np.percentile(t, [50, 95, 99])
            row = {"setup": setup, "scheduler": sched, "policy": pol, "dataset": dataset,
                   "windows": int(len(w)), "requests": int(len(r)),
                   "ttft_mean_s": float(t.mean()), "ttft_p50_s": float(p50),
                   "ttft_p95_s": float(p95), "ttft_p99_s": float(p99)}
            for k in LEDGER_SUM:
                row[k] = float(w[k].sum()) if k in w else 0.0
            rows.append(row)
    res = pd.DataFrame(rows)
    if res.empty:
        return res
    base = res[res.policy == BASELINE_POLICY].set_index(["setup", "scheduler", "dataset"])
    speed, change, saved = [], [], []
    for _, row in res.iterrows():
        k = (row.setup, row.scheduler, row.dataset)
        if k in base.index:
            b = base.loc[k]
            speed.append(b["ttft_mean_s"] / row.ttft_mean_s if row.ttft_mean_s > 0 else math.nan)
            change.append(row.ttft_mean_s / b["ttft_mean_s"] - 1.0 if b["ttft_mean_s"] > 0 else math.nan)
            saved.append(b["recomputed_prefill_gpu_s"] - row.recomputed_prefill_gpu_s)
        else:
            speed.append(math.nan)
            change.append(math.nan)
            saved.append(math.nan)
    res["speedup_vs_cache_aware"] = speed
    res["ttft_mean_change_vs_cache_aware"] = change
    res["gpu_s_saved_vs_cache_aware"] = saved
    for k in ("rdma_bytes", "rdma_copies", "copies_unused", "recomputed_prefill_tokens", "prompt_tokens"):
        res[k] = res[k].astype(np.int64)
    return res


_WORKER_SRC: list = [None]


def _init_worker(src) -> None:
    import gc

    _WORKER_SRC[0] = src
    gc.freeze()


def _cell_task(args):
    """Worker entry point (process pool): replay one cell on window ``k`` of the split."""
    j, cell, k = args
    return j, _run_and_collect(cell, _window(_WORKER_SRC[0], k))


def _run_and_collect(cell: Cell, trace) -> dict:
    """:func:`run_cell`, then free the finished run at once.

    A run leaves its simulator, router and per-request records in reference cycles (the
    simulator and the view routers see point at each other) that only Python's cyclic collector
    frees, and by then they sit in its oldest generation, collected rarely: ~2 MB per window of
    the default test split piled up over a 60-cell replay (+140 MB). Callers freeze the objects
    that existed before the cells (``gc.freeze``), so this collection walks only what the cells
    made (~40 ms after a 4,120-request window; ~130 ms without the freeze).
    """
    import gc

    out = run_cell(cell, trace)
    gc.collect()
    return out


#: Below this many replayed requests (cells x window rows) the default is serial: a small replay
#: takes a few seconds, and starting workers and shipping results back would be most of it.
POOL_MIN_REQUESTS = 20_000


def default_workers() -> int:
    """Worker processes by default: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:          # not Linux
        return max(1, os.cpu_count() or 1)


def run_experiment(dataset, split: str = "test", policies=("cache_aware", "btb"),
                   setups=("70b_h100x4",), schedulers=("chunked",), replicas: int = 4,
                   seed: int = 0, router_params: dict | None = None, max_windows: int | None = None,
                   continuous: bool = False, workers: int | None = None, progress: bool | None = None,
                   attention: bool = True) -> ExperimentResult:
    """Replay every window of ``dataset[split]`` for each setup x scheduler x policy.

    Windows are read from the dataset one at a time (:func:`split_windows`) and every cell of a
    window is replayed before the next window is read, so a replay holds one window (per worker),
    not the split. Results do not depend on ``workers``: tables are assembled in the order
    setup x scheduler x policy x window whatever order the cells finished in.

    Parameters
    ----------
    dataset : path
        A Bursted dataset directory (``btb synth`` output).
    split : str
        Split name (``"test"`` for the study, ``"train"`` for tuning).
    policies, setups, schedulers : sequences of str
        Names from :data:`btb_core.routers.POLICIES`, :data:`btb_core.specs.SETUPS` and
        ``("prefill_first", "chunked")``.
    replicas : int
        Replicas per cluster (4 as in the reference study).
    router_params : dict, optional
        Policy name -> constructor keyword arguments.
    max_windows : int, optional
        Replay only the first N windows of the split.
    continuous : bool
        Also replay all windows back to back as one run: one row of run metrics per setup,
        scheduler and policy in ``info["continuous"]``.
    workers : int, optional
        Worker processes (a process pool over cells; 1 = serial in this process). Default: the
        cores available (:func:`default_workers`), or serial when the replay is small (fewer than
        :data:`POOL_MIN_REQUESTS` replayed requests) or has a single cell.
    progress : bool, optional
        One progress bar per setup (cells done); None = on a terminal or in Jupyter
        (:func:`btb_core.progress.progress_bar`).
    attention : bool
        ``False`` replays with the published linear cost model (no causal attention FLOPs), as the
        reference study did.

    Returns
    -------
    ExperimentResult

    Raises
    ------
    ConfigError
        Unknown policy, setup or scheduler, ``workers`` < 1, or an empty split.
    """
    check_names(policies=policies, setups=setups, schedulers=schedulers)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers = {workers!r}: must be an integer >= 1 (1 = serial), or None for "
                          f"the available cores")
    router_params = router_params or {}
    _check_max_windows(max_windows)
    src = split_windows(dataset, split)
    nwin = len(src) if max_windows is None else min(max_windows, len(src))
    if not nwin:
        raise ConfigError(f"{dataset}: split {split!r} has no windows")
    wids = src.ids[:nwin]
    index = {wid: k for k, wid in enumerate(wids)}
    kinds = dict(zip(wids, src.kinds))
    cells = [Cell(s, sch, p, wid, replicas, tuple(sorted(router_params.get(p, {}).items())), seed,
                  attention=attention)
             for s in setups for sch in schedulers for p in policies for wid in wids]
    results: list = [None] * len(cells)
    cache = _cache_lookup(dataset, split, cells, results)
    # window-major; cells found in the replay cache are not replayed
    order = sorted((j for j in range(len(cells)) if results[j] is None),
                   key=lambda j: (index[cells[j].window], j))
    if workers is None:
        rows = dict(zip(wids, src.rows[:nwin]))
        requests = sum(rows[cells[j].window] for j in order)
        n_workers = default_workers() if requests >= POOL_MIN_REQUESTS else 1
    else:
        n_workers = workers
    n_workers = max(1, min(n_workers, len(order)))
    bars = _bars(cells, setups, progress)
    if bars:
        for j, out in enumerate(results):
            if out is not None:
                bars[cells[j].setup].update(1)
    import gc

    gc.collect()
    gc.freeze()     # see _run_and_collect
    try:
        if n_workers > 1:
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(max_workers=n_workers, initializer=_init_worker,
                                     initargs=(src,)) as ex:
                futures = [ex.submit(_cell_task, (j, cells[j], index[cells[j].window])) for j in order]
                for fut in as_completed(futures):
                    j, out = fut.result()
                    results[j] = out
                    _cache_store(cache, j, out)
                    if bars:
                        bars[cells[j].setup].update(1)
        else:
            for j in order:
                results[j] = _run_and_collect(cells[j], _window(src, index[cells[j].window]))
                _cache_store(cache, j, results[j])
                if bars:
                    bars[cells[j].setup].update(1)
            _LAST_WINDOW[0] = None
            _LAST_KINDS[0] = None
    finally:
        gc.unfreeze()
        for bar in bars.values():
            bar.close()
    windows_df, requests_df = _assemble(cells, results, kinds)
    result = ExperimentResult(pool(requests_df, windows_df), windows_df, requests_df,
                              info={"dataset": str(dataset), "split": split, "replicas": replicas,
                                    "seed": seed, "windows": nwin, "attention": attention})
    if cache is not None:       # every cell is in the cache now: a notebook waiting for them may start
        from . import replay_cache

        replay_cache.note_experiment_done(cache[0])
    if continuous:
        result.info["continuous"] = _continuous(src, nwin, policies, setups, schedulers, replicas,
                                                seed, router_params, attention)
    return result


def _assemble(cells, results, kinds) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per-window table and the per-request table of a replay, in cell order.

    The per-request table is the cells' request frames concatenated, with the cell's ``setup``,
    ``scheduler``, ``policy``, ``window`` and ``kind`` as its first columns. Those are built once
    for the whole table (each value repeated over its cell's rows) rather than inserted into every
    cell's frame and concatenated (five inserts per cell were ~1.6 ms, 3 s of a 2,100-cell
    replay): the same table, value for value and dtype for dtype.
    """
    win_rows, req_frames = [], []
    for cell, out in zip(cells, results):
        win_rows.append({"setup": cell.setup, "scheduler": cell.scheduler, "policy": cell.policy,
                         "window": cell.window, "kind": kinds[cell.window], **out["metrics"]})
        req_frames.append(out["requests"])
    windows_df = pd.DataFrame(win_rows)
    lens = np.fromiter((len(r) for r in req_frames), dtype=np.int64, count=len(req_frames))
    requests_df = pd.concat(req_frames, ignore_index=True)
    del req_frames
    for name in ("kind", "window", "policy", "scheduler", "setup"):
        per_cell = [kinds[c.window] for c in cells] if name == "kind" else [getattr(c, name) for c in cells]
        requests_df.insert(0, name, _repeat_strings(per_cell, lens))
    return windows_df, requests_df


def _repeat_strings(per_cell: list, lens: np.ndarray):
    """``per_cell[c]`` repeated ``lens[c]`` times, as the column pandas makes of those strings
    (its default ``str`` dtype). With Arrow-backed strings the column is one Arrow ``take`` of
    the distinct values (converting a million Python strings one by one took ~0.15 s)."""
    dtype = pd.Series(np.array(["x"], dtype=object)).dtype
    if getattr(dtype, "storage", None) == "pyarrow":
        import pyarrow as pa

        uniq = list(dict.fromkeys(per_cell))
        code = {v: k for k, v in enumerate(uniq)}
        idx = np.repeat(np.array([code[v] for v in per_cell], dtype=np.int64), lens)
        return pd.array(pa.array(uniq, type=pa.large_string()).take(pa.array(idx)), dtype=dtype)
    return np.repeat(np.array(per_cell, dtype=object), lens)


def _cache_lookup(dataset, split, cells, results) -> tuple | None:
    """Fill ``results[j]`` for every cell found in the replay cache (:mod:`btb_core.replay_cache`,
    on when ``$BTB_REPLAY_CACHE`` is set); returns ``(directory, keys)`` for storing the others,
    or None when the cache is off. Prints one line saying how many cells were reused."""
    import sys

    from . import replay_cache

    directory = replay_cache.cache_dir()
    if directory is None:
        return None
    digest = replay_cache.dataset_digest(dataset)
    keys = [replay_cache.cell_key(c, split, digest) for c in cells]
    for j, key in enumerate(keys):
        results[j] = replay_cache.load(directory, key)
    hits = sum(r is not None for r in results)
    if hits:
        print(f"[btb] replay cache: {hits} of {len(cells)} cells already replayed in this run, "
              f"reused", file=sys.stderr, flush=True)
    return directory, keys


def _cache_store(cache, j: int, out: dict) -> None:
    """Store cell ``j``'s fresh output (before the caller adds its own columns)."""
    if cache is not None:
        from . import replay_cache

        replay_cache.store(cache[0], cache[1][j], out)


def _continuous(src, nwin, policies, setups, schedulers, replicas, seed, router_params, attention=True):
    """The first ``nwin`` windows of ``src`` back to back (30 s apart) as one run; returns a
    metrics table. The windows' rows are concatenated as numpy arrays (ids as views)."""
    from .routers import make_router
    from .sim import ClusterConfig, simulate
    from .trace import make_trace

    a, i, o, h = [], [], [], []
    offset = 0.0
    block = None
    for k in range(nwin):
        w = src.window(k)
        block = w.block_tokens
        t = w.table
        a.append(t["arrival_s"].to_numpy() + offset)
        i.append(t["input_length"].to_numpy())
        o.append(t["output_length"].to_numpy())
        h.extend(w.row_hash_ids(r) for r in range(len(w)))
        offset = float(a[-1][-1]) + 30.0
    trace = make_trace(np.concatenate(a), np.concatenate(i), np.concatenate(o), h,
                       block_tokens=block, name="continuous")
    del a, i, o, h
    rows = []
    for s in setups:
        for sch in schedulers:
            for p in policies:
                cl = ClusterConfig.from_setup(s, num_replicas=replicas, scheduler=sch, attention=attention)
                res = simulate(trace, make_router(p, **router_params.get(p, {})), cl, seed=seed)
                rows.append({"setup": s, "scheduler": sch, "policy": p, **res.metrics})
    return pd.DataFrame(rows)


def _bars(cells, setups, progress) -> dict:
    """One progress bar per setup (its cells), or {} when progress is off."""
    from .progress import progress_bar

    bars = {}
    for s in setups:
        bar = progress_bar(sum(c.setup == s for c in cells), f"replaying {s}", "cell", progress)
        if bar is None:
            return {}
        bars[s] = bar
    return bars


# ------------------------------------------------------------------ datasets for notebooks
def ensure_dataset(preset: str = "quick", seed: int = 0, out_dir=None, **overrides) -> Path:
    """A Bursted dataset built from the shipped Mooncake trace, reused if already built.

    Builds ``btb_core.synth`` preset ``preset`` (with field ``overrides``) at ``seed`` into
    ``out_dir`` (default ``<repo>/build/datasets/bursted-<preset>[-<overrides>]-seed<seed>``) unless
    a dataset with the same manifest parameters is already there. Returns the directory.

    Processes that ask for the same default directory at once (notebooks run side by side by
    ``make reproduce``) build it once: the others wait on a lock file beside it in
    ``build/datasets/`` (``.<name>.lock``) and then find it built.
    """
    import contextlib
    import fcntl

    from . import synth
    from .fileio import ensure_dir
    from .paths import REPO_ROOT

    tag = "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
    out = Path(out_dir) if out_dir else REPO_ROOT / "build" / "datasets" / f"bursted-{preset}{tag}-seed{seed}"
    manifest = out / "manifest.json"
    if manifest.exists():
        return out
    if out_dir:
        lock = contextlib.nullcontext()
    else:
        ensure_dir(out.parent)
        lock = open(out.parent / f".{out.name}.lock", "a")
    with lock:
        if not out_dir:
            fcntl.flock(lock, fcntl.LOCK_EX)     # released when the file is closed
        if not manifest.exists():
            cfg = synth.preset(preset, **overrides)
            ds = synth.build(None, cfg, seed=seed, preset_name=preset)
            synth.write(ds, out, overwrite=True)
    return out


def reading(results: pd.DataFrame) -> list[str]:
    """Plain-language sentences on where BTB helps, from a results table (one per setup x scheduler)."""
    out = []
    for (setup, sched), g in results.groupby(["setup", "scheduler"], sort=False):
        g = g.set_index(["policy", "dataset"])
        if ("btb", "bursted") not in g.index or ("cache_aware", "bursted") not in g.index:
            continue
        b, c = g.loc[("btb", "bursted")], g.loc[("cache_aware", "bursted")]
        bursted = g.xs("bursted", level="dataset")
        best = bursted["ttft_mean_s"].idxmin()
        s = (f"{setup} / {sched}: BTB mean TTFT {b.ttft_mean_s:.3f} s vs cache_aware {c.ttft_mean_s:.3f} s "
             f"({100 * (b.ttft_mean_s / c.ttft_mean_s - 1):+.1f}%), p95 {b.ttft_p95_s:.2f} vs {c.ttft_p95_s:.2f} s; "
             f"{int(b.rdma_copies)} copies ({int(b.copies_unused)} unused, {b.rdma_bytes / 1e9:.0f} GB)")
        if ("btb", "normal") in g.index:
            n, cn = g.loc[("btb", "normal")], g.loc[("cache_aware", "normal")]
            s += f"; control (normal windows) {100 * (n.ttft_mean_s / cn.ttft_mean_s - 1):+.1f}%"
        if best != "btb":
            s += f". Best policy here: {best} ({bursted.loc[best, 'ttft_mean_s']:.3f} s)"
        out.append(s + ".")
    return out


#: The reference study's published result (Llama-3.3-70B on 4x H100, Bursted-ART test split, SGLang
#: ``cache_aware`` vs BTB; linear cost model, prefill-first scheduling), as given in the issue tracker
#: (issue 7) and DESIGN.md section 1.
REFERENCE_STUDY = {"cache_aware_ttft_mean_s": 1.373, "btb_ttft_mean_s": 0.632,
                   "cache_aware_ttft_p95_s": 4.697, "btb_ttft_p95_s": 4.697, "control_change": 0.009}


def compare_with_reference(runs: dict[str, pd.DataFrame], setup: str = "70b_h100x4") -> pd.DataFrame:
    """Side-by-side of BTB vs cache_aware: the published numbers and each of ``runs``.

    ``runs`` maps a label (e.g. ``"linear cost model"``) to a results table of
    :func:`run_experiment`. One row per (label, scheduler).
    """
    ref = REFERENCE_STUDY
    rows = [{"run": "reference study (published)", "scheduler": "prefill_first",
             "cache_aware_mean_s": ref["cache_aware_ttft_mean_s"], "btb_mean_s": ref["btb_ttft_mean_s"],
             "btb_change": ref["btb_ttft_mean_s"] / ref["cache_aware_ttft_mean_s"] - 1,
             "cache_aware_p95_s": ref["cache_aware_ttft_p95_s"], "btb_p95_s": ref["btb_ttft_p95_s"],
             "control_change": ref["control_change"]}]
    for label, res in runs.items():
        r = res[res.setup == setup].set_index(["scheduler", "policy", "dataset"])
        for sched in dict.fromkeys(res.loc[res.setup == setup, "scheduler"]):
            c, b = r.loc[(sched, "cache_aware", "bursted")], r.loc[(sched, "btb", "bursted")]
            ctrl = (r.loc[(sched, "btb", "normal"), "ttft_mean_s"] / r.loc[(sched, "cache_aware", "normal"), "ttft_mean_s"] - 1
                    if (sched, "btb", "normal") in r.index else float("nan"))
            rows.append({"run": label, "scheduler": sched, "cache_aware_mean_s": c.ttft_mean_s,
                         "btb_mean_s": b.ttft_mean_s, "btb_change": b.ttft_mean_s / c.ttft_mean_s - 1,
                         "cache_aware_p95_s": c.ttft_p95_s, "btb_p95_s": b.ttft_p95_s,
                         "control_change": ctrl})
    return pd.DataFrame(rows)
