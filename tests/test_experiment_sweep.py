"""Experiment (window-by-window replay, pooling) and sweeps (serial, Dask, resume)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from btb_core.errors import ConfigError
from btb_core.experiment import pool, run_experiment, window_kind
from btb_core.sweep import Grid, read_results, run_sweep, summarize
from btb_core.trace import load_bursted

BT = 512
PREFIX_BLOCKS = 16  # an 8,192-token shared prefix


def _rows(trace_id, kind, rows):
    out = []
    for t, n_in, n_out, ids in rows:
        out.append({"arrival_s": t, "input_length": n_in, "output_length": n_out,
                    "hash_ids": [str(x) for x in ids], "source": "synthetic" if kind == "synthetic" else "base",
                    "trace_id": trace_id, "split": "test",
                    "metadata": json.dumps({"window_kind": kind})})
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Two windows: a normal one (unrelated prompts) and a synthetic one (a burst of 24 requests
    sharing a 16-block prefix within 4 s, plus its own 1-block suffix each)."""
    rng = np.random.default_rng(0)
    rows = []
    normal = [(float(t), 2000, 20, [f"n{i}-{b}" for b in range(4)])
              for i, t in enumerate(np.sort(rng.uniform(0, 20, 12)))]
    rows += _rows("w0-normal", "normal", normal)
    prefix = [f"p{b}" for b in range(PREFIX_BLOCKS)]
    burst = [(0.5 + float(t), PREFIX_BLOCKS * BT + 200, 1, prefix + [f"s{i}"])
             for i, t in enumerate(np.sort(rng.uniform(0, 4, 24)))]
    rows += _rows("w1-synthetic", "synthetic", burst)
    d = tmp_path_factory.mktemp("bursted")
    df = pd.DataFrame(rows)
    df.insert(0, "request_id", np.arange(len(df)))
    df.to_parquet(d / "test.parquet", index=False)
    (d / "manifest.json").write_text(json.dumps({"block_tokens": BT}))
    return d


BTB_PARAMS = {"y_tokens": PREFIX_BLOCKS * BT}


def test_window_kinds_from_metadata(dataset):
    wins = load_bursted(dataset, split="test").groups("trace_id")
    assert [window_kind(w) for w in wins] == ["normal", "synthetic"]


def test_experiment_pools_bursted_and_normal(dataset):
    res = run_experiment(dataset, "test", policies=("cache_aware", "btb", "least_load"),
                         setups=("70b_h100x4",), schedulers=("prefill_first", "chunked"),
                         router_params={"btb": BTB_PARAMS}, progress=False)
    r = res.results.set_index(["scheduler", "policy", "dataset"])
    assert set(res.results["dataset"]) == {"bursted", "normal"}
    assert r.loc[("chunked", "cache_aware", "bursted"), "requests"] == 36
    assert r.loc[("chunked", "cache_aware", "normal"), "requests"] == 12
    # pooled means and speedups recomputed from the per-request table: the mean over every
    # request of every window (not a mean of window means), and cache_aware's mean over this one
    req = res.requests
    for sched in ("prefill_first", "chunked"):
        for dataset, kinds in (("bursted", ("normal", "synthetic")), ("normal", ("normal",))):
            sel = req[(req.scheduler == sched) & req["kind"].isin(kinds)]
            mean = sel.groupby("policy")["ttft_s"].mean()
            for pol in ("cache_aware", "btb", "least_load"):
                row = r.loc[(sched, pol, dataset)]
                assert row["ttft_mean_s"] == pytest.approx(mean[pol], rel=1e-12)
                assert row["speedup_vs_cache_aware"] == pytest.approx(
                    mean["cache_aware"] / mean[pol], rel=1e-12)
    # (the checks have teeth: windows differ in size and BTB differs from cache_aware)
    sel = req[(req.scheduler == "chunked") & (req.policy == "btb")]
    assert sel.groupby("kind")["ttft_s"].mean().mean() != pytest.approx(sel["ttft_s"].mean())
    assert r.loc[("chunked", "btb", "bursted"), "speedup_vs_cache_aware"] != pytest.approx(1.0, rel=1e-6)
    # control: the normal window has no repeated prefix, so BTB is inert there (identical TTFTs, no copies)
    assert r.loc[("chunked", "btb", "normal"), "ttft_mean_s"] == r.loc[("chunked", "cache_aware", "normal"), "ttft_mean_s"]
    assert r.loc[("chunked", "btb", "normal"), "rdma_copies"] == 0
    # on the burst BTB copies the prefix and recomputes less than least_load
    assert r.loc[("chunked", "btb", "bursted"), "rdma_copies"] >= 1
    assert (r.loc[("chunked", "btb", "bursted"), "recomputed_prefill_tokens"]
            < r.loc[("chunked", "least_load", "bursted"), "recomputed_prefill_tokens"])
    # the ledger sums the per-window metrics
    w = res.windows[(res.windows.policy == "btb") & (res.windows.scheduler == "chunked")]
    assert r.loc[("chunked", "btb", "bursted"), "rdma_bytes"] == w["rdma_bytes"].sum()


def test_experiment_rejects_unknown_names(dataset):
    with pytest.raises(ConfigError, match="unknown policy 'nope'"):
        run_experiment(dataset, policies=("nope",), progress=False)
    with pytest.raises(ConfigError, match="unknown setup"):
        run_experiment(dataset, setups=("70b_tpu",), progress=False)


def _grid(dataset, out):
    return Grid.from_dict({
        "dataset": str(dataset), "split": "test", "setups": ["70b_h100x4"], "schedulers": ["chunked"],
        "replicas": [4], "seed": 0,
        "policies": {"cache_aware": {}, "btb": {"y_tokens": PREFIX_BLOCKS * BT, "x_repeats": [2, 3],
                                                "m_replicas": [1, 3]}},
    }, out=str(out))


def test_grid_expansion_and_validation(dataset, tmp_path):
    g = _grid(dataset, tmp_path / "s")
    assert len(g.policies) == 1 + 4
    assert len(g.cells()) == 5 * 2
    with pytest.raises(ConfigError, match="has no parameter 'w'"):
        Grid.from_dict({"dataset": str(dataset), "policies": {"btb": {"w": [1]}}})
    with pytest.raises(ConfigError, match="missing field 'dataset'"):
        Grid.from_dict({"policies": {}})


def test_sweep_resumes_without_redoing_cells(dataset, tmp_path):
    g = _grid(dataset, tmp_path / "sweep")
    first = run_sweep(g, limit=3, progress=False)
    assert len(first) == 3
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "sweep").glob("cell-*.parquet")}
    full = run_sweep(g, progress=False)
    assert len(full) == 10
    for name, t in mtimes.items():  # finished cells were not rewritten
        assert (tmp_path / "sweep" / name).stat().st_mtime_ns == t
    serial = run_sweep(_grid(dataset, tmp_path / "serial"), progress=False)
    pd.testing.assert_frame_equal(full, serial)
    s = summarize(full)
    assert set(s["m_replicas"].dropna()) == {1, 3}
    # pooled TTFT is request-weighted and the speedup divides cache_aware's by it: recomputed
    # from the per-request TTFTs of the same replays run as an experiment
    exp = run_experiment(dataset, "test", policies=("cache_aware", "btb"), schedulers=("chunked",),
                         router_params={"btb": {**BTB_PARAMS, "x_repeats": 3, "m_replicas": 3}},
                         progress=False)
    mean = exp.requests.groupby("policy")["ttft_s"].mean()
    ca = s[s.policy == "cache_aware"].iloc[0]
    btb = s[(s.policy == "btb") & (s.x_repeats == 3) & (s.m_replicas == 3)].iloc[0]
    assert ca["ttft_mean_s"] == pytest.approx(mean["cache_aware"], rel=1e-12)
    assert btb["ttft_mean_s"] == pytest.approx(mean["btb"], rel=1e-12)
    assert btb["speedup_vs_cache_aware"] == pytest.approx(mean["cache_aware"] / mean["btb"], rel=1e-12)
    per_window = exp.requests[exp.requests.policy == "btb"].groupby("window")["ttft_s"].mean()
    assert per_window.mean() != pytest.approx(mean["btb"])      # unweighted pooling would differ


def test_sweep_on_dask_local_cluster_equals_serial(dataset, tmp_path):
    pytest.importorskip("dask.distributed")
    serial = run_sweep(_grid(dataset, tmp_path / "serial"), progress=False)
    dask = run_sweep(_grid(dataset, tmp_path / "dask"), executor="dask", workers=2, progress=False)
    pd.testing.assert_frame_equal(serial, dask)
    assert len(read_results(tmp_path / "dask")) == 10


def test_continuous_run_replays_all_windows_back_to_back(dataset):
    res = run_experiment(dataset, "test", policies=("cache_aware", "btb"), schedulers=("chunked",),
                         router_params={"btb": BTB_PARAMS}, continuous=True, progress=False)
    cont = res.info["continuous"].set_index("policy")
    assert list(cont.index) == ["cache_aware", "btb"]
    assert (cont["requests"] == 36).all()
    # the normal window comes first and has no shared prefix, so BTB's copies all serve the burst
    assert cont.loc["btb", "rdma_copies"] >= 1
    assert cont.loc["cache_aware", "rdma_copies"] == 0


@pytest.mark.parametrize("extra, match", [
    ({"bogus": 1}, "unknown field 'bogus'"),
    ({"seed": "abc"}, "'seed' = 'abc'"),
    ({"max_windows": -3}, "'max_windows' = -3"),
    ({"setups": ["70b_tpu"]}, "unknown setup '70b_tpu'"),
    ({"schedulers": []}, "'schedulers' is an empty list"),
    ({"policies": {"btb": {"x_repeats": []}}}, "empty list of values"),
])
def test_grid_rejects_bad_fields(dataset, extra, match):
    with pytest.raises(ConfigError, match=match):
        Grid.from_dict({"dataset": str(dataset), **extra})


def test_failed_sweep_writes_nothing_and_results_dir_reads_as_parquet(dataset, tmp_path):
    bad = Grid.from_dict({"dataset": str(tmp_path / "missing")}, out=str(tmp_path / "bad"))
    with pytest.raises(FileNotFoundError):
        run_sweep(bad, progress=False)
    assert not (tmp_path / "bad").exists()
    run_sweep(_grid(dataset, tmp_path / "ok"), limit=2, progress=False)
    assert len(pd.read_parquet(tmp_path / "ok")) == 2  # the sweep's _grid.json is not in the way
