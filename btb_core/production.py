"""What production adds (notebook 03, last section): router instances, stale views, KV-usage limits.

Three experiments on hand-built traces (:mod:`btb_core.scenarios`), each a small grid of runs
summarised into one row per run:

- :func:`instances_table`: one burst through 1 or N gateway instances, with and without index
  sync, round-robin or session-sticky assignment (:mod:`btb_core.routers.instances`);
- :func:`lag_table`: the same burst with KV events arriving 0 / 0.5 / 2 s late
  (:mod:`btb_core.sim.lag`);
- :func:`thresholds_table`: a long-context, long-decode workload where ``cache_aware`` keeps
  sending to a replica whose KV cache is full, with and without SGLang's token-usage thresholds,
  next to ``kv_aware`` (:data:`LONG_CONTEXT`).
"""

from __future__ import annotations

import pandas as pd

from .scenarios import ScenarioSpec

#: The long-context case: 80 requests over 40 s sharing an 8,192-token prefix, each with 8,192
#: tokens of its own and 8,192 output tokens. A request holds ~32 KV blocks of 512 tokens for
#: minutes of decode, so a replica's KV budget (875 blocks for Llama-3.3-70B on 4x H100) fills
#: after ~25 requests while the prefix match (50%) keeps ``cache_aware`` on it.
LONG_CONTEXT = ScenarioSpec("burst", 80, 40.0, 8192, 8192, output_tokens=8192)

#: Token-usage threshold settings compared in :func:`thresholds_table` (upstream default: off).
THRESHOLD_VARIANTS = {
    "off (upstream default)": {},
    "overload 0.9": {"overload_token_usage_threshold": 0.9},
    "balance 0.5": {"balance_token_usage_threshold": 0.5},
}


def production_run(trace, policy: str, cluster, *, routers: int = 1, assign: str = "round_robin",
                   sync_s: float = 0.0, kv_event_lag_s: float = 0.0, load_lag_s: float = 0.0,
                   seed: int = 0, **router_params):
    """Simulate ``trace`` under ``routers`` instances of ``policy`` behind the given lags.

    Returns the :class:`~btb_core.sim.SimResult`; ``result.info["router"]`` is the router (a
    :class:`~btb_core.routers.instances.RouterInstances` when ``routers > 1`` or ``sync_s > 0``).
    """
    from .routers import policy_class
    from .routers.instances import RouterInstances, trace_session_ids
    from .sim import simulate

    cls = policy_class(policy)
    if routers == 1 and sync_s == 0.0:
        router = cls(**router_params)
    else:
        sessions = trace_session_ids(trace) if assign == "session" else None
        router = RouterInstances.of_policy(cls, router_params, routers, assign, sync_s, sessions)
    result = simulate(trace, router, cluster, seed=seed, kv_event_lag_s=kv_event_lag_s,
                      load_lag_s=load_lag_s)
    result.info["router"] = router
    return result


def summary_row(result, **labels) -> dict:
    """One summary row of a run: ``labels`` then TTFT mean / p95 / p99 (s), hit fraction of prompt
    tokens, recomputed prefill tokens, replicas used, copies and duplicate copies (a destination
    warmed more than once)."""
    req = result.requests
    m = result.metrics
    tr = result.transfers
    dup = int(len(tr) - tr["dst"].nunique()) if len(tr) else 0
    return {**labels, "ttft_mean_s": m["ttft_mean_s"], "ttft_p95_s": m["ttft_p95_s"],
            "ttft_p99_s": m["ttft_p99_s"], "hit_fraction": m["hit_fraction"],
            "recomputed_prefill_tokens": m["recomputed_prefill_tokens"],
            "replicas_used": int(req["replica"].nunique()), "copies": int(len(tr)),
            "duplicate_copies": dup}


def instances_table(trace, cluster, policies=("cache_aware", "btb"), counts=(1, 8),
                    sync_s=(0.0, 1.0), assign=("round_robin",), seed: int = 0) -> pd.DataFrame:
    """Every policy x instance count x sync period x assignment; one-instance runs only once.

    Columns: ``policy, variant`` (a label), ``routers, assign, sync_s`` then
    :func:`summary_row`'s.
    """
    rows = []
    for policy in policies:
        for n in counts:
            for a in (assign if n > 1 else assign[:1]):
                for s in (sync_s if n > 1 else (0.0,)):
                    res = production_run(trace, policy, cluster, routers=n, assign=a, sync_s=s,
                                         seed=seed)
                    label = f"{n} instance{'s' if n > 1 else ''}"
                    if n > 1 and a == "session":
                        label += " by session"
                    if n > 1 and s > 0:
                        label += f", sync {s:g} s"
                    rows.append(summary_row(res, policy=policy, variant=label, routers=n,
                                            assign=a, sync_s=s))
    return pd.DataFrame(rows)


def lag_table(trace, cluster, policies=("kv_aware", "btb"), lags_s=(0.0, 0.5, 2.0),
              seed: int = 0) -> pd.DataFrame:
    """Every policy x KV-event lag. Columns: ``policy, variant, kv_event_lag_s`` then
    :func:`summary_row`'s
    plus ``failed_copies`` (BTB copies refused because the stale view named a source that had
    evicted the prefix)."""
    rows = []
    for policy in policies:
        for lag in lags_s:
            res = production_run(trace, policy, cluster, kv_event_lag_s=lag, seed=seed)
            row = summary_row(res, policy=policy, variant=f"KV events {lag:g} s late",
                              kv_event_lag_s=lag)
            row["failed_copies"] = int(getattr(res.info["router"], "failed_copies", 0))
            rows.append(row)
    return pd.DataFrame(rows)


def thresholds_table(trace, cluster, variants=None, reference=("kv_aware",),
                     seed: int = 0) -> pd.DataFrame:
    """``cache_aware`` under each token-usage threshold setting, then the ``reference`` policies.

    Columns: ``policy, variant`` (the setting) then :func:`summary_row`'s.
    """
    variants = THRESHOLD_VARIANTS if variants is None else variants
    rows = []
    for label, params in variants.items():
        res = production_run(trace, "cache_aware", cluster, seed=seed, **params)
        rows.append(summary_row(res, policy="cache_aware", variant=label))
    for policy in reference:
        res = production_run(trace, policy, cluster, seed=seed)
        rows.append(summary_row(res, policy=policy, variant="defaults"))
    return pd.DataFrame(rows)


__all__ = ["LONG_CONTEXT", "THRESHOLD_VARIANTS", "instances_table", "lag_table",
           "production_run", "summary_row", "thresholds_table"]
