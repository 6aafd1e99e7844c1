"""Paged KV admission: blocks allocated as decode grows, recompute preemption when they run out."""

from __future__ import annotations

import dataclasses

import pytest

from btb_core.errors import ConfigError
from btb_core.routers import policy_class
from btb_core.sim import ClusterConfig, simulate
from btb_core.trace import load_trace, make_trace, shipped_traces

BT = 16


def cluster(blocks=None, **kw):
    base = ClusterConfig.from_setup("70b_h100x4", num_replicas=1, dram_capacity_bytes=0, **kw)
    if blocks is None:
        return base
    return dataclasses.replace(base, hbm_kv_capacity_bytes=blocks * BT * base.cost.kv_bytes_per_token)


@pytest.mark.parametrize("scheduler", ["chunked", "prefill_first"])
def test_paged_with_ample_memory_equals_reserve(scheduler):
    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 800)
    kw = dict(num_replicas=4, scheduler=scheduler, hbm_kv_capacity_bytes=10**13, dram_capacity_bytes=0)
    a = simulate(tr, policy_class("cache_aware")(), ClusterConfig.from_setup("70b_h100x4", **kw))
    b = simulate(tr, policy_class("cache_aware")(),
                 ClusterConfig.from_setup("70b_h100x4", kv_admission="paged", **kw))
    assert b.metrics["preemptions"] == 0
    assert a.requests.equals(b.requests.drop(columns=["preemptions"]))
    assert {k: v for k, v in b.metrics.items() if k in a.metrics} == a.metrics


@pytest.mark.parametrize("scheduler", ["chunked", "prefill_first"])
def test_oversubscribed_paged_preempts_newest_and_finishes_everything(scheduler):
    # two requests, 2 prompt blocks each, 80 output tokens: 7 blocks each at the end, 10 in HBM.
    tr = make_trace([0.0, 0.0], [32, 32], [80, 80], [[0, 1], [5, 6]], block_tokens=BT)
    reserve = simulate(tr, policy_class("least_load")(), cluster(10, scheduler=scheduler)).requests
    res = simulate(tr, policy_class("least_load")(), cluster(10, scheduler=scheduler, kv_admission="paged"))
    req = res.requests
    # reserve: the second waits for the first to finish; paged admits both, then preempts
    assert reserve["queue_wait_s"].iloc[1] == pytest.approx(reserve["finish_s"].iloc[0])
    assert res.metrics["preemptions"] >= 1
    assert req["preemptions"].tolist()[0] == 0 and req["preemptions"].iloc[1] >= 1  # the newest
    assert (req["finish_s"] > 0).all() and len(req) == 2
    # closed form: after s decode steps each holds ceil((32 + s) / 16) blocks; two of them fit in
    # 10 blocks while 32 + s <= 80, so the newest is preempted holding 80 tokens of KV after 48
    # steps (49 tokens generated); it is recomputed as an 81-token prompt whose 2 complete prompt
    # blocks stayed cached: 49 tokens prefilled again
    assert res.metrics["preempted_kv_tokens"] == 80
    assert res.metrics["preemption_recomputed_tokens"] == 49
    # the first keeps running undisturbed; the second finishes after it
    assert req["finish_s"].iloc[1] > req["finish_s"].iloc[0]
    assert req["ttft_s"].iloc[1] < reserve["ttft_s"].iloc[1]   # its first token came earlier


def test_oversubscribed_trace_every_request_finishes_once():
    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 600)
    res = simulate(tr, policy_class("cache_aware")(),
                   ClusterConfig.from_setup("70b_h100x4", num_replicas=2, kv_admission="paged"))
    req = res.requests
    assert len(req) == 600 and req["request_id"].is_unique and (req["finish_s"] >= req["arrival_s"]).all()
    assert res.metrics["preemptions"] == int(req["preemptions"].sum()) > 0


def test_kv_admission_validated():
    with pytest.raises(ConfigError, match=r"ClusterConfig.kv_admission='lazy': must be one of \('reserve', 'paged'\)"):
        cluster(kv_admission="lazy")
    tr = make_trace([0.0], [32], [400], [[0, 1]], block_tokens=BT)
    with pytest.raises(ConfigError, match="needs 27 KV blocks"):
        simulate(tr, policy_class("least_load")(), cluster(10, kv_admission="paged"))


def test_cli_kv_admission(tmp_path, capsys):
    import json

    from btb_core.cli import main
    from btb_core.paths import DATA_DIR

    src = DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl"
    path = tmp_path / "head.jsonl"
    path.write_text("\n".join(src.read_text().splitlines()[:400]) + "\n")
    assert main(["replay", "--trace", str(path), "--replicas", "2", "--kv-admission", "paged",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_admission"] == "paged" and out["requests"] == 400 and out["preemptions"] >= 0
    assert main(["replay", "--trace", str(path), "--json"]) == 0
    assert "preemptions" not in json.loads(capsys.readouterr().out)   # reserve: as before
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--trace", str(path), "--kv-admission", "lazy"])
    assert exc.value.code == 2 and "invalid choice: 'lazy'" in capsys.readouterr().err


def test_paged_with_closed_loop_sessions():
    from btb_core.sessions import infer_sessions, plan_sessions

    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 600)
    plan = plan_sessions(infer_sessions(tr))
    res = simulate(plan.trace, policy_class("cache_aware")(),
                   ClusterConfig.from_setup("70b_h100x4", num_replicas=2, kv_admission="paged"),
                   sessions=plan, think_s=0.5)
    req = res.requests
    assert len(req) == 600 and (req["finish_s"] >= req["arrival_s"]).all()
    assert res.metrics["preemptions"] > 0
    b = plan.prev >= 0
    assert (req["arrival_s"].to_numpy()[b] > req["finish_s"].to_numpy()[plan.prev[b]]).all()
