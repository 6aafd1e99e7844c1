"""Calibration passes spread over the validation, medians of repeats, and the median over runs
(issue 18; README section 14). No engine needed: the engine's calls are replaced by synthetic
measurements of a known cost model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from btb_core.engine import calibrate as cal
from btb_core.engine.server import EngineCluster

TRUTH = np.array([0.02, 0.015, 3e-4, 1e-7, 4e-6])   # frontend, overhead, a, b, e
COLD = (128, 512, 1024, 2048, 3072, 4096)
CACHED = ((1024, 256), (2048, 1024), (4096, 2048), (2048, 64))


def _rows(speed: float, repeat: int = 0, server: int = 0) -> list[dict]:
    rows = [{"kind": "cold", "new_tokens": n, "cached_tokens": 0, "input_length": n} for n in COLD]
    rows += [{"kind": "cached", "new_tokens": s, "cached_tokens": c, "input_length": c + s}
             for c, s in CACHED]
    for r in rows:
        r.update(ttft_s=speed * float(np.dot(cal.design_row(r["new_tokens"], r["cached_tokens"]),
                                             TRUTH)),
                 tpot_s=np.nan, repeat=repeat, arrivals=0, server=server)
    return rows


def _arrival(repeat: int, per_arrival_s: float, server: int = 0, k: int = 24) -> list[dict]:
    return [{"kind": "arrival", "new_tokens": 2048, "cached_tokens": 0, "input_length": 2048,
             "ttft_s": 1.0, "tpot_s": np.nan, "repeat": repeat, "arrivals": 0, "server": server},
            {"kind": "arrival", "new_tokens": 2048, "cached_tokens": 0, "input_length": 2048,
             "ttft_s": 1.0 + k * per_arrival_s, "tpot_s": np.nan, "repeat": repeat,
             "arrivals": k, "server": server}]


def test_the_median_fit_leaves_out_a_slow_repeat_that_the_row_fit_takes_in():
    # three repeats, the middle one in a slow spell (every request 1.5x): each point's median is
    # the true TTFT, so the fit recovers the truth; fitted over every row it does not
    calib = pd.DataFrame(_rows(1.0, 0) + _rows(1.5, 1) + _rows(1.0, 2))
    med = cal.fit_cost(calib)
    got = [med.frontend_s, med.step_overhead_s, med.linear_s_per_token, med.attention_s_per_pair,
           med.context_s_per_token]
    assert got == pytest.approx(TRUTH.tolist(), rel=1e-6)
    rows = cal.fit_cost(calib, points="rows")
    pred = rows.predict_ttft_s(2048, 0)[0] / med.predict_ttft_s(2048, 0)[0]
    # least squares on relative error over 1, 1.5, 1 (x the true TTFT): minimises
    # 2 (p/x - 1)^2 + (p/1.5x - 1)^2, so p = 12/11 x at every point
    assert pred == pytest.approx(12 / 11, rel=1e-6)
    assert cal.point_medians(calib)["requests"].tolist() == [3] * (len(COLD) + len(CACHED))
    with pytest.raises(ValueError, match="points must be one of"):
        cal.fit_cost(calib, points="mean")


def test_arrival_rounds_of_different_passes_are_kept_apart_and_the_median_taken():
    # rounds numbered 0, 1 in each pass; keyed by (server, pass, repeat), five rounds: 5, 5, 6, 4,
    # 40 ms (a slow spell in the last); median 5 ms, mean 12 ms
    parts = [pd.DataFrame(_arrival(0, 0.005) + _arrival(1, 0.005)).assign(**{"pass": 0}),
             pd.DataFrame(_arrival(0, 0.006) + _arrival(1, 0.004)).assign(**{"pass": 1}),
             pd.DataFrame(_arrival(0, 0.040)).assign(**{"pass": 2})]
    calib = pd.concat(parts, ignore_index=True)
    assert cal.arrival_overhead_s(calib, "median") == pytest.approx(0.005)
    assert cal.arrival_overhead_s(calib, "rows") == pytest.approx(0.012)
    # without the pass key the rounds of equal number would be merged into one
    merged = cal.arrival_overhead_s(calib.drop(columns="pass"), "median")
    assert merged != pytest.approx(0.005)


def test_pool_runs_takes_the_median_run_and_keeps_the_pooled_figure():
    from btb_core.engine.validation import pool_runs, summarise

    def run(real, sim):
        n = len(real)
        return pd.DataFrame({"ttft_s": real, "sim_ttft_s": sim, "cached_tokens": [0] * n,
                             "sim_cached_tokens": [0] * n, "cached_match": [True] * n,
                             "ttft_rel_error": np.asarray(sim) / np.asarray(real) - 1.0})

    # the simulator says 1 s; the engine took 1.0, 1.02 and (a slow spell) 2.0 s on average
    frames = [run([1.0, 1.0], [1.0, 1.0]), run([1.02, 1.02], [1.0, 1.0]), run([2.0, 2.0], [1.0, 1.0])]
    out = pool_runs(frames, [summarise(f) for f in frames])
    assert out["ttft_mean_rel_error"] == pytest.approx(1 - 1 / 1.02)
    assert out["ttft_p90_rel_error"] == pytest.approx(1 - 1 / 1.02)
    assert out["ttft_mean_rel_error_pooled"] == pytest.approx(1 - 3 / 4.02)
    assert out["ttft_mean_signed_error_runs"] == pytest.approx([0.0, 1 / 1.02 - 1, -0.5], abs=1e-4)


def test_pass_speed_is_each_pass_against_the_fit():
    calib = pd.concat([pd.DataFrame(_rows(1.0)).assign(**{"pass": 0}),
                       pd.DataFrame(_rows(1.2)).assign(**{"pass": 1})], ignore_index=True)
    from btb_core.engine.validation import pass_speed

    fit0 = cal.fit_cost(calib[calib["pass"] == 0])
    assert pass_speed(calib, fit0) == pytest.approx([1.0, 1.2], rel=1e-6)


class _FakeCluster:
    ports = [1, 2]

    def __init__(self, n, api_cores=None):
        assert n == 2
        self.api_cores = EngineCluster.resolve_api_cores(api_cores, [0, 1])
        self.api_note = ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def reset_prefix_caches(self):
        return True


def test_validate_calibrates_between_rounds_and_fits_every_pass(monkeypatch):
    # the engine replaced by a known cost model: pass 0 (two repeats) at speed 1, the pass after
    # round 1 in a slow spell (1.5x), the next two at speed 1. Every point's median over its
    # five requests is the truth, so the fit is; the passes' speeds and the drift are measured
    # against it; each policy has three runs, summarised by their median
    from btb_core.engine import validation as val

    speeds = iter([1.0, 1.5, 1.0, 1.0])
    calls = []

    def measure_concurrent(ports, repeats=2, salt=0, warmup=True, arrival_rounds=4, **kw):
        calls.append({"repeats": repeats, "salt": salt, "warmup": warmup,
                      "arrival_rounds": arrival_rounds})
        s = next(speeds)
        rows = []
        for i in range(len(ports)):
            for rep in range(repeats):
                rows += _rows(s, rep, i)
            for rnd in range(arrival_rounds):
                rows += _arrival(rnd, 0.005 * s, i)
            rows.append({"kind": "decode", "new_tokens": 512, "cached_tokens": 0,
                         "input_length": 512, "ttft_s": 0.1, "tpot_s": 0.015 + cal._decode_memory_s(),
                         "repeat": 0, "arrivals": 0, "server": i})
        return pd.DataFrame(rows).assign(busy_servers=len(ports))

    tr = val.head(val.load_validation_trace(), 6)
    sent = []

    def replay(trace, router, ports, salt=0, seed=0):
        sent.append(salt)
        t = trace.table
        return pd.DataFrame({"request_id": t["request_id"], "replica": np.arange(len(t)) % 2,
                             "arrival_s": t["arrival_s"], "sent_s": t["arrival_s"],
                             "input_length": t["input_length"], "output_length": t["output_length"],
                             "ttft_s": 1.0, "e2e_s": 1.0, "cached_tokens": 0,
                             "prompt_tokens": t["input_length"]})

    monkeypatch.setattr(cal, "measure_concurrent", measure_concurrent)
    monkeypatch.setattr(val, "replay", replay)
    monkeypatch.setattr(val, "EngineCluster", _FakeCluster)
    monkeypatch.setattr(val, "require_engine", lambda: None)
    res = val.validate(tr, replicas=(2,), policies=("round_robin", "least_load"), log=None)

    assert [c["repeats"] for c in calls] == [2, 1, 1, 1]
    assert [c["warmup"] for c in calls] == [True, False, False, False]
    assert [c["arrival_rounds"] for c in calls] == [cal.ARRIVAL_ROUNDS] + [val.PASS_ARRIVAL_ROUNDS] * 3
    assert len({c["salt"] for c in calls}) == 4
    assert sorted(res.calibration["pass"].unique().tolist()) == [0, 1, 2, 3]
    fit = res.fitted_for(2)
    assert [fit.linear_s_per_token, fit.attention_s_per_pair, fit.context_s_per_token] == \
        pytest.approx(TRUTH[2:].tolist(), rel=1e-6)
    assert fit.arrival_overhead_s == pytest.approx(0.005)
    assert res.info["calibration_points"] == "median" and res.info["recalibrate"] is True
    assert res.info["api_cores"] == [None, None]      # the default: on their engines' cores
    assert res.info["calibration_pass_speed"]["2"] == pytest.approx([1.0, 1.5, 1.0, 1.0], rel=1e-4)
    assert res.info["calibration_drift"] == pytest.approx(0.0, abs=1e-9)
    # the last pass's cold and cached requests (not its arrival or decode rows), both servers
    assert res.info["drift_requests"] == 2 * (len(COLD) + len(CACHED))
    assert res.info["drift_busy_servers"] == 2
    assert len(sent) == 2 + 3 * 2   # two warm-up replays, then three rounds of two policies
    assert res.summary["replay_repeats"].tolist() == [3, 3]
    assert [len(v) for v in res.summary["ttft_mean_signed_error_runs"]] == [3, 3]
    assert sorted(res.requests["repeat"].unique().tolist()) == [0, 1, 2]
    # rescored from its own tables (no engine): the same figures, the host-steal column kept
    again = val.rescore(res, trace=tr).summary
    assert again["ttft_mean_rel_error"].tolist() == pytest.approx(res.summary["ttft_mean_rel_error"].tolist())
    assert again["host_steal_s"].tolist() == pytest.approx(res.summary["host_steal_s"].tolist(), nan_ok=True)


def test_validate_without_recalibration_measures_once_before(monkeypatch):
    from btb_core.engine import validation as val

    calls = []

    def measure_concurrent(ports, repeats=2, salt=0, warmup=True, arrival_rounds=4, **kw):
        calls.append(repeats)
        rows = []
        for i in range(len(ports)):
            for rep in range(repeats):
                rows += _rows(1.0, rep, i)
        return pd.DataFrame(rows).assign(busy_servers=len(ports))

    tr = val.head(val.load_validation_trace(), 4)

    def replay(trace, router, ports, salt=0, seed=0):
        t = trace.table
        return pd.DataFrame({"request_id": t["request_id"], "replica": 0, "arrival_s": t["arrival_s"],
                             "sent_s": t["arrival_s"], "input_length": t["input_length"],
                             "output_length": t["output_length"], "ttft_s": 1.0, "e2e_s": 1.0,
                             "cached_tokens": 0, "prompt_tokens": t["input_length"]})

    monkeypatch.setattr(cal, "measure_concurrent", measure_concurrent)
    monkeypatch.setattr(val, "replay", replay)
    monkeypatch.setattr(val, "EngineCluster", _FakeCluster)
    monkeypatch.setattr(val, "require_engine", lambda: None)
    res = val.validate(tr, replicas=(2,), policies=("round_robin",), recalibrate=False,
                       drift_check=False, replay_repeats=2, log=None)
    assert calls == [2]
    assert res.info["recalibrate"] is False and "calibration_pass_speed" not in res.info
    assert res.calibration["pass"].unique().tolist() == [0]


@pytest.mark.parametrize("policy, why", [("btb", "copies KV"), ("btb_adaptive", "copies KV"),
                                         ("sglang_gateway", "stand-in workers")])
def test_validate_refuses_policies_the_real_servers_cannot_run_before_starting_anything(
        policy, why, monkeypatch):
    # btb_adaptive used to start the servers, calibrate and warm up before failing on the live
    # view (it has no cost model); now every policy outside ENGINE_POLICIES is refused up front
    from btb_core.engine import validation as val
    from btb_core.errors import ConfigError

    def never(*a, **k):
        raise AssertionError("nothing may start")

    monkeypatch.setattr(val, "EngineCluster", never)
    monkeypatch.setattr(val, "require_engine", never)
    with pytest.raises(ConfigError, match=why):
        val.validate(policies=("round_robin", policy), log=None)
    for p in val.ENGINE_POLICIES:    # each of these runs on the live view
        from btb_core.engine.replay import LiveView
        from btb_core.routers import make_router
        make_router(p).reset(LiveView(2, 32, 1024))


class _Done:
    def __init__(self, n_words):
        self.ttft_s = 0.5 + 1e-4 * n_words
        self.cached_tokens = 0


@pytest.mark.parametrize("side_tokens, side_new, prefix_words", [(2080, 32, 2048), (1056, 1056, None)])
def test_measure_arrival_sends_arriving_requests_of_the_asked_size(side_tokens, side_new, prefix_words,
                                                                   monkeypatch):
    """``--side-tokens`` / ``--side-new`` of benchmarks/engine_arrival_cost.py: the arriving
    requests have ``side_tokens`` words, all but ``side_new`` of them a prefix sent once before
    (none when ``side_new`` covers the prompt)."""
    sent = []

    def fake_complete(port, model, text, max_tokens, **kw):
        sent.append(text.split())
        return _Done(len(sent[-1]))

    monkeypatch.setattr(cal, "complete", fake_complete)
    monkeypatch.setattr(cal.time, "sleep", lambda s: None)
    rows = cal.measure_arrival(1, rounds=1, k=3, side_tokens=side_tokens, side_new=side_new)
    lengths = sorted(len(t) for t in sent)
    if prefix_words is None:
        assert lengths == sorted([2048, 2048] + [side_tokens] * 3)
    else:
        assert lengths == sorted([prefix_words, 2048, 2048] + [side_tokens] * 3)
        prefix = next(t for t in sent if len(t) == prefix_words)
        sides = [t for t in sent if len(t) == side_tokens]
        assert all(t[:prefix_words] == prefix for t in sides)
        assert len({tuple(t[prefix_words:]) for t in sides}) == 3     # own tails
    assert [r["arrivals"] for r in rows] == [0, 3]


@pytest.mark.parametrize("side_tokens, side_new", [(1056, 0), (0, 32), (1060, 32), (4000, 4000),
                                                   (20000, 32)])
def test_measure_arrival_refuses_sizes_it_cannot_send(side_tokens, side_new, monkeypatch):
    monkeypatch.setattr(cal, "complete", lambda *a, **k: pytest.fail("sent a request"))
    with pytest.raises(ValueError, match="measure_arrival"):
        cal.measure_arrival(1, rounds=1, k=2, side_tokens=side_tokens, side_new=side_new)
