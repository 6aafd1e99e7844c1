"""Power of two choices: two distinct random replicas, keep the less loaded.

Reference: ``sgl-model-gateway/src/policies/power_of_two.rs`` (sgl-project/sglang @ 61c660a3): draw
``i`` uniformly, then ``j = (i + 1 + U{0..n-2}) mod n`` so the two differ, and take ``i`` when
``load_i <= load_j`` (ties favour the first draw). Load is the in-flight request count this router
dispatched (the gateway's ``worker.load()`` fallback; it can also use engine-reported token loads,
which this simulator's router does not see).
"""

from __future__ import annotations

from .base import Router
from .least_load import InFlightLoad


class PowerOfTwoRouter(Router):
    """Pick two distinct replicas with ``view.rng`` and route to the one with lower in-flight load.

    With one replica it always returns 0 without drawing.
    """

    name = "power_of_two"
    PARAMS = ()

    def reset(self, view) -> None:
        super().reset(view)
        self.load = InFlightLoad(view.num_replicas)

    def route(self, request) -> int:
        n = self.view.num_replicas
        if n == 1:
            replica = 0
        else:
            rng = self.view.rng
            i = int(rng.integers(n))
            j = (i + 1 + int(rng.integers(n - 1))) % n
            replica = i if self.load.loads[i] <= self.load.loads[j] else j
        self.load.add(request, replica)
        return replica

    def on_request_finished(self, request, replica: int) -> None:
        self.load.finish(request)
