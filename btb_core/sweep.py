"""Parameter sweeps: policy parameters x setups x schedulers x windows, resumable, on any executor.

A grid (YAML or JSON file, or a dict) names a Bursted dataset split and the axes::

    dataset: build/bursted          # a `btb synth` output directory (relative to the grid file)
    split: train
    max_windows: 6                  # optional: the first N windows
    setups: [70b_h100x4]
    schedulers: [chunked]
    replicas: [4]
    seed: 0
    policies:
      cache_aware: {}               # the baseline for speedups
      btb:                          # each list is an axis; scalars are fixed values
        x_repeats: [2, 3, 4]
        z_s: [0.5, 1.0, 2.0]
        m_replicas: 4
    out: build/sweeps/btb_xz        # results: a parquet dataset directory

Every cell (one policy-parameter combination on one setup x scheduler x replica count x window)
is one simulation. Each finished cell is written at once as its own part file
``out/cell-<hash>.parquet`` (temporary file + rename), so the directory is always a valid parquet
dataset (``pandas.read_parquet(out)``; the sweep's own ``_grid.json`` is skipped by parquet readers)
and an interrupted sweep, rerun, skips the cells already done.

Executors: ``serial`` (this process), ``processes`` (a local process pool), ``dask`` (a
``dask.distributed`` cluster: an existing scheduler address, or a ``LocalCluster`` of ``workers``
processes). Workers load the dataset themselves (cached per process), so only cell descriptions and
small metric rows cross the wire. Results do not depend on the executor.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import ConfigError
from .fileio import atomic_write_bytes, dir_lock, ensure_dir, jsonable
from .experiment import BASELINE_POLICY, Cell, check_names, run_cell, split_windows, window_by_id

#: Fields a grid file may have.
GRID_KEYS = frozenset({"dataset", "split", "max_windows", "setups", "schedulers", "replicas", "seed",
                       "policies", "out"})

#: Metric columns stored per cell (see :func:`btb_core.sim.metrics.run_metrics`).
CELL_METRICS = ("requests", "ttft_mean_s", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "hit_fraction",
                "rdma_bytes", "rdma_copies", "copies_unused", "recomputed_prefill_tokens",
                "recomputed_prefill_gpu_s", "prefill_gpu_s_saved", "makespan_s")


@dataclass(frozen=True)
class Grid:
    """A parsed sweep grid (see the module docstring for the file format)."""

    dataset: str
    split: str
    setups: tuple
    schedulers: tuple
    replicas: tuple
    policies: tuple          # ((policy, ((name, value), ...)), ...) expanded combinations
    seed: int
    max_windows: int | None
    out: str

    @classmethod
    def from_dict(cls, spec: dict, base_dir: Path | None = None, out: str | None = None) -> "Grid":
        base_dir = Path(base_dir) if base_dir else Path.cwd()
        if not isinstance(spec, dict):
            raise ConfigError(f"grid must be a mapping, got {type(spec).__name__}")
        unknown = sorted(set(spec) - GRID_KEYS)
        if unknown:
            raise ConfigError(f"grid: unknown field {unknown[0]!r}; valid fields: {', '.join(sorted(GRID_KEYS))}")
        if "dataset" not in spec:
            raise ConfigError("grid: missing field 'dataset' (a `btb synth` output directory)")
        from .routers import policy_class, router_params

        policies = []
        pol_spec = spec.get("policies") or {"cache_aware": {}, "btb": {}}
        if not isinstance(pol_spec, dict):
            raise ConfigError("grid: 'policies' must map policy names to parameter axes")
        for name, axes in pol_spec.items():
            check_names(policies=[name], where="grid: ")
            axes = axes or {}
            valid = {p.name for p in router_params(policy_class(name))}
            for k in axes:
                if k not in valid:
                    raise ConfigError(f"grid: policy {name!r} has no parameter {k!r}; valid: {sorted(valid)}")
            keys = sorted(axes)
            values = [v if isinstance(v, list) else [v] for v in (axes[k] for k in keys)]
            for k, v in zip(keys, values):
                if not v:
                    raise ConfigError(f"grid: policy {name!r} parameter {k!r} has an empty list of values")
            for combo in itertools.product(*values):
                params = tuple(zip(keys, combo))
                try:  # every value checked here, not on a worker mid-sweep
                    policy_class(name)(**dict(params))
                except ConfigError as exc:
                    raise ConfigError(f"grid: policy {name!r}: {exc}") from None
                except (TypeError, ValueError, OverflowError) as exc:
                    raise ConfigError(f"grid: policy {name!r} parameters {dict(params)}: "
                                      f"{type(exc).__name__}: {exc}") from None
                policies.append((name, params))

        def tup(key, default):
            v = spec.get(key, default)
            v = tuple(v if isinstance(v, list) else [v])
            if not v:
                raise ConfigError(f"grid: field {key!r} is an empty list")
            return v

        def integer(key, value, lo):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ConfigError(f"grid: field {key!r} = {value!r}: must be an integer >= {lo}")
            return value

        setups, schedulers = tup("setups", "70b_h100x4"), tup("schedulers", "chunked")
        check_names(setups=setups, schedulers=schedulers, where="grid: ")
        replicas = tuple(integer("replicas", r, 1) for r in tup("replicas", 4))
        seed = integer("seed", spec.get("seed", 0), 0)
        max_windows = spec.get("max_windows")
        if max_windows is not None:
            max_windows = integer("max_windows", max_windows, 1)

        dataset = Path(spec["dataset"])
        if not dataset.is_absolute():
            dataset = Path(os.path.normpath(base_dir / dataset))  # examples/../build -> build
        if out is not None:  # given on the command line: relative to the current directory
            out_path = Path(out).resolve()
        else:                # from the grid file: relative to the grid file
            out_path = Path(spec.get("out") or "build/sweeps/results")
            if not out_path.is_absolute():
                out_path = Path(os.path.normpath(base_dir / out_path))
        return cls(str(dataset), str(spec.get("split", "train")), setups, schedulers, replicas,
                   tuple(policies), seed, max_windows, str(out_path))

    @classmethod
    def from_file(cls, path, out: str | None = None) -> "Grid":
        import yaml

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: grid file not found")
        try:
            spec = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"{path}{where}: not valid YAML/JSON ({problem})") from None
        return cls.from_dict(spec, base_dir=path.parent, out=out)

    def cells(self) -> list[Cell]:
        src = split_windows(self.dataset, self.split)    # window ids only: no trace is built
        n = len(src) if self.max_windows is None else min(self.max_windows, len(src))
        if not n:
            raise ConfigError(f"{self.dataset}: split {self.split!r} has no windows")
        return [Cell(s, sch, pol, wid, r, params, self.seed)
                for s in self.setups for sch in self.schedulers for r in self.replicas
                for pol, params in self.policies for wid in src.ids[:n]]


def cell_id(cell: Cell) -> str:
    return hashlib.sha1(cell.key().encode()).hexdigest()[:16]


def _sweep_job(args):
    cell, dataset, split = args
    kind, tr = window_by_id(dataset, split, cell.window)
    m = run_cell(cell, tr, with_requests=False)["metrics"]
    row = {"cell": cell_id(cell), "key": cell.key(), "setup": cell.setup, "scheduler": cell.scheduler,
           "replicas": cell.replicas, "policy": cell.policy,
           "params": json.dumps(dict(cell.params), sort_keys=True), "window": cell.window,
           "kind": kind, "seed": cell.seed}
    for k, v in cell.params:
        row[f"param_{k}"] = v
    for k in CELL_METRICS:
        row[k] = m[k]
    return row


def _write_part(out: Path, row: dict) -> None:
    atomic_write_bytes(out / f"cell-{row['cell']}.parquet", pd.DataFrame([row]).to_parquet(index=False))


def _whole_parquet(path: Path) -> bool:
    """True if ``path`` starts and ends with the parquet magic ``PAR1`` (a cell file cut short,
    e.g. 0 bytes after a crash or a full disk, is not a finished cell)."""
    try:
        size = path.stat().st_size
        if size < 12:
            return False
        with open(path, "rb") as fh:
            head = fh.read(4)
            fh.seek(-4, 2)
            return head == b"PAR1" and fh.read(4) == b"PAR1"
    except OSError:
        return False


def _cell_files(out: Path) -> list[Path]:
    return sorted(p for p in Path(out).glob("cell-*.parquet") if _whole_parquet(p))


def done_cells(out) -> set[str]:
    """Ids of the cells with a whole result file in ``out`` (a truncated file does not count)."""
    out = Path(out)
    if not out.exists():
        return set()
    return {p.stem[len("cell-"):] for p in _cell_files(out)}


def read_results(out, cells=None) -> pd.DataFrame:
    """Finished cells of a sweep directory, sorted by key (empty DataFrame if none).

    ``cells`` (a list of :class:`~btb_core.experiment.Cell`, e.g. ``grid.cells()``) keeps only
    those cells: a directory may also hold cells of earlier grids on the same dataset."""
    parts = _cell_files(Path(out))
    if cells is not None:
        want = {cell_id(c) for c in cells}
        parts = [p for p in parts if p.stem[len("cell-"):] in want]
    if not parts:
        return pd.DataFrame()
    df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    return df.sort_values("key", kind="stable").reset_index(drop=True)


def run_sweep(grid: Grid, executor: str = "serial", workers: int = 2,
              scheduler_address: str | None = None, progress: bool | None = None,
              limit: int | None = None) -> pd.DataFrame:
    """Run every unfinished cell of ``grid``; returns its results (finished before + now; cells
    of other grids kept in the same directory are left out).

    Parameters
    ----------
    grid : Grid
    executor : {"serial", "processes", "dask"}
    workers : int
        Processes for ``processes``, or for a ``LocalCluster`` when ``dask`` has no address.
    scheduler_address : str, optional
        ``tcp://host:port`` of an existing Dask scheduler (implies ``executor="dask"``).
    limit : int, optional
        Run at most this many pending cells (then stop, as if interrupted); >= 0.

    Raises
    ------
    ConfigError
        A negative ``limit``; a malformed or unreachable ``scheduler_address``; ``grid.out``
        inside a Bursted dataset, or holding results on another dataset, split, seed or window
        count (``_grid.json``), or another sweep running into it.
    OutputError
        An operating-system error writing results (one line naming the path).
    """
    if scheduler_address:
        executor = "dask"
    if executor not in ("serial", "processes", "dask"):
        raise ConfigError(f"executor={executor!r}: choose serial, processes or dask")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"--limit {limit!r}: must be an integer >= 0 (omit it for every cell)")
    if scheduler_address is not None:
        check_scheduler_address(scheduler_address)
    out = Path(grid.out)
    check_sweep_out(out)
    cells = grid.cells()  # loads the dataset first: a bad grid fails before anything is written
    created = not out.exists()
    ensure_dir(out)
    try:
        with dir_lock(out, blocking=False, what="sweep"):
            _check_fingerprint(out, grid)
            return _run_locked(grid, out, cells, executor, workers, scheduler_address, progress, limit)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a sweep that wrote nothing leaves nothing behind
        raise


def check_sweep_out(out: Path) -> None:
    """Refuse a results directory that is, or is inside, a Bursted dataset, or is a file."""
    from .fileio import shown_path
    from .manifest import enclosing_dataset

    ds = enclosing_dataset(out, include_self=True)
    if ds is not None:
        raise ConfigError(f"--out {shown_path(out)}: is {'' if ds == out.absolute() else 'inside '}"
                          f"the Bursted dataset {shown_path(ds)}; sweep results there would break "
                          f"it (choose a directory outside it)")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {shown_path(out)}: exists and is not a directory")


def grid_fingerprint(grid: Grid) -> dict:
    """What identifies a sweep's cells: ``_grid.json`` in the results directory."""
    return {"dataset": grid.dataset, "split": grid.split, "seed": grid.seed,
            "max_windows": grid.max_windows, "setups": list(grid.setups),
            "schedulers": list(grid.schedulers), "replicas": list(grid.replicas),
            "policies": [[name, dict(params)] for name, params in grid.policies]}


#: Fingerprint fields that must match for cells of two grids to share a results directory (a
#: cell's id covers its setup, scheduler, replicas, policy, parameters, window and seed, not these).
SHARED_KEYS = ("dataset", "split", "seed", "max_windows")


def _check_fingerprint(out: Path, grid: Grid) -> None:
    """Refuse ``out`` if it holds cells of another dataset, split, seed or window count; record
    this grid in ``_grid.json``. Grids that differ only in their axes share ``out``: each run
    reads back only its own cells (:func:`read_results` with ``cells``), so they never mix."""
    from .fileio import shown_path

    path = out / "_grid.json"  # "_" prefix: parquet readers skip it
    want = jsonable(grid_fingerprint(grid))
    if path.exists():
        try:
            have = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise ConfigError(f"{shown_path(path)}: not a sweep fingerprint (malformed JSON); "
                              f"choose another --out") from None
        if not isinstance(have, dict):
            have = {}
        diff = [k for k in SHARED_KEYS if have.get(k) != want[k]]
        if diff:
            raise ConfigError(f"--out {shown_path(out)}: holds results of a sweep on another "
                              f"{diff[0]} (was {have.get(diff[0])!r}, now {want[diff[0]]!r}); choose "
                              f"another --out or delete it")
        if have == want:
            return
    elif any(out.iterdir()):
        raise ConfigError(f"--out {shown_path(out)}: not empty and not a sweep results directory "
                          f"(no _grid.json); choose another --out")
    atomic_write_bytes(path, (json.dumps(want, sort_keys=True) + "\n").encode())


def check_scheduler_address(address: str) -> None:
    """Refuse a malformed ``tcp://HOST:PORT`` before connecting."""
    import re

    if not isinstance(address, str) or not re.fullmatch(
            r"(tcp|tls|inproc|ucx|ws|wss)://[^\s/:]+(:\d{1,5})?/?", address.strip()):
        raise ConfigError(f"--scheduler-address {address!r}: expected tcp://HOST:PORT")
    port = address.rstrip("/").rsplit(":", 1)[-1]
    if port.isdigit() and not 0 < int(port) < 65536:
        raise ConfigError(f"--scheduler-address {address!r}: port must be 1..65535")


def _worker_init() -> None:
    """Process-pool worker start-up: die with the parent (Linux ``PR_SET_PDEATHSIG``), so killing
    ``btb sweep`` never leaves workers running; elsewhere a watcher thread polls the parent."""
    import os
    import signal

    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGTERM, 0, 0, 0) == 0:  # 1 = PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass
    import threading
    import time

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _run_locked(grid, out, cells, executor, workers, scheduler_address, progress, limit):
    finished = done_cells(out)
    pending = [c for c in cells if cell_id(c) not in finished]
    if limit is not None:
        pending = pending[:limit]
    jobs = [(c, grid.dataset, grid.split) for c in pending]
    from .progress import progress_bar

    bar = None

    def done(row):
        _write_part(out, row)
        if bar is not None:
            bar.update(1)

    try:
        if executor == "serial" or not jobs:
            bar = progress_bar(len(jobs), "sweep", "cell", progress) if jobs else None
            for j in jobs:
                done(_sweep_job(j))
        elif executor == "processes":
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(max_workers=workers, initializer=_worker_init) as ex:
                bar = progress_bar(len(jobs), "sweep", "cell", progress)
                for fut in as_completed([ex.submit(_sweep_job, j) for j in jobs]):
                    done(fut.result())
        else:
            from dask.distributed import Client, LocalCluster, as_completed

            cluster = None
            if scheduler_address:
                try:
                    client = Client(scheduler_address, timeout="10s")
                except (OSError, TimeoutError, ValueError) as exc:
                    raise ConfigError(f"--scheduler-address {scheduler_address}: cannot connect "
                                      f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                                      f"; is `dask scheduler` running there?") from None
            else:
                cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                       dashboard_address=":0")  # any free port
                client = Client(cluster)
            try:
                bar = progress_bar(len(jobs), "sweep", "cell", progress)  # once connected
                futures = [client.submit(_sweep_job, j, pure=False) for j in jobs]
                for fut in as_completed(futures):
                    done(fut.result())
            finally:
                client.close()
                if cluster is not None:
                    cluster.close()
    finally:
        if bar is not None:
            bar.close()
    return read_results(out, cells)


def summarize(results: pd.DataFrame, kinds=None) -> pd.DataFrame:
    """Pool cells over windows per (setup, scheduler, replicas, policy, params).

    ``ttft_mean_s`` is request-weighted; ``speedup_vs_cache_aware`` divides the ``cache_aware``
    cell group's pooled mean TTFT (same setup, scheduler, replicas) by this group's; copies and
    unused copies are summed. ``kinds`` restricts to window kinds (e.g. ``("synthetic",)``).
    """
    if results.empty:
        return results
    df = results if kinds is None else results[results["kind"].isin(kinds)]
    keys = ["setup", "scheduler", "replicas", "policy", "params"]
    g = df.assign(_w=df["ttft_mean_s"] * df["requests"]).groupby(keys, sort=True)
    s = g.agg(requests=("requests", "sum"), _w=("_w", "sum"), windows=("window", "nunique"),
              rdma_copies=("rdma_copies", "sum"), copies_unused=("copies_unused", "sum"),
              recomputed_prefill_tokens=("recomputed_prefill_tokens", "sum")).reset_index()
    s["ttft_mean_s"] = s.pop("_w") / s["requests"]
    base = s[s.policy == BASELINE_POLICY].groupby(["setup", "scheduler", "replicas"])["ttft_mean_s"].first()
    s["speedup_vs_cache_aware"] = [
        base.get((r.setup, r.scheduler, r.replicas), np.nan) / r.ttft_mean_s for r in s.itertuples()]
    params = s["params"].map(json.loads)
    for k in sorted({k for p in params for k in p}):
        s[k] = params.map(lambda p, k=k: p.get(k))
    return s
