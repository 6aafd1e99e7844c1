"""The facts notebook 03's "What production adds" section reports, at its quick defaults.

Burst: 240 requests over 30 s sharing a 65,536-token prefix (+1,024 own tokens), 8 replicas of
Llama-3.3-70B on 4x H100; conversations: the first 600 s of the shipped Mooncake conversation
trace; long context: :data:`btb_core.production.LONG_CONTEXT` on 4 replicas.
"""

from __future__ import annotations

import pytest

from btb_core.paths import DATA_DIR
from btb_core.production import LONG_CONTEXT, instances_table, lag_table, thresholds_table
from btb_core.scenarios import ScenarioSpec, build
from btb_core.sim import ClusterConfig
from btb_core.trace import load_trace


@pytest.fixture(scope="module")
def cluster():
    return ClusterConfig.from_setup("70b_h100x4", num_replicas=8)


@pytest.fixture(scope="module")
def burst():
    return build(ScenarioSpec("burst", 240, 30.0, 65_536, 1_024))


def _by(table, **where):
    rows = table
    for k, v in where.items():
        rows = rows[rows[k] == v]
    assert len(rows) == 1, where
    return rows.iloc[0]


def test_burst_through_eight_instances(cluster, burst):
    t = instances_table(burst, cluster, policies=("cache_aware", "btb"), counts=(1, 8),
                        sync_s=(0.0, 1.0))
    assert list(t["variant"]) == ["1 instance", "8 instances", "8 instances, sync 1 s"] * 2
    one, eight = _by(t, policy="cache_aware", routers=1), _by(t, policy="cache_aware", routers=8,
                                                             sync_s=0.0)
    assert one["replicas_used"] == 6 and eight["replicas_used"] == 1   # all instances pick 0
    assert eight["ttft_mean_s"] > 2.5 * one["ttft_mean_s"]
    assert one["ttft_mean_s"] == pytest.approx(4.04, rel=0.05)
    synced = _by(t, policy="cache_aware", routers=8, sync_s=1.0)
    assert synced["ttft_mean_s"] == eight["ttft_mean_s"]               # they agree already
    b1, b8 = _by(t, policy="btb", routers=1), _by(t, policy="btb", routers=8, sync_s=0.0)
    assert b1["copies"] == 4 and b8["copies"] == 0                     # no instance detects it
    assert b8["ttft_mean_s"] == eight["ttft_mean_s"]                   # BTB = its fallback


def test_conversations_hit_rate_needs_sync(cluster):
    conv = load_trace(DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl")
    conv = conv.window(0.0, 600.0, rebase=True)
    t = instances_table(conv, cluster, policies=("cache_aware",), counts=(1, 8),
                        sync_s=(0.0, 1.0), assign=("round_robin", "session"))
    hit = dict(zip(t["variant"], t["hit_fraction"]))
    assert hit["1 instance"] == pytest.approx(0.285, abs=0.01)
    assert hit["8 instances"] < 0.5 * hit["1 instance"]
    assert hit["8 instances, sync 1 s"] == pytest.approx(hit["1 instance"], abs=0.005)
    assert hit["8 instances"] < hit["8 instances by session"] < hit["1 instance"]


def test_late_kv_events_delay_btb(cluster, burst):
    t = lag_table(burst, cluster, policies=("kv_aware", "btb"), lags_s=(0.0, 0.5, 2.0))
    btb = t[t["policy"] == "btb"].set_index("kv_event_lag_s")
    kv = t[t["policy"] == "kv_aware"].set_index("kv_event_lag_s")
    assert btb.loc[0.0, "ttft_mean_s"] < btb.loc[0.5, "ttft_mean_s"] < btb.loc[2.0, "ttft_mean_s"]
    assert btb.loc[2.0, "recomputed_prefill_tokens"] > 1.5 * btb.loc[0.0, "recomputed_prefill_tokens"]
    assert kv["ttft_mean_s"].max() < 1.05 * kv.loc[0.0, "ttft_mean_s"]


def test_token_usage_thresholds_on_long_contexts():
    c4 = ClusterConfig.from_setup("70b_h100x4", num_replicas=4)
    t = thresholds_table(build(LONG_CONTEXT), c4)
    p95 = dict(zip(t["variant"], t["ttft_p95_s"]))
    assert p95["off (upstream default)"] > 300
    assert p95["overload 0.9"] < 0.6 * p95["off (upstream default)"]
    assert p95["balance 0.5"] < 10
    assert p95["defaults"] < 1.0                                        # kv_aware
