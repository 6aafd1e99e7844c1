"""``btb sweep --grid FILE``: run a parameter grid serially, on a process pool or on Dask."""

from __future__ import annotations

from pathlib import Path


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
    p.set_defaults(func=run)


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
        print(s[cols].to_string(index=False, float_format="%.3f"))
    return 0
