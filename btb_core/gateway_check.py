"""Does our ``cache_aware`` decide what the real SGLang Model Gateway decides? (``btb gateway-check``)

Two simulations of the same trace on the same cluster:

* **cache_aware**: the product's re-implementation (``btb_core.routers.cache_aware``), with tree
  eviction off (``eviction_interval_s=0``) because the adapter pins the gateway's eviction off;
* **gateway**: ``sglang_gateway``, the real gateway deciding every arrival. During this run each
  cache_aware variant also runs in *shadow*: at every arrival it is asked for its choice first,
  then told where the gateway actually sent the request (tree insert and load), so it always sees
  the gateway run's history.

Two agreements per variant:

* ``step_agreement``: fraction of arrivals where the shadow's choice equals the gateway's, given the
  same history. This isolates the rule: a difference here is a different decision in the same
  state, and the table of disagreements by the shadow's branch (imbalanced / hit / miss) says where;
* ``replay_agreement``: fraction of requests sent to the same replica in the two independent runs.
  One early difference changes the loads and trees after it, so this one compounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .routers import make_router
from .routers.base import Router

_TTFT_KEYS = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p95_s", "ttft_p99_s")


class _Shadowed(Router):
    """The gateway router, with cache_aware routers asked first and then told the gateway's choice."""

    name = "sglang_gateway"

    def __init__(self, gateway, shadows: dict) -> None:
        self.gateway = gateway
        self.shadows = shadows
        self.log: list = []   # (request index, gateway replica, {variant: (choice, branch)})

    def reset(self, view) -> None:
        super().reset(view)
        for s in self.shadows.values():
            s.reset(view)
        self.gateway.reset(view)
        self.log = []

    def route(self, request) -> int:
        picks = {}
        for key, s in self.shadows.items():
            before = dict(s.decisions)
            choice = s.choose(request)
            branch = next(b for b in before if s.decisions[b] != before[b])
            picks[key] = (choice, branch)
        r = self.gateway.route(request)
        for s in self.shadows.values():
            s.record(request, r)
        self.log.append((request.index, r, picks))
        return r

    def on_request_finished(self, request, replica: int) -> None:
        for s in self.shadows.values():
            s.on_request_finished(request, replica)
        self.gateway.on_request_finished(request, replica)

    def close(self) -> None:
        self.gateway.close()


@dataclass
class GatewayCheck:
    """Result of :func:`gateway_check`.

    Attributes
    ----------
    summary : pandas.DataFrame
        One row per cache_aware variant: ``variant``, ``requests``, ``step_agreement``,
        ``replay_agreement``, ``step_disagree_{imbalanced,hit,miss}`` (counts by the shadow's
        branch).
    replicas : pandas.DataFrame
        Requests per replica: column ``replica`` and one column per run (``gateway`` and each
        variant).
    ttft : pandas.DataFrame
        One row per run with ``run`` and ``ttft_{mean,p50,p90,p95,p99}_s`` (seconds).
    decisions : pandas.DataFrame
        Per request: ``request_id``, ``arrival_s``, ``gateway`` (replica in the gateway run) and for
        each variant ``<variant>`` (its replica in its own run), ``<variant>_shadow`` and
        ``<variant>_branch`` (its choice and branch in the gateway run's state).
    """

    summary: pd.DataFrame
    replicas: pd.DataFrame
    ttft: pd.DataFrame
    decisions: pd.DataFrame
    info: dict = field(default_factory=dict)


def _variant_name(params: dict) -> str:
    if not params:
        return "cache_aware"
    return "cache_aware[" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + "]"


def gateway_check(trace, cluster, seed: int = 0, gateway_params: dict | None = None,
                  variants: list[dict] | None = None, progress: bool = False) -> GatewayCheck:
    """Run the real gateway and our ``cache_aware`` on ``trace`` and compare (module docstring).

    Parameters
    ----------
    trace : btb_core.trace.Trace
    cluster : btb_core.sim.ClusterConfig
    seed : int
    gateway_params : dict, optional
        ``SGLangGatewayRouter`` keyword arguments (``gateway_policy``, thresholds, ...). Its
        thresholds are also given to every cache_aware variant unless the variant sets its own.
    variants : list of dict, optional
        cache_aware keyword arguments per variant; default: the product default and
        ``tie_break="first_holder"``.
    progress : bool

    Returns
    -------
    GatewayCheck

    Raises
    ------
    GatewayError
        If the gateway is missing or does not come up.
    """
    from .sim import simulate

    gateway_params = dict(gateway_params or {})
    if variants is None:
        variants = [{}, {"tie_break": "first_holder"}]
    shared = {k: gateway_params[k] for k in ("cache_threshold", "balance_abs_threshold",
                                             "balance_rel_threshold") if k in gateway_params}
    names = [_variant_name(v) for v in variants]

    def ca(v):
        return make_router("cache_aware", **{"eviction_interval_s": 0.0, **shared, **v})

    shadow = _Shadowed(make_router("sglang_gateway", **gateway_params),
                       {n: ca(v) for n, v in zip(names, variants)})
    gw = simulate(trace, shadow, cluster, seed=seed, progress=progress)
    runs = {"gateway": gw}
    for n, v in zip(names, variants):
        runs[n] = simulate(trace, ca(v), cluster, seed=seed, progress=progress)

    req = gw.requests
    dec = pd.DataFrame({"request_id": req["request_id"], "arrival_s": req["arrival_s"],
                        "gateway": req["replica"].to_numpy()})
    order = {idx: k for k, (idx, _, _) in enumerate(shadow.log)}
    pos = np.array([order[i] for i in range(len(req))])
    rows = []
    for n in names:
        dec[n] = runs[n].requests["replica"].to_numpy()
        dec[n + "_shadow"] = [shadow.log[p][2][n][0] for p in pos]
        dec[n + "_branch"] = [shadow.log[p][2][n][1] for p in pos]
        agree = dec[n + "_shadow"] == dec["gateway"]
        row = {"variant": n, "requests": len(dec),
               "step_agreement": float(agree.mean()) if len(dec) else 1.0,
               "replay_agreement": float((dec[n] == dec["gateway"]).mean()) if len(dec) else 1.0}
        for b in ("imbalanced", "hit", "miss"):
            row[f"step_disagree_{b}"] = int((~agree & (dec[n + "_branch"] == b)).sum())
        rows.append(row)
    replicas = pd.DataFrame({"replica": range(cluster.num_replicas)})
    for key, res in runs.items():
        counts = res.requests["replica"].value_counts()
        replicas[key] = [int(counts.get(r, 0)) for r in range(cluster.num_replicas)]
    ttft = pd.DataFrame([{"run": key, **{k: res.metrics[k] for k in _TTFT_KEYS}}
                         for key, res in runs.items()])
    return GatewayCheck(pd.DataFrame(rows), replicas, ttft, dec,
                        {"gateway_params": gateway_params, "variants": variants})


__all__ = ["GatewayCheck", "gateway_check"]
