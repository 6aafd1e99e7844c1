"""KV-aware routing as in the NVIDIA Dynamo KV router.

Reference: ``lib/llm/src/kv_router/scheduler.rs`` (ai-dynamo/dynamo @ db19bd2a),
``DefaultWorkerSelector::select_worker`` and ``softmax_sample``. For each worker ``w`` and a request
of ``isl`` tokens in ``ceil(isl / block)`` blocks:

- ``overlap_w`` = leading request blocks cached on ``w`` (the KV-event indexer; here
  ``view.cached_blocks`` over ``overlap_tiers``, default device HBM only, as the default indexer
  sees GPU blocks);
- ``prefill_blocks_w = (active prefill tokens on w + isl - overlap_w * block) / block``, where the
  active prefill tokens are the router's own book, as in Dynamo's ``ActiveSequences``: each request
  it dispatched adds ``isl - overlap * block`` for the worker it went to (``add_request`` with its
  ``overlap_blocks``) and removes it when its prefill completes (``mark_prefill_completed``), so a
  queued request that will hit a cached prefix costs only its uncached tokens
  (``lib/llm/src/kv_router/sequence.rs``, ``scheduler.rs``);
- ``decode_blocks_w = active blocks on w + request blocks - overlap_w`` (blocks the request would
  add);
- ``logit_w = overlap_score_weight * prefill_blocks_w + decode_blocks_w`` (lower is better;
  ``overlap_score_weight`` default 1.0, ``--kv-overlap-score-weight`` in the Dynamo docs).

Temperature 0 (``--router-temperature`` default 0.0) takes the minimum logit and breaks ties
uniformly at random; ``T > 0`` samples from ``softmax(-logit / ((max - min) * T))`` (logits
normalised by their range; uniform when all are equal). Random draws come from ``view.rng``.
"""

from __future__ import annotations

import math

import numpy as np

from .base import Router
from .cache_aware import parse_tiers
from .params import RouterParam, check_range


class KvAwareRouter(Router):
    """NVIDIA Dynamo KV router cost function (see the module docstring).

    Parameters
    ----------
    overlap_score_weight : float >= 0
        Weight of the prefill term (1.0, Dynamo ``KvRouterConfig`` default).
    router_temperature : float >= 0
        0 = argmin with seeded random ties; > 0 = softmax sampling (0.0, Dynamo default).
    overlap_tiers : str
        Comma list of cache tiers whose blocks count as overlap (default ``"hbm"``).

    Raises
    ------
    ConfigError
        On a negative weight or temperature, or an unknown tier.
    """

    name = "kv_aware"
    PARAMS = (
        RouterParam("overlap_score_weight", float, 1.0, "weight of the prefill-blocks term"),
        RouterParam("router_temperature", float, 0.0, "0 = argmin, > 0 = softmax sampling"),
        RouterParam("overlap_tiers", str, "hbm", "cache tiers counted as overlap"),
    )

    def __init__(self, overlap_score_weight: float = 1.0, router_temperature: float = 0.0,
                 overlap_tiers: str = "hbm") -> None:
        check_range(self.name, "overlap_score_weight", overlap_score_weight, 0.0)
        check_range(self.name, "router_temperature", router_temperature, 0.0)
        self.overlap_score_weight = float(overlap_score_weight)
        self.router_temperature = float(router_temperature)
        self.overlap_tiers = parse_tiers(overlap_tiers, self.name, "overlap_tiers")

    def reset(self, view) -> None:
        super().reset(view)
        self._prefill_tokens = [0] * view.num_replicas   # the router's book of uncached prompt tokens
        self._booked: dict[int, tuple[int, int]] = {}     # request index -> (replica, tokens booked)

    def _costs(self, request) -> tuple[list[float], list[int]]:
        """Per-replica logits (blocks, lower is better) and uncached prompt tokens."""
        v = self.view
        bt = request.block_tokens
        isl = int(request.input_length)
        ids = request.hash_ids
        req_blocks = math.ceil(isl / bt)
        w = self.overlap_score_weight
        logits, uncached = [], []
        for r in range(v.num_replicas):
            overlap = min(v.cached_blocks(r, ids, self.overlap_tiers), req_blocks)
            u = max(0, isl - overlap * bt)
            prefill_blocks = (self._prefill_tokens[r] + u) / bt
            decode_blocks = v.active_blocks(r) + (req_blocks - overlap)
            logits.append(w * prefill_blocks + decode_blocks)
            uncached.append(u)
        return logits, uncached

    def logits(self, request) -> np.ndarray:
        """Per-replica cost, shape ``(num_replicas,)``, in blocks (lower is better)."""
        return np.array(self._costs(request)[0])

    def on_prefill_done(self, request, replica: int) -> None:
        booked = self._booked.pop(request.index, None)
        if booked is not None:
            self._prefill_tokens[booked[0]] -= booked[1]

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """Dynamo's softmax over range-normalised negated logits at ``router_temperature > 0``."""
        lo, hi = float(logits.min()), float(logits.max())
        if hi == lo:
            return np.full(len(logits), 1.0 / len(logits))
        scaled = -(logits - lo) / ((hi - lo) * self.router_temperature)
        p = np.exp(scaled - scaled.max())
        return p / p.sum()

    def route(self, request) -> int:
        logits, uncached = self._costs(request)
        rng = self.view.rng
        if self.router_temperature == 0.0:
            lo = min(logits)
            tied = [r for r, x in enumerate(logits) if x == lo]
            pick = tied[0] if len(tied) == 1 else tied[int(rng.integers(len(tied)))]
        else:
            p = self.probabilities(np.array(logits))
            u = rng.random()
            pick = int(min(np.searchsorted(np.cumsum(p), u, side="left"), len(p) - 1))
        # book the request's uncached tokens on its worker until its prefill completes
        self._prefill_tokens[pick] += uncached[pick]
        self._booked[request.index] = (pick, uncached[pick])
        return pick


__all__ = ["KvAwareRouter"]
