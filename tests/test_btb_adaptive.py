"""`btb_adaptive` (issue 10, item 2): one scenario test per mechanism 2a-2h, the ledger, the CLI."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from btb_core.cli import main
from btb_core.cost import cost_model_for_setup
from btb_core.errors import ConfigError
from btb_core.routers import make_router
from btb_core.routers.btb_adaptive import BTBAdaptiveRouter, common_prefix, grid_depths
from btb_core.sim import ClusterConfig, simulate
from btb_core.suite import BurstJob, Shape

from test_experiment_sweep import dataset  # noqa: F401  (fixture)
from test_routers_unit import req, setup  # noqa: F401

BT = 512


def run(shape, seed=0, cluster=None, **params):
    router = BTBAdaptiveRouter(**params)
    res = simulate(shape.build(seed), router, cluster or shape.cluster(), seed=seed)
    return res, router


def burst(prefix_tokens, rate, duration_s, replicas=4, scheduler="chunked", **job):
    return Shape("t", "test", (BurstJob(prefix_tokens, rate, duration_s, **job),),
                 replicas=replicas, span_s=duration_s, scheduler=scheduler)


# -- helpers ---------------------------------------------------------------------------------------
def test_grid_and_common_prefix():
    g = grid_depths(257)
    assert g[:16] == list(range(1, 17)) and g[-1] == 257
    assert all(b - a <= max(1, a // 8) for a, b in zip(g, g[1:])) and len(g) < 60
    assert 17 not in g and 18 in g
    a, b = (1, 2, 3, 4, 5), (1, 2, 3, 9, 10)
    assert common_prefix(a, b) == 3 and common_prefix(a, a) == 5 and common_prefix(a, (7,)) == 0


def test_parameters_are_checked():
    with pytest.raises(ConfigError, match="x_repeats=1"):
        BTBAdaptiveRouter(x_repeats=1)
    with pytest.raises(ConfigError, match="target_utilization=1.5"):
        BTBAdaptiveRouter(target_utilization=1.5)
    with pytest.raises(ConfigError, match="pin_hot"):
        BTBAdaptiveRouter(pin_hot="yes")


# -- 2a detection at any depth ---------------------------------------------------------------------
@pytest.mark.parametrize("prefix_blocks", [16, 21, 64])
def test_2a_detects_the_exact_shared_depth_off_the_grid_too(prefix_blocks):
    res, router = run(burst(prefix_blocks * BT, 8.0, 3.0))
    depths = {int(d) for d in router.ledger_frame()["prefix_blocks"]
              if router.ledger_frame() is not None}
    acts = router.ledger_frame()
    warm = acts[acts["event"] == "warm_set"]["prefix_blocks"]
    assert len(warm) and set(warm) == {prefix_blocks}
    assert max(depths) == prefix_blocks


def test_2a_minimum_copy_depth_comes_from_the_cost_model():
    v = setup(BTBAdaptiveRouter(), n=2)
    r = v.router
    cost = v.cost
    n = r.min_copy_blocks
    bt = v.block_tokens
    assert cost.load_s("rdma", n * bt) < cost.prefill_s(n * bt)
    if n > 1:
        assert cost.load_s("rdma", (n - 1) * bt) >= cost.prefill_s((n - 1) * bt)
    # a link 1,000x slower makes short prefixes not worth copying
    slow = _slow_cost(1e-2)
    v.cost = slow
    r.reset(v)
    assert r.min_copy_blocks > n
    assert slow.load_s("rdma", r.min_copy_blocks * bt) < slow.prefill_s(r.min_copy_blocks * bt)


def _slow_cost(factor):
    cost = cost_model_for_setup("70b_h100x4")
    gpu = dataclasses.replace(cost.node.gpu, nic_bytes_per_s=cost.node.gpu.nic_bytes_per_s * factor)
    return dataclasses.replace(cost, node=dataclasses.replace(cost.node, gpu=gpu))


# -- 2b cost and room checks ----------------------------------------------------------------------
def test_2b_no_copy_over_a_link_slower_than_recomputing():
    shape = burst(32_768, 8.0, 6.0)
    fast, _ = run(shape)
    assert len(fast.transfers) > 0
    cluster = ClusterConfig(cost=_slow_cost(1e-4), num_replicas=4)
    res, router = run(shape, cluster=cluster)
    assert len(res.transfers) == 0
    led = router.ledger_frame()
    assert (led["event"] == "copy").sum() == 0


def test_2b_no_copy_to_a_replica_without_hbm_room():
    router = BTBAdaptiveRouter()
    view = setup(router, n=3)
    prefix = tuple(range(1, 65))
    view.now_s = 0.0
    holder = router.route(req(0, prefix + (500,)))
    view.cache[holder]["hbm"].update(prefix)
    router.on_prefill_done(req(0, prefix + (500,)), holder)
    view.free = [10_000 if r == holder else 0 for r in range(3)]   # others: no free blocks
    view.kv = [0.0 if r == holder else 0.99 for r in range(3)]     # (and so they are avoided)
    for i in range(1, 30):
        view.now_s = 0.01 * i
        q = req(i, prefix + tuple(range(1000 + 200 * i, 1128 + 200 * i)))
        router.on_prefill_done(q, router.route(q))
    assert view.transfers == []
    led = router.ledger_frame()
    skips = led[led["event"] == "skip"]
    assert len(skips) and set(skips["reason"]) == {"no HBM room without evicting blocks in use"}
    assert holder not in set(skips["dst"])


# -- 2c demand-sized warm set -----------------------------------------------------------------------
def test_2c_warm_set_grows_with_demand_and_stays_at_one_for_a_served_trickle():
    # 16k prefix, one request every 3 s: one replica serves it with headroom
    trickle = burst(16_384, 1 / 3, 30.0, replicas=8)
    res, router = run(trickle)
    assert len(res.transfers) == 0
    assert res.requests["replica"].nunique() == 1
    # once the first prefill's backlog is served, the warm set follows the arrival rate
    targets = {}
    for rate in (2.0, 12.0):
        res, router = run(burst(16_384, rate, 12.0, replicas=8, suffix_tokens=2048))
        led = router.ledger_frame()
        ws = led[(led["event"] == "warm_set") & (led["time_s"] > 6.0)]
        targets[rate] = int(ws["target"].iloc[-1]) if len(ws) else None
    # 2 req/s x 0.17 s of own prefill needs one replica; 12 req/s needs ceil(12 x 0.17 / 0.7) >= 3
    assert targets[2.0] in (1, None) and targets[12.0] >= 3


def test_2c_rewarms_a_replica_whose_copy_was_evicted():
    router = BTBAdaptiveRouter(pipelined_copies=False, pin_hot=False)
    view = setup(router, n=4)
    prefix = tuple(range(1, 65))
    view.cache[0]["hbm"].update(prefix)              # replica 0 holds the prefix
    t = 0.0
    for i in range(60):                                # a heavy burst: the warm set must grow
        view.now_s = t
        q = req(i, prefix + tuple(range(1000 + 200 * i, 1128 + 200 * i)))
        r = router.route(q)
        view.cache[r]["hbm"].update(prefix)            # its prefill completes at once
        router.on_prefill_done(q, r)
        t += 0.02
    dsts = [tr[1] for tr in view.transfers]
    assert dsts and 0 not in dsts
    for tid, tr in enumerate(view.transfers):
        view.land(tid)
    n_before = len(view.transfers)
    evicted = dsts[0]
    view.cache[evicted]["hbm"].clear()                # its copy was evicted
    view.now_s = t
    router.route(req(99, prefix + tuple(range(90_000, 90_128))))
    assert len(view.transfers) == n_before + 1 and view.transfers[-1][1] == evicted


# -- 2d load in predicted seconds, KV-full avoidance, unbiased ties ---------------------------------
def test_2d_load_is_predicted_seconds_not_request_count():
    router = BTBAdaptiveRouter()
    view = setup(router, n=2)
    router.route(req(0, tuple(range(1, 2049))))       # a 32k-token prompt on one replica
    first = router.requests[0][2]
    for i in range(1, 4):                              # three 256-token prompts: all to the other
        router.route(req(i, (10_000 + i,)))
        assert router.requests[i][2] == 1 - first
    assert router.backlog_s(first) > router.backlog_s(1 - first) > 0


def test_2d_avoids_a_replica_with_full_kv_and_breaks_ties_at_random():
    router = BTBAdaptiveRouter()
    view = setup(router, n=4)
    picks = []
    for i in range(40):
        router.reset(view)
        picks.append(router.route(req(i, (100 + i,))))
    assert set(picks) == {0, 1, 2, 3}                 # idle ties: every replica, not index 0
    view.kv[2] = 1.0                                  # all of its KV budget in use: avoided
    for i in range(40):
        router.reset(view)
        assert router.route(req(i, (200 + i,))) != 2
    view.kv[2] = 0.99                                 # nearly full: avoided only below the default
    assert {router.reset(view) or router.route(req(i, (300 + i,))) for i in range(40)} == {0, 1, 2, 3}
    strict = BTBAdaptiveRouter(kv_full_fraction=0.95)
    for i in range(40):
        strict.reset(view)
        assert strict.route(req(i, (400 + i,))) != 2


# -- 2e least predicted TTFT: warm, landing or cold ---------------------------------------------------
def test_2e_spreads_cold_prefills_on_an_idle_cluster_then_uses_warm_replicas():
    router = BTBAdaptiveRouter()
    view = setup(router, n=4)
    a = router.route(req(0, tuple(range(1, 2049))))            # 32k tokens, unrelated prompts
    b = router.route(req(1, tuple(range(3000, 5048))))
    assert a != b                                             # cold spread: faster than queueing
    view.cache[a]["hbm"].update(range(1, 2049))
    router.on_prefill_done(req(0, ()), a)
    view.now_s = 5.0
    c = router.route(req(2, tuple(range(1, 2049)) + (9000,), input_length=2049 * 16))
    assert c == a and router.requests[2][3] == "warm"


def test_2e_predictions_match_the_simulator_once_warm():
    res, router = run(burst(32_768, 4.0, 10.0))
    rf = router.requests_frame()
    assert np.allclose(rf["actual_ttft_s"], res.requests["ttft_s"])
    late = rf[rf["arrival_s"] > 5.0]
    assert len(late) > 10
    err = (late["predicted_ttft_s"] - late["actual_ttft_s"]).abs()
    assert float(err.median()) < 0.01


# -- 2f fan-out ------------------------------------------------------------------------------------
def test_2f_later_copies_come_from_replicas_whose_copy_landed():
    # prefill_first, no pipelining: copies start after the first prefill; the burst grows later
    shape = Shape("t", "t", (BurstJob(32_768, 2.0, 8.0), BurstJob(0, 1.0, 1.0)), replicas=8,
                  span_s=16.0, scheduler="prefill_first")
    shape = Shape("t", "t", (BurstJob(32_768, 2.0, 6.0),
                             BurstJob(32_768, 30.0, 4.0, start_s=6.0, suffix_tokens=2048)),
                  replicas=8, span_s=10.0, scheduler="prefill_first")
    # the two jobs must share the prefix: rebuild the trace with job 1 using job 0's ids
    trace = shape.build(0)
    tab = trace.table
    ids = [list(h) for h in tab["hash_ids"]]
    first = next(i for i, s in enumerate(tab["source"]) if s == "job0")
    for i, s in enumerate(tab["source"]):
        if s == "job1":
            ids[i] = list(ids[first][:64]) + [10_000_000 + i * 8 + k for k in range(len(ids[i]) - 64)]
    from btb_core.trace import make_trace

    tr2 = make_trace(tab["arrival_s"].tolist(), tab["input_length"].tolist(),
                     tab["output_length"].tolist(), ids, block_tokens=BT)
    router = BTBAdaptiveRouter(pipelined_copies=False)
    res = simulate(tr2, router, shape.cluster(), seed=0)
    led = router.ledger_frame()
    copies = led[led["event"] == "copy"]
    landed_dsts = set()
    from_landed = 0
    for _, c in copies.sort_values("time_s").iterrows():
        if c["src"] in landed_dsts:
            from_landed += 1
        landed_dsts |= set(copies[copies["landed_s"] <= c["time_s"]]["dst"])
    assert len(copies) >= 3 and from_landed >= 1


# -- 2g pipelined copies -----------------------------------------------------------------------------
def test_2g_pipelined_copies_make_replicas_warm_when_the_first_prefill_ends():
    shape = burst(65_536, 8.0, 8.0)
    res, router = run(shape)
    led = router.ledger_frame()
    copies = led[led["event"] == "copy"]
    assert (led["event"] == "pipe").sum() >= 1
    first_done = float(res.requests["arrival_s"].iloc[0] + res.requests["ttft_s"].iloc[0])
    # chunks go out while the first prefill runs; the last chunk lands right after it ends
    assert (copies["landed_s"] < first_done - 1.0).any()
    last = copies[copies["prefix_blocks"] == 128]["landed_s"]
    assert len(last) and float(last.min()) - first_done < 0.2
    # requests sent to a replica whose copy was landing waited for it and reused the whole prefix
    rf = router.requests_frame()
    landing = rf["choice"] == "landing"
    assert landing.sum() >= 1
    assert (res.requests.loc[landing.values, "reused_tokens"] >= 65_536).all()
    # without pipelining the first full copy lands later, and mean TTFT is worse
    res2, router2 = run(shape, pipelined_copies=False)
    assert len(res2.transfers) > 0
    led2 = router2.ledger_frame()
    c2 = led2[led2["event"] == "copy"]
    assert float(c2["landed_s"].min()) > float(last.min())
    assert res.metrics["ttft_mean_s"] < res2.metrics["ttft_mean_s"]
    # the transfers of a pipelined copy carry only the new blocks of each chunk
    assert res.transfers["blocks"].sum() == res.transfers.groupby("dst")["landed_blocks"].max().sum()


# -- 2h pinning --------------------------------------------------------------------------------------
def test_2h_hot_prefix_pinned_while_active_and_released_after():
    shape = Shape("t", "t", (BurstJob(32_768, 6.0, 4.0),), replicas=4, span_s=30.0,
                  background_rate_per_s=1.0)
    res, router = run(shape)
    led = router.ledger_frame()
    pins, unpins = led[led["event"] == "pin"], led[led["event"] == "unpin"]
    assert len(pins) >= 1 and len(unpins) == len(pins)
    # released once the burst has been quiet for rate_window_s (10 s), not at the end of the run
    assert float(unpins["time_s"].min()) < float(res.requests["arrival_s"].max())
    assert float(unpins["time_s"].min()) > 4.0 + 10.0 - 1.0
    res2, router2 = run(shape, pin_hot=False)
    assert (router2.ledger_frame()["event"] == "pin").sum() == 0


# -- ledger and CLI ------------------------------------------------------------------------------------
def test_ledger_columns_and_unused_copies_small_on_a_burst():
    res, router = run(burst(65_536, 6.0, 10.0, replicas=8))
    led = router.ledger_frame()
    assert {"time_s", "event", "reason", "predicted_land_s", "landed_s"} <= set(led.columns)
    copies = led[led["event"] == "copy"]
    assert np.allclose(copies["predicted_land_s"], copies["landed_s"], atol=1e-6)
    m = res.metrics
    assert m["rdma_copies"] > 0 and m["copies_unused"] <= 0.05 * m["rdma_copies"]


def test_replay_cli_trace_mode(tmp_path, capsys):
    from btb_core.paths import DATA_DIR

    lines = (DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl").read_text().splitlines()
    path = tmp_path / "head.jsonl"
    path.write_text("\n".join(lines[:200]) + "\n")
    assert main(["replay", "--trace", str(path), "--policy", "btb_adaptive", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 200 and out["policy"] == "btb_adaptive"
    assert main(["replay", "--trace", str(path), "--policy", "btb_adaptive",
                 "--router-param", "target_utilization=0.5", "--json"]) == 0
    capsys.readouterr()
    assert main(["replay", "--trace", str(path), "--policy", "btb_adaptive",
                 "--router-param", "y_tokens=4"]) == 2
    capsys.readouterr()
    # behind two router instances and stale views
    assert main(["replay", "--trace", str(path), "--policy", "btb_adaptive", "--routers", "2",
                 "--kv-event-lag-s", "0.5", "--load-lag-s", "0.2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 200


def test_replay_cli_dataset_mode(dataset, capsys):  # noqa: F811
    assert main(["replay", "--dataset", str(dataset), "--split", "test", "--policy", "btb",
                 "btb_adaptive", "--scheduler", "both", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    got = {(r["scheduler"], r["policy"], r["dataset"]): r for r in rows}
    for sched in ("prefill_first", "chunked"):
        ad, lit = got[(sched, "btb_adaptive", "bursted")], got[(sched, "btb", "bursted")]
        assert ad["ttft_mean_s"] > 0 and lit["ttft_mean_s"] > 0


def test_deterministic_for_a_seed():
    shape = burst(16_384, 10.0, 3.0, replicas=8)
    a = make_router("btb_adaptive")
    b = make_router("btb_adaptive")
    ra = simulate(shape.build(1), a, shape.cluster(), seed=3)
    rb = simulate(shape.build(1), b, shape.cluster(), seed=3)
    assert ra.requests["replica"].tolist() == rb.requests["replica"].tolist()
    assert ra.requests["ttft_s"].tolist() == rb.requests["ttft_s"].tolist()


# -- engine: holds -------------------------------------------------------------------------------------
class _Scripted:
    """Request 0 -> replica 0; when its prefill is done, copy its prefix to replica 1 (hold as
    given) and send requests 1 (same prefix) and 2 (unrelated) to replica 1 at once."""

    name = "scripted"

    def __init__(self, hold):
        self.hold = hold

    def reset(self, view):
        self.view = view

    def route(self, request):
        if request.index == 0:
            self.ids = request.hash_ids[:64]
            return 0
        return 1

    def on_prefill_done(self, request, replica):
        if request.index == 0:
            self.view.start_transfer(0, 1, self.ids, hold=self.hold)

    def on_request_finished(self, request, replica):
        pass

    def on_transfer_done(self, *a):
        pass


@pytest.mark.parametrize("hold", [True, False])
def test_hold_makes_a_request_wait_for_the_copy_and_others_pass_it(hold):
    from btb_core.trace import make_trace

    prefix = list(range(1, 65))
    cold = simulate(make_trace([0.0], [32_768 + 256], [1], [prefix + [100]], block_tokens=BT),
                    _Scripted(hold), ClusterConfig.from_setup("70b_h100x4", num_replicas=2))
    t_done = float(cold.requests["ttft_s"].iloc[0])       # the first prefill ends here
    t1 = t_done + 0.001                                    # the copy (~54 ms) is in flight
    trace = make_trace([0.0, t1, t1], [32_768 + 256, 32_768 + 256, 1024], [1, 1, 1],
                       [prefix + [100], prefix + [101], [200, 201]], block_tokens=BT)
    res = simulate(trace, _Scripted(hold), ClusterConfig.from_setup("70b_h100x4", num_replicas=2))
    req = res.requests.set_index("request_id")
    land = float(res.transfers["end_s"].iloc[0])
    if hold:
        assert req.loc[1, "reused_tokens"] == 32_768            # waited for the copy
        assert req.loc[1, "arrival_s"] + req.loc[1, "queue_wait_s"] >= land - 1e-9
        assert req.loc[2, "queue_wait_s"] < 1e-6                # the unrelated one went past it
        assert res.transfers["served_requests"].iloc[0] == 1
    else:
        assert req.loc[1, "reused_tokens"] == 0                 # recomputed: the copy came late
        assert res.transfers["served_requests"].iloc[0] == 0


def test_a_landing_copy_ends_a_decode_stretch_so_the_held_request_starts():
    from btb_core.trace import make_trace

    prefix = list(range(1, 65))
    # request 0 computes the prefix on replica 0; request 1 (long decode) keeps replica 1 in a
    # decode stretch; request 2 (same prefix) waits on replica 1 for the copy
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=2)

    class R(_Scripted):
        def route(self, request):
            if request.index == 0:
                self.ids = request.hash_ids[:64]
                return 0
            return 1

    one = simulate(make_trace([0.0], [32_768 + 256], [1], [prefix + [100]], block_tokens=BT),
                   R(True), cluster)
    t1 = float(one.requests["ttft_s"].iloc[0]) + 0.001
    trace = make_trace([0.0, 0.1, t1], [32_768 + 256, 512, 32_768 + 256], [1, 2000, 1],
                       [prefix + [100], [300], prefix + [101]], block_tokens=BT)
    res = simulate(trace, R(True), cluster)
    land = float(res.transfers["end_s"].iloc[0])
    req = res.requests.set_index("request_id")
    start = req.loc[2, "arrival_s"] + req.loc[2, "queue_wait_s"]
    assert req.loc[2, "reused_tokens"] == 32_768
    assert land - 1e-9 <= start < land + 0.05          # one decode step after landing, not 2,000
