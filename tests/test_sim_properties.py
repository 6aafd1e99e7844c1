"""Property tests (hypothesis) of simulator invariants over random small traces."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btb_core.cost import cost_model_for_setup
from btb_core.routers import Router
from btb_core.sim import ClusterConfig, simulate
from btb_core.sim.engine import Simulator
from strategies import family_traces

BT = 64
COST = cost_model_for_setup("70b_h100x4")


class SeededRandom(Router):
    name = "seeded_random"

    def route(self, request):
        return int(self.view.rng.integers(self.view.num_replicas))


class CopyingRandom(SeededRandom):
    """Random routing that also copies the first block of every prompt it can to a random peer."""

    name = "copying_random"

    def route(self, request):
        v = self.view
        if request.full_blocks >= 2:
            ids = request.hash_ids[:2]
            for src in range(v.num_replicas):
                if v.cached_blocks(src, ids) == 2:
                    dst = (src + 1) % v.num_replicas
                    if dst != src:
                        v.start_transfer(src, dst, ids)
                    break
        return super().route(request)


def run_checked(trace, router, cluster, seed):
    """Simulate, checking every replica's KV-cache accounting after every operation and copy, and
    that nothing stays pinned or reserved once the run is over (KVCache.check_invariants)."""
    sim = Simulator(trace, router, cluster, seed=seed)
    caches = [rep.cache for rep in sim.replicas]

    def checked(step):
        def run(obj):
            step(obj)
            for cache in caches:
                cache.check_invariants()
        return run

    sim._op_done = checked(sim._op_done)
    sim._transfer_done = checked(sim._transfer_done)
    res = sim.run()
    for cache in caches:
        cache.check_invariants(idle=True)
    return res


def traces():
    return family_traces(BT, max_requests=25, max_output=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), scheduler=st.sampled_from(["prefill_first", "chunked"]),
       replicas=st.integers(1, 3), hbm_blocks=st.integers(20, 60), dram_blocks=st.integers(0, 30),
       chunk=st.sampled_from([128, 512, 8192]), copying=st.booleans(), seed=st.integers(0, 5))
def test_invariants(trace, scheduler, replicas, hbm_blocks, dram_blocks, chunk, copying, seed):
    kvb = COST.kv_bytes_per_token * BT
    cluster = ClusterConfig(cost=COST, num_replicas=replicas, scheduler=scheduler, chunk_tokens=chunk,
                            hbm_kv_capacity_bytes=hbm_blocks * kvb, dram_capacity_bytes=dram_blocks * kvb)
    router = CopyingRandom() if copying else SeededRandom()
    res = run_checked(trace, router, cluster, seed)
    req = res.requests
    # every request finishes exactly once, in order arrival <= admission <= first token <= finish
    assert len(req) == len(trace)
    assert req["request_id"].is_unique
    assert np.all(req["queue_wait_s"] >= 0)
    assert np.all(req["ttft_s"] >= req["queue_wait_s"])
    assert np.all(req["e2e_s"] >= req["ttft_s"])
    # TTFT is at least the prefill time of the tokens it did not reuse
    floor = np.array([COST.prefill_s(n, c) for n, c in zip(req["recomputed_tokens"], req["reused_tokens"])])
    # (absolute slack: ttft_s = (arrival + d) - arrival carries float rounding of ~1e-16 s)
    assert np.all(req["ttft_s"].to_numpy() >= floor * (1 - 1e-12) - 1e-12)
    assert np.all(req["reused_tokens"] <= req["input_length"] - 1)
    # no tier ever holds more than its capacity
    assert res.info["peak_hbm_blocks"] <= hbm_blocks
    assert res.info["peak_dram_blocks"] <= dram_blocks
    # replaying gives the identical table
    again = simulate(trace, CopyingRandom() if copying else SeededRandom(), cluster, seed=seed)
    assert again.requests.equals(req)
