"""Routers on the simulator with small hand-built traces: each documented behaviour, with numbers.

Setup: Llama-3.3-70B on 4x H100 per replica (``70b_h100x4``), 8 replicas, 512-token blocks, a
65,536-token shared prefix (128 blocks) plus a 1,024-token suffix of each request's own, 1 output
token (the Bursted job shape). A cold prefill of the prefix takes ~7.4 s; an RDMA copy ~0.107 s.
Exact facts (who routes where, how many prefixes are recomputed, how many copies start) are pinned
exactly; TTFTs are pinned to 5% so small cost-model refinements do not break them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from btb_core.routers import POLICIES
from btb_core.scenarios import (ScenarioSpec, build, copy_frames, frame_times, run,
                                standard_specs, summarize)
from btb_core.sim import ClusterConfig

PREFIX = 65_536
SUFFIX = 1_024


@pytest.fixture(scope="module")
def cluster():
    return ClusterConfig.from_setup("70b_h100x4", num_replicas=8)


@pytest.fixture(scope="module")
def burst():  # 8 requests/s for 30 s
    return build(ScenarioSpec("burst", 240, 30.0, PREFIX, SUFFIX))


@pytest.fixture(scope="module")
def burst_results(cluster, burst):
    return {p: run(burst, p, cluster) for p in ("least_load", "cache_aware", "btb")}


def _cold_prefills(res) -> pd.Series:
    """Requests per replica that reused nothing (each recomputed the whole prefix)."""
    req = res.requests
    return req[req["reused_tokens"] == 0].groupby("replica").size()


def test_least_load_scatters_the_burst_and_every_replica_recomputes(burst_results):
    res = burst_results["least_load"]
    req = res.requests
    assert sorted(req["replica"].unique()) == list(range(8))
    assert _cold_prefills(res).to_dict() == {r: 1 for r in range(8)}
    assert int(req["recomputed_tokens"].sum()) == 8 * PREFIX + 240 * SUFFIX
    assert req["ttft_s"].mean() == pytest.approx(1.51, rel=0.05)


def test_cache_aware_keeps_the_burst_on_the_holder_until_the_imbalance_rule_fires(burst_results):
    res = burst_results["cache_aware"]
    req = res.requests
    router = res.info["router"]
    # the first 65 requests pile on replica 0 (its in-flight count reaches 65 = 64 + 1) ...
    assert (req["replica"].iloc[:65] == 0).all()
    # ... and the 66th is the first one the imbalance rule (65 - 0 > 64, 65 > 1.5 * 0) moves
    assert req["replica"].iloc[65] == 1
    assert router.decisions["imbalanced"] > 0
    # every replica it spills onto is cold and recomputes the prefix once
    cold = _cold_prefills(res)
    assert (cold == 1).all() and cold.index[0] == 0 and len(cold) == req["replica"].nunique()
    assert res.queue_samples.query("replica == 0")["queue_length"].max() == 58
    assert req["ttft_s"].mean() == pytest.approx(4.04, rel=0.05)


def test_btb_warms_m_copies_spreads_the_burst_and_cuts_mean_ttft(cluster, burst_results):
    ca, btb = burst_results["cache_aware"], burst_results["btb"]
    tr = btb.transfers
    assert len(tr) == 4 and set(tr["src"]) == {0} and sorted(tr["dst"]) == [1, 2, 3, 4]
    assert (tr["landed_blocks"] == PREFIX // 512).all()
    # no copy starts before the holder finished prefilling the prefix (a cold 64k prefill), and
    # the first one starts at the first arrival after that (arrivals every 30/239 s)
    cold_prefix_s = cluster.cost.prefill_s(PREFIX)
    assert cold_prefix_s == pytest.approx(7.37, rel=0.01)
    assert cold_prefix_s <= tr["request_s"].min() <= cold_prefix_s + 30 / 239 + 0.2
    # after the copies land nobody recomputes the prefix again
    assert _cold_prefills(btb).to_dict() == {0: 1}
    assert int(btb.requests["recomputed_tokens"].sum()) == PREFIX + 240 * SUFFIX
    assert btb.requests["replica"].nunique() >= 3
    assert btb.info["router"].decisions["warm"] > 0
    assert btb.requests["ttft_s"].mean() < 0.7 * ca.requests["ttft_s"].mean()
    assert btb.requests["ttft_s"].mean() == pytest.approx(2.40, rel=0.05)


def test_trickle_is_cache_awares_best_case_and_least_loads_worst(cluster):
    trickle = build(ScenarioSpec("trickle", 12, 33.0, PREFIX, 256))  # one every 3 s
    ll, ca = run(trickle, "least_load", cluster), run(trickle, "cache_aware", cluster)
    assert set(ca.requests["replica"]) == {0}
    assert int(ca.requests["recomputed_tokens"].sum()) == PREFIX + 12 * 256
    # least-load moves requests 2 and 3 to idle cold replicas while replica 0 is still prefilling
    assert ll.requests["replica"].tolist()[:3] == [0, 1, 2]
    assert int(ll.requests["recomputed_tokens"].sum()) == 3 * PREFIX + 12 * 256
    assert ll.requests["ttft_s"].mean() > 1.5 * ca.requests["ttft_s"].mean()


def test_unrelated_requests_cache_aware_degenerates_to_least_load(cluster):
    trace = build(ScenarioSpec("unrelated", 48, 6.0, suffix_tokens=8192))
    ll, ca = run(trace, "least_load", cluster), run(trace, "cache_aware", cluster)
    assert ll.requests["replica"].tolist() == ca.requests["replica"].tolist()
    assert ll.requests["ttft_s"].tolist() == ca.requests["ttft_s"].tolist()


def test_btb_m_larger_than_replicas_copies_to_every_other_replica():
    small = ClusterConfig.from_setup("70b_h100x4", num_replicas=3)
    trace = build(ScenarioSpec("burst", 60, 15.0, PREFIX, 256))
    res = run(trace, "btb", small, m_replicas=10)
    assert sorted(res.transfers["dst"]) == [1, 2]


def test_btb_short_burst_ends_before_the_first_prefill_so_no_copy(cluster):
    trace = build(ScenarioSpec("burst", 20, 5.0, PREFIX, 256))  # all within one cold prefill
    res = run(trace, "btb", cluster)
    assert len(res.transfers) == 0
    assert res.info["router"].decisions == {"warm": 0, "fallback": 20}


def test_btb_pause_option_runs_and_copies_the_same(cluster, burst):
    res = run(burst, "btb", cluster, pause_compute_while_receiving=True)
    assert len(res.transfers) == 4


# sglang_gateway (a real process) has its own determinism test in tests/test_gateway.py.
@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"sglang_gateway"}))
def test_every_policy_is_deterministic_for_a_seed(cluster, policy):
    trace = build(ScenarioSpec("burst", 40, 10.0, PREFIX, 256, num_prefixes=2))
    a, b = run(trace, policy, cluster, seed=3), run(trace, policy, cluster, seed=3)
    pd.testing.assert_frame_equal(a.requests, b.requests)


def test_summary_and_frames_tables(cluster, burst_results):
    summary = summarize({("burst", p): r for p, r in burst_results.items()})
    assert list(summary["policy"]) == ["least_load", "cache_aware", "btb"]
    assert summary.set_index("policy").loc["btb", "copies"] == 4
    res = burst_results["btb"]
    times = frame_times(res, 4, end_s=12.0)
    frames = copy_frames(res, times)
    assert len(frames) == 8 * len(times)
    last = frames[frames["frame"] == frames["frame"].max()].set_index("replica")["copy_state"]
    assert last.to_dict() == {0: "source", 1: "landed", 2: "landed", 3: "landed", 4: "landed",
                              5: "none", 6: "none", 7: "none"}
    assert "in flight" in set(frames["copy_state"])
    assert set(standard_specs()) == {"unrelated", "trickle", "burst"}
    assert np.isfinite(summary["ttft_mean_s"]).all()
