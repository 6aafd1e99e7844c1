"""``KVCache.admit_lookup`` (admission's one walk) equals the two look-ups it replaces.

Admission asks a replica's cache how much of a prompt's prefix each tier holds (``match``) and how
many of its HBM blocks sit unpinned in the LRU (``lru_hits``); ``admit_lookup`` answers both in one
walk over the path. Checked on every replica, for the prompt and several of its leading parts, at
every routing decision of random replays with evictions, DRAM spills, copies and a disk tier.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btb_core.cost import cost_model_for_setup
from btb_core.routers import Router
from btb_core.sim import ClusterConfig, simulate
from strategies import family_traces

BT = 64
COST = cost_model_for_setup("70b_h100x4")


class LookupChecker(Router):
    """Routes at random, copies a prompt's first blocks now and then, and before each decision
    compares ``admit_lookup`` with ``match`` + ``lru_hits`` on every replica."""

    name = "lookup_checker"

    def reset(self, view):
        super().reset(view)
        self.checked = 0
        self.nonzero = 0

    def route(self, request):
        v = self.view
        ids = request.hash_ids
        starts, lens = v.pieces(ids)
        for rep in v._replicas:
            cache = rep.cache
            for limit in {1, max(1, len(ids) // 2), max(1, len(ids) - 1), len(ids)}:
                n_h, n_d, n_k = cache.match(starts, lens, limit)
                want = (n_h, n_d, n_k, cache.lru_hits(starts, lens, n_h))
                assert cache.admit_lookup(starts, lens, limit) == want, (request.index, limit)
                self.checked += 1
                self.nonzero += any(want)
        rng = v.rng
        if len(ids) >= 2 and v.num_replicas > 1 and rng.random() < 0.3:
            src = [r for r in range(v.num_replicas) if v.cached_blocks(r, ids[:2], ("hbm",)) == 2]
            if src:
                try:
                    v.start_transfer(src[0], (src[0] + 1) % v.num_replicas, ids[:2])
                except ValueError:    # (the destination may hold it already)
                    pass
        return int(rng.integers(v.num_replicas))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=family_traces(BT, branches=2), replicas=st.integers(1, 3),
       hbm_blocks=st.integers(20, 60), dram_blocks=st.integers(0, 30),
       disk_blocks=st.sampled_from([0, 0, 40]),
       scheduler=st.sampled_from(["prefill_first", "chunked"]), seed=st.integers(0, 3))
def test_admit_lookup_equals_match_and_lru_hits(trace, replicas, hbm_blocks, dram_blocks,
                                                disk_blocks, scheduler, seed):
    kvb = COST.kv_bytes_per_token * BT
    cluster = ClusterConfig(cost=COST, num_replicas=replicas, scheduler=scheduler, chunk_tokens=256,
                            hbm_kv_capacity_bytes=hbm_blocks * kvb,
                            dram_capacity_bytes=dram_blocks * kvb,
                            disk_capacity_bytes=disk_blocks * kvb)
    router = LookupChecker()
    simulate(trace, router, cluster, seed=seed)
    assert router.checked >= len(trace) * replicas


def test_admit_lookup_sees_every_tier():
    """A hand-made state: the path's first run partly pinned, partly in the LRU; the next blocks
    in DRAM, then on disk."""
    from btb_core.sim.kvcache import DiskTier, KVCache

    cache = KVCache(10, 10, DiskTier(10))
    starts, lens = [0, 100], [4, 6]      # a path of two pieces: run 0 (4 blocks), run 100 (6)
    cache.pin_prefix(starts, lens, 0, 0)
    cache.reserve_private(6)
    cache.complete_blocks(starts, lens, 0, 6)      # blocks 0..5 in HBM, pinned by one holder
    cache.release(starts, lens, 6, 0)               # ... now all in the LRU
    cache.pin_prefix(starts, lens, 2, 0)            # a new holder pins blocks 0, 1 again
    assert cache.admit_lookup(starts, lens, 10) == (6, 0, 0, 4)
    cache.reserve_private(8)                        # evicts the 4 LRU blocks: 2..5 go to DRAM
    assert cache.admit_lookup(starts, lens, 10) == (2, 4, 0, 0)
    assert cache.admit_lookup(starts, lens, 3) == (2, 1, 0, 0)
    assert cache.admit_lookup(starts, lens, 1) == (1, 0, 0, 0)
