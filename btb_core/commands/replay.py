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
import sys
from pathlib import Path

from ..errors import ConfigError
from ..fileio import atomic_write_bytes, jsonable
from .tables import add_wide_option, measured_floats, more_columns_note, render


def _setup_names() -> list[str]:
    """Every setup ``--setup`` takes: the presets of :mod:`btb_core.specs` and the reference node."""
    from ..cost import REFERENCE_SETUP
    from ..specs import SETUPS

    return [*SETUPS, REFERENCE_SETUP]


def register(sub) -> None:
    from ..cost import REFERENCE_SETUP
    from ..routers import POLICIES
    from ..sim.schedulers import SCHEDULERS

    p = sub.add_parser("replay", help="replay a trace or a Bursted dataset through routing policies",
                       description=__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", type=Path, help="a trace file (Mooncake JSONL, ART, Bursted parquet/dir, Azure CSV)")
    p.add_argument("--block-tokens", type=int, default=None, metavar="N",
                   help="tokens per hash id of --trace (default: its format's, 512 for Mooncake "
                        "JSONL; the engine validation trace in data/traces/engine_validation has 32)")
    src.add_argument("--dataset", type=Path, help="a Bursted dataset directory (experiment mode)")
    p.add_argument("--split", default="test", help="dataset split (experiment mode; default test)")
    p.add_argument("--policy", nargs="+", default=["cache_aware"],
                   help=f"policy name(s): {' '.join(POLICIES)} (default cache_aware)")
    p.add_argument("--setup", nargs="+", default=["70b_h100x4"], metavar="SETUP",
                   help="model x hardware setup(s): " + " ".join(_setup_names())
                        + f" ({REFERENCE_SETUP}: the published linear table's node; default "
                          "70b_h100x4)")
    p.add_argument("--replicas", type=int, default=4, help="replicas (default 4)")
    p.add_argument("--scheduler", default="chunked", choices=(*SCHEDULERS, "both"),
                   help=f"{', '.join(SCHEDULERS)} (default chunked) or, in experiment mode, both "
                        "(every one of them)")
    p.add_argument("--seed", type=int, default=0, help="random seed for routers that draw (default 0)")
    p.add_argument("--router-param", action="append", default=[], metavar="NAME=VALUE",
                   help="router constructor parameter, repeatable (e.g. cache_threshold=0.5)")
    prod = p.add_argument_group("routers as production runs them (trace mode)")
    prod.add_argument("--routers", type=int, default=1, metavar="N",
                      help="independent router instances of the policy, each with its own state and "
                           "in-flight counts (default 1)")
    prod.add_argument("--router-assign", default="round_robin", choices=("round_robin", "session"),
                      help="split arrivals across instances round-robin (default) or by a hash "
                           "of the session id (the trace's, else inferred from chained prefixes)")
    prod.add_argument("--router-sync-s", type=float, default=0.0, metavar="S",
                      help="instances exchange prefix-index updates every S seconds (0: never)")
    prod.add_argument("--kv-event-lag-s", type=float, default=0.0, metavar="L",
                      help="cache-content changes reach routers L seconds late (default 0)")
    prod.add_argument("--load-lag-s", type=float, default=0.0, metavar="L",
                      help="engine load figures are snapshots refreshed every L seconds (default 0: live)")
    p.add_argument("--continuous", action="store_true",
                   help="experiment mode: also replay all windows as one continuous run")
    p.add_argument("--max-windows", type=int, default=None, help="experiment mode: first N windows only")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="experiment mode: worker processes replaying windows (default: the cores "
                        "available, serial for a small replay; 1 = serial); results do not depend on it")
    p.add_argument("--linear", action="store_true",
                   help="cost model without the attention term (the published reference table)")
    p.add_argument("--closed-loop", action="store_true",
                   help="trace mode: replay conversation sessions closed-loop (turn k+1 is sent when "
                        "turn k finishes plus a think time, and starts with turn k's prompt and "
                        "output blocks); sessions come from the trace's session_id/turn columns, "
                        "else are inferred from chained prefixes")
    p.add_argument("--think-s", type=float, default=None, metavar="SECONDS",
                   help="with --closed-loop: exponential think time of this mean, seeded by --seed "
                        "(default: the trace's gap between consecutive turns)")
    p.add_argument("--events", type=Path, default=None, metavar="FILE",
                   help="trace mode: YAML list of cluster events {t_s, action: add|fail|drain, "
                        "replica}: add a cold replica, fail one (cache and requests lost, requests "
                        "retried elsewhere) or drain one (no new requests)")
    p.add_argument("--kv-admission", default="reserve", choices=("reserve", "paged"),
                   help="trace mode: reserve (default) = KV for prompt + output reserved at admission, "
                        "no preemption; paged = blocks allocated as decode grows, the newest running "
                        "request preempted and recomputed when KV runs out (vLLM)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_wide_option(p)
    p.add_argument("--out", type=Path, help="write the per-request table (parquet)")
    p.add_argument("--overwrite", action="store_true", help="allow --out to replace an existing file")
    p.set_defaults(func=run)


def _router(policy: str, params: list[str], routers: int = 1, assign: str = "round_robin",
            sync_s: float = 0.0, trace=None):
    from ..routers import parse_router_params, policy_class
    from ..routers.instances import RouterInstances, trace_session_ids

    cls = policy_class(policy)
    kwargs = parse_router_params(cls, params)
    if routers == 1 and sync_s == 0.0:
        return cls(**kwargs)
    sessions = trace_session_ids(trace) if (assign == "session" and trace is not None) else None
    return RouterInstances.of_policy(cls, kwargs, routers, assign, sync_s, sessions)


def _production_flags_used(args) -> list[str]:
    used = []
    if args.routers != 1:
        used.append("--routers")
    if args.router_sync_s:
        used.append("--router-sync-s")
    if args.kv_event_lag_s:
        used.append("--kv-event-lag-s")
    if args.load_lag_s:
        used.append("--load-lag-s")
    return used


def _write_parquet(df, out: Path, overwrite: bool) -> None:
    """Write ``df`` to ``out`` atomically; refuse a directory, and an existing file without
    ``overwrite``."""
    _check_out(out, overwrite)
    atomic_write_bytes(out, df.to_parquet(index=False))


def _check_out(out: Path, overwrite: bool) -> None:
    """The checks of :func:`_write_parquet`, run before a long replay as well as before writing."""
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file name such as {out / 'requests.parquet'}")
    from ..manifest import enclosing_dataset

    ds = enclosing_dataset(out)
    if ds is not None:
        raise ConfigError(f"--out {out}: is inside the Bursted dataset {ds}; a file there would break "
                          "it (choose a path outside it)")
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; pass --overwrite to replace it")


#: Columns of the dataset-mode table (``--wide``: all of them; ``--json``: every metric).
DATASET_TABLE = ["setup", "scheduler", "policy", "dataset", "requests", "ttft_mean_s", "ttft_p50_s",
                 "ttft_p95_s", "ttft_p99_s", "speedup_vs_cache_aware", "rdma_copies", "copies_unused",
                 "recomputed_prefill_tokens"]
#: What the dataset-mode table hides, in this order, to fit 120 columns.
DATASET_HIDE = ("recomputed_prefill_tokens", "ttft_p50_s", "ttft_p99_s", "requests")


def _run_dataset(args) -> int:
    """``btb replay --dataset DIR ...``: the experiment of :mod:`btb_core.experiment`."""
    from ..experiment import run_experiment
    from ..routers import parse_router_params, policy_class, router_params

    from ..sim.schedulers import SCHEDULERS

    schedulers = tuple(SCHEDULERS) if args.scheduler == "both" else (args.scheduler,)
    params = {}
    if args.router_param:
        used = set()
        for p in args.policy:
            cls = policy_class(p)
            names = {rp.name for rp in router_params(cls)}
            mine = [kv for kv in args.router_param
                    if kv.split("=", 1)[0].strip().replace("-", "_") in names]
            used.update(mine)
            params[p] = parse_router_params(cls, mine)
        unused = [kv for kv in args.router_param if kv not in used]
        if unused:
            raise ConfigError(f"--router-param {unused[0]!r} is not a parameter of any of the policies "
                              f"{', '.join(args.policy)}")
    if args.out is not None:
        _check_out(args.out, args.overwrite)     # before the replay, not after it
    res = run_experiment(args.dataset, args.split, tuple(args.policy), tuple(args.setup), schedulers,
                         replicas=args.replicas, seed=args.seed, router_params=params,
                         max_windows=args.max_windows, continuous=args.continuous,
                         workers=args.workers, progress=False if args.json else None,  # None: a tty
                         attention=not args.linear)
    if args.out is not None:
        _write_parquet(res.requests, args.out, args.overwrite)
    if len(res.results) and "normal" not in set(res.results.get("dataset", ())):
        print(f"btb replay: note: split {args.split!r} has no normal window among those replayed: "
              f"every row is 'bursted' (all windows), none 'normal'", file=sys.stderr)
    if args.json:
        payload = {"results": jsonable(res.results.to_dict("records"))}
        if "continuous" in res.info:     # --continuous: the back-to-back run's rows too
            payload["continuous"] = jsonable(res.info["continuous"].to_dict("records"))
        print(json.dumps(payload, indent=2))
    else:
        main = [c for c in DATASET_TABLE if c in res.results]
        table = res.results if args.wide else res.results[main]
        print(render(table, wide=args.wide, group=("setup", "scheduler"), drop=DATASET_HIDE,
                     float_format="%.3f", floats=measured_floats(table)))
        if not args.wide and (note := more_columns_note(res.results.columns, main)):
            print(note)
        if "continuous" in res.info:
            print("\ncontinuous run:")
            print(render(res.info["continuous"][["setup", "scheduler", "policy", "ttft_mean_s",
                                                 "ttft_p95_s"]],
                         wide=args.wide, group=("setup", "scheduler"), float_format="%.3f",
                         floats=("ttft_mean_s", "ttft_p95_s")))
    return 0


def _check_session_args(args) -> None:
    if args.think_s is not None and not args.closed_loop:
        raise ConfigError("--think-s needs --closed-loop")
    if args.think_s is not None and not (args.think_s >= 0 and args.think_s != float("inf")):
        raise ConfigError(f"--think-s {args.think_s}: must be a number >= 0 (seconds)")
    if args.events is not None and args.dataset is not None:
        raise ConfigError("--events applies to one continuous run; use it with --trace, not --dataset")
    if args.block_tokens is not None and args.dataset is not None:
        raise ConfigError("--block-tokens is for --trace; a Bursted dataset records its own block size")
    if args.block_tokens is not None and args.block_tokens < 1:
        raise ConfigError(f"--block-tokens {args.block_tokens}: must be >= 1 tokens")
    if args.events is not None and "sglang_gateway" in (args.policy or []):
        raise ConfigError("--events: the real gateway (sglang_gateway) routes over a fixed set of "
                          "workers; cluster events are not supported with it")
    if args.kv_admission != "reserve" and args.dataset is not None:
        raise ConfigError(f"--kv-admission {args.kv_admission} is for --trace mode; dataset mode "
                          "replays with reserve admission")
    if args.closed_loop and args.dataset is not None:
        raise ConfigError("--closed-loop replays one trace's sessions; use it with --trace, not --dataset")


def _session_plan(trace, quiet: bool):
    from ..sessions import infer_sessions, plan_sessions

    if "session_id" not in trace.table.columns:
        trace = infer_sessions(trace)
        if not quiet:
            print(f"{trace.name}: no session_id column; sessions inferred from chained prefixes "
                  f"({trace.table['session_id'].nunique()} sessions)", file=sys.stderr)
    return plan_sessions(trace)


def run(args) -> int:
    _check_session_args(args)
    from ..sim.cluster import MAX_REPLICAS
    if not 1 <= args.replicas <= MAX_REPLICAS:
        raise ConfigError(f"--replicas {args.replicas}: must be an integer in [1, {MAX_REPLICAS:,}]")
    if args.max_windows is not None and args.max_windows < 1:
        raise ConfigError(f"--max-windows {args.max_windows}: must be >= 1 (omit it for every window)")
    if args.workers is not None:
        if args.dataset is None:
            raise ConfigError("--workers is for --dataset mode (windows replayed in parallel)")
        if args.workers < 1:
            raise ConfigError(f"--workers {args.workers}: must be >= 1 (1 = serial; omit it for the "
                              "cores available)")
    if args.dataset is not None:
        used = _production_flags_used(args)
        if used:
            raise ConfigError(f"{used[0]} is for --trace mode (one continuous run); replay a window "
                              "of the dataset with --trace instead")
        return _run_dataset(args)
    if len(args.policy) > 1 or len(args.setup) > 1:
        return _run_trace_many(args)
    if args.scheduler == "both":
        raise ConfigError("--scheduler both is for --dataset mode; use prefill_first or chunked")
    from ..sim import ClusterConfig, simulate
    from ..trace import load_trace

    if args.out is not None:
        _check_out(args.out, args.overwrite)     # before the replay, not after it
    trace = load_trace(args.trace, block_tokens=args.block_tokens)
    trace.require_prefix_info("replay (prefix caching and routing)")
    if getattr(trace, "group_column", None):
        n = trace.table[trace.group_column].nunique()
        where = args.trace if args.trace.is_dir() else args.trace.parent
        raise ConfigError(f"{args.trace} holds {n} windows ({trace.group_column}), each with its own "
                          f"clock; replay it window by window with --dataset {where}")
    cluster = ClusterConfig.from_setup(args.setup[0], num_replicas=args.replicas, scheduler=args.scheduler,
                                       attention=not args.linear, kv_admission=args.kv_admission)
    router = _router(args.policy[0], args.router_param, args.routers, args.router_assign,
                     args.router_sync_s, trace)
    progress = (not args.json) and sys.stderr.isatty()
    events = None
    if args.events is not None:
        from ..sim import check_events, load_events

        loaded = load_events(args.events)
        try:
            events = check_events(loaded, args.replicas)
        except ConfigError as exc:     # name the file, as load_events' own errors do
            raise ConfigError(f"{args.events}: {exc} (events counted in time order)") from None
    plan = _session_plan(trace, args.json) if args.closed_loop else None
    result = simulate(plan.trace if plan is not None else trace, router, cluster, seed=args.seed,
                      progress=progress, kv_event_lag_s=args.kv_event_lag_s,
                      load_lag_s=args.load_lag_s, sessions=plan,
                      think_s=args.think_s if plan is not None else None, events=events)
    metrics = {"trace": str(args.trace), "policy": args.policy[0], "setup": args.setup[0],
               "replicas": args.replicas, "scheduler": args.scheduler, "seed": args.seed,
               "routers": args.routers, "router_assign": args.router_assign,
               "router_sync_s": args.router_sync_s, "kv_event_lag_s": args.kv_event_lag_s,
               "load_lag_s": args.load_lag_s,
               **({"kv_admission": args.kv_admission} if args.kv_admission != "reserve" else {}),
               **({"events": str(args.events)} if events is not None else {}),
               **({"closed_loop": True, "think_s": args.think_s if args.think_s is not None else "trace gap"}
                  if plan is not None else {}),
               **result.metrics}
    if args.out is not None:
        _write_parquet(result.requests, args.out, args.overwrite)
    if args.json:
        print(json.dumps(jsonable(metrics), indent=2))
    else:
        width = max(len(k) for k in metrics)
        for k, v in metrics.items():
            text = f"{v:.3f}" if isinstance(v, float) else str(v)   # as the tables print floats
            print(f"{k:<{width}}  {text}")
        if args.out is not None:
            print(f"per-request table written to {args.out}")
    return 0


def _params_by_policy(policies, router_param: list[str]) -> dict[str, list[str]]:
    """``--router-param`` entries split by the policy that has each parameter (ConfigError for an
    entry no policy takes)."""
    from ..routers import policy_class, router_params

    out, used = {}, set()
    for p in policies:
        names = {rp.name for rp in router_params(policy_class(p))}
        out[p] = [kv for kv in router_param if kv.split("=", 1)[0].strip().replace("-", "_") in names]
        used.update(out[p])
    unused = [kv for kv in router_param if kv not in used]
    if unused:
        raise ConfigError(f"--router-param {unused[0]!r} is not a parameter of any of the policies "
                          f"{', '.join(policies)}")
    return out


#: Columns of the several-policies table (--wide: every metric; --json: every field).
TRACE_TABLE = ["setup", "policy", "requests", "ttft_mean_s", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
               "hit_fraction", "rdma_copies", "copies_unused"]
#: What that table hides, in this order, if it is still wider than 120 columns.
TRACE_HIDE = ("ttft_p50_s", "ttft_p99_s", "requests")


def _run_trace_many(args) -> int:
    """``--trace`` with several ``--policy`` / ``--setup``: one run of the trace per (setup, policy),
    each on a fresh cluster; a table (or a JSON list) with one row per run."""
    import pandas as pd

    if args.scheduler == "both":
        raise ConfigError("--scheduler both is for --dataset mode; use prefill_first or chunked")
    if args.out is not None:
        raise ConfigError("--out writes one run's requests: give one --policy and one --setup with it")
    if args.closed_loop or args.routers != 1 or args.router_sync_s or args.kv_event_lag_s \
            or args.load_lag_s:
        raise ConfigError("--closed-loop, --routers and the lag options take one --policy and one "
                          "--setup")
    from ..experiment import check_names
    from ..sim import ClusterConfig, simulate
    from ..trace import load_trace

    check_names(policies=args.policy, setups=args.setup)
    params = _params_by_policy(args.policy, args.router_param)
    trace = load_trace(args.trace, block_tokens=args.block_tokens)
    trace.require_prefix_info("replay (prefix caching and routing)")
    if getattr(trace, "group_column", None):
        where = args.trace if args.trace.is_dir() else args.trace.parent
        raise ConfigError(f"{args.trace} holds several windows, each with its own clock; replay it "
                          f"window by window with --dataset {where}")
    rows = []
    for setup in args.setup:
        cluster = ClusterConfig.from_setup(setup, num_replicas=args.replicas, scheduler=args.scheduler,
                                           attention=not args.linear, kv_admission=args.kv_admission)
        for policy in args.policy:
            result = simulate(trace, _router(policy, params[policy]), cluster, seed=args.seed,
                              progress=False)
            rows.append({"trace": str(args.trace), "policy": policy, "setup": setup,
                         "replicas": args.replicas, "scheduler": args.scheduler, "seed": args.seed,
                         **result.metrics})
    if args.json:
        print(json.dumps(jsonable(rows), indent=2))
    else:
        df = pd.DataFrame(rows)
        print(f"{args.trace}: {args.replicas} replicas, {args.scheduler}, seed {args.seed}")
        if args.wide:
            main = [c for c in TRACE_TABLE if c in df]    # the default table's order, then the rest
            cols = main + [c for c in df.columns
                           if c not in main and c not in ("trace", "replicas", "scheduler", "seed")]
        else:
            cols = [c for c in TRACE_TABLE if c in df]
        print(render(df[cols], wide=args.wide, constant=("setup",), drop=TRACE_HIDE,
                     float_format="%.3f", floats=measured_floats(df[cols])))
        if not args.wide and (note := more_columns_note(
                [c for c in df.columns if c not in ("trace", "replicas", "scheduler", "seed")], cols)):
            print(note)
    return 0
