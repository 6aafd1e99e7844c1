"""``kv_aware`` and ``llm_d`` against plain references (issue 14): the router's book kept per block run, the
overlaps from the holder index, the logits of replicas holding nothing in one numpy expression,
the tie-breaks in list operations; the reference below computes the module docstring's formula
replica by replica, with a refcount per block id and one ``cached_blocks`` call per replica.
Whole replays must give identical per-request tables, in every rule variant (router or engine
decode load, temperature 0 or not, tie-break, a failed and an added replica, a lagged view).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from btb_core.bursted_shaped import bursted_shaped_trace
from btb_core.routers import Router
from btb_core.routers.kv_aware import KvAwareRouter
from btb_core.routers.llm_d import LlmDRouter
from btb_core.sim import ClusterConfig, simulate
from btb_core.sim.cluster import ClusterEvent


class PlainKvAware(Router):
    """The module docstring of ``btb_core.routers.kv_aware``, one replica at a time."""

    name = "plain_kv_aware"

    def __init__(self, weight=1.0, temperature=0.0, active_blocks="router", tie_break="tree_size",
                 tiers=("hbm",)):
        self.w, self.t, self.mode, self.tie, self.tiers = (weight, temperature, active_blocks,
                                                           tie_break, tiers)

    def reset(self, view):
        super().reset(view)
        n = view.num_replicas
        self.prefill = [0] * n
        self.booked = {}
        self.books = [dict() for _ in range(n)]
        self.active = {}

    def route(self, request):
        v = self.view
        ids = request.hash_ids
        bt, isl = request.block_tokens, request.input_length
        req_blocks = math.ceil(isl / bt)
        full = ids[:request.full_blocks]
        logits, unc = [], []
        for r in range(v.num_replicas):
            overlap = min(v.cached_blocks(r, ids, self.tiers), req_blocks)
            u = max(0, isl - overlap * bt)
            if self.mode == "router":
                depth = 0
                while depth < len(full) and full[depth] in self.books[r]:
                    depth += 1
                decode = len(self.books[r]) + len(full) - depth
            else:
                decode = v.active_blocks(r) + (req_blocks - overlap)
            logits.append(self.w * ((self.prefill[r] + u) / bt) + decode)
            unc.append(u)
        cands = list(v.routable_replicas)
        if self.t == 0.0:
            lo = min(logits[r] for r in cands)
            tied = [r for r in cands if logits[r] == lo]
            if len(tied) > 1 and self.tie == "tree_size":
                sizes = [v.cached_block_count(r) for r in tied]
                tied = [r for r, s in zip(tied, sizes) if s == min(sizes)]
            pick = tied[0] if len(tied) == 1 else tied[int(v.rng.integers(len(tied)))]
        else:
            sub = np.array([logits[r] for r in cands])
            lo, hi = float(sub.min()), float(sub.max())
            if hi == lo:
                p = np.full(len(sub), 1.0 / len(sub))
            else:
                scaled = -(sub - lo) / ((hi - lo) * self.t)
                p = np.exp(scaled - scaled.max())
                p = p / p.sum()
            k = int(min(np.searchsorted(np.cumsum(p), v.rng.random(), side="left"), len(p) - 1))
            pick = cands[k]
        self.prefill[pick] += unc[pick]
        self.booked[request.index] = (pick, unc[pick])
        if self.mode == "router":
            book = self.books[pick]
            for h in full:
                book[h] = book.get(h, 0) + 1
            self.active[request.index] = (pick, full)
        return pick

    def on_prefill_done(self, request, replica):
        r, u = self.booked.pop(request.index, (None, 0))
        if r is not None:
            self.prefill[r] -= u

    def on_request_finished(self, request, replica):
        r, full = self.active.pop(request.index, (None, ()))
        if r is not None:
            book = self.books[r]
            for h in full:
                book[h] -= 1
                if not book[h]:
                    del book[h]

    def on_replica_removed(self, replica, failed):
        if failed:
            self.prefill[replica] = 0
            self.books[replica] = {}
            self.booked = {k: v for k, v in self.booked.items() if v[0] != replica}
            self.active = {k: v for k, v in self.active.items() if v[0] != replica}


CASES = [
    ({}, {}),
    ({"active_blocks": "engine"}, {"active_blocks": "engine"}),
    ({"router_temperature": 0.7}, {"temperature": 0.7}),
    ({"tie_break": "random"}, {"tie_break": "random"}),
    ({"overlap_score_weight": 2.5, "overlap_tiers": "hbm,dram"},
     {"weight": 2.5, "tiers": ("hbm", "dram")}),
]


@pytest.mark.parametrize("replicas", [3, 12, 100])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_kv_aware_replays_equal_the_plain_formula(replicas, case):
    kw, ref_kw = CASES[case]
    trace = bursted_shaped_trace(windows=1).rows(0, 500)
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=replicas)
    fast = simulate(trace, KvAwareRouter(**kw), cluster, seed=5)
    slow = simulate(trace, PlainKvAware(**ref_kw), cluster, seed=5)
    assert fast.requests.equals(slow.requests)


@pytest.mark.parametrize("replicas", [3, 12, 100])
def test_kv_aware_equals_the_plain_formula_with_events_and_lag(replicas):
    """A replica fails and one joins (restricted candidates, a dropped book), on a lagged view."""
    trace = bursted_shaped_trace(windows=1).rows(0, 500)
    t = float(trace.arrival_s[250])
    events = [ClusterEvent(t, "fail", 1), ClusterEvent(t + 5.0, "add", replicas)]
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=replicas)
    for kw, ref_kw in CASES[:3]:
        fast = simulate(trace, KvAwareRouter(**kw), cluster, seed=2, events=events,
                        kv_event_lag_s=0.3)
        slow = simulate(trace, PlainKvAware(**ref_kw), cluster, seed=2, events=events,
                        kv_event_lag_s=0.3)
        assert fast.requests.equals(slow.requests), kw


# -- llm_d: the index kept by pieces against the id-by-id index -----------------------------------
class _BlockByBlockLlmD(LlmDRouter):
    """llm_d as on a view that hands over no pieces: the id tuple, the per-id LRU and holder
    masks, the running-AND match (the rules the pieces path must reproduce)."""

    def reset(self, view):
        super().reset(view)
        self._request_pieces = None
        self._cached_pieces = None
        self._by_pieces = False


@pytest.mark.parametrize("kw", [{}, {"lru_capacity_blocks": 40, "max_prefix_blocks": 30},
                                {"lru_capacity_blocks": 64, "active_request_weight": 1.0},
                                {"prefix_mode": "kv_events"}])
def test_llm_d_by_pieces_replays_equal_block_by_block(kw):
    """Small LRUs (evictions), a capped prefix, a failed and an added replica, a lagged view."""
    trace = bursted_shaped_trace(windows=1).rows(0, 600)
    t = float(trace.arrival_s[300])
    events = [ClusterEvent(t, "fail", 1), ClusterEvent(t + 5.0, "add", 12)]
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=12)
    for lag in (0.0, 0.3):
        fast = simulate(trace, LlmDRouter(**kw), cluster, seed=4, events=events,
                        kv_event_lag_s=lag)
        slow = simulate(trace, _BlockByBlockLlmD(**kw), cluster, seed=4, events=events,
                        kv_event_lag_s=lag)
        assert fast.requests.equals(slow.requests), (kw, lag)
