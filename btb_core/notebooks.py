"""Execute the notebooks in ``notebooks/`` in order with papermill.

``python -m btb_core.notebooks --params notebooks/params/full.yaml --out build/notebooks`` runs every
``NN_*.ipynb`` in name order, injecting the parameters listed under the notebook's stem in the YAML
file (notebooks not listed run at their quick defaults), and writes the executed copies to ``--out``.
With ``--params`` figures go to ``figures/`` (this is ``make reproduce``); without it (quick defaults)
to ``build/figures-quick/``, unless ``$BTB_FIGURES_DIR`` says otherwise. A notebook run by hand in
JupyterLab writes to ``build/figures/``, so the shipped figures are only ever written by
``make reproduce``.

Progress: one line per notebook, and the kernel's progress bars (replayed windows, sweep cells) are
passed through to the terminal. Kernels talk to this process over IPC sockets in a private temporary
directory, not TCP, so there is nothing to eavesdrop on and ipykernel has nothing to warn about.
Stops at the first failing notebook with a one-line message naming it.
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


def _ipc_kernel_manager(socket_dir: str):
    """A jupyter_client kernel manager class whose kernels listen on IPC sockets in ``socket_dir``."""
    from jupyter_client import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.transport = "ipc"
            self.ip = os.path.join(socket_dir, "kernel")

    return IPCKernelManager


def run_all(params_file: Path | None, out_dir: Path, only: list[str] | None = None) -> int:
    import tempfile

    import papermill as pm

    params = yaml.safe_load(params_file.read_text()) if params_file else {}
    params = params or {}
    os.environ.setdefault("BTB_CHART_RENDERER", "png")  # static chart images in executed notebooks
    os.environ.setdefault("BTB_PROGRESS", "text")     # kernels' progress bars as text, passed through
    if "BTB_FIGURES_DIR" not in os.environ:
        # quick-parameter runs must never overwrite the full-size figures shipped in figures/
        quick = params_file is None
        os.environ["BTB_FIGURES_DIR"] = str(REPO_ROOT / ("build/figures-quick" if quick else "figures"))
        print(f"[btb] {'quick' if quick else 'full-size'} parameters: figures go to "
              f"{os.path.relpath(os.environ['BTB_FIGURES_DIR'], REPO_ROOT)}/", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    notebooks = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if any(nb.stem.startswith(o) for o in only)]
    total_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="btb-kernels-") as socket_dir:
        for i, nb in enumerate(notebooks, 1):
            start = time.perf_counter()
            print(f"[btb] ({i}/{len(notebooks)}) running {nb.name} ...", flush=True)
            try:
                pm.execute_notebook(
                    str(nb),
                    str(out_dir / nb.name),
                    parameters=params.get(nb.stem, {}),
                    cwd=str(REPO_ROOT / "notebooks"),
                    progress_bar=False,
                    kernel_name=KERNEL_NAME,
                    stderr_file=sys.stderr,
                    kernel_manager_class=_ipc_kernel_manager(socket_dir),
                )
            except pm.PapermillExecutionError as exc:
                print(f"[btb] {nb.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}",
                      file=sys.stderr)
                return 1
            print(f"[btb] ({i}/{len(notebooks)}) {nb.name} done in {time.perf_counter() - start:.1f} s",
                  flush=True)
    print(f"[btb] all {len(notebooks)} notebooks done in {time.perf_counter() - total_start:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=None, help="YAML: notebook stem -> parameters")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "notebooks")
    parser.add_argument("--only", nargs="*", help="run only notebooks whose name starts with these")
    args = parser.parse_args(argv)
    return run_all(args.params, args.out, args.only)


if __name__ == "__main__":
    sys.exit(main())
