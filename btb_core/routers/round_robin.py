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
        n = self.view.num_replicas
        replica = self._next
        cands = self.candidates()
        if len(cands) != n:   # cluster events: the next routable replica, cyclically
            replica = next((c for c in cands if c >= replica), cands[0])
        self._next = (replica + 1) % n
        return replica
