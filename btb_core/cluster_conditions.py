"""Engines and clients as production runs them (issue 12): closed-loop sessions, paged admission
with preemption, and cluster events, each compared across routing policies.

Small drivers behind notebooks 03 and 04; the mechanics live in the simulator
(:func:`btb_core.sim.simulate` with ``sessions=``, ``events=``, ``ClusterConfig.kv_admission``)
and :mod:`btb_core.sessions`.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from .routers import make_router
from .sessions import infer_sessions, plan_sessions, session_table
from .sim import ClusterConfig, simulate
from .sim.metrics import session_metrics

#: Run metrics the comparison tables keep, in order.
_KEEP = ("requests", "ttft_mean_s", "ttft_p95_s", "e2e_mean_s", "hit_fraction", "makespan_s")


def session_comparison(trace, policies, cluster: ClusterConfig, think_s: float | None = None,
                       seed: int = 0) -> pd.DataFrame:
    """Each policy replayed open-loop (trace arrivals) and closed-loop (sessions) on ``trace``.

    Parameters
    ----------
    trace : btb_core.trace.Trace
        With or without ``session_id`` (inferred from chained prefixes if missing).
    policies : sequence of str
    cluster : ClusterConfig
    think_s : float, optional
        Closed loop: exponential think time of this mean (default: the trace's gaps).
    seed : int

    Returns
    -------
    pandas.DataFrame
        One row per (policy, loop): ``policy``, ``loop`` ("open" / "closed"), the run metrics
        ``requests, ttft_mean_s, ttft_p95_s, e2e_mean_s, hit_fraction, makespan_s`` and the
        per-session ones (``sessions``, ``session_duration_mean_s``, ``session_ttft_mean_s``,
        ``session_output_tokens_per_s_mean``, ...). Both loops replay the same planned prompts
        (:func:`btb_core.sessions.plan_sessions`), so they differ only in timing and in the output
        blocks a finished turn leaves cached.
    """
    if "session_id" not in trace.table.columns:
        trace = infer_sessions(trace)
    plan = plan_sessions(trace)
    rows = []
    for policy in policies:
        for loop in ("open", "closed"):
            kw = {"sessions": plan, "think_s": think_s} if loop == "closed" else {}
            res = simulate(plan.trace, make_router(policy), cluster, seed=seed, **kw)
            row = {"policy": policy, "loop": loop, **{k: res.metrics[k] for k in _KEEP}}
            if loop == "open":
                req = res.requests.assign(session_id=plan.session, turn=plan.turn)
                row.update(session_metrics(session_table(req)))
            else:
                row.update({k: v for k, v in res.metrics.items() if k.startswith("session")})
            rows.append(row)
    return pd.DataFrame(rows)


def admission_comparison(trace, policies, cluster: ClusterConfig, seed: int = 0) -> pd.DataFrame:
    """Each policy under ``reserve`` and ``paged`` KV admission on ``trace``.

    Returns
    -------
    pandas.DataFrame
        One row per (policy, kv_admission): the run metrics of :data:`_KEEP` plus
        ``queue_wait_mean_s``, ``preemptions``, ``preempted_kv_tokens`` and
        ``preemption_recomputed_tokens`` (0 under ``reserve``).
    """
    rows = []
    for policy in policies:
        for adm in ("reserve", "paged"):
            res = simulate(trace, make_router(policy), dataclasses.replace(cluster, kv_admission=adm), seed=seed)
            m = res.metrics
            rows.append({"policy": policy, "kv_admission": adm, **{k: m[k] for k in _KEEP},
                         "queue_wait_mean_s": m["queue_wait_mean_s"],
                         "preemptions": m.get("preemptions", 0),
                         "preempted_kv_tokens": m.get("preempted_kv_tokens", 0),
                         "preemption_recomputed_tokens": m.get("preemption_recomputed_tokens", 0)})
    return pd.DataFrame(rows)


def event_runs(trace, policies, cluster: ClusterConfig, events, seed: int = 0, **router_params) -> dict:
    """``{policy: SimResult}`` of ``trace`` replayed with cluster ``events`` (router parameters
    apply to the policies that take them)."""
    from .routers import policy_class, router_params as params_of

    out = {}
    for policy in policies:
        names = {p.name for p in params_of(policy_class(policy))}
        kw = {k: v for k, v in router_params.items() if k in names}
        out[policy] = simulate(trace, make_router(policy, **kw), cluster, seed=seed, events=events)
    return out


def event_summary(results: dict, events) -> pd.DataFrame:
    """Per policy: TTFT, retries, and what the replicas added by ``events`` received.

    Columns: ``policy``, ``ttft_mean_s``, ``ttft_p95_s``, ``retries``, ``added_replicas``,
    ``requests_on_added`` (requests that finished on an added replica), ``first_request_on_added_s``
    (earliest arrival among them), ``copies_to_added`` (RDMA copies that landed on one) and
    ``first_copy_to_added_s`` (when the first landed).
    """
    added = [e.replica for e in events if e.action == "add"]
    rows = []
    for policy, res in results.items():
        req, tr = res.requests, res.transfers
        on_added = req[req["replica"].isin(added)]
        copies = tr[tr["dst"].isin(added) & (tr["landed_blocks"] > 0)] if len(tr) else tr
        rows.append({"policy": policy, "ttft_mean_s": res.metrics["ttft_mean_s"],
                     "ttft_p95_s": res.metrics["ttft_p95_s"], "retries": res.metrics["retries"],
                     "added_replicas": len(added), "requests_on_added": int(len(on_added)),
                     "first_request_on_added_s": float(on_added["arrival_s"].min()) if len(on_added) else None,
                     "copies_to_added": int(len(copies)),
                     "first_copy_to_added_s": float(copies["end_s"].min()) if len(copies) else None})
    return pd.DataFrame(rows)


def event_timeline(results: dict, bin_s: float = 0.5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Long tables for :func:`btb_core.plots.production.event_timeline_chart`: per-replica queue
    lengths per bin (``time_s, replica, queue_length, policy``) and landed copies
    (``policy, dst, end_s, blocks``)."""
    series = pd.concat([r.queue_length_series(bin_s=bin_s).assign(policy=p) for p, r in results.items()],
                       ignore_index=True)
    copies = pd.concat([r.transfers.assign(policy=p) for p, r in results.items()], ignore_index=True)
    if len(copies):
        copies = copies[copies["landed_blocks"] > 0][["policy", "dst", "end_s", "blocks"]]
    else:
        copies = pd.DataFrame(columns=["policy", "dst", "end_s", "blocks"])
    return series, copies


__all__ = ["admission_comparison", "event_runs", "event_summary", "event_timeline",
           "session_comparison"]
