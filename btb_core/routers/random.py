"""Random: a uniformly random replica per request (SGLang ``random`` policy).

Reference: ``sgl-model-gateway/src/policies/random.rs`` (sgl-project/sglang @ 56ec295e) draws one
healthy worker uniformly. Here every replica is healthy and the draw comes from ``view.rng`` (the
run's seeded ``numpy.random.Generator``), so a seed fixes the whole sequence.
"""

from __future__ import annotations

from .base import Router


class RandomRouter(Router):
    """Send each request to ``view.rng.integers(num_replicas)``; no parameters."""

    name = "random"
    PARAMS = ()

    def route(self, request) -> int:
        cands = self.candidates()
        return int(cands[int(self.view.rng.integers(len(cands)))])
