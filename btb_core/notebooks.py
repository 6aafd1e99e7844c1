"""Execute the notebooks in ``notebooks/`` in order with papermill.

``python -m btb_core.notebooks --params notebooks/params/full.yaml --out build/notebooks`` runs every
``NN_*.ipynb`` in name order, injecting the parameters listed under the notebook's stem in the YAML
file (notebooks not listed run at their quick defaults), and writes the executed copies to ``--out``.
Without ``--params`` (quick defaults) figures go to ``build/figures-quick/`` unless ``$BTB_FIGURES_DIR``
says otherwise, so the full-size figures in ``figures/`` are only ever written by ``make reproduce``.
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


def run_all(params_file: Path | None, out_dir: Path, only: list[str] | None = None) -> int:
    import papermill as pm

    params = yaml.safe_load(params_file.read_text()) if params_file else {}
    params = params or {}
    os.environ.setdefault("BTB_CHART_RENDERER", "png")  # static chart images in executed notebooks
    if params_file is None and "BTB_FIGURES_DIR" not in os.environ:
        # quick-parameter runs must never overwrite the full-size figures shipped in figures/
        os.environ["BTB_FIGURES_DIR"] = str(REPO_ROOT / "build" / "figures-quick")
        print(f"[btb] quick parameters: figures go to {os.environ['BTB_FIGURES_DIR']}", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    notebooks = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if any(nb.stem.startswith(o) for o in only)]
    total_start = time.perf_counter()
    for nb in notebooks:
        start = time.perf_counter()
        print(f"[btb] running {nb.name} ...", flush=True)
        try:
            pm.execute_notebook(
                str(nb),
                str(out_dir / nb.name),
                parameters=params.get(nb.stem, {}),
                cwd=str(REPO_ROOT / "notebooks"),
                progress_bar=False,
                kernel_name="python3",
            )
        except pm.PapermillExecutionError as exc:
            print(f"[btb] {nb.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}",
                  file=sys.stderr)
            return 1
        print(f"[btb] {nb.name} done in {time.perf_counter() - start:.1f} s", flush=True)
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
