"""``btb sweep --grid FILE``: run a parameter grid serially, on a process pool or on Dask."""

from __future__ import annotations

from pathlib import Path

from .tables import add_wide_option, render


def register(sub) -> None:
    p = sub.add_parser("sweep", help="run a policy-parameter grid (resumable; serial, processes or Dask)",
                       description="Run every unfinished cell of a sweep grid (see btb_core.sweep for "
                                   "the YAML format). Finished cells are kept, so rerunning resumes.")
    p.add_argument("--grid", type=Path, required=True, help="grid file (YAML or JSON)")
    p.add_argument("--out", default=None, help="results directory (default: the grid's 'out')")
    p.add_argument("--executor", choices=("serial", "processes", "dask"), default=None,
                   help="default: dask when --scheduler-address or --workers > 1 is given, else serial")
    p.add_argument("--workers", type=int, default=1, help="local worker processes (default 1)")
    p.add_argument("--scheduler-address", default=None, metavar="tcp://HOST:PORT",
                   help="an existing Dask scheduler to run on")
    p.add_argument("--limit", type=int, default=None, help="run at most N pending cells, then stop")
    add_wide_option(p)
    p.set_defaults(func=run)


#: Sweep-table columns printed once above the table when every cell shares them.
SWEEP_CONSTANT = ("replicas", "windows")
#: Sweep-table columns that split it into one block per value when cells differ in them.
SWEEP_GROUP = ("setup", "scheduler")
#: What the sweep table hides, in this order, to fit 120 columns.
SWEEP_HIDE = ("recomputed_prefill_tokens", "requests", "windows", "replicas")


def run(args) -> int:
    from ..sweep import Grid, run_sweep, summarize

    grid = Grid.from_file(args.grid, out=args.out)
    executor = args.executor or ("dask" if (args.scheduler_address or args.workers > 1) else "serial")
    results = run_sweep(grid, executor=executor, workers=max(1, args.workers),
                        scheduler_address=args.scheduler_address, limit=args.limit)
    total = len(grid.cells())
    print(f"{len(results)} of {total} cells done; results in {grid.out}")
    if len(results):
        s = summarize(results)
        cols = [c for c in s.columns if c not in ("params",)]
        print(render(s[cols], wide=args.wide, constant=SWEEP_CONSTANT, group=SWEEP_GROUP,
                     drop=SWEEP_HIDE, float_format="%.3f"))
    return 0
