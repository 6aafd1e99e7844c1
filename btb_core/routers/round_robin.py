"""Round-robin: replicas in turn, ignoring load and cache (SGLang ``round_robin`` policy)."""

from __future__ import annotations

from .base import Router


class RoundRobinRouter(Router):
    """Send the i-th request to replica ``i mod num_replicas``."""

    name = "round_robin"

    def reset(self, view) -> None:
        super().reset(view)
        self._next = 0

    def route(self, request) -> int:
        replica = self._next
        self._next = (self._next + 1) % self.view.num_replicas
        return replica
