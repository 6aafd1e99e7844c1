"""The simulator options that match a real engine (issue 18, docs/DESIGN.md section 8):
``ClusterConfig.reuse_on``, ``CostModel.step_overhead_s``, ``CostModel.attention_mfu``; and the
engine-validation pieces that need no engine (text, fit, comparison)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from btb_core.cost import cost_model_for_setup
from btb_core.errors import ConfigError
from btb_core.routers import Router
from btb_core.sim import ClusterConfig, simulate
from btb_core.trace import make_trace

BT = 32
COST = cost_model_for_setup("70b_h100x4")


class Fixed(Router):
    name = "fixed"

    def route(self, request):
        return 0


def trace_of(rows, block_tokens=BT):
    a, i, o, h = zip(*rows)
    return make_trace(list(a), list(i), list(o), [list(x) for x in h], block_tokens=block_tokens)


def ids(tag, n_tokens):
    return [tag * 100_000 + k for k in range(-(-n_tokens // BT))]


def req(t, prefix_tag, prefix_tokens, total_tokens, own_tag, out=1):
    """A row sharing ``prefix_tokens`` (a multiple of 32) of family ``prefix_tag``, then its own."""
    shared = ids(prefix_tag, prefix_tokens)
    own = [own_tag * 100_000 + 50_000 + k for k in range(-(-total_tokens // BT) - len(shared))]
    return (t, total_tokens, out, shared + own)


def chunked(cost=COST, **kw):
    return ClusterConfig(cost=cost, num_replicas=1, scheduler="chunked", chunk_tokens=2048, **kw)


# ---------------------------------------------------------------- reuse_on
def test_reuse_on_scheduled_second_simultaneous_request_hits_first_ones_blocks():
    # vLLM v1 caches a chunk's full blocks when it schedules them: B, admitted in the same step
    # as A, reuses A's 32 shared blocks (1,024 tokens); with "prefill_done" it reuses nothing.
    rows = [req(0.0, 1, 1024, 1024 + 40, 7), req(0.0, 1, 1024, 1024 + 72, 8)]
    late = simulate(trace_of(rows), Fixed(), chunked()).requests
    early = simulate(trace_of(rows), Fixed(), chunked(reuse_on="scheduled")).requests
    assert late["reused_tokens"].tolist() == [0, 0]
    assert early["reused_tokens"].tolist() == [0, 1024]
    # B computes only its 72 own tokens, in A's step: both finish together, sooner than late's B
    assert early["ttft_s"].iloc[1] == pytest.approx(early["ttft_s"].iloc[0])
    assert early["ttft_s"].iloc[1] < late["ttft_s"].iloc[1]


def test_reuse_on_scheduled_only_blocks_of_scheduled_chunks():
    # A: 3,000 tokens = chunks of 2,048 + 952. B (same prefix) is admitted in A's first step with
    # no budget left, so it waits; at the next step it sees the 64 blocks scheduled in step 1
    # and those of A's second chunk scheduled before it (93 full blocks of A), capped at B's own.
    rows = [req(0.0, 1, 2976, 3000, 4), req(0.0, 1, 2976, 3010, 5)]
    early = simulate(trace_of(rows), Fixed(), chunked(reuse_on="scheduled")).requests
    assert early["reused_tokens"].tolist() == [0, 93 * BT]


def test_full_hit_recomputes_last_block():
    # a repeated prompt reuses at most (input_length - 1) // block blocks (vLLM: num_tokens - 1)
    p = ids(1, 4096)
    rows = [(0.0, 4096, 1, p), (100.0, 4096, 1, p), (200.0, 4100, 1, p + [3]), (300.0, 4100, 1, p + [3])]
    res = simulate(trace_of(rows), Fixed(), chunked(reuse_on="scheduled")).requests
    assert res["reused_tokens"].tolist() == [0, 4064, 4096, 4096]


def test_reuse_on_validated():
    with pytest.raises(ConfigError, match="reuse_on"):
        chunked(reuse_on="admitted")


# ---------------------------------------------------------------- step overhead, attention_mfu
def test_step_overhead_added_once_per_step_and_decode_step():
    o = 0.01
    cost = COST.replace(step_overhead_s=o)
    # 5,000 tokens = 3 chunked steps; then 4 decode steps for 5 output tokens
    rows = [(0.0, 5000, 5, ids(1, 5000))]
    base = simulate(trace_of(rows), Fixed(), chunked()).requests.iloc[0]
    over = simulate(trace_of(rows), Fixed(), chunked(cost=cost)).requests.iloc[0]
    assert over["ttft_s"] - base["ttft_s"] == pytest.approx(3 * o, rel=1e-9)
    assert (over["e2e_s"] - over["ttft_s"]) - (base["e2e_s"] - base["ttft_s"]) == pytest.approx(4 * o, rel=1e-9)
    pf = ClusterConfig(cost=cost, num_replicas=1, scheduler="prefill_first")
    pf0 = ClusterConfig(cost=COST, num_replicas=1, scheduler="prefill_first")
    a = simulate(trace_of(rows), Fixed(), pf).requests.iloc[0]
    b = simulate(trace_of(rows), Fixed(), pf0).requests.iloc[0]
    assert a["ttft_s"] - b["ttft_s"] == pytest.approx(o, rel=1e-9)


def test_attention_mfu_scales_only_the_attention_term():
    half = COST.replace(attention_mfu=COST.mfu / 2)
    lin = COST.replace(attention=False)
    for s, c in [(1000, 0), (2048, 4096)]:
        attn = COST.prefill_s(s, c) - lin.prefill_s(s, c)
        assert half.prefill_s(s, c) == pytest.approx(lin.prefill_s(s, c) + 2 * attn, rel=1e-12)
    assert COST.replace(attention_mfu=None).prefill_s(3000, 1000) == COST.prefill_s(3000, 1000)


@pytest.mark.parametrize("kw", [{"attention_mfu": 0.0}, {"attention_mfu": 1.5},
                                {"step_overhead_s": -1.0}, {"step_overhead_s": float("nan")}])
def test_bad_engine_cost_fields(kw):
    with pytest.raises(ConfigError):
        COST.replace(**kw)


# ---------------------------------------------------------------- validation pieces, no engine
def test_prompt_text_shares_exactly_the_shared_blocks():
    from btb_core.engine.text import PromptBuilder

    pb = PromptBuilder(32, salt=3)
    a = pb.words([1, 2, 3], 80)
    b = pb.words([1, 2, 4], 70)
    assert len(a) == 80 and len(b) == 70
    assert a[:64] == b[:64] and a[64:70] != b[64:70]
    assert PromptBuilder(32, salt=4).words([1], 32) != pb.words([1], 32)
    assert all(w.startswith("w") and 3 <= int(w[1:]) < 8192 for w in a)
    with pytest.raises(ValueError):
        pb.words([1], 40)


def test_fit_recovers_known_coefficients():
    from btb_core.engine.calibrate import design_row, fit_cost

    truth = np.array([0.02, 0.015, 2e-5, 3e-9, 2.5e-6])
    rows = []
    for n in (128, 512, 1024, 2048, 3072, 4096, 6144):
        rows.append({"kind": "cold", "new_tokens": n, "cached_tokens": 0, "input_length": n})
    for c, s in ((1024, 256), (2048, 1024), (4096, 2048), (1024, 32), (2048, 64), (4096, 32)):
        rows.append({"kind": "cached", "new_tokens": s, "cached_tokens": c, "input_length": c + s})
    df = pd.DataFrame(rows)
    df["ttft_s"] = [float(np.dot(design_row(r.new_tokens, r.cached_tokens), truth)) for r in df.itertuples()]
    fit = fit_cost(df)
    got = [fit.frontend_s, fit.step_overhead_s, fit.linear_s_per_token, fit.attention_s_per_pair,
           fit.context_s_per_token]
    assert got == pytest.approx(truth.tolist(), rel=1e-6)
    # the cost model reproduces the coefficients: one chunk of S after C, minus the overhead
    cm = fit.cost
    assert cm.prefill_s(1000, 3000) == pytest.approx(2e-5 * 1000 + 3e-9 * (1000 * 3000 + 5e5), rel=1e-9)
    assert cm.step_overhead_s == pytest.approx(0.015)
    assert cm.context_s(3000) == pytest.approx(2.5e-6 * 3000, rel=1e-12)
    # a request with 32 new tokens after 4,096 cached: without the context term the fit is far off
    lone = fit.predict_ttft_s([32], [4096])[0]
    assert lone == pytest.approx(0.02 + 0.015 + 2e-5 * 32 + 3e-9 * (32 * 4096 + 512) + 2.5e-6 * 4096)
    assert 2.5e-6 * 4096 / lone > 0.2


def test_simulated_engine_matches_fitted_model_for_lone_requests():
    # a request alone on the simulated engine: TTFT = the fitted closed form
    from btb_core.engine.calibrate import fitted_engine
    from btb_core.engine.validation import FixedAssignment, engine_cluster_config

    fit = fitted_engine(0.02, 0.015, 2e-5, 3e-9, context_s_per_token=2e-6)
    rows = [req(0.0, 1, 4992, 5000, 2), req(100.0, 1, 4992, 5300, 3)]
    tr = trace_of(rows)
    res = simulate(tr, FixedAssignment([0, 0]), engine_cluster_config(fit, 1)).requests
    expect = fit.predict_ttft_s([5000, 5300 - 4992], [0, 4992])
    assert (res["ttft_s"].to_numpy() + fit.frontend_s) == pytest.approx(expect, rel=1e-9)
    assert res["reused_tokens"].tolist() == [0, 4992]


def test_prefill_first_adds_the_context_term_once_per_prefill():
    # prefill_first runs a request's whole prefill as one operation: its context term is
    # context_s_per_token x its cached tokens (one chunk), on top of prefill_s and the overhead
    import dataclasses

    from btb_core.engine.calibrate import fitted_engine
    from btb_core.engine.validation import FixedAssignment, engine_cluster_config

    fit = fitted_engine(0.0, 0.015, 2e-5, 3e-9, context_s_per_token=2e-6)
    rows = [req(0.0, 1, 4992, 5000, 2), req(100.0, 1, 4992, 5300, 3)]
    cfg = dataclasses.replace(engine_cluster_config(fit, 1), scheduler="prefill_first")
    res = simulate(trace_of(rows), FixedAssignment([0, 0]), cfg).requests
    cm = fit.cost
    second = cm.prefill_s(5300 - 4992, 4992) + 0.015 + 2e-6 * 4992
    assert res["ttft_s"].iloc[1] == pytest.approx(second, rel=1e-12)
    assert res["ttft_s"].iloc[0] == pytest.approx(cm.prefill_s(5000, 0) + 0.015, rel=1e-12)


# ---------------------------------------------------------------- arrival_overhead_s
def _arrival_cost(arrival_overhead_s, context_s_per_token=0.0):
    from btb_core.engine.calibrate import fitted_engine

    return fitted_engine(0.0, 0.015, 2e-5, 3e-9, context_s_per_token=context_s_per_token,
                         arrival_overhead_s=arrival_overhead_s)


@pytest.mark.parametrize("scheduler", ["chunked", "prefill_first"])
def test_arrivals_during_a_step_push_its_end_back(scheduler):
    # A (cold, one step) computes alone from t=0; B and C arrive during its step and wait: A's
    # TTFT is its step plus 2 x arrival_overhead_s, and the step B and C then share starts that
    # much later. A request arriving at an idle replica (A) adds nothing.
    import dataclasses

    from btb_core.engine.validation import FixedAssignment, engine_cluster_config

    rows = [req(0.0, 1, 0, 2000, 2), req(0.01, 3, 1024, 1100, 3), req(0.02, 4, 1024, 1100, 4)]
    out = {}
    for s in (0.0, 0.004):
        fit = _arrival_cost(s)
        cfg = dataclasses.replace(engine_cluster_config(fit, 1), scheduler=scheduler)
        out[s] = simulate(trace_of(rows), FixedAssignment([0, 0, 0]), cfg).requests
    base, slow = out[0.0], out[0.004]
    step_a = fit.cost.prefill_s(2000, 0) + 0.015
    assert base["ttft_s"].iloc[0] == pytest.approx(step_a, rel=1e-12)
    assert slow["ttft_s"].iloc[0] == pytest.approx(step_a + 2 * 0.004, rel=1e-12)
    # B and C start when A's step ends: every later time moves by the same 8 ms
    assert (slow["ttft_s"].iloc[1:] - base["ttft_s"].iloc[1:]).to_numpy() == pytest.approx([0.008] * 2)


def test_arrival_overhead_counts_arrivals_during_the_step_only():
    # B arrives after A's step ended (replica idle again): nothing added to anyone.
    from btb_core.engine.validation import FixedAssignment, engine_cluster_config

    rows = [req(0.0, 1, 0, 2000, 2), req(5.0, 3, 0, 500, 3)]
    base = simulate(trace_of(rows), FixedAssignment([0, 0]),
                    engine_cluster_config(_arrival_cost(0.0), 1)).requests
    slow = simulate(trace_of(rows), FixedAssignment([0, 0]),
                    engine_cluster_config(_arrival_cost(0.004), 1)).requests
    assert slow["ttft_s"].tolist() == base["ttft_s"].tolist()


def test_arrival_during_a_decode_stretch_moves_everything_after_it_by_the_overhead():
    # A decodes 200 tokens in one stretch; B arrives mid-stretch: the stretch is cut at the step
    # in progress, which ends arrival_overhead_s later, and every later event moves by that much.
    from btb_core.engine.validation import FixedAssignment, engine_cluster_config

    rows = [req(0.0, 1, 0, 512, 2, out=200), req(1.0, 3, 0, 512, 3, out=5)]
    base = simulate(trace_of(rows), FixedAssignment([0, 0]),
                    engine_cluster_config(_arrival_cost(0.0), 1)).requests
    slow = simulate(trace_of(rows), FixedAssignment([0, 0]),
                    engine_cluster_config(_arrival_cost(0.003), 1)).requests
    assert slow["ttft_s"].iloc[0] == base["ttft_s"].iloc[0]            # arrived at an idle replica
    assert slow["ttft_s"].iloc[1] == pytest.approx(base["ttft_s"].iloc[1] + 0.003, abs=1e-12)
    assert (slow["finish_s"] - base["finish_s"]).to_numpy() == pytest.approx([0.003, 0.003], abs=1e-12)


def test_arrival_overhead_fit_from_arrival_rows():
    from btb_core.engine.calibrate import arrival_overhead_s

    rows = pd.DataFrame([
        {"kind": "arrival", "repeat": 0, "arrivals": 0, "ttft_s": 1.00},
        {"kind": "arrival", "repeat": 0, "arrivals": 12, "ttft_s": 1.06},
        {"kind": "arrival", "repeat": 1, "arrivals": 0, "ttft_s": 1.10},
        {"kind": "arrival", "repeat": 1, "arrivals": 12, "ttft_s": 1.148},
        {"kind": "cold", "repeat": 0, "arrivals": 0, "ttft_s": 9.0},
    ])
    assert arrival_overhead_s(rows) == pytest.approx((0.005 + 0.004) / 2)
    # faster with arrivals than alone (noise): clipped at 0; no arrival rows or column: 0
    assert arrival_overhead_s(rows.assign(ttft_s=[1.0, 0.9, 1.0, 0.9, 1.0])) == 0.0
    assert arrival_overhead_s(rows.drop(columns="arrivals")) == 0.0
    assert arrival_overhead_s(rows[rows["kind"] == "cold"]) == 0.0


def test_cost_model_rejects_negative_arrival_overhead():
    with pytest.raises(ConfigError, match="arrival_overhead_s"):
        _arrival_cost(-0.001)


def test_shipped_validation_trace_is_the_generator_output(tmp_path):
    from btb_core.engine.validation import DEFAULT_TRACE, load_validation_trace
    from btb_core.engine.workload import write_validation_trace

    out = write_validation_trace(tmp_path / "t.jsonl", seed=0)
    assert out.read_bytes() == DEFAULT_TRACE.read_bytes()
    t = load_validation_trace()
    assert t.block_tokens == 32 and len(t.table) == 84


def test_engine_not_installed_message_names_the_make_target(monkeypatch, tmp_path):
    from btb_core.engine import server

    monkeypatch.setenv("BTB_ENGINE_PYTHON", str(tmp_path / "no-python"))
    monkeypatch.setattr(server, "_AVAILABLE", None)
    assert not server.engine_available()
    with pytest.raises(server.EngineNotInstalled, match="make engine"):
        server.EngineCluster(1).__enter__()
    monkeypatch.setattr(server, "_AVAILABLE", None)


@pytest.mark.parametrize("argv, match", [
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--policy", "btb"], "copies KV between replicas"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--warmup-replays", "-1"], "--warmup-replays must be >= 0"),
])
def test_cli_validate_engine_bad_options_one_line(argv, match, capsys):
    from btb_core.cli import main

    assert main(["validate-engine", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]


def test_fit_with_decode_row_pins_the_step_overhead():
    from btb_core.engine.calibrate import _decode_memory_s, design_row, fit_cost

    truth = np.array([0.05, 0.03, 4e-4, 2e-7, 3e-6])
    rows = [{"kind": "cold", "new_tokens": n, "cached_tokens": 0, "input_length": n}
            for n in (256, 1024, 2048, 3072)]
    rows += [{"kind": "cached", "new_tokens": s, "cached_tokens": c, "input_length": c + s}
             for c, s in ((1024, 256), (2048, 512), (2048, 32))]
    df = pd.DataFrame(rows)
    df["ttft_s"] = [float(np.dot(design_row(r.new_tokens, r.cached_tokens), truth)) for r in df.itertuples()]
    df["tpot_s"] = np.nan
    dec = pd.DataFrame([{"kind": "decode", "new_tokens": 512, "cached_tokens": 0, "input_length": 512,
                         "ttft_s": 0.3, "tpot_s": 0.03 + _decode_memory_s()}])
    fit = fit_cost(pd.concat([df, dec], ignore_index=True))
    assert fit.step_overhead_s == pytest.approx(0.03, rel=1e-9)
    got = [fit.frontend_s, fit.linear_s_per_token, fit.attention_s_per_pair, fit.context_s_per_token]
    assert got == pytest.approx([0.05, 4e-4, 2e-7, 3e-6], rel=1e-6)
    assert fit.cost.mbu == pytest.approx(1.0)


def _synthetic_calibration(truth, busy, server=0):
    from btb_core.engine.calibrate import design_row

    rows = [{"kind": "cold", "new_tokens": n, "cached_tokens": 0, "input_length": n}
            for n in (128, 512, 1024, 2048, 3072, 4096, 6144)]
    rows += [{"kind": "cached", "new_tokens": s, "cached_tokens": c, "input_length": c + s}
             for c, s in ((1024, 256), (2048, 1024), (4096, 2048))]
    df = pd.DataFrame(rows)
    df["ttft_s"] = [float(np.dot(design_row(r.new_tokens, r.cached_tokens), truth)) for r in df.itertuples()]
    df["tpot_s"] = np.nan
    df["busy_servers"] = busy
    df["server"] = server
    return df


def test_each_server_count_gets_the_fit_of_its_own_calibration(tmp_path):
    # a run on n servers is compared with the cost model fitted to the rows measured with n
    # servers busy; a count without rows falls back to the largest smaller one
    from btb_core.engine.calibrate import calibration_for, fit_by_busy
    from btb_core.engine.validation import ValidationResult, load_result, save_result

    alone = np.array([0.02, 0.015, 2e-5, 3e-9, 0.0])
    loaded = np.array([0.02, 0.015, 2.6e-5, 3.9e-9, 0.0])  # both terms 30 % slower
    calib = pd.concat([_synthetic_calibration(alone, 1), _synthetic_calibration(loaded, 2, 0),
                       _synthetic_calibration(loaded, 2, 1)], ignore_index=True)
    assert len(calibration_for(calib, 1)) == 10 and len(calibration_for(calib, 2)) == 20
    assert len(calibration_for(calib, 3)) == 20
    fits = fit_by_busy(calib)
    assert sorted(fits) == [1, 2]
    assert fits[1].linear_s_per_token == pytest.approx(2e-5, rel=1e-6)
    assert fits[2].linear_s_per_token == pytest.approx(2.6e-5, rel=1e-6)
    assert fits[2].attention_s_per_pair == pytest.approx(3.9e-9, rel=1e-6)
    # an old calibration without the column is a one-server calibration
    assert sorted(fit_by_busy(calib.drop(columns=["busy_servers"]).iloc[:10])) == [1]
    res = ValidationResult(calib, fits[2], pd.DataFrame({"num_replicas": [2]}),
                           pd.DataFrame([{"num_replicas": 2, "policy": "round_robin"}]), {}, fits)
    assert res.fitted_for(1) is fits[1] and res.fitted_for(2) is fits[2]
    back = load_result(save_result(res, tmp_path / "run"))
    assert sorted(back.fits) == [1, 2]
    assert back.fitted_for(2).linear_s_per_token == pytest.approx(2.6e-5, rel=1e-9)
    assert back.fitted_for(1).linear_s_per_token == pytest.approx(2e-5, rel=1e-9)


def _scored(ttft_real, ttft_sim):
    n = len(ttft_real)
    return pd.DataFrame({"ttft_s": ttft_real, "sim_ttft_s": ttft_sim,
                         "cached_tokens": [32] * n, "sim_cached_tokens": [32] * n,
                         "cached_match": [True] * n,
                         "ttft_rel_error": np.asarray(ttft_sim) / np.asarray(ttft_real) - 1.0})


def test_repeated_runs_pool_requests_and_report_the_engine_noise():
    # two real runs of the same 2 requests: means 1.0 and 1.5 s; the simulator says 1.0 s for both
    from btb_core.engine.validation import pool_runs, summarise

    runs = [_scored([0.5, 1.5], [0.5, 1.5]), _scored([1.0, 2.0], [0.5, 1.5])]
    sums = [dict(summarise(r), sim_policy_ttft_mean_s=m, replay_wall_s=w)
            for r, m, w in zip(runs, (1.0, 2.0), (3.0, 4.0))]
    out = pool_runs(runs, sums)
    assert out["requests"] == 4 and out["replay_repeats"] == 2
    assert out["ttft_mean_real_s"] == pytest.approx(1.25)
    assert out["ttft_mean_sim_s"] == pytest.approx(1.0)
    # per run sim / real = 1 and 2/3: their median (the mean of two) is 5/6; pooled, 1 / 1.25
    assert out["ttft_mean_rel_error"] == pytest.approx(1 / 6)
    assert out["ttft_mean_rel_error_pooled"] == pytest.approx(0.2)
    # sample std of (1.0, 1.5) = 0.35355, over the mean 1.25
    assert out["ttft_mean_real_cv"] == pytest.approx(np.sqrt(0.125) / 1.25)
    # per-request errors 0, 0, 0.5, 0.25: median (0 + 0.25) / 2
    assert out["ttft_median_request_rel_error"] == pytest.approx(0.125)
    assert out["sim_policy_ttft_mean_s"] == pytest.approx(1.5)
    assert out["replay_wall_s"] == pytest.approx(7.0)
    one = pool_runs(runs[:1], sums[:1])
    assert np.isnan(one["ttft_mean_real_cv"]) and one["ttft_mean_rel_error"] == pytest.approx(0.0)


def test_drift_is_the_median_measured_over_fitted_ttft(monkeypatch):
    from btb_core.engine import calibrate as cal

    from btb_core.engine import validation as val
    fit = cal.fitted_engine(0.01, 0.02, 4e-4, 2e-7)
    pts = [(1024, 0), (2048, 0), (1024, 4096)]
    pred = fit.predict_ttft_s([s for s, _ in pts], [c for _, c in pts])

    def fake(ports, **kw):
        assert kw["cold_lengths"] == val.DRIFT_COLD_LENGTHS
        rows = [{"kind": "cold" if c == 0 else "cached", "new_tokens": s, "cached_tokens": c,
                 "ttft_s": p * k} for (s, c), p, k in zip(pts, pred, (1.10, 1.30, 1.15))]
        rows.append({"kind": "decode", "new_tokens": 512, "cached_tokens": 0, "ttft_s": 99.0})
        return pd.DataFrame(rows)

    monkeypatch.setattr(cal, "measure_concurrent", fake)
    out = val.measure_drift([1, 2], fit, salt=1)
    assert out["calibration_drift"] == pytest.approx(0.15)  # the median, not the mean (0.183)
    assert out["drift_requests"] == 3 and out["drift_busy_servers"] == 2


def test_rescore_keeps_repeats_apart_and_pools_them():
    # two copies of the same real run as repeats 0 and 1: pooled figures equal one run's, the
    # run-to-run noise is 0, and each repeat is simulated on its own
    from btb_core.engine import calibrate as cal
    from btb_core.engine.validation import (REAL_COLUMNS, ValidationResult, head,
                                          load_validation_trace, rescore)

    calib = _synthetic_calibration(np.array([0.02, 0.015, 4e-4, 3e-7, 0.0]), 1)
    fit = cal.fit_cost(calib)
    tr = head(load_validation_trace(), 6)
    t = tr.table
    real = pd.DataFrame({"request_id": t["request_id"], "replica": 0, "arrival_s": t["arrival_s"],
                         "sent_s": t["arrival_s"], "input_length": t["input_length"],
                         "output_length": t["output_length"], "ttft_s": 1.0, "e2e_s": 1.0,
                         "cached_tokens": 0, "prompt_tokens": t["input_length"]})[list(REAL_COLUMNS)]
    reqs = pd.concat([real.assign(policy="round_robin", num_replicas=1, repeat=k) for k in (0, 1)],
                     ignore_index=True)
    res = rescore(ValidationResult(calib, fit, reqs, pd.DataFrame(), {}, {1: fit}), trace=tr)
    assert len(res.summary) == 1 and res.summary["replay_repeats"].iloc[0] == 2
    assert res.summary["requests"].iloc[0] == 12
    assert res.summary["ttft_mean_real_cv"].iloc[0] == pytest.approx(0.0)
    assert sorted(res.requests["repeat"].unique().tolist()) == [0, 1]
    a, b = (res.requests[res.requests["repeat"] == k]["sim_ttft_s"].to_numpy() for k in (0, 1))
    assert np.array_equal(a, b)


def test_validate_rejects_a_bad_warmup_count_before_starting_anything():
    from btb_core.engine.validation import validate
    from btb_core.errors import ConfigError

    for bad in (-1, "2", 1.5, True):
        with pytest.raises(ConfigError, match="warmup_replays must be an integer >= 0"):
            validate(warmup_replays=bad, log=None)


def test_rescore_without_the_context_term_is_more_optimistic_on_the_shipped_run():
    # the shipped run's calibration has points with few new tokens after long cached contexts:
    # refitted without e, the simulator gets faster on the validation trace (README section 14)
    from btb_core.engine.validation import SHIPPED_RESULT, load_result, rescore

    shipped = load_result(SHIPPED_RESULT)
    with_e = rescore(shipped).summary.set_index(["num_replicas", "policy"])
    without = rescore(shipped, context_term=False).summary.set_index(["num_replicas", "policy"])
    assert (without["ttft_mean_sim_s"] < with_e["ttft_mean_sim_s"]).all()
    assert with_e["ttft_mean_sim_s"].to_dict() == pytest.approx(
        shipped.summary.set_index(["num_replicas", "policy"])["ttft_mean_sim_s"].to_dict(), rel=1e-9)


def test_speed_factor_scales_every_time_of_a_lone_request():
    # FittedEngine.scaled(f): all six coefficients x f, so a request alone on the engine (no
    # queueing) is simulated exactly f times slower; compare() keeps the unscaled TTFT too
    from btb_core.engine.validation import compare

    fit = _arrival_cost(0.004, context_s_per_token=2e-6)
    rows = [req(0.0, 1, 2048, 3000, 2), req(100.0, 1, 2048, 2100, 3)]
    tr = trace_of(rows)
    real = pd.DataFrame({"request_id": tr.table["request_id"], "replica": [0, 0],
                         "arrival_s": [0.0, 100.0], "sent_s": [0.0, 100.0],
                         "input_length": [3000, 2100], "output_length": [1, 1],
                         "ttft_s": [1.0, 0.1], "e2e_s": [1.0, 0.1], "cached_tokens": [0, 2048],
                         "prompt_tokens": [3000, 2100]})
    plain = compare(real, tr, fit, 1)
    slow = compare(real, tr, fit, 1, speed_factor=1.25)
    assert "speed_factor" not in plain and (slow["speed_factor"] == 1.25).all()
    assert slow["sim_ttft_unscaled_s"].tolist() == plain["sim_ttft_s"].tolist()
    assert slow["sim_ttft_s"].to_numpy() == pytest.approx(1.25 * plain["sim_ttft_s"].to_numpy(), rel=1e-12)
    with pytest.raises(ValueError, match="factor"):
        fit.scaled(0.0)


def test_arrival_overhead_applies_to_requests_a_router_dispatches_later():
    # the router holds C back and dispatches it when B's prefill is done, while A (long) still
    # computes on replica 0: C's arrival there pushes A's running step back (Simulator._enqueue)
    from btb_core.engine.validation import engine_cluster_config

    class HoldC(Router):
        name = "hold_c"

        def reset(self, view):
            super().reset(view)
            self.held = None

        def route(self, request):
            if request.index == 2:
                self.held = request
                return None
            return request.index       # A -> 0, B -> 1

        def on_prefill_done(self, request, replica):
            if request.index == 1 and self.held is not None:
                self.view.dispatch(self.held, 0)
                self.held = None

    rows = [req(0.0, 1, 0, 4000, 2), req(0.0, 3, 0, 200, 3), req(0.0, 4, 0, 200, 4)]
    out = {}
    for s in (0.0, 0.004):
        cfg = engine_cluster_config(_arrival_cost(s), 2)
        out[s] = simulate(trace_of(rows), HoldC(), cfg).requests
    # A's first 2,048-token step is running when C arrives (B's 200 tokens finish first)
    assert out[0.004]["ttft_s"].iloc[0] == pytest.approx(out[0.0]["ttft_s"].iloc[0] + 0.004, abs=1e-12)
    assert out[0.004]["ttft_s"].iloc[1] == out[0.0]["ttft_s"].iloc[1]


def test_arrival_overhead_leaves_out_rounds_with_a_missing_ttft():
    from btb_core.engine.calibrate import arrival_overhead_s

    rows = pd.DataFrame({"kind": "arrival", "repeat": [0, 0, 1, 1, 2, 2], "arrivals": [0, 12] * 3,
                         "ttft_s": [1.0, 1.06, 1.0, 1.06, 1.0, np.nan]})
    assert arrival_overhead_s(rows) == pytest.approx(0.005)
    assert arrival_overhead_s(rows.assign(arrivals=[0, 12, 0, np.nan, 0, 12])) == pytest.approx(0.005)


def test_scaled_fit_survives_as_dict_and_rejects_non_numbers():
    from btb_core.engine.calibrate import FittedEngine, fitted_engine

    fit = fitted_engine(0.006, 0.009, 2.9e-4, 1e-7, 0.017, 3.9e-6, 0.0054)
    for k in (0.9, 1.3):
        slow = fit.scaled(k)
        back = FittedEngine.from_dict(slow.as_dict())
        assert back.as_dict() == slow.as_dict()
        assert back.cost.decode_step_s(1, 512) == pytest.approx(k * fit.cost.decode_step_s(1, 512), rel=1e-12)
    assert "memory_bytes_per_s" not in fit.as_dict()
    for bad in (True, "2", float("nan"), -1.0):
        with pytest.raises(ValueError, match="factor"):
            fit.scaled(bad)


def test_rescore_with_a_speed_factor_on_some_runs_only():
    # one run probed (factor 1.1), the other not (NaN): no crash, unscaled errors for both runs
    from btb_core.engine.validation import SHIPPED_RESULT, load_result, rescore

    res = load_result(SHIPPED_RESULT)
    req = res.requests.copy()
    req["speed_factor"] = np.where(req["repeat"] == 0, 1.1, np.nan)
    req.loc[req.groupby(["num_replicas", "policy"]).head(1).index, "speed_factor"] = np.nan
    res.requests = req
    out = rescore(res).summary
    assert np.isfinite(out["unscaled_ttft_mean_rel_error"]).all()
    repeats = res.requests["repeat"].nunique()   # one run of each policy probed at 1.1, the rest 1
    assert out["speed_factor"].to_numpy() == pytest.approx((1.1 + repeats - 1) / repeats)
    plain = rescore(res, speed_correction=False).summary
    assert "speed_factor" not in plain
    assert out["unscaled_ttft_mean_rel_error"].to_numpy() == pytest.approx(
        plain["ttft_mean_rel_error_pooled"].to_numpy())   # both over the pooled requests


def test_arrival_overhead_skips_a_paused_replica_and_moves_a_running_operation():
    # Simulator._arrival_overhead: a replica paused for a copy computes nothing the front end
    # could slow; a running operation ends arrival_overhead_s later (a new heap entry, the old
    # one invalidated by the operation token)
    from btb_core.engine.validation import FixedAssignment, engine_cluster_config
    from btb_core.sim.engine import Simulator

    sim = Simulator(trace_of([req(0.0, 1, 0, 100, 2)]), FixedAssignment([0]),
                    engine_cluster_config(_arrival_cost(0.004), 1))
    rep = sim.replicas[0]
    for kind, end in (("pause", 1.0), ("iter", 1.004)):
        sim.start_op(rep, kind, 1.0, None)
        token, heap = rep.op_token, len(sim._heap)
        sim._arrival_overhead(rep)
        assert rep.op_end_s == pytest.approx(end)
        moved = kind != "pause"
        assert (rep.op_token, len(sim._heap)) == ((token + 1, heap + 1) if moved else (token, heap))
        if moved:
            assert max(e[0] for e in sim._heap if e[4] == rep.op_token) == pytest.approx(1.004)


def test_engine_validation_module_is_not_shadowed():
    """``btb_core.engine.validate`` is the function, ``btb_core.engine.validation`` its module:
    ``import ... as`` and attribute access reach each without importlib."""
    import btb_core.engine
    import btb_core.engine.validation as val

    assert callable(btb_core.engine.validate) and btb_core.engine.validate is val.validate
    assert btb_core.engine.validation is val and hasattr(val, "rescore")


def test_host_steal_reads_the_steal_column(tmp_path):
    """``/proc/stat``'s ``cpu`` line: user nice system idle iowait irq softirq steal ...; steal
    (8th number) in clock ticks."""
    import os

    from btb_core.engine.validation import host_steal_s

    stat = tmp_path / "stat"
    stat.write_text("cpu  3934113 8276 550180 4730866 28391 0 7307 7472 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    assert host_steal_s(str(stat)) == 7472 / os.sysconf("SC_CLK_TCK")
    stat.write_text("intr 1 2 3\n")
    assert host_steal_s(str(stat)) is None
    assert host_steal_s(str(tmp_path / "missing")) is None
    here = host_steal_s()
    assert here is None or here >= 0
