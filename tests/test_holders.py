"""Holder indexes (issue 14): the one-walk answers equal the per-replica scans they replace.

- ``ClusterView.cached_blocks_all`` (the simulator's :class:`btb_core.sim.holders.HolderIndex`, fed
  by the KV caches) against ``cached_blocks`` replica by replica (and ``holding_all_pieces``, the
  replicas holding a whole leading part), after every routing decision of
  random replays with evictions, DRAM spills, copies and stale (lagged) views;
- the routers' own holder sets (:class:`btb_core.routers.holder_sets.BookHolders`, the cache-aware
  tree's holder masks, ``llm_d``'s approximate-index holders) against brute force;
- whole replays of every prefix-aware policy with the index and with the scan give identical
  per-request tables.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btb_core.bursted_shaped import bursted_shaped_trace
from btb_core.cost import cost_model_for_setup
from btb_core.routers import Router, make_router
from btb_core.routers.holder_sets import BookHolders
from btb_core.routers.llm_d import LlmDRouter
from btb_core.routers.prefix_tree import ApproxPrefixIndex
from btb_core.sim import ClusterConfig, simulate
from btb_core.sim.cluster import ClusterEvent
from btb_core.sim import holders
from btb_core.sim.view import ClusterView
from btb_core.trace.runs import tuple_of_pieces
from strategies import family_traces

BT = 64
COST = cost_model_for_setup("70b_h100x4")
TIER_SETS = [("hbm",), ("dram",), ("hbm", "dram"), ("hbm", "dram", "disk")]


class CheckingRouter(Router):
    """Routes at random, copies a prompt's leading blocks now and then (so copies land and evict),
    and before each decision checks ``cached_blocks_all`` against the per-replica scan for the
    prompt and a few of its leading parts, in every tier combination."""

    name = "checking"

    def reset(self, view):
        super().reset(view)
        self.checked = 0

    def route(self, request):
        v = self.view
        ids = request.hash_ids
        starts, lens = v.request_pieces(request)     # the request's own pieces, not its ids
        assert (starts, lens) == v.pieces(ids)
        for cut in {len(ids), max(1, len(ids) // 2), 1}:
            prefix = ids[:cut]
            for tiers in TIER_SETS:
                want = {r: v.cached_blocks(r, prefix, tiers) for r in range(v.num_replicas)}
                want = {r: m for r, m in want.items() if m}
                assert v.cached_blocks_all(prefix, tiers) == want, (request.index, cut, tiers)
                assert v.cached_blocks_all_pieces(starts, lens, cut, tiers) == want, \
                    (request.index, cut, tiers)
                # the replicas holding all ``cut`` blocks (btb's holders of its prefix)
                assert v.holding_all_pieces(starts, lens, cut, tiers) == \
                    sorted(r for r, m in want.items() if m == cut), (request.index, cut, tiers)
                self.checked += 1
        assert v.cached_block_count_all() == [v.cached_block_count(r)
                                              for r in range(v.num_replicas)]
        rng = v.rng
        up = list(v.routable_replicas)
        if request.full_blocks >= 2 and rng.random() < 0.5:
            prefix = ids[:2]
            srcs = [r for r in up if v.cached_blocks(r, prefix) == 2]
            dsts = [r for r in up if srcs and r != srcs[0]]
            if dsts:
                try:
                    v.start_transfer(srcs[0], dsts[0], prefix)
                except ValueError:   # a stale (lagged) view: the source evicted it meanwhile
                    pass
        return up[int(rng.integers(len(up)))]


def traces():
    return family_traces(BT, branches=2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), replicas=st.integers(1, 4), hbm_blocks=st.integers(20, 60),
       dram_blocks=st.integers(0, 30), scheduler=st.sampled_from(["prefill_first", "chunked"]),
       lag=st.sampled_from([0.0, 0.0, 0.3]), seed=st.integers(0, 3))
def test_cached_blocks_all_equals_the_per_replica_scan(trace, replicas, hbm_blocks, dram_blocks,
                                                       scheduler, lag, seed):
    kvb = COST.kv_bytes_per_token * BT
    cluster = ClusterConfig(cost=COST, num_replicas=replicas, scheduler=scheduler, chunk_tokens=256,
                            hbm_kv_capacity_bytes=hbm_blocks * kvb,
                            dram_capacity_bytes=dram_blocks * kvb)
    router = CheckingRouter()
    simulate(trace, router, cluster, seed=seed, kv_event_lag_s=lag)
    assert router.checked >= len(trace) * 4


def test_cached_blocks_all_with_a_disk_tier_and_failures():
    """Disk is not indexed (the scan answers) and a failed replica leaves the index."""
    trace = bursted_shaped_trace(windows=1).rows(0, 300)
    for shared in (False, True):
        cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=3,
                                           disk_capacity_bytes=4e12, disk_shared=shared)
        router = CheckingRouter()
        events = [ClusterEvent(20.0, "fail", 1)]
        simulate(trace, router, cluster, seed=1, events=events)
        assert router.checked > 0


# -- router-side holder sets -----------------------------------------------------------------------
PATHS = [tuple(f"p{j}-{i}" for i in range(k)) for j, k in ((0, 6), (1, 3))]
PATHS += [PATHS[0][:2] + ("q0", "q1"), PATHS[0][:4] + ("r0",), ("s0",)]


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 7), st.integers(0, len(PATHS) - 1),
                              st.integers(1, 6)), max_size=60),
       query=st.integers(0, len(PATHS) - 1), limit=st.integers(0, 7))
def test_book_depths_equal_a_binary_search_per_replica(ops, query, limit):
    book = BookHolders(8)   # more than 4 holders of a block: the bisection on set sizes
    added = []
    for add, r, p, cut in ops:
        ids = PATHS[p][:cut]
        if add or not added:
            book.add(r, ids)
            added.append((r, ids))
        else:
            r0, ids0 = added.pop(r % len(added))
            book.remove(r0, ids0)
    ids = PATHS[query]
    want = {}
    for r, held in enumerate(book.books):
        k = 0
        while k < min(limit, len(ids)) and ids[k] in held:
            k += 1
        if k:
            want[r] = k
    assert book.depths(ids, limit) == want
    for h in book.holders:
        assert book.holder_set(h) == {r for r, held in enumerate(book.books) if h in held}


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, len(PATHS) - 1),
                              st.integers(1, 6), st.booleans()), max_size=40),
       query=st.integers(0, len(PATHS) - 1), allowed=st.integers(1, 15))
def test_tree_deepest_match_is_the_longest_match_over_replicas(ops, query, allowed):
    tree = ApproxPrefixIndex(4)
    for t, (r, p, cut, trim) in enumerate(ops):
        tree.insert(r, PATHS[p][:cut], cut * BT, BT, float(t))
        if trim:
            tree.evict_to(r, 2 * BT)
    ids = PATHS[query]
    best = max([tree.match_blocks(r, ids) for r in range(4) if allowed >> r & 1], default=0)
    assert tree.deepest_match(ids, allowed) == best
    for k in range(1, len(ids) + 1):
        assert tree.root_holders(ids[k - 1]) == [r for r in range(4)
                                                 if tree.match_blocks(r, ids) >= k]


class _FakeView:
    num_replicas = 4
    now_s = 0.0


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, len(PATHS) - 1),
                              st.integers(1, 6)), max_size=40),
       capacity=st.integers(1, 12), query=st.integers(0, len(PATHS) - 1))
def test_llm_d_approx_matches_equal_each_replicas_walk(ops, capacity, query):
    router = LlmDRouter(lru_capacity_blocks=capacity)
    router.reset(_FakeView())
    for r, p, cut in ops:
        router._remember(r, PATHS[p][:cut])
    blocks = PATHS[query]
    want = {}
    for r, lru in enumerate(router._lru):
        k = 0
        while k < len(blocks) and blocks[k] in lru:
            k += 1
        if k:
            want[r] = k
    assert router._approx_matches(blocks) == want
    for h, mask in router._lru_holders.items():
        assert mask == sum(1 << r for r, lru in enumerate(router._lru) if h in lru)
    assert all(h in router._lru_holders for lru in router._lru for h in lru)


# -- whole replays: index vs scan ------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["cache_aware", "kv_aware", "llm_d", "btb", "btb_adaptive"])
@pytest.mark.parametrize("params", [{}, {"kv": True}])
def test_replay_with_the_index_equals_replay_with_the_scan(policy, params, monkeypatch):
    """The same run with ``cached_blocks_all`` answered by the holder index and by asking every
    replica gives the identical per-request table (llm_d and cache_aware in KV-event mode too)."""
    kw = {}
    if params.get("kv"):
        kw = {"cache_aware": {"match_mode": "kv_events"}, "llm_d": {"prefix_mode": "kv_events"},
              "kv_aware": {"overlap_tiers": "hbm,dram"}, "btb": {"source_tiers": "hbm"},
              "btb_adaptive": {"pin_hot": False}}[policy]
    trace = bursted_shaped_trace(windows=1).rows(0, 700)
    # 12 replicas: past the few-replica scalar paths of kv_aware and btb_adaptive (8)
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=12)
    fast = simulate(trace, make_router(policy, **kw), cluster, seed=3)
    monkeypatch.setattr(ClusterView, "cached_blocks_all", ClusterView._scan_all)
    monkeypatch.setattr(ClusterView, "cached_blocks_all_pieces",
                        lambda self, starts, lens, n, tiers: self._scan_all(
                            tuple_of_pieces(starts, lens)[:n], tiers))
    monkeypatch.setattr(ClusterView, "cached_block_count_all",
                        lambda self: [self.cached_block_count(r) for r in range(self.num_replicas)])
    slow = simulate(trace, make_router(policy, **kw), cluster, seed=3)
    assert fast.requests.equals(slow.requests)
    assert fast.transfers.equals(slow.transfers)


class MapsOrderRouter(CheckingRouter):
    """Asks the holder index each question twice, splitting holders in a plain loop and by
    C-level maps (``holders._FEW``), and checks the answers agree in value *and order*; then
    routes as :class:`CheckingRouter` (which checks them against the per-replica scan)."""

    def route(self, request):
        v = self.view
        index = v._sim.holder_index
        starts, lens = v.request_pieces(request)
        for cut in {len(request.hash_ids), max(1, len(request.hash_ids) // 2), 1}:
            for use in ((True, False), (False, True), (True, True)):
                holders._FEW = 1 << 30
                loop = index.matched(v._caches, starts, lens, cut, *use, use[0] and use[1])
                holders._FEW = 0
                maps = index.matched(v._caches, starts, lens, cut, *use, use[0] and use[1])
                pairs = zip(loop, maps) if isinstance(loop, tuple) else [(loop, maps)]
                for a, b in pairs:
                    assert list(a.items()) == list(b.items())
                    self.checked_order += 1
        return super().route(request)

    def reset(self, view):
        super().reset(view)
        self.checked_order = 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), replicas=st.integers(9, 16), hbm_blocks=st.integers(20, 60),
       dram_blocks=st.integers(0, 30), seed=st.integers(0, 3))
def test_holder_split_by_maps_equals_the_plain_loop(trace, replicas, hbm_blocks, dram_blocks,
                                                    seed):
    """Many holders (the C-level path of ``HolderIndex.matched``): same answers, same order."""
    kvb = COST.kv_bytes_per_token * BT
    cluster = ClusterConfig(cost=COST, num_replicas=replicas, scheduler="prefill_first",
                            chunk_tokens=256, hbm_kv_capacity_bytes=hbm_blocks * kvb,
                            dram_capacity_bytes=dram_blocks * kvb)
    router = MapsOrderRouter()
    few = holders._FEW
    try:
        holders._FEW = 0
        simulate(trace, router, cluster, seed=seed)
    finally:
        holders._FEW = few
    assert router.checked_order >= len(trace) * 3
