"""``btb gateway-check``: the real SGLang Model Gateway against our ``cache_aware`` on one trace.

Prints, per cache_aware variant, the step agreement (same state, same decision?) and the replay
agreement (same replica in two independent runs), disagreements by cache_aware's branch, requests
per replica in each run, and both TTFT summaries. See :mod:`btb_core.gateway_check`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import ConfigError
from ..fileio import jsonable
from .tables import add_wide_option, render


def register(sub) -> None:
    p = sub.add_parser("gateway-check", help="compare cache_aware with the real SGLang gateway on a trace",
                       description=__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", type=Path, help="a trace file (as for btb replay --trace)")
    src.add_argument("--burst", action="store_true",
                     help="instead of a trace: notebook 03's same-prefix burst (480 requests sharing a "
                          "65,536-token prefix, each with its own 1,024-token suffix, over 60 s)")
    p.add_argument("--replicas", type=int, default=4, help="replicas (default 4)")
    p.add_argument("--setup", default="70b_h100x4", help="model x hardware setup (default 70b_h100x4)")
    p.add_argument("--scheduler", default="chunked", choices=("prefill_first", "chunked"),
                   help="replica scheduler (default chunked)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--router-param", action="append", default=[], metavar="NAME=VALUE",
                   help="sglang_gateway parameter, repeatable (gateway_policy, cache_threshold, "
                        "balance_abs_threshold, balance_rel_threshold, chars_per_block, "
                        "startup_timeout_s); thresholds also go to cache_aware")
    p.add_argument("--cache-aware-param", action="append", default=[], metavar="NAME=VALUE",
                   help="compare one cache_aware variant with these parameters instead of the default "
                        "pair (product default and tie_break=first_holder)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_wide_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import pandas as pd

    from ..gateway_check import gateway_check
    from ..routers import parse_router_params, policy_class
    from ..sim import ClusterConfig
    from ..trace import load_trace

    if args.replicas < 1:
        raise ConfigError(f"--replicas {args.replicas}: must be >= 1")
    gw_params = parse_router_params(policy_class("sglang_gateway"), args.router_param)
    if gw_params.get("gateway_policy", "cache_aware") != "cache_aware":
        raise ConfigError("gateway-check compares cache_aware decisions; use gateway_policy=cache_aware "
                          "(or btb replay --policy sglang_gateway for other gateway policies)")
    variants = None
    if args.cache_aware_param:
        variants = [parse_router_params(policy_class("cache_aware"), args.cache_aware_param)]
    if args.burst:
        from ..scenarios import ScenarioSpec, build

        trace = build(ScenarioSpec("burst", 480, 60.0, 65_536, 1_024))
        label = "same-prefix burst (480 x 65,536 + 1,024 tokens over 60 s)"
    else:
        trace = load_trace(args.trace)
        trace.require_prefix_info("gateway-check (prefix routing)")
        label = str(args.trace)
    cluster = ClusterConfig.from_setup(args.setup, num_replicas=args.replicas, scheduler=args.scheduler)
    res = gateway_check(trace, cluster, seed=args.seed, gateway_params=gw_params, variants=variants,
                        progress=(not args.json) and sys.stderr.isatty())
    if args.json:
        print(json.dumps(jsonable({
            "trace": label, "replicas": args.replicas, "setup": args.setup,
            "scheduler": args.scheduler, "seed": args.seed, "gateway_params": gw_params,
            "summary": res.summary.to_dict("records"),
            "replicas_per_run": res.replicas.to_dict("records"),
            "ttft": res.ttft.to_dict("records")}), indent=2))
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(f"{label}: {len(res.decisions)} requests, {args.replicas} replicas\n")
        print("agreement with the real gateway (step: same state; replay: independent runs)")
        print(render(res.summary, wide=args.wide, float_format="%.4f",
                     drop=("step_disagree_miss", "step_disagree_hit", "step_disagree_imbalanced")))
        print("\nrequests per replica")
        print(render(res.replicas, wide=args.wide))
        print("\nTTFT (s)")
        print(render(res.ttft, wide=args.wide, float_format="%.3f"))
    return 0
