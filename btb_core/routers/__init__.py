"""Routing policies behind one interface, and the name -> class table :data:`POLICIES`."""

from __future__ import annotations

from ..errors import ConfigError
from .base import Router
from .btb import BTBRouter
from .btb_adaptive import BTBAdaptiveRouter
from .cache_aware import CacheAwareRouter
from .gateway.router import SGLangGatewayRouter
from .kv_aware import KvAwareRouter
from .least_load import LeastLoadRouter
from .llm_d import LlmDRouter
from .params import RouterParam, parse_router_params, router_params
from .power_of_two import PowerOfTwoRouter
from .random import RandomRouter
from .round_robin import RoundRobinRouter

#: Policy name -> router class, in the order charts and tables list them. A new policy is one new
#: file plus one line here.
POLICIES: dict[str, type[Router]] = {
    RoundRobinRouter.name: RoundRobinRouter,
    RandomRouter.name: RandomRouter,
    PowerOfTwoRouter.name: PowerOfTwoRouter,
    LeastLoadRouter.name: LeastLoadRouter,
    CacheAwareRouter.name: CacheAwareRouter,
    KvAwareRouter.name: KvAwareRouter,
    LlmDRouter.name: LlmDRouter,
    BTBRouter.name: BTBRouter,
    BTBAdaptiveRouter.name: BTBAdaptiveRouter,
    SGLangGatewayRouter.name: SGLangGatewayRouter,
}


def policy_class(name: str) -> type[Router]:
    """The router class of policy ``name``; ``ConfigError`` names it and lists the valid ones."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; choose from {', '.join(sorted(POLICIES))}") from None


def make_router(name: str, **params) -> Router:
    """Instantiate the policy ``name`` with constructor ``params`` (see :func:`policy_class`)."""
    return policy_class(name)(**params)


def __getattr__(name: str):
    if name == "ClusterView":  # the simulator's view class, imported on demand (routers stay sim-free)
        from ..sim.view import ClusterView

        return ClusterView
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["POLICIES", "ClusterView", "Router", "RouterParam", "make_router", "policy_class",
           "parse_router_params", "router_params"]
