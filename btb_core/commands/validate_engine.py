"""``btb validate-engine``: the simulator against a real vLLM engine on CPU (issue 18).

Starts 1-2 vLLM CPU servers of a tiny random-weight model on loopback (``make engine`` installs
them), calibrates the fitted cost model, replays a trace per routing policy with streaming
requests, runs the simulator on the same requests and prints real vs simulated figures.

Examples
--------
``btb validate-engine``                                 default trace, 2 servers, 4 policies
``btb validate-engine --replicas 1 --policy least_load --json``
``btb validate-engine --trace my.jsonl --out build/engine/run``
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import ConfigError
from .tables import add_wide_option, render


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``validate-engine`` subcommand."""
    from ..engine.validation import DEFAULT_POLICIES

    p = subparsers.add_parser(
        "validate-engine", help="real vLLM (CPU) vs simulated TTFT and cached tokens",
        description="Replay a trace on 1-2 real vLLM CPU servers (tiny random model, one core "
                    "each), routed by the project's routers, and compare per request with the "
                    "simulator run on the same requests with a cost model fitted to the engine. "
                    "Needs the engine environment: `make engine`.")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="trace file (default: data/traces/engine_validation/engine_validation.jsonl; "
                        "Mooncake JSONL is read with 32-token blocks)")
    p.add_argument("--replicas", type=int, nargs="+", choices=(1, 2), default=[2], metavar="N",
                   help="servers, 1 or 2 (several values run each; default 2)")
    p.add_argument("--policy", nargs="+", default=list(DEFAULT_POLICIES), metavar="P",
                   help=f"routing policies (default {' '.join(DEFAULT_POLICIES)})")
    p.add_argument("--repeats", type=int, default=2, metavar="N",
                   help="calibration repeats per point before the replays (default 2)")
    p.add_argument("--replay-repeats", type=int, default=3, metavar="N",
                   help="real runs per server count and policy, in rounds (every policy once, "
                        "then again); the error figures are the median over runs, and with "
                        "N >= 2 the summary gives the engine's own run-to-run noise, "
                        "ttft_mean_real_cv (default 3: a whole run was now and then 45-160%% "
                        "slower than the runs around it on the 2-core test machine)")
    p.add_argument("--no-recalibrate", action="store_true",
                   help="calibrate only before the replays (default: one more calibration pass "
                        "after each round, ~30 s each, and the fit made from all of them)")
    p.add_argument("--warmup-replays", type=int, default=2, metavar="N",
                   help="unrecorded replays of the trace per server count before the recorded "
                        "ones: a fresh engine is slower on its first runs (default 2; 0 = none)")
    p.add_argument("--no-drift-check", action="store_true",
                   help="do not report the speed drift from the first calibration pass to the "
                        "last (with --no-recalibrate: skip re-measuring calibration points after "
                        "the replays, ~15 s)")
    p.add_argument("--speed-correction", action="store_true",
                   help="probe the servers' speed just before and after each run (~3 s a run) "
                        "and simulate the run with the fit scaled to it; the summary then gives "
                        "the errors with and without (speed_factor, unscaled_ttft_*)")
    p.add_argument("--api-core", choices=("engine", "spare"), default="engine",
                   help="where each server's API server (HTTP, tokenising, streaming) runs: on its "
                        "engine's core (default), or on a core no engine uses when there is one "
                        "(one server on a 2-core machine, --replicas 1 alone: --replicas 1 2 "
                        "starts two), as a GPU server's front end has host cores of its own")
    p.add_argument("--max-requests", type=int, default=None, metavar="N",
                   help="replay only the first N requests of the trace")
    p.add_argument("--quick-calibration", action="store_true",
                   help="calibrate on fewer, shorter requests (4 cold lengths, 3 cached points)")
    p.add_argument("--seed", type=int, default=0, help="router seed and text salt (default 0)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="also write calibration.csv, requests.csv and summary.json there")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_wide_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..engine.validation import validate

    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    if args.replay_repeats < 1:
        raise ConfigError(f"--replay-repeats must be >= 1, got {args.replay_repeats}")
    if args.warmup_replays < 0:
        raise ConfigError(f"--warmup-replays must be >= 0, got {args.warmup_replays}")
    if args.max_requests is not None and args.max_requests < 1:
        raise ConfigError(f"--max-requests must be >= 1, got {args.max_requests}")
    log = (lambda msg: print(f"btb validate-engine: {msg}", file=sys.stderr))
    res = validate(args.trace, replicas=tuple(args.replicas), policies=tuple(args.policy),
                   repeats=args.repeats, replay_repeats=args.replay_repeats,
                   drift_check=not args.no_drift_check, warmup_replays=args.warmup_replays,
                   recalibrate=not args.no_recalibrate,
                   speed_correction=args.speed_correction,
                   api_cores=None if args.api_core == "engine" else args.api_core,
                   seed=args.seed, max_requests=args.max_requests,
                   quick_calibration=args.quick_calibration, log=log)
    from ..fileio import jsonable

    out = jsonable(res.as_json())
    if args.out:
        from ..engine.validation import save_result

        save_result(res, args.out)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    cols = ["num_replicas", "policy", "requests", "cached_tokens_match_fraction", "ttft_mean_real_s",
            "ttft_mean_sim_s", "ttft_mean_rel_error", "ttft_p90_rel_error",
            "ttft_median_request_rel_error"]
    if "speed_factor" in res.summary:
        cols += ["speed_factor", "unscaled_ttft_mean_rel_error"]
    if args.replay_repeats > 1:
        cols += [c for c in ("ttft_mean_rel_error_pooled", "ttft_mean_real_cv") if c in res.summary]
    if args.wide:   # each run's signed error is a list: in --json and --out
        cols += [c for c in res.summary.columns
                 if c not in cols and c != "ttft_mean_signed_error_runs"]
    print(render(res.summary[cols], wide=args.wide, float_format=lambda v: f"{v:.3f}",
                 group=("num_replicas",),
                 floats=[c for c in cols if c not in ("num_replicas", "policy", "requests",
                                                      "replay_repeats")],
                 drop=("requests", "ttft_mean_real_cv", "ttft_mean_rel_error_pooled",
                       "ttft_median_request_rel_error", "ttft_p90_rel_error")))
    if "ttft_mean_rel_error_pooled" in res.summary:
        print("ttft_mean_real_s / ttft_mean_sim_s: every run's requests pooled;\n"
              "ttft_mean_rel_error, ttft_p90_rel_error: the median run's")
    drift = res.info.get("calibration_drift")
    if drift is not None:
        when = ("the last calibration pass against a fit of the first" if res.info.get("recalibrate")
                else "after the replays, against the calibration")
        print(f"calibration drift, {when}: {drift:+.1%}\n(measured / fitted TTFT - 1: how far the "
              "machine's speed moved)")
    speeds = res.info.get("calibration_pass_speed")
    if speeds:
        for n, v in speeds.items():
            print(f"{n} server(s), each calibration pass (before the replays, then after each "
                  "round), measured / fitted TTFT:\n  " + ", ".join(f"{x:.3f}" for x in v))
    return 0

