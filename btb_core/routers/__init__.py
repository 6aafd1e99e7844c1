"""Routing policies behind one interface, and the name -> class table :data:`POLICIES`."""

from __future__ import annotations

from .base import ClusterView, Router
from .round_robin import RoundRobinRouter

#: Policy name -> router class. A new policy is one new file plus one line here.
POLICIES: dict[str, type[Router]] = {
    RoundRobinRouter.name: RoundRobinRouter,
}


def make_router(name: str, **params) -> Router:
    """Instantiate the policy ``name`` with constructor ``params``; ``KeyError`` lists valid names."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None
    return cls(**params)


__all__ = ["POLICIES", "ClusterView", "Router", "make_router"]
