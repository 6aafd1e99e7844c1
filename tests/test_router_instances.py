"""Several router instances and stale views (issue 11): the invariants the notebook relies on.

- N instances that share one state route exactly like one instance (and one instance behind the
  wrapper exactly like the bare policy);
- lags of 0 are bit-identical to a run without them;
- with a KV-event lag L a router never sees a block before it completed + L (and does see it
  then), and with a load lag L it sees snapshots refreshed every L seconds;
- per-instance state has the consequences the issue describes (BTB's detector is per instance).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from btb_core.cli import main
from btb_core.errors import ConfigError
from btb_core.routers import policy_class
from btb_core.routers.base import Router
from btb_core.routers.btb import BTBRouter
from btb_core.routers.cache_aware import CacheAwareRouter
from btb_core.routers.instances import RouterInstances
from btb_core.scenarios import ScenarioSpec, build
from btb_core.sim import ClusterConfig, simulate

PREFIX, SUFFIX = 65_536, 1_024


@pytest.fixture(scope="module")
def cluster():
    return ClusterConfig.from_setup("70b_h100x4", num_replicas=8)


@pytest.fixture(scope="module")
def burst():   # 4 requests/s for 20 s: one 64k-token prefix, each with its own 1k suffix
    return build(ScenarioSpec("burst", 80, 20.0, PREFIX, SUFFIX))


def _same(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.metrics == b.metrics


# -- instances -------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["cache_aware", "kv_aware", "btb", "llm_d", "power_of_two"])
def test_instances_sharing_one_state_route_like_one(policy, cluster, burst):
    cls = policy_class(policy)
    bare = simulate(burst, cls(), cluster)
    shared = cls()
    _same(bare, simulate(burst, RouterInstances(lambda k: shared, 8, sync_s=0.5), cluster))
    _same(bare, simulate(burst, RouterInstances.of_policy(cls, {}, 1), cluster))


def test_eight_instances_split_btb_detection(cluster, burst):
    # 4 requests/s round-robin over 8 instances: each instance sees one request every 2 s, never
    # 2 within BTB's Z = 1 s, so no instance detects the burst and no copy starts
    one = BTBRouter()
    assert simulate(burst, one, cluster).metrics["rdma_copies"] == 4
    many = RouterInstances.of_policy(BTBRouter, {}, 8)
    res = simulate(burst, many, cluster)
    assert res.metrics["rdma_copies"] == 0 and many.routed == [10] * 8
    # by session (here: the shared first block) the whole job goes through one instance
    sticky = RouterInstances.of_policy(BTBRouter, {}, 8, assign="session")
    _same(simulate(burst, one, cluster), simulate(burst, sticky, cluster))
    assert sorted(sticky.routed) == [0] * 7 + [80]


def test_instances_each_start_their_own_copies(cluster):
    # a dense burst: every instance detects it and copies on its own, so copies duplicate
    burst = build(ScenarioSpec("burst", 160, 10.0, PREFIX, SUFFIX))
    many = RouterInstances.of_policy(BTBRouter, {}, 2)
    res = simulate(burst, many, cluster)
    per_instance = [len(r.transfers) for r in many.instances]
    assert per_instance == [4, 4] and res.metrics["rdma_copies"] == 8
    assert res.transfers["dst"].duplicated().any()     # the same destination warmed twice


def test_sync_exchanges_prefix_index_updates():
    from tests.test_routers_unit import req, setup

    a, b = CacheAwareRouter(), CacheAwareRouter()
    routers = iter([a, b])
    wrap = RouterInstances(lambda k: next(routers), 2, sync_s=1.0)
    view = setup(wrap, n=4)
    wrap.route(req(0, [1, 2, 3, 4]))           # instance 0 routes the prompt
    assert b.tree.match_blocks(0, (1, 2, 3, 4)) == 0
    view.now_s = 1.0
    wrap.route(req(1, [9]))                    # the exchange at t = 1 s runs first
    r0 = next(r for r in range(4) if a.tree.match_blocks(r, (1, 2, 3, 4)) == 4)
    assert b.tree.match_blocks(r0, (1, 2, 3, 4)) == 4
    assert b.load.loads == [0, 0, 0, 0] or sum(b.load.loads) == 1   # loads are never shared
    assert wrap.syncs == 1


@pytest.mark.parametrize("kw, field", [({"num_instances": 0}, "--routers"),
                                       ({"num_instances": 2, "assign": "hash"}, "--router-assign"),
                                       ({"num_instances": 2, "sync_s": -1.0}, "--router-sync-s")])
def test_instances_reject_bad_values(kw, field):
    with pytest.raises(ConfigError, match=field):
        RouterInstances(lambda k: CacheAwareRouter(), **kw)


# -- lag -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["kv_aware", "btb", "llm_d", "cache_aware"])
def test_zero_lag_is_bit_identical(policy, cluster, burst):
    cls = policy_class(policy)
    _same(simulate(burst, cls(), cluster),
          simulate(burst, cls(), cluster, kv_event_lag_s=0.0, load_lag_s=0.0))


class Probe(Router):
    """Round-robin (so the cluster evolves the same whatever it sees) that records, at every
    arrival, what its view says about the prefix and the queues."""

    name = "probe"

    def __init__(self, prefix_blocks: int):
        self.prefix_blocks = prefix_blocks

    def reset(self, view):
        super().reset(view)
        self.i = 0
        self.seen = []

    def route(self, request):
        v = self.view
        prefix = request.hash_ids[:self.prefix_blocks]
        self.seen.append((v.now_s, [v.cached_blocks(r, prefix) for r in range(v.num_replicas)],
                          [v.queue_length(r) for r in range(v.num_replicas)]))
        self.i += 1
        return (self.i - 1) % v.num_replicas


@pytest.mark.parametrize("lag_s", [0.5, 2.0])
def test_kv_event_lag_never_shows_a_block_early(lag_s, cluster):
    # 4 replicas, the prefix arrives every 0.25 s: each replica computes it itself (round robin);
    # prefill_first completes a prompt's blocks all at once, at its first token
    c4 = dataclasses.replace(cluster, num_replicas=4, scheduler="prefill_first")
    trace = build(ScenarioSpec("burst", 120, 30.0, PREFIX, SUFFIX))
    y = PREFIX // 512
    live, late = Probe(y), Probe(y)
    res = simulate(trace, live, c4)
    res_late = simulate(trace, late, c4, kv_event_lag_s=lag_s)
    _same(res, res_late)                                   # the probe's picks do not depend on it
    req_t = res.requests
    done = (req_t["arrival_s"] + req_t["ttft_s"]).groupby(req_t["replica"]).min()  # first prefill
    for (t, blocks_live, _), (_, blocks_late, _) in zip(live.seen, late.seen):
        for r in range(4):
            if blocks_late[r] >= y:
                assert t >= done[r] + lag_s - 1e-9         # never before completion + lag
            if t >= done[r] + lag_s:
                assert blocks_late[r] == y                 # and visible from then on
            if blocks_live[r] < y:
                assert blocks_late[r] < y
    assert any(b[r] < y <= a[r] for (_, a, _), (_, b, _) in zip(live.seen, late.seen)
               for r in range(4))                          # the lag did hide something


def test_load_lag_gives_snapshots_every_period(cluster):
    c2 = dataclasses.replace(cluster, num_replicas=2)
    trace = build(ScenarioSpec("unrelated", 60, 6.0, suffix_tokens=8192))
    live, late = Probe(1), Probe(1)
    simulate(trace, live, c2)
    simulate(trace, late, c2, load_lag_s=1.0)
    by_period = {}
    for t, _, queues in late.seen:
        by_period.setdefault(int(np.floor(t)), set()).add(tuple(queues))
    assert all(len(v) == 1 for v in by_period.values())    # constant between refreshes
    assert by_period[0] == {(0, 0)}                         # before the first refresh: idle cluster
    live_q = {tuple(q) for _, _, q in live.seen}
    assert len(live_q) > len(by_period)                     # live figures change more often


def test_lag_rejects_negative_values(cluster, burst):
    with pytest.raises(ConfigError, match="kv_event_lag_s"):
        simulate(burst, CacheAwareRouter(), cluster, kv_event_lag_s=-1.0)


# -- command line ----------------------------------------------------------------------------------
def test_cli_replay_with_eight_routers_runs(capsys):
    trace = "data/traces/mooncake/conversation_trace.jsonl"
    from btb_core.paths import REPO_ROOT

    assert main(["replay", "--trace", str(REPO_ROOT / trace), "--policy", "cache_aware",
                 "--routers", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["routers"] == 8 and out["requests"] > 0
