"""``benchmarks/engine_step_gaps.py``: real vs simulated step durations of a validation result
(offline, on the shipped measured run; no engine needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def gaps():
    sys.path.insert(0, str(BENCH))
    try:
        import engine_step_gaps
    finally:
        sys.path.remove(str(BENCH))
    return engine_step_gaps


@pytest.fixture(scope="module")
def shipped(gaps):
    from btb_core.engine.validation import SHIPPED_RESULT

    return gaps.analyse(SHIPPED_RESULT)


def test_the_method_recovers_the_simulators_own_step_model(shipped):
    # fitted to the *simulated* step durations, the step model must give back the cost model the
    # simulator ran with (the calibration's), term by term; the fixed cost per step also takes
    # the decode tokens sharing each step, which the fit has no term for
    cal, sim = shipped["calibration_fit"], shipped["fit_to_simulated_steps"]
    for term in ("linear_s_per_token", "attention_s_per_pair", "context_s_per_token",
                 "arrival_overhead_s"):
        assert sim[term] == pytest.approx(cal[term], rel=0.05), term
    assert sim["rms_rel_error"] < 0.005


def test_shipped_one_server_run_pinned(shipped):
    # 12 one-server runs of 17 prompt-completing steps each, the first not counted (no step
    # before it), less the two intervals around the one step whose first tokens the engine
    # split (57 ms apart): every step's real and simulated duration, and the median gap the
    # README quotes
    assert shipped["runs"] == 12 and shipped["intervals"] == 12 * 17 - 2
    assert [s["step"] for s in shipped["per_step"]] == list(range(1, 18))
    assert shipped["real_over_sim_median"] == pytest.approx(1.053, abs=0.001)
    assert shipped["fit_to_real_steps"]["arrival_overhead_s"] == pytest.approx(
        shipped["calibration_fit"]["arrival_overhead_s"], rel=0.05)


def test_engine_groups_split_first_tokens_at_the_gap(gaps):
    t = [0.50, 0.51, 0.20, 0.52, 0.21, 0.90]
    assert gaps.engine_groups(t) == {frozenset({2, 4}), frozenset({0, 1, 3}), frozenset({5})}
    assert gaps.engine_groups([0.0, gaps.GROUP_GAP_S]) == {frozenset({0}), frozenset({1})}


def test_steps_the_engine_ran_differently_are_left_out(gaps):
    # a run whose engine merged two of the simulator's steps (their first tokens together):
    # the intervals ending at either of them are not compared, the others are unchanged
    from btb_core.engine.validation import SHIPPED_RESULT, head, load_result, load_validation_trace

    res = load_result(SHIPPED_RESULT)
    reqs = res.requests[res.requests["num_replicas"] == 1]
    real = reqs[(reqs["policy"] == "cache_aware") & (reqs["repeat"] == 0)].reset_index(drop=True)
    trace = head(load_validation_trace(), len(real))
    fitted = res.fitted_for(1)
    base = gaps.run_intervals(real, trace, fitted)
    assert [r["step"] for r in base] == list(range(1, 18))
    fin = (real["sent_s"] + real["ttft_s"]).to_numpy()
    groups = sorted(gaps.engine_groups(fin), key=lambda g: min(fin[i] for i in g))
    five, six = groups[5], groups[6]            # steps 5 and 6: give 5's first tokens 6's time
    merged = real.copy()
    late = max(fin[i] for i in six)
    for i in five:
        merged.loc[i, "ttft_s"] = late - merged.loc[i, "sent_s"]
    got = gaps.run_intervals(merged, trace, fitted)
    assert [r["step"] for r in got] == [s for s in range(1, 18) if s not in (5, 6, 7)]
    same = {r["step"]: r for r in base}
    assert all(r == same[r["step"]] for r in got)


def test_cli_writes_json_and_refuses_bad_arguments(gaps, tmp_path, capsys):
    out = tmp_path / "gaps.json"
    assert gaps.main(["--out", str(out)]) == 0
    assert "busy steps; real / simulated step duration: median 1.053" in capsys.readouterr().out
    got = json.loads(out.read_text())
    assert got["intervals"] == 202 and got["result"] == "data/engine_validation/measured"
    first = out.read_bytes()
    assert gaps.main(["--out", str(out)]) == 0 and out.read_bytes() == first   # reproducible
    capsys.readouterr()
    # a result without one-server runs: the shipped one's two-server runs only
    from btb_core.engine.validation import SHIPPED_RESULT, load_result, save_result

    res = load_result(SHIPPED_RESULT)
    res.requests = res.requests[res.requests["num_replicas"] == 2]
    two = tmp_path / "two"
    save_result(res, two)
    with pytest.raises(SystemExit, match="no one-server run in this result"):
        gaps.main(["--result", str(two), "--out", str(out)])
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "summary.json").write_text("not json")
    (tmp_path / "afile").write_text("")
    bad = load_result(SHIPPED_RESULT)
    bad.requests = bad.requests.drop(columns=["sent_s"])
    save_result(bad, tmp_path / "nosent")
    for result, says in ((tmp_path / "none", "no such folder"),
                         (tmp_path / "afile", "not a folder"),
                         (tmp_path / "nosent", "requests.csv is not a validation result's"),
                         (tmp_path / "junk", "not a readable validation result")):
        with pytest.raises(SystemExit, match=says):
            gaps.main(["--result", str(result), "--out", str(out)])
    for argv, says in ((["--out", str(tmp_path / "no" / "x.json")], "does not exist"),
                       (["--out", str(tmp_path)], "is a folder"),
                       (["--out", str(tmp_path / "afile" / "x.json")], "is not a folder")):
        with pytest.raises(SystemExit):
            gaps.main(argv)
        assert says in capsys.readouterr().err


def test_a_run_cut_short_is_analysed_with_a_warning(gaps, tmp_path, capsys):
    """A requests.csv whose run has fewer rows than the result's runs replayed (a file cut
    short) is analysed, and the warning names the run and both counts; whole runs give none."""
    from btb_core.engine.validation import SHIPPED_RESULT, load_result, save_result

    res = load_result(SHIPPED_RESULT)
    n = int(res.info["trace_requests"])
    r = res.requests
    first = r[r["num_replicas"] == 1].iloc[0]
    run = (r["num_replicas"] == 1) & (r["policy"] == first["policy"]) & (r["repeat"] == first["repeat"])
    res.requests = r[~run | (run.cumsum() <= n - 10)]
    save_result(res, tmp_path / "cut")
    capsys.readouterr()
    got = gaps.analyse(tmp_path / "cut")
    err = capsys.readouterr().err
    assert f"run {first['policy']} / repeat {int(first['repeat'])} has {n - 10} of the {n}" in err
    assert err.count("warning:") == 1
    assert got["intervals"] < 202
    gaps.analyse(SHIPPED_RESULT)
    assert "warning" not in capsys.readouterr().err


def test_a_run_with_rows_missing_inside_or_repeated_is_skipped_not_mispaired(gaps, tmp_path, capsys):
    """Rows deleted from the middle of a run, or a row repeated: pairing the rest with the
    trace's first requests would compare different requests, so the run is skipped, named in a
    warning; the other runs' figures are those of the intact result without it."""
    from btb_core.engine.validation import SHIPPED_RESULT, load_result, save_result

    whole = gaps.analyse(SHIPPED_RESULT)
    res = load_result(SHIPPED_RESULT)
    r = res.requests
    one = r[r["num_replicas"] == 1]
    policy, repeat = one.iloc[0]["policy"], int(one.iloc[0]["repeat"])
    run = (r["num_replicas"] == 1) & (r["policy"] == policy) & (r["repeat"] == repeat)
    pos = run.cumsum()
    hole = r[~(run & pos.between(6, 8))]                            # rows 5-7 of the run gone
    dup = pd.concat([r, r[run & (pos == 3)]]).sort_index(kind="stable")   # row 2 twice
    capsys.readouterr()
    for name, table in (("hole", hole), ("dup", dup)):
        res.requests = table
        save_result(res, tmp_path / name)
        got = gaps.analyse(tmp_path / name)
        err = capsys.readouterr().err
        assert (f"run {policy} / repeat {repeat}: its requests are not the trace's first" in err
                and "run skipped" in err), (name, err)
        assert got["runs"] == whole["runs"] - 1
        assert got["intervals"] < whole["intervals"] and got["per_step"]
    # every one-server run broken: one line says so
    res.requests = r[(r["num_replicas"] == 2) | ((r["num_replicas"] == 1) & (r.groupby(
        ["num_replicas", "policy", "repeat"]).cumcount() != 4))]
    save_result(res, tmp_path / "all")
    with pytest.raises(SystemExit, match="no one-server run whose requests are the validation trace's"):
        gaps.analyse(tmp_path / "all")


def test_a_users_result_does_not_overwrite_the_shipped_figures(gaps, tmp_path):
    from btb_core.engine.validation import SHIPPED_RESULT, load_result, save_result

    shipped_json = gaps.HERE / "results_engine_step_gaps.json"
    before = shipped_json.read_bytes()
    save_result(load_result(SHIPPED_RESULT), tmp_path / "mine")
    assert gaps.main(["--result", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "step_gaps.json").is_file()
    assert shipped_json.read_bytes() == before
