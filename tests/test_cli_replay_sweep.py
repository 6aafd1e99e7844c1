"""`btb replay` (trace and dataset modes) and `btb sweep` from the command line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from btb_core.cli import main
from btb_core.paths import DATA_DIR
from btb_core.routers import POLICIES

from test_experiment_sweep import BT, PREFIX_BLOCKS, dataset  # noqa: F401  (fixture)

CONV = DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl"


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("trace")
    lines = CONV.read_text().splitlines()[:300]
    path = d / "head.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("policy", list(POLICIES))
def test_replay_trace_every_policy_json(small_trace, policy, capsys):
    assert main(["replay", "--trace", str(small_trace), "--policy", policy, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 300
    for k in ("ttft_mean_s", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "hit_fraction"):
        assert out[k] is not None and out[k] >= 0
    assert out["policy"] == policy and out["setup"] == "70b_h100x4" and out["replicas"] == 4


def test_replay_writes_table_and_refuses_overwrite(small_trace, tmp_path, capsys):
    out = tmp_path / "req.parquet"
    args = ["replay", "--trace", str(small_trace), "--policy", "least_load", "--out", str(out)]
    assert main(args) == 0
    df = pd.read_parquet(out)
    assert len(df) == 300 and {"ttft_s", "replica", "reuse_tier"} <= set(df.columns)
    before = out.read_bytes()
    assert main(args) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_bytes() == before


def test_replay_trace_refuses_out_before_replaying(small_trace, tmp_path, capsys, monkeypatch):
    """An --out that cannot be written is refused before the replay spends its time, not after."""
    import btb_core.sim as sim

    def no_replay(*a, **k):
        raise AssertionError("the replay ran before --out was checked")

    monkeypatch.setattr(sim, "simulate", no_replay)
    existing = tmp_path / "taken.parquet"
    existing.write_bytes(b"user data")
    for out in (existing, tmp_path):
        args = ["replay", "--trace", str(small_trace), "--policy", "btb", "--out", str(out)]
        assert main(args) == 2
        assert str(out) in capsys.readouterr().err
    assert existing.read_bytes() == b"user data"


def test_replay_router_param_errors_are_one_line(small_trace, capsys):
    assert main(["replay", "--trace", str(small_trace), "--policy", "cache_aware",
                 "--router-param", "cache_threshold=abc"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("btb replay: error:") and "cache_threshold" in err and "\n" not in err


@pytest.mark.parametrize("argv, says", [
    (["--policy", "foo", "cache_aware"], "unknown policy 'foo'; choose from"),
    (["--policy", "cache_aware", "--replicas", "0"], "--replicas 0: must be an integer in [1, 4,096]"),
])
def test_replay_errors_name_the_option_once(small_trace, capsys, argv, says):
    assert main(["replay", "--trace", str(small_trace), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("btb replay") == 1 and err.startswith("btb replay: error: ") and says in err
    assert "ClusterConfig" not in err


def test_replay_dataset_json(dataset, capsys):  # noqa: F811
    assert main(["replay", "--dataset", str(dataset), "--split", "test", "--policy", "cache_aware", "btb",
                 "--scheduler", "both", "--router-param", f"y_tokens={PREFIX_BLOCKS * BT}", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert {(r["scheduler"], r["policy"], r["dataset"]) for r in rows} == {
        (s, p, d) for s in ("prefill_first", "chunked") for p in ("cache_aware", "btb") for d in ("bursted", "normal")}
    for r in rows:
        assert {"setup", "ttft_mean_s", "ttft_p95_s", "speedup_vs_cache_aware", "rdma_copies"} <= set(r)


def test_replay_multiwindow_file_points_to_dataset_mode(dataset, capsys):  # noqa: F811
    assert main(["replay", "--trace", str(dataset / "test.parquet"), "--policy", "btb"]) == 2
    assert "--dataset" in capsys.readouterr().err


def test_sweep_cli_runs_and_resumes(dataset, tmp_path, capsys):  # noqa: F811
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"dataset: {dataset}\nsplit: test\npolicies:\n  cache_aware: {{}}\n"
                    f"  btb: {{y_tokens: {PREFIX_BLOCKS * BT}, m_replicas: [1, 2]}}\nout: {tmp_path / 'res'}\n")
    assert main(["sweep", "--grid", str(grid), "--limit", "2"]) == 0
    assert "2 of 6 cells done" in capsys.readouterr().out
    assert main(["sweep", "--grid", str(grid)]) == 0
    assert "6 of 6 cells done" in capsys.readouterr().out
    assert main(["sweep", "--grid", str(tmp_path / "missing.yaml")]) == 2


def test_replay_dataset_rejects_misspelled_router_param(dataset, capsys):  # noqa: F811
    assert main(["replay", "--dataset", str(dataset), "--policy", "cache_aware",
                 "--router-param", "balance_abs_treshold=0"]) == 2
    assert "balance_abs_treshold" in capsys.readouterr().err
    assert main(["replay", "--dataset", str(dataset), "--policy", "cache_aware",
                 "--router-param", "balance-abs-threshold=0", "--json"]) == 0


def test_replay_dataset_json_counts_are_integers(dataset, capsys):  # noqa: F811
    # rdma_bytes is a count of bytes, an integer as in trace mode's JSON (it was a float here)
    assert main(["replay", "--dataset", str(dataset), "--policy", "btb", "--setup", "70b_h100x4",
                 "--router-param", f"y_tokens={PREFIX_BLOCKS * BT}", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    burst = next(r for r in rows if r["dataset"] == "bursted")
    assert burst["rdma_bytes"] > 0 and isinstance(burst["rdma_bytes"], int)
    for k in ("rdma_copies", "copies_unused", "recomputed_prefill_tokens", "prompt_tokens"):
        assert isinstance(burst[k], int)


def test_replay_dataset_says_when_no_window_is_normal(dataset, tmp_path, capsys):  # noqa: F811
    # the fixture's test split without its normal window
    df = pd.read_parquet(dataset / "test.parquet")
    df = df[~df["trace_id"].str.contains("normal")]
    assert len(df) and df["trace_id"].nunique() == 1
    df.to_parquet(tmp_path / "test.parquet", index=False)
    (tmp_path / "manifest.json").write_text((dataset / "manifest.json").read_text())
    base = ["replay", "--policy", "cache_aware", "--setup", "70b_h100x4"]
    for extra in ([], ["--json"]):
        assert main(base + ["--dataset", str(tmp_path)] + extra) == 0
        got = capsys.readouterr()
        assert "split 'test' has no normal window among those replayed" in got.err
        assert "normal window" not in got.out
    assert main(base + ["--dataset", str(dataset)]) == 0
    assert "normal window" not in capsys.readouterr().err


def test_replay_trace_key_value_floats_as_tables_print_them(small_trace, capsys):
    assert main(["replay", "--trace", str(small_trace), "--policy", "least_load"]) == 0
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines() if line.strip())
    mean = lines["ttft_mean_s"].strip()
    assert mean.split(".")[1].isdigit() and len(mean.split(".")[1]) == 3, mean   # %.3f
    assert lines["requests"].strip() == "300"
