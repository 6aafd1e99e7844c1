"""Execute the notebooks in ``notebooks/`` in order with papermill.

``python -m btb_core.notebooks --params notebooks/params/full.yaml --out build/notebooks`` runs every
``NN_*.ipynb`` in name order, injecting the parameters listed under the notebook's stem in the YAML
file (notebooks not listed run at their quick defaults), and writes the executed copies to ``--out``.
The file is checked before anything runs (:func:`load_params`): a notebook or parameter name it
does not know, or a file that is not a mapping, is a one-line error (exit 2). With ``--params
notebooks/params/full.yaml`` the listed notebooks' figures go to ``figures/`` (this is ``make
reproduce``); with another params file, to ``<--out>/figures/``; the unlisted notebooks' (quick
defaults) to ``build/figures-quick/``, as every figure of a run without ``--params``, unless
``$BTB_FIGURES_DIR`` says otherwise. A notebook run by hand in
JupyterLab writes to ``build/figures/``, so the shipped figures are only ever written by
``make reproduce``.

``--jobs N`` runs up to N notebooks at once, each in a process of its own (``make reproduce`` runs
two: on two cores the single-threaded notebooks fill the core that a replay's process pool leaves
idle between its phases); a notebook that replays cells another one replays first
(:data:`REUSES`) starts once it has replayed them. Every notebook of a run shares one replay cache
(:mod:`btb_core.replay_cache`, in a fresh folder under ``build/replay-cache/`` removed at the end),
so a cell replayed by one notebook is read back, not replayed again, by the next.

Progress: one line per notebook, and the kernel's progress bars (replayed windows, sweep cells) are
passed through to the terminal (with ``--jobs`` > 1 each line starts with the notebook's number).
Kernels talk to their papermill process over IPC sockets in a private temporary directory, not TCP,
so there is nothing to eavesdrop on and ipykernel has nothing to warn about. Stops at the first
failing notebook with a one-line message naming it (and ends the notebooks still running).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import yaml

from .paths import REPO_ROOT


#: Full-size parameters per notebook stem (what ``make reproduce`` passes to papermill).
FULL_PARAMS = REPO_ROOT / "notebooks" / "params" / "full.yaml"


def size_parameters(size: str, stem: str) -> dict:
    """The parameters a notebook's ``size`` switch stands for.

    Parameters
    ----------
    size : {"quick", "full"}
        ``"quick"``: the notebook's own defaults (returns ``{}``); ``"full"``: the values under
        ``stem`` in ``notebooks/params/full.yaml``, the ones ``make reproduce`` runs.
    stem : str
        Notebook file name without ``.ipynb``, e.g. ``"04_btb_replay"``.

    Raises
    ------
    ConfigError
        ``size`` is neither ``"quick"`` nor ``"full"``.
    """
    from .errors import ConfigError

    if size == "quick":
        return {}
    if size != "full":
        raise ConfigError(f"size = {size!r}: choose 'quick' (the notebook's defaults) or 'full' "
                          f"({FULL_PARAMS.relative_to(REPO_ROOT)}, what make reproduce runs)")
    return dict((yaml.safe_load(FULL_PARAMS.read_text()) or {}).get(stem, {}))


#: The Jupyter kernel `make install` registers ("Python (btb)"); every notebook asks for it.
KERNEL_NAME = "btb"


def load_params(params_file: Path, notebooks: list[Path]) -> dict:
    """Read and check a parameters file: a YAML mapping of notebook stem -> mapping of the
    notebook's parameters (the names in its ``parameters`` cell).

    Raises
    ------
    ConfigError
        The file is missing or not YAML, is not a mapping, names a notebook that does not exist,
        gives a notebook something other than a mapping, or a parameter the notebook does not
        have (one line naming the file, notebook and parameter).
    """
    import papermill as pm

    from .errors import ConfigError

    try:
        text = Path(params_file).read_text()
    except OSError as exc:
        raise ConfigError(f"{params_file}: cannot read the parameters file "
                          f"({exc.strerror or exc})") from None
    try:
        params = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"{params_file}: not valid YAML{at}") from None
    if not isinstance(params, dict):
        raise ConfigError(f"{params_file}: expected a mapping of notebook name -> parameters, "
                          f"got {type(params).__name__}")
    by_stem = {nb.stem: nb for nb in notebooks}
    for stem, values in params.items():
        if stem not in by_stem:
            raise ConfigError(f"{params_file}: unknown notebook {stem!r}; notebooks: "
                              f"{', '.join(by_stem)}")
        if values is None:
            params[stem] = {}
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{params_file}: {stem}: expected a mapping of parameter -> value, "
                              f"got {type(values).__name__}")
        known = pm.inspect_notebook(str(by_stem[stem]))
        for name in values:
            if name not in known:
                raise ConfigError(f"{params_file}: {stem}: unknown parameter {name!r}; its "
                                  f"parameters: {', '.join(known)}")
    return params


def _ipc_kernel_manager(socket_dir: str):
    """A jupyter_client kernel manager class whose kernels listen on IPC sockets in ``socket_dir``."""
    from jupyter_client import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.transport = "ipc"
            self.ip = os.path.join(socket_dir, "kernel")
            # the connection file beside the sockets, so that it goes with their folder even
            # when the kernel is killed (jupyter_client's default, a file in the temp folder,
            # was left behind by every stopped notebook)
            self.connection_file = os.path.join(socket_dir, "kernel.json")

    return IPCKernelManager


#: Notebooks that replay cells another notebook replays first, as ``{notebook: ((other, n), ...)}``:
#: with ``--jobs`` > 1 a notebook starts only once each ``other`` has finished its first ``n``
#: experiments (:func:`btb_core.experiment.run_experiment` calls, counted through the run's replay
#: cache: :func:`btb_core.replay_cache.experiments_done`) or has ended, so the cache serves those
#: cells instead of replaying them twice. 06's Bursted section replays five of 04's policies on
#: 04's windows, all of them cells of 04's first experiment (its main replay), so 06 runs beside
#: the rest of 04 (its controls, closed-loop and admission sections). If 04's cells were to move
#: to a later experiment, 06 would replay them itself: the same numbers, only slower.
REUSES = {"06_beyond_the_rule": (("04_btb_replay", 1),)}


def _execute(nb: Path, out_dir: Path, parameters: dict, socket_dir: str) -> str | None:
    """Run one notebook with papermill; returns None, or a one-line failure message."""
    import papermill as pm

    try:
        pm.execute_notebook(
            str(nb),
            str(out_dir / nb.name),
            parameters=parameters,
            cwd=str(REPO_ROOT / "notebooks"),
            progress_bar=False,
            kernel_name=KERNEL_NAME,
            stderr_file=sys.stderr,
            kernel_manager_class=_ipc_kernel_manager(socket_dir),
        )
    except pm.PapermillExecutionError as exc:
        return f"{nb.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}"
    except KeyboardInterrupt:
        _mark_interrupted(out_dir / nb.name)
        raise
    return None


#: ``id`` of the cell :func:`_mark_interrupted` puts first in an executed notebook.
INTERRUPTED_CELL_ID = "btb-interrupted"


def _mark_interrupted(path: Path) -> None:
    """Mark the executed copy ``path`` of a notebook stopped by Ctrl-C or SIGTERM as such.

    papermill saves the copy as it goes and, on any exception, ends with every cell it had not
    reached marked ``completed`` (``NotebookExecutionManager.notebook_complete``), so the copy
    of a stopped run looked finished. Here the cells that never ran get ``pending`` back, the
    one running when the run was stopped ``failed``, the notebook's metadata
    ``papermill.exception`` true, and a first markdown cell says where it stopped. A copy that
    cannot be read (stopped before papermill first saved it) is left alone; the rewrite is
    atomic (:func:`btb_core.fileio.atomic_write_bytes`).
    """
    import nbformat

    from .fileio import atomic_write_bytes

    try:
        nb = nbformat.read(str(path), as_version=4)
    except (OSError, ValueError):
        return
    stopped_at = None
    for i, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("papermill")
        if meta is None or cell.cell_type != "code":
            continue
        # the cell the stop came in: still "running", or ended by the interrupt (papermill marks
        # a cell whose kernel raised KeyboardInterrupt "completed"), or marked by an earlier call
        hit = meta.get("status") in ("running", "failed") or any(
            o.get("output_type") == "error" and o.get("ename") == "KeyboardInterrupt"
            for o in cell.get("outputs", ()))
        if hit and stopped_at is None:
            meta["status"], meta["exception"] = "failed", True
            stopped_at = i
        elif cell.get("execution_count") is None and meta.get("start_time") is None:
            meta["status"] = "pending"
            stopped_at = i if stopped_at is None else stopped_at
    nb.metadata.setdefault("papermill", {})["exception"] = True
    where = (f"code cell {sum(c.cell_type == 'code' for c in nb.cells[:stopped_at]) + 1}"
             if stopped_at is not None else "its end")
    note = nbformat.v4.new_markdown_cell(
        f"**This run was stopped (Ctrl-C or SIGTERM) at {where}: the cells from there on did "
        "not run, and their outputs are missing or stale.**")
    note.id = INTERRUPTED_CELL_ID
    nb.cells = [c for c in nb.cells if c.get("id") != INTERRUPTED_CELL_ID]
    nb.cells.insert(0, note)
    atomic_write_bytes(path, nbformat.writes(nb).encode("utf-8"))


def run_all(params_file: Path | None, out_dir: Path, only: list[str] | None = None, jobs: int = 1,
            quiet: bool = False) -> int:
    """Execute the notebooks (see the module docstring); returns the exit status (0 or 1).

    Parameters
    ----------
    params_file : Path or None
        YAML mapping notebook stem -> papermill parameters (None: quick defaults).
    out_dir : Path
        Where the executed copies go.
    only : list of str, optional
        Run only notebooks whose name starts with one of these.
    jobs : int
        Notebooks run at once (>= 1). With more than one, each runs in a process of its own, its
        output lines prefixed with its number, and a notebook listed in :data:`REUSES` starts
        once the notebooks it reuses have replayed what it reuses; notebooks others wait for
        start first.
    quiet : bool
        No per-notebook lines (used for the processes of ``jobs`` > 1).

    The run's replay cache (:mod:`btb_core.replay_cache`) lives in a fresh folder under
    ``build/replay-cache/``, removed when the run ends, unless ``$BTB_REPLAY_CACHE`` is set.
    """
    import shutil
    import tempfile

    from .errors import ConfigError

    all_notebooks = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    notebooks = all_notebooks
    if only:
        notebooks = [nb for nb in notebooks if any(nb.stem.startswith(o) for o in only)]
        if not notebooks:
            raise ConfigError(f"--only {' '.join(only)}: no notebook matches; notebooks: "
                              f"{', '.join(nb.stem for nb in all_notebooks)}")
    params = load_params(params_file, all_notebooks) if params_file else {}
    os.environ.setdefault("BTB_CHART_RENDERER", "png")  # static chart images in executed notebooks
    os.environ.setdefault("BTB_PROGRESS", "text")     # kernels' progress bars as text, passed through
    saved_env = {k: os.environ.get(k) for k in ("BTB_FIGURES_DIR", "_BTB_FIGURES_AUTO")}
    figures_for = None
    if "BTB_FIGURES_DIR" not in os.environ or os.environ.get("_BTB_FIGURES_AUTO") == "1":
        # only the shipped parameters (make reproduce) write the full-size figures shipped in
        # figures/: another params file's go beside its executed notebooks, in <out>/figures, and
        # a notebook the params file does not list runs at its quick defaults, so its figures go
        # to build/figures-quick/
        shipped = params_file is not None and Path(params_file).resolve() == FULL_PARAMS.resolve()
        full_dir = REPO_ROOT / "figures" if shipped else Path(out_dir).resolve() / "figures"

        def figures_for(stem: str) -> str:
            full = params_file is not None and stem in params
            return str(full_dir if full else REPO_ROOT / "build/figures-quick")

        os.environ["_BTB_FIGURES_AUTO"] = "1"   # the notebooks' own processes decide the same way
        if not quiet:
            for nb in notebooks:
                if params_file is not None and nb.stem not in params:
                    print(f"[btb] {nb.stem} is not in {params_file}: quick defaults, figures go to "
                          "build/figures-quick/", flush=True)
            where = "build/figures-quick" if params_file is None else (
                "figures" if shipped else str(full_dir))
            print(f"[btb] {'quick' if params_file is None else 'full-size' if shipped else params_file} "
                  f"parameters: figures go to {where}/", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    from .replay_cache import ENV as CACHE_ENV

    own_cache = None
    if not os.environ.get(CACHE_ENV, "").strip():
        root = REPO_ROOT / "build" / "replay-cache"
        root.mkdir(parents=True, exist_ok=True)
        own_cache = tempfile.mkdtemp(prefix="run-", dir=root)
        os.environ[CACHE_ENV] = own_cache
    total_start = time.perf_counter()
    try:
        if jobs > 1 and len(notebooks) > 1:
            status = _run_parallel(notebooks, params_file, out_dir, jobs)
        else:
            status = _run_serial(notebooks, params, out_dir, quiet, figures_for)
    finally:
        if own_cache is not None:
            shutil.rmtree(own_cache, ignore_errors=True)
            os.environ.pop(CACHE_ENV, None)
        for k, v in saved_env.items():          # leave the caller's environment as it was
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if status == 0 and not quiet:
        print(f"[btb] all {len(notebooks)} notebooks done in {time.perf_counter() - total_start:.1f} s")
    return status


def _run_serial(notebooks: list[Path], params: dict, out_dir: Path, quiet: bool,
                figures_for=None) -> int:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="btb-kernels-") as socket_dir:
        for i, nb in enumerate(notebooks, 1):
            start = time.perf_counter()
            if figures_for is not None:
                os.environ["BTB_FIGURES_DIR"] = figures_for(nb.stem)   # the kernel inherits it
            if not quiet:
                print(f"[btb] ({i}/{len(notebooks)}) running {nb.name} ...", flush=True)
            failed = _execute(nb, out_dir, params.get(nb.stem, {}), socket_dir)
            if failed:
                print(f"[btb] {failed}", file=sys.stderr)
                return 1
            if not quiet:
                print(f"[btb] ({i}/{len(notebooks)}) {nb.name} done in "
                      f"{time.perf_counter() - start:.1f} s", flush=True)
    return 0


class _Console:
    """Our stdout shared by the notebooks' output threads: whole chunks under a lock, and a line
    break first when another source left its line unfinished (a progress bar redrawn with
    carriage returns), so lines of two notebooks never run together."""

    def __init__(self, out=None):
        import threading

        self.out = out or sys.stdout
        self.lock = threading.Lock()
        self.last = None            # who wrote last
        self.at_start = True        # the last write ended a line
        self.muted = False          # True: the notebooks' output is dropped (they are being stopped)

    def write(self, source, text: str) -> None:
        if not text or (self.muted and source is not None):
            return
        with self.lock:
            if source != self.last and not self.at_start:
                self.out.write("\n")
            self.out.write(text)
            self.out.flush()
            self.last = source
            self.at_start = text.endswith("\n")

    def say(self, line: str) -> None:
        self.write(None, line + "\n")


def _pump(stream, prefix: str, console: _Console | None = None) -> None:
    """Copy a child's output to ``console``, ``prefix`` at the start of every line (progress bars
    redraw with a carriage return: a new line for this purpose too)."""
    console = console or _Console()
    at_start = True
    for chunk in iter(lambda: stream.read1(65536), b""):
        text = chunk.decode("utf-8", errors="replace")
        pieces = []
        for ch in text:
            if at_start and ch not in "\r\n":
                pieces.append(prefix)
                at_start = False
            pieces.append(ch)
            if ch in "\r\n":
                at_start = True
        console.write(prefix, "".join(pieces))


def reuses_met(waits, done, started, cache) -> bool:
    """Whether a notebook whose :data:`REUSES` entries in this run are ``waits`` (``(other,
    experiments)`` pairs) may start: each ``other`` has ended (in ``done``), or was started (in
    ``started``) and has finished at least ``experiments`` experiments according to the run's
    replay cache ``cache`` (a directory, or None when the cache is off: then only ``done``
    counts)."""
    from .replay_cache import experiments_done

    return all(other in done or (other in started and cache is not None
                                 and experiments_done(cache, other) >= experiments)
               for other, experiments in waits)


def _run_parallel(notebooks: list[Path], params_file: Path | None, out_dir: Path, jobs: int) -> int:
    """Run up to ``jobs`` notebooks at once, each in its own process (see :func:`run_all`)."""
    import signal
    import subprocess
    import threading

    from .replay_cache import NOTEBOOK_ENV, cache_dir

    stems = [nb.stem for nb in notebooks]
    waits = {s: [(d, k) for d, k in REUSES.get(s, ()) if d in stems] for s in stems}
    needed = {d for ds in waits.values() for d, _ in ds}
    cache = cache_dir()

    pending = sorted(notebooks, key=lambda nb: (nb.stem not in needed, nb.name))
    done: set[str] = set()
    started: set[str] = set()
    running: dict = {}
    n = len(notebooks)
    number = {nb.stem: i for i, nb in enumerate(notebooks, 1)}
    console = _Console()
    status = 0
    try:
        while pending or running:
            while len(running) < jobs:
                ready = [nb for nb in pending if reuses_met(waits[nb.stem], done, started, cache)]
                if not ready:
                    break
                nb = ready[0]
                pending.remove(nb)
                cmd = [sys.executable, "-m", "btb_core.notebooks", "--out", str(out_dir), "--only",
                       nb.stem, "--jobs", "1", "--quiet"]
                if params_file is not None:
                    cmd[3:3] = ["--params", str(params_file)]
                console.say(f"[btb] ({number[nb.stem]}/{n}) running {nb.name} ...")
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        env={**os.environ, NOTEBOOK_ENV: nb.stem})
                started.add(nb.stem)
                pump = threading.Thread(target=_pump, args=(proc.stdout, f"[{nb.stem[:2]}] ", console),
                                        daemon=True)
                pump.start()
                running[nb.stem] = (nb, proc, pump, time.perf_counter())
            if not running:
                print(f"[btb] cannot start {', '.join(nb.name for nb in pending)}: the notebooks "
                      f"they wait for did not run", file=sys.stderr)
                return 1
            time.sleep(0.2)
            for stem, (nb, proc, pump, start) in list(running.items()):
                if proc.poll() is None:
                    continue
                pump.join()
                del running[stem]
                if proc.returncode != 0:
                    console.say(f"[btb] {nb.name} failed (exit status {proc.returncode}); stopping")
                    status = 1
                    pending.clear()
                    break
                done.add(stem)
                console.say(f"[btb] ({number[stem]}/{n}) {nb.name} done in "
                            f"{time.perf_counter() - start:.1f} s")
            if status:
                break
    finally:
        # notebooks stopped here print their kernels' complaints about closed sockets (ZMQ
        # tracebacks): not worth showing; their executed copies say where they stopped
        console.muted = bool(running)
        for nb, proc, pump, start in running.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)   # the notebook's process group: papermill,
            except ProcessLookupError:                 # its kernel and the kernel's workers
                pass
        for nb, proc, pump, start in running.values():
            proc.wait()
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=None, help="YAML: notebook stem -> parameters")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "notebooks")
    parser.add_argument("--only", nargs="*", help="run only notebooks whose name starts with these")
    parser.add_argument("--jobs", type=int, default=1,
                        help="notebooks run at once, each in its own process (default 1: in order)")
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be >= 1")
    import signal

    from .errors import ConfigError

    terminated = []

    def on_sigterm(signum, frame):
        # SIGTERM (a CI time limit, `timeout`, `kill`) unwinds as Ctrl-C does, so the notebooks
        # still running are stopped: each runs in a session of its own, which a signal sent to
        # this process alone would leave running (with its kernel, and any engine servers)
        terminated.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return run_all(args.params, args.out, args.only, args.jobs, args.quiet)
    except ConfigError as exc:
        print(f"btb notebooks: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if not args.quiet:       # (a notebook's own process: the runner that started it says it)
            print(f"btb notebooks: {'terminated' if terminated else 'interrupted'} (the notebooks "
                  f"still running were stopped)", file=sys.stderr)
        return 128 + signal.SIGTERM if terminated else 130


if __name__ == "__main__":
    sys.exit(main())
