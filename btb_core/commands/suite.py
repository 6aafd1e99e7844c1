"""``btb suite``: every routing policy on every burst shape of :mod:`btb_core.suite`."""

from __future__ import annotations

import json

from ..fileio import jsonable
from .tables import add_wide_option, measured_floats, more_columns_note, render


def register(sub) -> None:
    p = sub.add_parser("suite", help="run every policy on every burst shape; ratio to the best per shape",
                       description="Replay each policy on each shape of the burst-shape suite "
                                   "(btb_core.suite.SHAPES) with default parameters and print mean / "
                                   "p95 TTFT, copies, unused copies and the ratio to the best policy "
                                   "of each shape.")
    p.add_argument("--policies", nargs="+", default=None, metavar="POLICY",
                   help="policies to run (default: every policy)")
    p.add_argument("--shapes", nargs="+", default=None, metavar="SHAPE",
                   help="shapes to run (default: the whole suite, 14 shapes; README section 13 "
                        "describes them, and an unknown name prints their list)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every shape's duration (fewer requests at the same rates; default 1)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    add_wide_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..suite import run_suite, shapes

    summary = run_suite(args.policies, shapes(args.shapes, args.scale), seed=args.seed,
                        workers=args.workers)
    if args.json:
        print(json.dumps(jsonable(summary.to_dict(orient="records")), indent=2))
        _few_requests_note(summary, args.scale)
        return 0
    cols = ["shape", "policy", "requests", "ttft_mean_s", "ttft_p95_s", "copies", "copies_unused",
            "mean_ratio", "p95_ratio"]
    if args.wide:
        cols += [c for c in summary.columns if c not in cols and summary[c].dtype != object]
    print(render(summary[cols], wide=args.wide, drop=("copies_unused", "copies"),
                 float_format="%.3f", floats=measured_floats(summary[cols])))
    if not args.wide and (note := more_columns_note(
            [c for c in summary.columns if summary[c].dtype != object], cols)):
        print(note)
    _few_requests_note(summary, args.scale)
    return 0


#: Below this many requests a shape's ratios between policies rest on a handful of TTFTs (the
#: smallest shape of the suite as shipped, p128k, has 32).
FEW_REQUESTS = 10


def _few_requests_note(summary, scale: float) -> None:
    """A note on stderr naming the shapes with fewer than :data:`FEW_REQUESTS` requests."""
    import sys

    per_shape = summary.groupby("shape", sort=False)["requests"].max()
    few = per_shape[per_shape < FEW_REQUESTS]
    if len(few):
        names = ", ".join(f"{s} ({int(n)})" for s, n in few.items())
        print(f"btb suite: note: {len(few)} shape{'s' if len(few) > 1 else ''} with fewer than "
              f"{FEW_REQUESTS} requests at --scale {scale:g}: {names}; their ratios rest on a "
              f"handful of requests (--scale 1 is the suite as shipped)", file=sys.stderr)
