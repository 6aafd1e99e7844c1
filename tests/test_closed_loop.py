"""Closed-loop sessions in the simulator: release after finish + think time, output blocks reused."""

from __future__ import annotations

import numpy as np
import pytest

from btb_core.errors import ConfigError
from btb_core.routers import policy_class
from btb_core.sessions import infer_sessions, plan_sessions
from btb_core.sim import ClusterConfig, simulate
from btb_core.trace import load_trace, make_trace, shipped_traces

BT = 16


def two_turns():
    # turn 0: 32 tokens (2 blocks), 40 output tokens -> history 72 tokens = 4 full blocks + 8
    # turn 1: 100 tokens, starts with turn 0's prompt + answer (ids 0,1 then 2,3 = output blocks)
    return make_trace([0.0, 30.0], [32, 100], [40, 5], [[0, 1], [0, 1, 2, 3, 4, 5, 6]],
                      block_tokens=BT, session_id=["s", "s"])


def cluster():
    return ClusterConfig.from_setup("70b_h100x4", num_replicas=1)


def test_turn_released_after_finish_and_reuses_output_blocks():
    plan = plan_sessions(two_turns())
    open_ = simulate(plan.trace, policy_class("least_load")(), cluster()).requests
    closed = simulate(plan.trace, policy_class("least_load")(), cluster(), sessions=plan).requests
    # open loop: turn 1 arrives at its trace time and finds only turn 0's 2 prompt blocks
    assert open_["arrival_s"].tolist() == [0.0, 30.0]
    assert open_["reused_tokens"].tolist() == [0, 2 * BT]
    # closed loop: released at finish(turn 0) + the trace's gap (30 s), and reuses turn 0's
    # prompt blocks and its two full output blocks
    assert closed["arrival_s"].iloc[1] == pytest.approx(closed["finish_s"].iloc[0] + 30.0)
    assert closed["arrival_s"].iloc[1] > closed["finish_s"].iloc[0]
    assert closed["reused_tokens"].tolist() == [0, 4 * BT]
    assert closed["session_id"].tolist() == [0, 0] and closed["turn"].tolist() == [0, 1]


def test_think_time_exponential_is_seeded_and_zero_means_back_to_back():
    plan = plan_sessions(two_turns())
    r0 = simulate(plan.trace, policy_class("least_load")(), cluster(), sessions=plan, think_s=0.0)
    assert r0.requests["arrival_s"].iloc[1] == r0.requests["finish_s"].iloc[0]
    a = simulate(plan.trace, policy_class("least_load")(), cluster(), seed=3, sessions=plan, think_s=5.0)
    b = simulate(plan.trace, policy_class("least_load")(), cluster(), seed=3, sessions=plan, think_s=5.0)
    c = simulate(plan.trace, policy_class("least_load")(), cluster(), seed=4, sessions=plan, think_s=5.0)
    assert a.requests.equals(b.requests)
    gap_a = a.requests["arrival_s"].iloc[1] - a.requests["finish_s"].iloc[0]
    gap_c = c.requests["arrival_s"].iloc[1] - c.requests["finish_s"].iloc[0]
    assert gap_a > 0 and gap_a != gap_c


def test_closed_loop_on_conversation_trace_every_turn_after_its_predecessor():
    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 600)
    plan = plan_sessions(infer_sessions(tr))
    res = simulate(plan.trace, policy_class("cache_aware")(), ClusterConfig.from_setup("70b_h100x4"),
                   sessions=plan, think_s=1.0)
    req = res.requests
    assert len(req) == 600 and (req["finish_s"] > 0).all()
    b = np.flatnonzero(plan.prev >= 0)
    a = plan.prev[b]
    assert (req["arrival_s"].to_numpy()[b] > req["finish_s"].to_numpy()[a]).all()
    m = res.metrics
    assert m["sessions"] == plan.num_sessions and m["session_turns_mean"] == pytest.approx(600 / m["sessions"])
    assert m["session_duration_mean_s"] > 0


def test_closed_loop_arguments_validated():
    plan = plan_sessions(two_turns())
    with pytest.raises(ConfigError, match="think_s=-1.0: must be a number >= 0"):
        simulate(plan.trace, policy_class("least_load")(), cluster(), sessions=plan, think_s=-1.0)
    with pytest.raises(ConfigError, match="think_s needs closed-loop sessions"):
        simulate(plan.trace, policy_class("least_load")(), cluster(), think_s=1.0)
    with pytest.raises(ConfigError, match="trace must be plan.trace"):
        simulate(two_turns(), policy_class("least_load")(), cluster(), sessions=plan)


def test_cli_closed_loop(tmp_path, capsys):
    import json

    from btb_core.cli import main
    from btb_core.paths import DATA_DIR

    src = DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl"
    path = tmp_path / "head.jsonl"
    path.write_text("\n".join(src.read_text().splitlines()[:300]) + "\n")
    assert main(["replay", "--trace", str(path), "--closed-loop", "--think-s", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["closed_loop"] is True and out["requests"] == 300 and out["sessions"] < 300
    for bad, msg in ((["--think-s", "1"], "--think-s needs --closed-loop"),
                     (["--closed-loop", "--think-s", "-2"], "--think-s -2.0: must be a number >= 0")):
        assert main(["replay", "--trace", str(path)] + bad) == 2
        assert msg in capsys.readouterr().err


def test_closed_loop_with_stale_views_and_router_instances():
    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 300)
    plan = plan_sessions(infer_sessions(tr))
    res = simulate(plan.trace, policy_class("cache_aware")(), ClusterConfig.from_setup("70b_h100x4"),
                   kv_event_lag_s=0.5, load_lag_s=1.0, sessions=plan, think_s=1.0)
    req = res.requests
    assert len(req) == 300 and (req["finish_s"] >= req["arrival_s"]).all()
    b = plan.prev >= 0
    assert (req["arrival_s"].to_numpy()[b] > req["finish_s"].to_numpy()[plan.prev[b]]).all()
