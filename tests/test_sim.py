"""Functional tests of the simulator against closed-form results (DESIGN.md section 4)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from btb_core.cost import cost_model_for_setup
from btb_core.errors import ConfigError
from btb_core.routers import Router, make_router
from btb_core.sim import ClusterConfig, simulate
from btb_core.sim.replica import DecodeModel
from btb_core.trace import make_trace

BT = 512


def prefix_ids(tag: int, n_blocks: int) -> list[int]:
    """Chained ids for a prefix family ``tag`` (ids are unique per (tag, position))."""
    return [tag * 100_000 + i for i in range(n_blocks)]


def trace_of(rows, block_tokens=BT):
    """rows: (arrival_s, input_length, output_length, hash_ids)."""
    a, i, o, h = zip(*rows)
    return make_trace(list(a), list(i), list(o), [list(x) for x in h], block_tokens=block_tokens)


def cluster(n=1, scheduler="prefill_first", **kw):
    return ClusterConfig.from_setup("70b_h100x4", num_replicas=n, scheduler=scheduler, **kw)


class Fixed(Router):
    """Routes request i to ``plan[i]`` (default replica 0)."""

    name = "fixed"

    def __init__(self, plan=None):
        self.plan = plan or {}

    def route(self, request):
        return self.plan.get(request.index, 0)


COST = cost_model_for_setup("70b_h100x4")


# ---------------------------------------------------------------- single request, closed form
@pytest.mark.parametrize("tokens", [100, 4096, 8000])
def test_single_request_ttft_equals_prefill_prefill_first(tokens):
    n_blocks = -(-tokens // BT)
    res = simulate(trace_of([(0.0, tokens, 1, prefix_ids(1, n_blocks))]), Fixed(), cluster())
    row = res.requests.iloc[0]
    assert row["ttft_s"] == pytest.approx(COST.prefill_s(tokens, 0), rel=1e-12)
    assert row["queue_wait_s"] == 0.0
    assert row["reused_tokens"] == 0


def test_single_request_chunked_long_prompt_sums_chunks():
    # 20,000 tokens = chunks of 8192 + 8192 + 3616; with the attention term each chunk attends to
    # the tokens before it, so the chunk FLOPs add up to the whole prefill's.
    tokens = 20_000
    res = simulate(trace_of([(0.0, tokens, 1, prefix_ids(1, 40))]), Fixed(), cluster(scheduler="chunked"))
    assert res.requests["ttft_s"].iloc[0] == pytest.approx(COST.prefill_s(tokens, 0), rel=1e-12)


def test_single_request_decode_closed_form():
    tokens, out = 3000, 50
    res = simulate(trace_of([(0.0, tokens, out, prefix_ids(1, 6))]), Fixed(), cluster())
    expected = COST.prefill_s(tokens, 0) + sum(COST.decode_step_s(1, tokens + 1 + j) for j in range(out - 1))
    assert res.requests["e2e_s"].iloc[0] == pytest.approx(expected, rel=1e-12)


def test_prefix_in_dram_costs_load_plus_suffix_prefill():
    # HBM holds 40 blocks: A (16 blocks) finishes, then B (39 other blocks + 1 for its output)
    # evicts all of A's prefix to DRAM; C shares A's 16-block prefix and must load it from DRAM.
    cap = 40 * BT * COST.kv_bytes_per_token
    p = prefix_ids(1, 16)
    rows = [
        (0.0, 16 * BT, 1, p),
        (10.0, 39 * BT, 1, prefix_ids(2, 39)),
        (30.0, 16 * BT + 300, 1, p + [999_999]),
    ]
    res = simulate(trace_of(rows), Fixed(), cluster(hbm_kv_capacity_bytes=cap))
    c = res.requests.iloc[2]
    assert c["reuse_tier"] == "dram"
    assert c["hit_dram_tokens"] == 16 * BT
    expected = COST.load_s("dram", 16 * BT) + COST.prefill_s(300, 16 * BT)
    assert c["ttft_s"] == pytest.approx(expected, rel=1e-12)
    assert res.metrics["hit_fraction_dram"] == pytest.approx(16 * BT / (55 * BT + 300 + 16 * BT))


# ---------------------------------------------------------------- M/D/1 queue
@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait_matches_pollaczek_khinchine(rho):
    tokens = 2048
    d = COST.prefill_s(tokens, 0)
    n = 60_000
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(d / rho, n))
    ids = [[k * 10 + j for j in range(4)] for k in range(n)]  # no two requests share a block
    res = simulate(make_trace(arrivals, [tokens] * n, [1] * n, ids, block_tokens=BT), Fixed(), cluster())
    wait = res.requests["queue_wait_s"].to_numpy()[n // 10:]  # drop the warm-up
    pk = rho * d / (2 * (1 - rho))
    assert wait.mean() == pytest.approx(pk, rel=0.05)
    assert np.allclose(res.requests["prefill_s"], d, rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- prefix reuse timing
def test_prefix_reused_after_prefill_completes_not_before():
    p = prefix_ids(1, 8)  # 4,096-token shared prefix
    d_a = COST.prefill_s(8 * BT + 100, 0)
    rows = [
        (0.0, 8 * BT + 100, 1, p + [1]),      # A
        (0.0, 8 * BT + 100, 1, p + [2]),      # B: admitted with A in the same chunked iteration
        (d_a + 0.5, 8 * BT + 100, 1, p + [3]),  # C: arrives after A's prefill completed
    ]
    res = simulate(trace_of(rows), Fixed(), cluster(scheduler="chunked"))
    reused = res.requests["reused_tokens"].tolist()
    assert reused == [0, 0, 8 * BT]


def test_chunked_blocks_become_reusable_chunk_by_chunk():
    # A: 20,000 tokens; after its first 8,192-token chunk, 16 blocks are complete. B arrives
    # during the second chunk and is admitted at the third iteration, when 32 blocks are complete.
    p = prefix_ids(1, 40)
    t1 = COST.prefill_s(8192, 0)
    rows = [(0.0, 20_000, 1, p), (t1 + 0.01, 20_000, 1, p[:39] + [7])]
    res = simulate(trace_of(rows), Fixed(), cluster(scheduler="chunked"))
    assert res.requests["reused_tokens"].tolist() == [0, 32 * BT]


def test_prefill_first_queued_request_reuses_once_admitted():
    p = prefix_ids(1, 8)
    rows = [(0.0, 8 * BT + 100, 1, p + [1]), (0.01, 8 * BT + 100, 1, p + [2])]
    res = simulate(trace_of(rows), Fixed(), cluster())
    b = res.requests.iloc[1]
    assert b["reused_tokens"] == 8 * BT
    d_a = COST.prefill_s(8 * BT + 100, 0)
    assert b["ttft_s"] == pytest.approx(d_a - 0.01 + COST.prefill_s(100, 8 * BT), rel=1e-12)


# ---------------------------------------------------------------- RDMA fabric
class CopyTwice(Router):
    """Request 0 -> replica 0. At request 1: copy its prefix 0->1 and 0->2, route it to 1.
    Request 2 -> replica 2."""

    name = "copy_twice"

    def __init__(self, n_blocks):
        self.n_blocks = n_blocks
        self.seen_before_landing = []
        self.done = []

    def route(self, request):
        v = self.view
        if request.index == 1:
            self.prefix = request.hash_ids[: self.n_blocks]  # ids are interned by make_trace
            self.t1 = v.start_transfer(0, 1, self.prefix)
            self.t2 = v.start_transfer(0, 2, self.prefix)
            self.seen_before_landing = [v.cached_blocks(1, self.prefix), v.cached_blocks(2, self.prefix)]
            return 1
        return {0: 0, 2: 2}[request.index]

    def on_transfer_done(self, transfer_id, src, dst, num_blocks):
        self.done.append((transfer_id, dst, num_blocks, self.view.now_s))


def test_warm_copy_invisible_until_landed_and_copies_queue_on_egress():
    p = prefix_ids(1, 128)  # 65,536 tokens
    tokens = 128 * BT + 256
    d_a = COST.prefill_s(tokens, 0)
    copy_s = COST.load_s("rdma", 128 * BT)
    t_b = d_a + 0.1
    rows = [(0.0, tokens, 1, p + [1]), (t_b, tokens, 1, p + [2]), (t_b + 2 * copy_s + 0.01, tokens, 1, p + [3])]
    router = CopyTwice(128)
    res = simulate(trace_of(rows), router, cluster(n=3))
    assert router.seen_before_landing == [0, 0]
    tr = res.transfers
    assert tr["start_s"].tolist() == pytest.approx([t_b, t_b + copy_s])   # second waits for egress
    assert tr["end_s"].tolist() == pytest.approx([t_b + copy_s, t_b + 2 * copy_s])
    assert [d[1] for d in router.done] == [1, 2]
    assert tr["bytes"].tolist() == [128 * BT * COST.kv_bytes_per_token] * 2
    req = res.requests
    assert req["reused_tokens"].tolist() == [0, 0, 128 * BT]  # B arrived before its copy landed
    assert tr["served_requests"].tolist() == [0, 1]
    assert res.metrics["copies_unused"] == 1
    assert res.metrics["rdma_bytes"] == 2 * 128 * BT * COST.kv_bytes_per_token


def test_start_transfer_rejects_incomplete_source():
    class Bad(Router):
        name = "bad"

        def route(self, request):
            self.view.start_transfer(0, 1, prefix_ids(1, 4))
            return 0

    with pytest.raises(ValueError, match="holds only 0 of the 4"):
        simulate(trace_of([(0.0, 4 * BT, 1, prefix_ids(1, 4))]), Bad(), cluster(n=2))


# ---------------------------------------------------------------- decode model, determinism, config
def test_decode_model_matches_cost_model():
    d = DecodeModel(COST)
    for n, ctx in [(1, 0), (8, 10_000), (256, 10), (256, 3_000_000)]:
        assert d.step_s(n, ctx) == pytest.approx(COST.decode_step_s(n, ctx), rel=1e-12)
    for n, ctx, k in [(4, 1000, 17), (256, 0, 40), (64, 5000, 1)]:
        assert d.stretch_s(n, ctx, k) == pytest.approx(sum(d.step_s(n, ctx + j * n) for j in range(k)), rel=1e-9)


def test_same_seed_identical_tables():
    from btb_core.trace import load_trace
    from btb_core.paths import DATA_DIR

    tr = load_trace(DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl").rows(0, 1500)
    a = simulate(tr, make_router("round_robin"), cluster(n=4, scheduler="chunked"), seed=3)
    b = simulate(tr, make_router("round_robin"), cluster(n=4, scheduler="chunked"), seed=3)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.metrics == b.metrics


@pytest.mark.parametrize("kwargs, match", [
    ({"num_replicas": 0}, "num_replicas=0"),
    ({"scheduler": "fifo"}, "scheduler='fifo'"),
    ({"chunk_tokens": 0}, "chunk_tokens=0"),
    ({"kv_reserve_fraction": 1.5}, "kv_reserve_fraction=1.5"),
    ({"dram_capacity_bytes": -1}, "dram_capacity_bytes=-1"),
    ({"hbm_kv_capacity_bytes": 0}, "hbm_kv_capacity_bytes=0"),
])
def test_bad_cluster_config_raises(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ClusterConfig(cost=COST, **kwargs)


def test_cluster_config_rejects_non_cost_and_unknown_setup():
    with pytest.raises(ConfigError, match="cost"):
        ClusterConfig(cost=object())
    with pytest.raises(ConfigError, match="70b_h100x4"):
        ClusterConfig.from_setup("nope")


def test_request_larger_than_hbm_is_a_clear_error():
    cap = 10 * BT * COST.kv_bytes_per_token
    with pytest.raises(ConfigError, match="needs 21 KV blocks"):
        simulate(trace_of([(0.0, 20 * BT, 1, prefix_ids(1, 20))]), Fixed(), cluster(hbm_kv_capacity_bytes=cap))


def test_prefix_in_dram_is_recomputed_when_loading_is_slower():
    # the same three requests as above, but a DRAM tier whose set-up latency (10 s) makes loading
    # the 16-block prefix slower than recomputing it: C recomputes and loads nothing
    slow = dataclasses.replace(COST, setup_latency_s={**COST.setup_latency_s, "dram": 10.0})
    assert slow.load_s("dram", 16 * BT) > slow.prefill_s(16 * BT, 0)
    cap = 40 * BT * COST.kv_bytes_per_token
    p = prefix_ids(1, 16)
    rows = [
        (0.0, 16 * BT, 1, p),
        (10.0, 39 * BT, 1, prefix_ids(2, 39)),
        (30.0, 16 * BT + 300, 1, p + [999_999]),
    ]
    cl = ClusterConfig(cost=slow, num_replicas=1, scheduler="prefill_first", hbm_kv_capacity_bytes=cap)
    res = simulate(trace_of(rows), Fixed(), cl)
    c = res.requests.iloc[2]
    assert c["reuse_tier"] == "none"
    assert c["reused_tokens"] == 0 and c["hit_dram_tokens"] == 0 and c["load_s"] == 0.0
    assert c["ttft_s"] == pytest.approx(slow.prefill_s(16 * BT + 300, 0), rel=1e-12)


class CopyFromEach(Router):
    """Requests 0 and 1 go to replicas 0 and 1; request 2 goes to replica 0 and starts copies of
    both earlier prompts into replica 2 at once."""

    name = "copy_from_each"

    def reset(self, view):
        super().reset(view)
        self.prompts = []

    def route(self, request):
        if request.index < 2:
            self.prompts.append(request.hash_ids)
            return request.index
        for src, ids in enumerate(self.prompts):
            self.view.start_transfer(src, 2, ids)
        return 0


def test_copies_into_one_replica_queue_on_its_ingress():
    # two copies from different sources (free egress NICs) to the same destination: the second
    # waits for the destination's ingress NIC, so it starts when the first ends
    p, q = prefix_ids(1, 32), prefix_ids(2, 32)
    t_copy = COST.prefill_s(32 * BT, 0) + 0.5
    rows = [(0.0, 32 * BT, 1, p), (0.0, 32 * BT, 1, q), (t_copy, 100, 1, [7])]
    res = simulate(trace_of(rows), CopyFromEach(), cluster(n=3))
    copy_s = COST.load_s("rdma", 32 * BT)
    tr = res.transfers
    assert tr["start_s"].tolist() == pytest.approx([t_copy, t_copy + copy_s], rel=1e-12)
    assert tr["end_s"].tolist() == pytest.approx([t_copy + copy_s, t_copy + 2 * copy_s], rel=1e-12)
