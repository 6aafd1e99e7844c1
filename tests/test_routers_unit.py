"""Unit tests of every router against a small hand-driven fake ClusterView (no simulator)."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from btb_core.cost import cost_model_for_setup
from btb_core.errors import ConfigError
from btb_core.routers import POLICIES, make_router, parse_router_params
from btb_core.routers.btb import BTBRouter
from btb_core.routers.cache_aware import CacheAwareRouter
from btb_core.routers.kv_aware import KvAwareRouter
from btb_core.routers.least_load import LeastLoadRouter
from btb_core.routers.llm_d import LlmDRouter
from btb_core.routers.power_of_two import PowerOfTwoRouter
from btb_core.routers.prefix_tree import ApproxPrefixIndex
from btb_core.routers.random import RandomRouter
from btb_core.sim.request import Request

BT = 16  # tokens per block in these tests


class FakeView:
    """A ClusterView whose state the test sets by hand."""

    def __init__(self, n: int = 4, seed: int = 0, block_tokens: int = BT):
        self.num_replicas = n
        self.block_tokens = block_tokens
        self.rng = np.random.default_rng(seed)
        self.now_s = 0.0
        self.cache = [{"hbm": set(), "dram": set(), "disk": set()} for _ in range(n)]
        self.queue = [0] * n
        self.kv = [0.0] * n
        self.blocks = [0] * n
        self.egress = [0.0] * n
        self.transfers: list[tuple] = []
        self.router = None
        self.chunk_tokens = 8192
        self.queued_tokens = [0] * n
        self.dispatched: list[tuple] = []
        self.cost = cost_model_for_setup("70b_h100x4")
        self.scheduler = "chunked"
        self.free = [10_000] * n
        self.pins: list[tuple] = []
        self.holds: list[tuple] = []

    def queue_length(self, r): return self.queue[r]
    def queued_prompt_tokens(self, r): return self.queued_tokens[r]
    def cached_block_count(self, r): return len(self.cache[r]["hbm"])
    def dispatch(self, request, r): self.dispatched.append((request.index, r))
    def kv_usage(self, r): return self.kv[r]
    def active_blocks(self, r): return self.blocks[r]
    def egress_backlog_s(self, r): return self.egress[r]

    def cached_blocks(self, r, hash_ids, tiers=("hbm", "dram", "disk")):
        held = set().union(*(self.cache[r][t] for t in tiers))
        k = 0
        while k < len(hash_ids) and hash_ids[k] in held:
            k += 1
        return k

    def ingress_backlog_s(self, r): return 0.0
    def hbm_free_blocks(self, r): return self.free[r]

    def pin_prefix(self, r, hash_ids):
        k = self.cached_blocks(r, hash_ids, ("hbm",))
        self.pins.append((r, tuple(hash_ids), k))
        return k

    def unpin_prefix(self, r, hash_ids, n):
        self.pins.remove((r, tuple(hash_ids), n))

    def hold_prefix(self, r, hash_ids, until_s):
        self.holds.append((r, tuple(hash_ids), until_s))

    def release_hold(self, r, hash_ids):
        self.holds = [h for h in self.holds if h[:2] != (r, tuple(hash_ids))]

    def start_transfer(self, src, dst, hash_ids, pause_destination=False, from_block=0, hold=False):
        if src == dst or self.cached_blocks(src, hash_ids) < len(hash_ids):
            raise ValueError("source does not hold the blocks")
        if from_block or hold:
            self.transfers.append((src, dst, tuple(hash_ids), pause_destination, from_block, hold))
        else:
            self.transfers.append((src, dst, tuple(hash_ids), pause_destination))
        self.egress[src] += 1.0
        return len(self.transfers) - 1

    def land(self, tid):
        src, dst, hash_ids = self.transfers[tid][:3]
        self.cache[dst]["hbm"].update(hash_ids)
        self.router.on_transfer_done(tid, src, dst, len(hash_ids))


def req(i, hash_ids, input_length=None, t=0.0, out=1):
    hash_ids = tuple(hash_ids)
    if input_length is None:
        input_length = len(hash_ids) * BT
    return Request(i, i, t, input_length, out, hash_ids, BT)


def setup(router, n=4, seed=0):
    view = FakeView(n, seed)
    view.router = router
    router.reset(view)
    return view


# -- table and parameters -------------------------------------------------------------------------
def test_policy_table_names():
    for name, cls in POLICIES.items():
        assert cls.name == name


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_params_list_matches_constructor_defaults(name):
    cls = POLICIES[name]
    sig = inspect.signature(cls.__init__).parameters
    for p in getattr(cls, "PARAMS", ()):
        if p.name in sig:
            assert sig[p.name].default == p.default, p.name
        else:  # forwarded to the contained cache-aware router
            assert p.name in inspect.signature(CacheAwareRouter.__init__).parameters
        assert p.default is None or isinstance(p.default, p.type)  # None: an optional parameter


# sglang_gateway starts a real process: tests/test_gateway.py covers it end to end.
@pytest.mark.parametrize("name", sorted(set(POLICIES) - {"sglang_gateway"}))
def test_every_policy_routes_in_range_with_defaults(name):
    router = make_router(name)
    view = setup(router, n=3)
    for i in range(6):
        r = router.route(req(i, range(100 * i, 100 * i + 3)))
        assert 0 <= r < 3
        router.on_request_finished(req(i, ()), r)
    assert view.transfers == []


def test_parse_router_params_converts_and_rejects():
    kw = parse_router_params(CacheAwareRouter, ["cache_threshold=0.5", "balance-abs-threshold=8",
                                                "miss_policy=smallest_tree"])
    assert kw == {"cache_threshold": 0.5, "balance_abs_threshold": 8,
                  "miss_policy": "smallest_tree"}
    assert parse_router_params(BTBRouter, ["pause_compute_while_receiving=yes"]) == \
        {"pause_compute_while_receiving": True}
    with pytest.raises(ConfigError, match="no parameter 'bogus'"):
        parse_router_params(CacheAwareRouter, ["bogus=1"])
    with pytest.raises(ConfigError, match="value 'abc' is not a float"):
        parse_router_params(CacheAwareRouter, ["cache_threshold=abc"])
    with pytest.raises(ConfigError, match="not in"):
        parse_router_params(CacheAwareRouter, ["miss_policy=nearest"])
    with pytest.raises(ConfigError, match="expected name=value"):
        parse_router_params(CacheAwareRouter, ["cache_threshold"])


@pytest.mark.parametrize("cls, kwargs, msg", [
    (CacheAwareRouter, {"cache_threshold": 1.5}, "cache_threshold=1.5"),
    (CacheAwareRouter, {"balance_abs_threshold": -1}, "balance_abs_threshold=-1"),
    (CacheAwareRouter, {"match_mode": "magic"}, "match_mode='magic'"),
    (KvAwareRouter, {"router_temperature": -0.1}, "router_temperature=-0.1"),
    (KvAwareRouter, {"overlap_tiers": "gpu"}, "overlap_tiers='gpu'"),
    (LlmDRouter, {"prefix_weight": -3}, "prefix_weight=-3"),
    (LeastLoadRouter, {"tie_break": "coin"}, "tie_break='coin'"),
    (BTBRouter, {"m_replicas": -1}, "m_replicas=-1"),
    (BTBRouter, {"x_repeats": 0}, "x_repeats=0"),
    (BTBRouter, {"cache_treshold": 0.3}, "cache_treshold"),
])
def test_bad_config_names_field_and_value(cls, kwargs, msg):
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(".", r"\.")):
        cls(**kwargs)


# -- least_load, random, power_of_two --------------------------------------------------------------
def test_least_load_counts_in_flight_and_ties_by_index():
    router = LeastLoadRouter()
    setup(router, n=3)
    reqs = [req(i, [i]) for i in range(4)]
    assert [router.route(r) for r in reqs[:3]] == [0, 1, 2]
    router.on_request_finished(reqs[1], 1)
    assert router.route(reqs[3]) == 1
    assert router.load.loads == [1, 1, 1]
    router.on_request_finished(reqs[1], 1)  # finishing twice is ignored
    assert router.load.loads == [1, 1, 1]


def test_least_load_random_ties_are_seeded():
    picks = []
    for seed in (0, 0, 1):
        router = LeastLoadRouter(tie_break="random")
        setup(router, n=4, seed=seed)
        picks.append(router.route(req(0, [0])))
    assert picks[0] == picks[1]
    seen = set()
    for seed in range(30):
        router = LeastLoadRouter(tie_break="random")
        setup(router, n=4, seed=seed)
        seen.add(router.route(req(0, [0])))
    assert seen == {0, 1, 2, 3}


def test_least_load_prompt_token_unit():
    router = LeastLoadRouter(load_unit="prompt_tokens")
    setup(router, n=2)
    assert router.route(req(0, [1] * 10)) == 0   # 160 tokens on 0
    assert router.route(req(1, [2])) == 1        # 16 tokens on 1
    assert router.route(req(2, [3])) == 1        # 1 has 16 < 160
    assert router.load.loads == [160, 32]


def test_random_is_seeded_and_covers_replicas():
    a, b = RandomRouter(), RandomRouter()
    setup(a, n=5, seed=7)
    setup(b, n=5, seed=7)
    seq_a = [a.route(req(i, [i])) for i in range(50)]
    assert seq_a == [b.route(req(i, [i])) for i in range(50)]
    assert set(seq_a) == set(range(5))


def test_power_of_two_takes_the_lighter_of_two():
    router = PowerOfTwoRouter(load="in_flight")
    setup(router, n=2, seed=3)
    router.load.loads[:] = [5, 0]
    assert {router.route(req(i, [i])) for i in range(4)} == {1}
    single = PowerOfTwoRouter()
    setup(single, n=1)
    assert single.route(req(0, [0])) == 0


def test_power_of_two_never_picks_the_unique_max_when_others_are_idle():
    router = PowerOfTwoRouter(load="in_flight")
    setup(router, n=3, seed=11)
    router.load.loads[:] = [100, 0, 0]
    picks = []
    for i in range(40):
        picks.append(router.route(req(i, [i])))
        router.on_request_finished(req(i, [i]), picks[-1])
    assert 0 not in picks and set(picks) == {1, 2}


@pytest.mark.parametrize("load", ["engine", "in_flight"])
def test_power_of_two_tie_goes_to_the_first_draw(load):
    # equal loads: the first of the two draws wins (SGLang's ``load_i <= load_j``); replay the
    # router's two draws from a twin generator to know which one came first
    router = PowerOfTwoRouter(load=load)
    setup(router, n=5, seed=7)
    twin = np.random.default_rng(7)
    for i in range(30):
        first = int(twin.integers(5))
        second = (first + 1 + int(twin.integers(4))) % 5
        assert second != first
        r = router.route(req(i, [i]))
        assert r == first
        router.on_request_finished(req(i, [i]), r)      # loads back to all equal


# -- the approximate prefix tree -------------------------------------------------------------------
def test_prefix_tree_match_and_lru_eviction():
    tree = ApproxPrefixIndex(2)
    tree.insert(0, (1, 2, 3), 48, BT, now_s=0.0)
    tree.insert(0, (1, 2, 4, 5), 64, BT, now_s=1.0)
    assert tree.match_blocks(0, (1, 2, 3, 9)) == 3
    assert tree.match_blocks(0, (1, 2, 4, 5, 6)) == 4
    assert tree.match_blocks(1, (1, 2)) == 0
    assert tree.size_tokens(0) == 5 * BT
    # leaf 3 (t=0) is older than leaf 5 (t=1): it goes first
    assert tree.evict_to(0, 4 * BT) == 1
    assert tree.match_blocks(0, (1, 2, 3)) == 2
    assert tree.match_blocks(0, (1, 2, 4, 5)) == 4
    assert tree.evict_to(0, 0) == 4 and tree.size_tokens(0) == 0


def test_prefix_tree_partial_last_block_tokens():
    tree = ApproxPrefixIndex(1)
    tree.insert(0, (1, 2), 20, BT, now_s=0.0)  # 16 + 4 tokens
    assert tree.size_tokens(0) == 20
    assert tree.match_tokens(0, (1, 2), 20, BT) == 20
    assert tree.match_tokens(0, (1, 7), 20, BT) == 16


@settings(max_examples=100, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), min_size=1,
                        max_size=12),
       budget=st.integers(0, 20))
def test_prefix_tree_stays_prefix_closed_and_matches_naive(prompts, budget):
    def chain(tokens):  # chained ids: the id of block i names the first i+1 "tokens"
        return tuple(tuple(tokens[: i + 1]) for i in range(len(tokens)))
    tree = ApproxPrefixIndex(1)
    for t, p in enumerate(prompts):
        tree.insert(0, chain(p), len(p) * BT, BT, now_s=float(t))
    tree.evict_to(0, budget * BT)
    assert tree.size_tokens(0) <= budget * BT
    held = set(tree.access_times(0))
    for h in held:  # prefix-closed
        assert all(h[:i] in held for i in range(1, len(h)))
    for p in prompts:
        ids = chain(p)
        naive = 0
        while naive < len(ids) and ids[naive] in held:
            naive += 1
        assert tree.match_blocks(0, ids) == naive


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 2), min_size=1, max_size=5),
                              st.integers(0, 12)), min_size=1, max_size=15))
def test_prefix_tree_root_holders_are_the_replicas_holding_the_first_block(ops):
    """root_holders(first block) == the replicas whose tree holds it, through inserts and
    evictions; every other replica matches 0 blocks (what cache_aware's one-walk match relies on)."""
    def chain(tokens):
        return tuple(tuple(tokens[: i + 1]) for i in range(len(tokens)))
    tree = ApproxPrefixIndex(3)
    for t, (replica, p, budget) in enumerate(ops):
        tree.insert(replica, chain(p), len(p) * BT, BT, now_s=float(t))
        tree.evict_to((replica + t) % 3, budget * BT)
        for _, q, _ in ops:
            ids = chain(q)
            holders = set(tree.root_holders(ids[0]))
            assert holders == {r for r in range(3) if ids[0] in tree.access_times(r)}
            assert all(tree.match_blocks(r, ids) == 0 for r in range(3) if r not in holders)


# -- cache_aware -----------------------------------------------------------------------------------
def test_cache_aware_hit_miss_and_tree_insert():
    router = CacheAwareRouter()
    setup(router, n=3)
    assert router.route(req(0, [1, 2, 3])) == 0       # empty trees: miss -> least load (0)
    assert router.route(req(1, [1, 2, 3, 4])) == 0    # 3/4 matched > 0.3: hit
    assert router.route(req(2, [9, 8])) == 1          # miss -> least load
    assert router.decisions == {"imbalanced": 0, "hit": 1, "miss": 2}


def test_cache_aware_threshold_is_strict_at_the_boundary():
    router = CacheAwareRouter(cache_threshold=0.3)
    setup(router, n=2)
    router.record(req(0, range(3)), 1)                 # replica 1 holds blocks 0..2
    router.load.loads[:] = [0, 5]
    ten = list(range(3)) + [50 + i for i in range(7)]  # 3 of 10 blocks match: rate == 0.3
    assert 48 / 160 == 0.3
    assert router.choose(req(1, ten)) == 0             # not > 0.3: miss -> least load
    eleven = list(range(3)) + [70 + i for i in range(6)]  # 3 of 9: 0.333 > 0.3
    assert router.choose(req(2, eleven)) == 1


@pytest.mark.parametrize("loads, imbalanced", [
    ([64, 0], False),     # diff 64 is not > 64
    ([65, 0], True),      # diff 65 > 64 and 65 > 1.5 * 0
    ([200, 135], False),  # diff 65 but 200 <= 1.5 * 135 = 202.5
    ([203, 135], True),   # diff 68 and 203 > 202.5
])
def test_cache_aware_imbalance_rule_boundaries(loads, imbalanced):
    router = CacheAwareRouter()
    setup(router, n=2)
    router.record(req(0, [1, 2]), 0)
    router.load.loads[:] = loads
    assert router.is_imbalanced() is imbalanced
    # the prompt is cached on 0; only the imbalance rule sends it to 1
    assert router.choose(req(1, [1, 2])) == (1 if imbalanced else 0)


def test_cache_aware_smallest_tree_miss_policy():
    router = CacheAwareRouter(miss_policy="smallest_tree")
    setup(router, n=3)
    router.record(req(0, range(10)), 0)
    router.record(req(1, range(100, 102)), 1)
    router.record(req(2, range(200, 205)), 2)
    assert router.choose(req(3, [999])) == 1  # 2 blocks is the smallest tree


def test_cache_aware_kv_events_mode_uses_true_cache_then_load():
    router = CacheAwareRouter(match_mode="kv_events")
    view = setup(router, n=3)
    view.cache[1]["dram"].update({1, 2})
    view.cache[2]["hbm"].update({1, 2})
    router.load.loads[:] = [0, 3, 2]
    assert router.choose(req(0, [1, 2, 3])) == 2   # equal overlap on 1 and 2: lower load
    router.load.loads[:] = [0, 1, 2]
    assert router.choose(req(0, [1, 2, 3])) == 1


def test_cache_aware_periodic_eviction_trims_trees():
    router = CacheAwareRouter(eviction_interval_s=10.0, max_tree_size=4 * BT)
    view = setup(router, n=1)
    router.record(req(0, range(8)), 0)
    assert router.tree.num_blocks(0) == 8
    view.now_s = 9.0
    router.record(req(1, [100]), 0)
    assert router.tree.num_blocks(0) == 9
    view.now_s = 10.0
    router.record(req(2, [200]), 0)  # trim first (to 4 blocks), then insert
    assert router.tree.num_blocks(0) == 5


# -- kv_aware --------------------------------------------------------------------------------------
def test_kv_aware_logits_closed_form():
    router = KvAwareRouter(active_blocks="engine")
    view = setup(router, n=3)
    view.cache[0]["hbm"].update({1, 2})       # 2 of 4 blocks cached on replica 0
    router._prefill_tokens[:] = [320, 0, 160]  # the router's own book of uncached prefill tokens
    view.blocks[:] = [10, 30, 0]
    logits = router.logits(req(0, [1, 2, 3, 4]))  # 64 tokens, 4 blocks
    # r0: prefill (320 + 32)/16 = 22, decode 10 + 2 = 12 -> 34
    # r1: prefill 64/16 = 4, decode 30 + 4 = 34 -> 38
    # r2: prefill (160 + 64)/16 = 14, decode 0 + 4 = 4 -> 18
    assert logits.tolist() == [34.0, 38.0, 18.0]
    assert router.route(req(0, [1, 2, 3, 4])) == 2


def test_kv_aware_overlap_counts_only_hbm_by_default():
    router = KvAwareRouter(active_blocks="engine")
    view = setup(router, n=2)
    view.cache[0]["dram"].update({1, 2})
    assert router.logits(req(0, [1, 2])).tolist() == [4.0, 4.0]
    router_all = KvAwareRouter(overlap_tiers="hbm,dram", active_blocks="engine")
    view2 = setup(router_all, n=2)
    view2.cache[0]["dram"].update({1, 2})
    assert router_all.logits(req(0, [1, 2])).tolist() == [0.0, 4.0]


def test_kv_aware_zero_temperature_ties_are_seeded_random():
    picks = set()
    for seed in range(20):
        router = KvAwareRouter()
        setup(router, n=3, seed=seed)
        picks.add(router.route(req(0, [5, 6])))
    assert picks == {0, 1, 2}
    a, b = KvAwareRouter(), KvAwareRouter()
    setup(a, n=3, seed=4)
    setup(b, n=3, seed=4)
    assert [a.route(req(i, [i])) for i in range(10)] == [b.route(req(i, [i])) for i in range(10)]


def test_kv_aware_softmax_probabilities():
    router = KvAwareRouter(router_temperature=1.0)
    setup(router, n=2)
    p = router.probabilities(np.array([0.0, 10.0]))
    assert p == pytest.approx([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])
    assert router.probabilities(np.array([3.0, 3.0])).tolist() == [0.5, 0.5]
    cold = KvAwareRouter(router_temperature=0.01)
    setup(cold, n=2)
    assert cold.probabilities(np.array([0.0, 10.0]))[0] == pytest.approx(1.0)


def test_kv_aware_softmax_sampling_frequencies():
    router = KvAwareRouter(router_temperature=1.0, active_blocks="engine")
    view = setup(router, n=2, seed=1)
    view.blocks[:] = [0, 10]  # logits differ by 10 -> p0 = 0.731
    picks = []
    for i in range(2000):
        r = req(i, [i])
        picks.append(router.route(r))
        router.on_prefill_done(r, picks[-1])  # keep the prefill book empty between draws
    assert picks.count(0) / 2000 == pytest.approx(0.731, abs=0.03)


def test_kv_aware_books_only_uncached_tokens_until_prefill_completes():
    # Dynamo's ActiveSequences: a dispatched request adds isl - overlap * block to its worker's
    # prefill load and removes it at mark_prefill_completed (regression: the engine's raw
    # waiting-queue tokens made a hot-prefix holder look 4 blocks busier per queued cache hit).
    router = KvAwareRouter()
    view = setup(router, n=2)
    view.cache[0]["hbm"].update({1, 2, 3})            # 3 of 4 blocks cached on replica 0
    first, second = req(0, [1, 2, 3, 4]), req(1, [1, 2, 3, 5])
    assert router.route(first) == 0
    assert router._prefill_tokens == [16, 0]           # 64 tokens - 3 cached blocks x 16
    assert router.route(second) == 0                   # still cheaper than 64 cold tokens on 1
    assert router._prefill_tokens == [32, 0]
    router.on_prefill_done(first, 0)
    router.on_prefill_done(second, 0)
    assert router._prefill_tokens == [0, 0]


# -- llm_d -----------------------------------------------------------------------------------------
def test_llm_d_scores_closed_form():
    router = LlmDRouter()
    view = setup(router, n=3)
    view.queue[:] = [0, 2, 4]
    view.kv[:] = [0.5, 0.0, 0.25]
    s = router.scores(req(0, [1, 2, 3, 4]))
    assert s[:, 0].tolist() == [0.0, 0.0, 0.0]
    assert s[:, 1].tolist() == [1.0, 0.5, 0.0]
    assert s[:, 2].tolist() == [0.5, 1.0, 0.75]
    # totals: 2*1 + 2*.5 = 3.0; 2*.5 + 2*1 = 3.0; 0 + 1.5 -> tie 0/1 broken by rng
    assert router.route(req(0, [1, 2, 3, 4])) in (0, 1)


def test_llm_d_prefix_scorer_remembers_routed_blocks():
    router = LlmDRouter()
    view = setup(router, n=2, seed=0)
    first = router.route(req(0, [1, 2, 3, 4]))
    s = router.scores(req(1, [1, 2, 9, 9]))
    assert s[first, 0] == 0.5 and s[1 - first, 0] == 0.0
    assert router.route(req(1, [1, 2, 9, 9])) == first  # 3 * 0.5 beats nothing else differing
    view.queue[first] = 5  # queue 0 vs 1 score; prefix 0.75*3=2.25 vs queue 2: still sticks
    assert router.route(req(2, [1, 2, 9, 10])) == first


def test_llm_d_equal_queues_score_one_and_lru_capacity():
    router = LlmDRouter(lru_capacity_blocks=2)
    view = setup(router, n=1)
    view.queue[:] = [7]
    assert router.scores(req(0, [1]))[0, 1] == 1.0
    router.route(req(0, [1, 2, 3]))
    assert list(router._lru[0]) == [2, 3]
    assert router.scores(req(1, [1, 2, 3]))[0, 0] == 0.0  # block 1 evicted: no leading match


def test_llm_d_kv_events_mode():
    router = LlmDRouter(prefix_mode="kv_events")
    view = setup(router, n=2)
    view.cache[1]["hbm"].update({1, 2, 3})
    assert router.scores(req(0, [1, 2, 3, 4]))[:, 0].tolist() == [0.0, 0.75]
    assert router.route(req(0, [1, 2, 3, 4])) == 1


def test_llm_d_prefix_column_with_many_matching_replicas():
    """Above ``_FEW_MATCHES`` matching replicas the prefix column is filled as a list: the same
    values as one replica at a time (matched / prefix blocks, 0 where nothing matches)."""
    from btb_core.routers.llm_d import _FEW_MATCHES
    n = _FEW_MATCHES + 8
    router = LlmDRouter(prefix_mode="kv_events")
    view = setup(router, n=n)
    for r in range(n - 3):                # every replica but the last three holds 1-4 blocks
        view.cache[r]["hbm"].update([1, 2, 3, 4][: 1 + r % 4])
    s = router.scores(req(0, [1, 2, 3, 4]))[:, 0].tolist()
    assert s == [(1 + r % 4) / 4 for r in range(n - 3)] + [0.0] * 3
    few = LlmDRouter(prefix_mode="kv_events")
    v2 = setup(few, n=4)
    for r in range(4):
        v2.cache[r]["hbm"].update([1, 2, 3, 4][: 1 + r % 4])
    assert few.scores(req(0, [1, 2, 3, 4]))[:, 0].tolist() == s[:4]


# -- btb -------------------------------------------------------------------------------------------
def btb(n=6, **kw):
    kw.setdefault("y_tokens", 4 * BT)
    router = BTBRouter(**kw)
    view = setup(router, n=n)
    return router, view


PREFIX = (11, 12, 13, 14)


def burst_req(i, t, suffix=None):
    return req(i, PREFIX + ((100 + i,) if suffix is None else suffix), t=t)


def test_btb_no_copy_until_prefix_is_complete_somewhere():
    router, view = btb()
    assert router.route(burst_req(0, 0.0)) == 0       # cache-aware miss -> replica 0
    view.now_s = 0.1
    assert router.route(burst_req(1, 0.1)) == 0       # active, but the prefill is still running
    assert view.transfers == []


def test_btb_copies_to_m_least_loaded_from_shortest_egress():
    router, view = btb(n=6)
    router.route(burst_req(0, 0.0))                   # -> 0
    view.cache[0]["hbm"].update(PREFIX)               # its prefill completed
    view.cache[5]["dram"].update(PREFIX)              # replica 5 holds it too, in DRAM
    view.egress[0] = 3.0                              # replica 0's NIC is busy
    router.load.loads[:] = [1, 4, 0, 2, 3, 0]
    view.now_s = 0.5
    router.route(burst_req(1, 0.5))
    dsts = [t[1] for t in view.transfers]
    srcs = [t[0] for t in view.transfers]
    assert dsts == [2, 3, 4, 1]                       # least loaded first; 0 and 5 hold it
    # egress: 5 is free (0 s) until its first copy (+1 s per copy in the fake), then alternate
    assert srcs == [5, 5, 5, 0]
    assert all(t[2] == PREFIX and t[3] is False for t in view.transfers)
    view.now_s = 0.6
    router.route(burst_req(2, 0.6))
    assert len(view.transfers) == 4                   # never started twice, budget M = 4 spent


def test_btb_m_larger_than_replicas_copies_to_every_other_replica():
    router, view = btb(n=3, m_replicas=10)
    router.route(burst_req(0, 0.0))
    view.cache[0]["hbm"].update(PREFIX)
    view.now_s = 0.2
    router.route(burst_req(1, 0.2))
    assert sorted(t[1] for t in view.transfers) == [1, 2]


def test_btb_routes_to_least_loaded_warm_replica_after_landing():
    router, view = btb(n=4, m_replicas=2)
    assert router.route(burst_req(0, 0.0)) == 0
    view.cache[0]["hbm"].update(PREFIX)
    view.now_s = 0.2
    assert router.route(burst_req(1, 0.2)) == 0       # copies start; none landed: cache-aware
    assert [t[1] for t in view.transfers] == [1, 2]
    view.now_s = 0.4
    view.land(0)                                      # copy to replica 1 lands
    r = router.route(burst_req(2, 0.4))
    assert r == 1                                     # loads: 0 -> 2, 1 -> 0
    assert router.decisions == {"warm": 1, "fallback": 2}
    # the contained cache-aware router saw the decision
    assert router.cache_aware.tree.match_blocks(1, PREFIX) == 4
    assert router.cache_aware.load.loads == [2, 1, 0, 0]
    assert router.transfers[0]["done_s"] == 0.4 and router.transfers[1]["done_s"] is None


def test_btb_short_prompts_and_trickles_fall_back_to_cache_aware():
    router, view = btb(n=3)
    for i in range(4):                                # one arrival every 2 s: never a burst
        view.now_s = 2.0 * i
        router.route(burst_req(i, view.now_s))
        view.cache[0]["hbm"].update(PREFIX)
    assert view.transfers == []
    router.route(req(10, (11, 12)))                   # fewer than Y blocks: no detector update
    assert router.detector.num_tracked <= 1


def test_btb_pause_option_is_passed_to_the_transfer():
    router, view = btb(n=2, pause_compute_while_receiving=True)
    router.route(burst_req(0, 0.0))
    view.cache[0]["hbm"].update(PREFIX)
    view.now_s = 0.1
    router.route(burst_req(1, 0.1))
    assert view.transfers == [(0, 1, PREFIX, True)]


def test_btb_y_from_tokens_and_too_short_y():
    router = BTBRouter()
    setup(router, n=2)
    assert router.y_blocks == 65_536 // BT
    with pytest.raises(ConfigError, match="y_tokens=8"):
        setup(BTBRouter(y_tokens=8), n=2)


def test_btb_m_zero_is_cache_aware():
    a, va = btb(n=3, m_replicas=0)
    b = CacheAwareRouter()
    setup(b, n=3)
    for i in range(6):
        va.now_s = 0.1 * i
        b.view.now_s = va.now_s
        assert a.route(burst_req(i, va.now_s)) == b.route(burst_req(i, va.now_s))
        va.cache[0]["hbm"].update(PREFIX)
    assert va.transfers == []
