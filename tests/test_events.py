"""Cluster events: a replica added (cold), failing (cache and requests lost, retried), draining."""

from __future__ import annotations

import dataclasses
import json

import pytest

from btb_core.errors import ConfigError
from btb_core.routers import policy_class
from btb_core.sim import ClusterConfig, ClusterEvent, check_events, load_events, simulate
from btb_core.trace import load_trace, make_trace, shipped_traces

BT = 16
POLICIES = ["round_robin", "random", "power_of_two", "least_load", "cache_aware", "kv_aware",
            "llm_d", "btb", "btb_adaptive"]


def cluster(n):
    return ClusterConfig.from_setup("70b_h100x4", num_replicas=n)


def burst(n=6, out=400, gap_s=0.0):
    return make_trace([i * gap_s for i in range(n)], [64] * n, [out] * n,
                      [[10 * i + k for k in range(4)] for i in range(n)], block_tokens=BT)


def test_fail_every_request_finishes_once_and_retries_are_counted():
    tr = burst()
    res = simulate(tr, policy_class("round_robin")(), cluster(2),
                   events=[ClusterEvent(0.5, "fail", 1)])
    req = res.requests
    # round robin put rows 1, 3, 5 on replica 1; at 0.5 s they are decoding (400 tokens take ~5 s)
    assert res.metrics["retries"] == 3 and req["retries"].tolist() == [0, 1, 0, 1, 0, 1]
    assert len(req) == 6 and req["request_id"].is_unique and (req["finish_s"] > 0).all()
    assert (req["replica"] == 0).all()
    retried = req[req["retries"] == 1]
    assert (retried["ttft_s"] > 0.5).all() and (retried["queue_wait_s"] >= 0.5).all()
    assert res.metrics["cluster_events"] == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_add_new_replica_gets_traffic_only_after_t_s(policy):
    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 400)
    t_add = float(tr.arrival_s[200])
    res = simulate(tr, policy_class(policy)(), cluster(2), events=[ClusterEvent(t_add, "add", 2)])
    req = res.requests
    on_new = req[req["replica"] == 2]
    assert len(on_new) > 0 and (on_new["arrival_s"] >= t_add).all()
    assert len(req) == 400 and (req["finish_s"] > 0).all()


@pytest.mark.parametrize("policy", POLICIES)
def test_fail_and_drain_with_every_policy(policy):
    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 600)
    t = float(tr.arrival_s[300])
    ev = [ClusterEvent(t, "fail", 1), ClusterEvent(t, "drain", 2), ClusterEvent(t + 30, "add", 4)]
    res = simulate(tr, policy_class(policy)(), cluster(4), events=ev)
    req = res.requests
    assert len(req) == 600 and req["request_id"].is_unique and (req["finish_s"] > 0).all()
    assert not (req["replica"] == 1).any() or (req.loc[req["replica"] == 1, "arrival_s"] < t).all()
    assert (req.loc[req["replica"] == 1, "retries"] == 0).all()
    # nothing new reaches the drained replica; what it held finishes there
    assert (req.loc[req["replica"] == 2, "arrival_s"] < t).all()
    assert res.metrics["retries"] == int(req["retries"].sum())


def test_btb_drops_copies_on_a_failed_replica_and_rewarms():
    # one 8-block prefix, a request every 0.2 s; BTB (X=2, Y=8 blocks, M=1) copies it once
    n = 60
    tr = make_trace([0.2 * i for i in range(n)], [8 * BT + 4] * n, [50] * n,
                    [list(range(8)) + [100 + i] for i in range(n)], block_tokens=BT)
    router = policy_class("btb")(y_tokens=8 * BT, m_replicas=1, z_s=1.0)
    first = simulate(tr, router, cluster(3)).transfers
    assert len(first) == 1
    dst = int(first["dst"].iloc[0])
    t_fail = float(first["end_s"].iloc[0]) + 1.0
    router = policy_class("btb")(y_tokens=8 * BT, m_replicas=1, z_s=1.0)
    res = simulate(tr, router, cluster(3), events=[ClusterEvent(t_fail, "fail", dst)])
    tr2 = res.transfers
    assert len(tr2) == 2 and int(tr2["dst"].iloc[1]) != dst and tr2["request_s"].iloc[1] >= t_fail
    assert (res.requests["finish_s"] > 0).all()


def test_copy_to_a_failing_replica_lands_nothing():
    from btb_core.sim.engine import Simulator

    tr = burst(2, out=5)
    sim = Simulator(tr, policy_class("least_load")(), cluster(2),
                    events=[ClusterEvent(0.0, "add", 2), ClusterEvent(0.5, "fail", 2)])
    with pytest.raises(ValueError, match="copies go from a live replica"):
        sim.view.start_transfer(0, 2, [0])   # replica 2 is not there before t = 0


def test_event_validation(tmp_path):
    with pytest.raises(ConfigError, match=r"ClusterEvent.action='crash': must be one of"):
        ClusterEvent(1.0, "crash", 0)
    with pytest.raises(ConfigError, match=r"ClusterEvent.t_s=-1: must be a finite number >= 0"):
        ClusterEvent(-1, "fail", 0)
    with pytest.raises(ConfigError, match=r"event 0 \(t_s=1.0, add replica 7\): an added replica takes the next index, 4"):
        check_events([ClusterEvent(1.0, "add", 7)], 4)
    with pytest.raises(ConfigError, match="replica 1 has already failed"):
        check_events([ClusterEvent(1.0, "fail", 1), ClusterEvent(2.0, "drain", 1)], 4)
    with pytest.raises(ConfigError, match="no such replica at that time"):
        check_events([ClusterEvent(1.0, "fail", 4), ClusterEvent(2.0, "add", 4)], 4)
    with pytest.raises(ConfigError, match="leaves no replica accepting requests"):
        check_events([ClusterEvent(1.0, "drain", 0), ClusterEvent(2.0, "fail", 1)], 2)
    p = tmp_path / "ev.yaml"
    for text, msg in (("- {t_s: 1, action: fail}\n", "item 0: missing field 'replica'"),
                      ("- {t_s: 1, action: fail, replica: 0, why: x}\n", "item 0: unknown field 'why'"),
                      ("t_s: 1\n", "expected a non-empty YAML list"),
                      ("- [1, fail, 0]\n", "item 0: expected a mapping"),
                      ("- {t_s: x, action: fail, replica: 0}\n", "item 0: field t_s='x'"),
                      ("- {t_s: 1, action: fail, replica: 0\n", "not valid YAML")):
        p.write_text(text)
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[")):
            load_events(p)
    p.write_text("- {t_s: 2.5, action: add, replica: 4}\n- {t_s: 1, action: drain, replica: 0}\n")
    assert check_events(load_events(p), 4) == (ClusterEvent(1, "drain", 0), ClusterEvent(2.5, "add", 4))


def test_cli_events(tmp_path, capsys):
    from btb_core.cli import main
    from btb_core.paths import DATA_DIR

    src = DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl"
    path = tmp_path / "head.jsonl"
    path.write_text("\n".join(src.read_text().splitlines()[:300]) + "\n")
    ev = tmp_path / "ev.yaml"
    ev.write_text("- {t_s: 100, action: fail, replica: 1}\n- {t_s: 200, action: add, replica: 4}\n")
    assert main(["replay", "--trace", str(path), "--events", str(ev), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 300 and out["cluster_events"] == 2 and out["retries"] >= 0
    ev.write_text("- {t_s: 100, action: fail, replica: 9}\n")
    assert main(["replay", "--trace", str(path), "--events", str(ev)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such replica at that time (replicas 0..3)" in err
    assert str(ev) in err   # the file is named


def test_production_drivers():
    from btb_core.cluster_conditions import (admission_comparison, event_runs, event_summary, event_timeline,
                                     session_comparison)

    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 200)
    loops = session_comparison(tr, ["cache_aware"], cluster(2), think_s=1.0)
    assert loops["loop"].tolist() == ["open", "closed"] and (loops["requests"] == 200).all()
    assert loops["sessions"].nunique() == 1
    adm = admission_comparison(tr, ["least_load"], dataclasses.replace(cluster(1), hbm_kv_capacity_bytes=int(48e9)))
    assert adm["kv_admission"].tolist() == ["reserve", "paged"] and adm["preemptions"].iloc[0] == 0
    events = [ClusterEvent(float(tr.arrival_s[100]), "add", 2)]
    runs = event_runs(tr, ["least_load", "btb"], cluster(2), events, m_replicas=1)
    summ = event_summary(runs, events)
    assert summ["added_replicas"].tolist() == [1, 1]
    assert (summ["first_request_on_added_s"].dropna() >= events[0].t_s).all()
    series, copies = event_timeline(runs)
    assert set(series["replica"]) == {0, 1, 2} and set(series["policy"]) == {"least_load", "btb"}


def test_btb_adaptive_rewarms_a_new_replica_after_a_failure():
    from btb_core.cluster_conditions import event_runs, event_summary
    from btb_core.scenarios import ScenarioSpec, build

    # 16 requests/s: the demand-sized warm set wants every replica, so losing one re-warms the new
    tr = build(ScenarioSpec("burst", 480, 30.0, 65536, 1024))
    events = [ClusterEvent(12.0, "fail", 1), ClusterEvent(16.0, "add", 4)]
    res = event_runs(tr, ["btb_adaptive"], cluster(4), events)
    summ = event_summary(res, events).iloc[0]
    assert summ["copies_to_added"] >= 1 and summ["first_copy_to_added_s"] > 16.0
    assert summ["requests_on_added"] > 0 and summ["first_request_on_added_s"] >= 16.0
    req = res["btb_adaptive"].requests
    assert len(req) == 480 and (req["finish_s"] > 0).all()


def test_btb_adaptive_forgets_the_pending_blocks_of_requests_lost_in_a_failure():
    # requests queued on replica 1 when it fails are re-routed: its pending book must not keep
    # saying their blocks are coming there (the warm set and the scores read it)
    n = 12
    tr = make_trace([0.001 * i for i in range(n)], [4096] * n, [8] * n,
                    [[1, 2, 3, 4] + [100 * i + k for k in range(252)] for i in range(n)],
                    block_tokens=BT)
    router = policy_class("btb_adaptive")()
    res = simulate(tr, router, cluster(2), events=[ClusterEvent(0.01, "fail", 1)])
    assert res.metrics["retries"] == 5 and (res.requests["replica"] == 0).all()
    # every request's prefill ended, so nothing is pending anywhere
    assert router._pend.runs == {} and not any(router._pend.pieces) and not any(router._pend.sizes)


@pytest.mark.parametrize("policy", ["power_of_two", "least_load", "cache_aware"])
def test_failed_replica_leaves_the_in_flight_book(policy):
    """The routers that book their own in-flight requests forget a failed replica's at once (its
    requests are routed again and booked where they go), and the book matches what is in flight."""
    seen = []

    class Recorded(policy_class(policy)):
        def on_replica_removed(self, replica, failed):
            before = self.load.loads[replica]
            super().on_replica_removed(replica, failed)
            seen.append((before, self.load.loads[replica]))

    res = simulate(burst(), Recorded(), cluster(2), events=[ClusterEvent(0.5, "fail", 1)])
    assert len(seen) == 1 and seen[0][0] > 0 and seen[0][1] == 0
    assert res.metrics["retries"] > 0
