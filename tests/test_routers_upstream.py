"""Features the routers' upstream versions ship (issue 11), each pinned to a hand-checked case.

SGLang Model Gateway: token-usage imbalance thresholds in ``cache_aware``, engine load in
``power_of_two``; NVIDIA Dynamo: tie-break by smaller tree, decode blocks booked at selection, the
router queue threshold; llm-d: load-aware and active-request scorers. The upstream file and commit
of each rule is cited in the router's module docstring.
"""

from __future__ import annotations

import pytest

from btb_core.routers import parse_router_params
from btb_core.routers.cache_aware import CacheAwareRouter
from btb_core.routers.kv_aware import KvAwareRouter
from btb_core.routers.llm_d import LlmDRouter
from btb_core.routers.power_of_two import PowerOfTwoRouter
from btb_core.scenarios import ScenarioSpec, build, run
from btb_core.sim import ClusterConfig, simulate
from tests.test_routers_unit import BT, req, setup


# -- power_of_two: engine load ---------------------------------------------------------------------
def _usage(view, usage, capacity_blocks=1000):
    view.kv[:] = usage
    view.blocks[:] = [round(u * capacity_blocks) for u in usage]


@pytest.mark.parametrize("seed", range(5))
def test_power_of_two_loads_10_20_usage_01_09_picks_the_first(seed):
    router = PowerOfTwoRouter()
    view = setup(router, n=2, seed=seed)
    router.load.loads[:] = [10, 20]
    _usage(view, [0.1, 0.9])
    assert router.route(req(0, [1])) == 0


@pytest.mark.parametrize("seed", range(5))
def test_power_of_two_follows_engine_load_not_its_own_counts(seed):
    # fewer requests in flight on replica 1, but its engine holds 9x the KV tokens: the gateway's
    # token load sends the request to replica 0; the router's own counts would pick replica 1
    engine, counts = PowerOfTwoRouter(), PowerOfTwoRouter(load="in_flight")
    for router in (engine, counts):
        view = setup(router, n=2, seed=seed)
        router.load.loads[:] = [20, 10]
        _usage(view, [0.1, 0.9])
    assert engine.route(req(0, [1])) == 0
    assert counts.route(req(0, [1])) == 1


def test_power_of_two_engine_load_counts_queued_prompt_tokens():
    router = PowerOfTwoRouter()
    view = setup(router, n=2)
    view.blocks[:] = [10, 0]           # 160 KV tokens in use on replica 0
    view.queued_tokens[:] = [0, 161]   # 161 prompt tokens waiting on replica 1
    assert router.engine_load(0) == 10 * BT and router.engine_load(1) == 161
    assert router.route(req(0, [1])) == 0


# -- cache_aware: token-usage thresholds ------------------------------------------------------------
def _cache_aware_with_hit_on_0(**kw):
    router = CacheAwareRouter(**kw)
    view = setup(router, n=2)
    router.record(req(0, [1, 2, 3, 4]), 0)   # replica 0's tree holds the prefix ...
    router.record(req(1, [9]), 1)            # ... and the loads are balanced (1 and 1)
    return router, view


def test_cache_aware_token_usage_thresholds_default_off():
    router, view = _cache_aware_with_hit_on_0()
    view.kv[:] = [1.0, 0.0]                  # replica 0's KV is full: upstream default ignores it
    assert not router.is_imbalanced()
    assert router.choose(req(2, [1, 2, 3, 5])) == 0


def test_cache_aware_overload_threshold_sheds_a_full_replica():
    router, view = _cache_aware_with_hit_on_0(overload_token_usage_threshold=0.9)
    view.kv[:] = [0.9, 0.0]                  # not strictly above 0.9: still follows the cache
    assert router.choose(req(2, [1, 2, 3, 5])) == 0
    view.kv[:] = [0.95, 0.0]
    router.load.loads[:] = [1, 0]
    assert router.is_imbalanced()
    assert router.choose(req(3, [1, 2, 3, 5])) == 1
    assert router.decisions["imbalanced"] == 1


def test_cache_aware_balance_threshold_on_usage_spread():
    router, view = _cache_aware_with_hit_on_0(balance_token_usage_threshold=0.5)
    view.kv[:] = [0.75, 0.25]                # spread 0.5: not strictly above
    assert not router.is_imbalanced()
    view.kv[:] = [0.8, 0.25]
    assert router.is_imbalanced()


# -- kv_aware: tie-break, decode booked at selection, router queue -----------------------------------
@pytest.mark.parametrize("seed", range(8))
def test_kv_aware_tie_goes_to_the_smaller_tree(seed):
    router = KvAwareRouter()
    view = setup(router, n=3, seed=seed)
    view.cache[0]["hbm"].update({100, 101, 102})   # unrelated blocks: same logits for all three
    view.cache[1]["hbm"].update({200})
    view.cache[2]["hbm"].update({300, 301})
    assert router.logits(req(0, [1, 2])).tolist() == [4.0, 4.0, 4.0]
    assert router.route(req(0, [1, 2])) == 1


def test_kv_aware_tie_random_rule_spreads():
    picks = set()
    for seed in range(20):
        router = KvAwareRouter(tie_break="random")
        view = setup(router, n=3, seed=seed)
        view.cache[0]["hbm"].update({100, 101, 102})
        picks.add(router.route(req(0, [1, 2])))
    assert picks == {0, 1, 2}


def test_kv_aware_books_decode_blocks_at_selection():
    router = KvAwareRouter()
    view = setup(router, n=2, seed=0)
    view.cache[0]["hbm"].update({50})            # replica 1 has the smaller tree: first goes there
    a = req(0, [1, 2, 3, 4])
    assert router.route(a) == 1
    router.on_prefill_done(a, 1)                 # prefill book empty again; engine shows nothing
    assert view.blocks == [0, 0]
    # decode: replica 1 already holds a's 4 blocks in the router's book
    assert router.logits(req(1, [7, 8])).tolist() == [4.0, 8.0]
    # a request sharing a's first 3 blocks adds only 1 new block there (unique blocks counted once)
    assert router.logits(req(2, [1, 2, 3, 9])).tolist() == [8.0, 9.0]
    router.on_request_finished(a, 1)
    assert router._book.runs == {} and router._book.sizes == [0, 0]
    assert router._active_len.tolist() == [0, 0]
    engine = KvAwareRouter(active_blocks="engine")   # the earlier rule: nothing until admission
    view = setup(engine, n=2, seed=0)
    view.cache[0]["hbm"].update({50})
    engine.on_prefill_done(a, engine.route(a))
    assert engine.logits(req(1, [7, 8])).tolist() == [4.0, 4.0]


def test_kv_aware_uncached_tokens_never_negative():
    """A replica caching a prompt's last, partial block too: overlap 2 blocks of 16 tokens on a
    24-token prompt leaves max(0, 24 - 32) = 0 uncached tokens (not -8), so with 24 booked
    prefill tokens it scores 24 / 16 + 1 = 2.5, tying the empty replica (24 / 16 + 1), and the
    smaller tree (replica 1) wins; an unclamped -8 would score 2.0 and win."""
    router = KvAwareRouter()
    view = setup(router, n=2, seed=0)
    view.cache[0]["hbm"].update({1, 2})
    router._prefill_tokens[0] = 24
    router._prefill_arr[0] = 24
    assert router.logits(req(0, [1, 2], input_length=24)).tolist() == [2.5, 2.5]
    assert router.route(req(0, [1, 2], input_length=24)) == 1


def test_kv_aware_router_queue_holds_while_every_replica_is_busy():
    router = KvAwareRouter(router_queue_threshold=0.0)
    view = setup(router, n=2, seed=0)
    first, second, third = req(0, [1, 2]), req(1, [3, 4]), req(2, [5, 6])
    r0, r1 = router.route(first), router.route(second)
    assert {r0, r1} == {0, 1}                    # each books 32 prefill tokens on its replica
    assert router.route(third) is None           # every replica above 0 x 8192 tokens: held
    assert router.queue == [third] and view.dispatched == []
    router.on_prefill_done(first, r0)            # r0's book drops to 0: the queue drains to it
    assert view.dispatched == [(2, r0)] and router.queue == []


def test_kv_aware_router_queue_threshold_parses_none():
    assert parse_router_params(KvAwareRouter, ["router_queue_threshold=none"]) == \
        {"router_queue_threshold": None}
    assert parse_router_params(KvAwareRouter, ["router_queue_threshold=0.5"]) == \
        {"router_queue_threshold": 0.5}


def test_kv_aware_router_queue_on_the_simulator():
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=2)
    trace = build(ScenarioSpec("unrelated", 12, 0.5, suffix_tokens=4096))
    free = run(trace, "kv_aware", cluster)
    router = KvAwareRouter(router_queue_threshold=0.5)
    held = simulate(trace, router, cluster)
    assert router.queued_total > 0 and router.queue == []
    assert len(held.requests) == 12                # every held request was dispatched and finished
    # held requests wait in the router instead of the engine queue: TTFT counts it all the same
    assert held.requests["ttft_s"].min() > 0
    assert held.metrics["ttft_mean_s"] == pytest.approx(free.metrics["ttft_mean_s"], rel=0.5)


# -- llm_d: load-aware and active-request scorers ----------------------------------------------------
def test_llm_d_load_aware_scorer_closed_form():
    router = LlmDRouter(load_aware_weight=1.0)
    view = setup(router, n=3)
    view.queue[:] = [0, 64, 200]
    assert router.scores(req(0, [1]))[:, 3].tolist() == [0.5, 0.25, 0.0]


def test_llm_d_active_request_scorer_counts_and_expires():
    router = LlmDRouter(prefix_weight=0, queue_weight=0, kv_cache_weight=0,
                        active_request_weight=1.0, active_request_timeout_s=10.0)
    view = setup(router, n=3, seed=0)
    picks = [router.route(req(i, [i + 1])) for i in range(3)]
    assert sorted(picks) == [0, 1, 2]            # each pick empties the least-busy replica
    fourth = router.route(req(3, [9]))
    assert router._active_counts[fourth] == 2
    s = router.scores(req(4, [10]))[:, 4]
    assert s[fourth] == 0.0 and sorted(s.tolist()) == [0.0, 0.5, 0.5]
    router.on_request_finished(req(3, [9]), fourth)
    assert router._active_counts == [1, 1, 1]
    view.now_s = 10.0                            # requests dispatched at t=0 time out at 10 s
    assert router.scores(req(5, [11]))[:, 4].tolist() == [1.0, 1.0, 1.0]
    assert router._active_counts == [0, 0, 0]


def test_llm_d_extra_scorers_off_by_default():
    router = LlmDRouter()
    view = setup(router, n=2)
    view.queue[:] = [0, 300]
    assert router.scores(req(0, [1]))[:, 3:].tolist() == [[0.0, 0.0], [0.0, 0.0]]
