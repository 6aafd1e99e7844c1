"""``btb replay``: run a trace (or a Bursted dataset) through a routing policy on a simulated cluster.

Two modes:

- ``btb replay --trace PATH --policy NAME``: one continuous run; prints the run metrics (a table,
  or JSON with ``--json``) and with ``--out FILE.parquet`` writes the per-request table.
- ``btb replay --dataset DIR --split test --policy P... --setup S...``: the experiment of
  :mod:`btb_core.experiment`, window by window on a fresh cluster, pooled over "bursted" (every
  window) and "normal" (normal windows only).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from ..errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("replay", help="replay a trace or a Bursted dataset through routing policies",
                       description=__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", type=Path, help="a trace file (Mooncake JSONL, ART, Bursted parquet/dir, Azure CSV)")
    src.add_argument("--dataset", type=Path, help="a Bursted dataset directory (experiment mode)")
    p.add_argument("--split", default="test", help="dataset split (experiment mode; default test)")
    p.add_argument("--policy", nargs="+", default=["cache_aware"],
                   help="policy name(s): round_robin random power_of_two least_load cache_aware kv_aware llm_d btb")
    p.add_argument("--setup", nargs="+", default=["70b_h100x4"],
                   help="model x hardware setup(s), e.g. 70b_h100x4 qwen3_8b_h100x4 (default 70b_h100x4)")
    p.add_argument("--replicas", type=int, default=4, help="replicas (default 4)")
    p.add_argument("--scheduler", default="chunked", choices=("prefill_first", "chunked", "both"),
                   help="prefill_first, chunked (default) or, in experiment mode, both")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--router-param", action="append", default=[], metavar="NAME=VALUE",
                   help="router constructor parameter, repeatable (e.g. cache_threshold=0.5)")
    p.add_argument("--continuous", action="store_true",
                   help="experiment mode: also replay all windows as one continuous run")
    p.add_argument("--max-windows", type=int, default=None, help="experiment mode: first N windows only")
    p.add_argument("--linear", action="store_true",
                   help="cost model without the attention term (the published reference table)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--out", type=Path, help="write the per-request table (parquet)")
    p.add_argument("--overwrite", action="store_true", help="allow --out to replace an existing file")
    p.set_defaults(func=run)


def _router(policy: str, params: list[str]):
    from ..routers import POLICIES, parse_router_params

    if policy not in POLICIES:
        raise ConfigError(f"unknown policy {policy!r}; choose one of {', '.join(sorted(POLICIES))}")
    cls = POLICIES[policy]
    return cls(**parse_router_params(cls, params))


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _write_parquet(df, out: Path, overwrite: bool) -> None:
    import os
    import tempfile

    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file name such as {out / 'requests.parquet'}")
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        df.to_parquet(tmp, index=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(args) -> int:
    if args.max_windows is not None and args.max_windows < 1:
        raise ConfigError(f"--max-windows {args.max_windows}: must be >= 1 (omit it for every window)")
    if args.dataset is not None:
        from ..experiment import run_cli

        return run_cli(args)
    if len(args.policy) != 1 or len(args.setup) != 1:
        raise ConfigError("--trace mode takes one --policy and one --setup")
    if args.scheduler == "both":
        raise ConfigError("--scheduler both is for --dataset mode; use prefill_first or chunked")
    from ..sim import ClusterConfig, simulate
    from ..trace import load_trace

    trace = load_trace(args.trace)
    trace.require_prefix_info("replay (prefix caching and routing)")
    if getattr(trace, "group_column", None):
        n = trace.table[trace.group_column].nunique()
        where = args.trace if args.trace.is_dir() else args.trace.parent
        raise ConfigError(f"{args.trace} holds {n} windows ({trace.group_column}), each with its own "
                          f"clock; replay it window by window with --dataset {where}")
    cluster = ClusterConfig.from_setup(args.setup[0], num_replicas=args.replicas, scheduler=args.scheduler,
                                       attention=not args.linear)
    router = _router(args.policy[0], args.router_param)
    progress = (not args.json) and sys.stderr.isatty()
    result = simulate(trace, router, cluster, seed=args.seed, progress=progress)
    metrics = {"trace": str(args.trace), "policy": args.policy[0], "setup": args.setup[0],
               "replicas": args.replicas, "scheduler": args.scheduler, "seed": args.seed,
               **result.metrics}
    if args.out is not None:
        _write_parquet(result.requests, args.out, args.overwrite)
    if args.json:
        print(json.dumps({k: _clean(v) for k, v in metrics.items()}, indent=2))
    else:
        width = max(len(k) for k in metrics)
        for k, v in metrics.items():
            text = f"{v:.4g}" if isinstance(v, float) else str(v)
            print(f"{k:<{width}}  {text}")
        if args.out is not None:
            print(f"per-request table written to {args.out}")
    return 0
