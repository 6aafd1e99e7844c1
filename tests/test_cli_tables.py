"""Every subcommand's printed tables fit 120 columns by default; ``--wide`` prints every column."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from btb_core.cli import COMMANDS, build_parser, main
from btb_core.commands.tables import TABLE_WIDTH, more_columns_note, render, width
from btb_core.paths import DATA_DIR

from test_experiment_sweep import BT, PREFIX_BLOCKS, dataset  # noqa: F401  (fixture)

CONV = DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl"
AZURE = DATA_DIR / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def _out(capsys, argv) -> str:
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "head.jsonl"
    path.write_text("\n".join(CONV.read_text().splitlines()[:200]) + "\n")
    return path


def _note(text: str) -> str:
    """The "(N more result fields, --wide shows them: ...)" note of a command's output, unwrapped."""
    flat = " ".join(text.split())
    match = re.search(r"\(\d+ more result fields?, --wide shows (them|it): [^)]*\)", flat)
    assert match, text
    return match.group(0)


def test_more_columns_note_names_what_the_table_leaves_out_in_order():
    assert more_columns_note(["a", "b", "c"], ["a", "b", "c"]) == ""
    assert more_columns_note(["a", "b", "c"], ["b"]) == "(2 more result fields, --wide shows them: a, c)"
    assert more_columns_note(["a", "b"], ["a"]) == "(1 more result field, --wide shows it: b)"
    many = [f"result_field_{i:02d}" for i in range(20)]
    text = more_columns_note(many, [])
    assert width(text) <= TABLE_WIDTH and len(text.splitlines()) > 1
    assert " ".join(text.split()).count("result_field_") == 20


def test_render_hides_least_important_columns_first_and_says_so():
    df = pd.DataFrame({"name": ["a", "b"], "x" * 85: [1, 2], "y" * 30: [3, 4], "z" * 20: [5, 6]})
    assert width(df.to_string(index=False)) > TABLE_WIDTH
    # hiding z alone leaves 123 characters: y goes too, x (not listed) stays
    text = render(df, drop=("z" * 20, "y" * 30))
    assert width(text) <= TABLE_WIDTH
    assert "x" * 85 in text and "z" * 20 not in text.splitlines()[0]
    assert text.splitlines()[-1] == f"(hidden to fit 120 columns: {'z' * 20}, {'y' * 30}; --wide shows them)"
    assert render(df, drop=("y" * 30, "z" * 20, "x" * 85), max_width=100).splitlines()[-1].endswith(
        "--wide shows them)")
    one = render(pd.DataFrame({"name": ["a"], "w" * 60: [1], "v" * 70: [2]}), drop=("v" * 70,))
    assert one.splitlines()[-1] == f"(hidden to fit 120 columns: {'v' * 70}; --wide shows it)"
    assert "z" * 20 not in render(df, drop=("y" * 30, "z" * 20)).splitlines()[-1]  # y alone fits
    assert render(df, wide=True) == df.to_string(index=False)
    # many hidden columns: every one named, the note wrapped to the width
    many = pd.DataFrame({"name": ["a"], **{f"column_number_{i:02d}": [i] for i in range(20)}})
    drop = tuple(f"column_number_{i:02d}" for i in range(19, 0, -1))
    text = render(many, drop=drop)
    assert width(text) <= TABLE_WIDTH
    note = " ".join(text.split("(hidden to fit", 1)[1].split())
    hidden = [c for c in drop if c not in text.splitlines()[0]]
    assert len(hidden) > 5 and all(c in note for c in hidden)
    # a single-valued column moves into a heading line
    same = pd.DataFrame({"setup": ["70b_h100x4"] * 2, "policy": ["btb", "cache_aware"]})
    assert render(same, constant=("setup",)).splitlines()[0] == "setup: 70b_h100x4"


@pytest.mark.parametrize("name", [c for c in COMMANDS if c not in ("cost", "synth")])
def test_every_table_command_has_wide(name):
    """cost and synth print fixed tables that always fit; every other table can grow."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert "--wide" in sub.choices[name].format_help()


@pytest.mark.parametrize("argv", [["cost"], ["cost", "--linear"],
                                  ["cost", "--setup", "70b_h100x4_reference"],
                                  ["cost", "--model", "kimi-k2", "--gpu", "b200", "--gpus", "8",
                                   "--tokens", "1", "1000000"]])
def test_cost_fits(capsys, argv):
    assert width(_out(capsys, argv)) <= TABLE_WIDTH


def test_audit_fits_and_wide_shows_every_column(capsys):
    argv = ["audit", str(CONV), str(AZURE), "--window-s", "10", "60"]
    text = _out(capsys, argv)
    assert width(text) <= TABLE_WIDTH
    assert "AzureLLMInferenceTrace_conv" in text and "n/a" in text
    wide = _out(capsys, argv + ["--wide"])
    assert "window_start_s" in wide


def test_audit_fits_with_a_long_trace_name(head, tmp_path, capsys):
    """A long file name widened the burstiness table past 120 (found by a helper): it hides its
    least important columns and says so; the fan-out title wraps."""
    long = tmp_path / ("a_trace_with_a_rather_long_file_name_" + "x" * 24 + ".jsonl")
    long.write_text(head.read_text())
    text = _out(capsys, ["audit", str(long), str(AZURE), "--exclude-sessions"])
    assert width(text) <= TABLE_WIDTH
    assert "(hidden to fit 120 columns: zero_bins_frac" in text
    assert "zero_bins_frac" in _out(capsys, ["audit", str(long), str(AZURE), "--wide"])


def test_replay_trace_modes_fit(head, capsys):
    one = _out(capsys, ["replay", "--trace", str(head), "--policy", "cache_aware"])
    assert width(one) <= TABLE_WIDTH
    many = ["replay", "--trace", str(head), "--policy", "round_robin", "power_of_two", "least_load",
            "cache_aware", "kv_aware", "llm_d", "btb", "btb_adaptive", "--setup", "70b_h100x4",
            "qwen3_8b_h100x4"]
    text = _out(capsys, many)
    assert width(text) <= TABLE_WIDTH
    assert text.count("btb_adaptive") == 2  # one row per (setup, policy)
    note = _note(text)
    assert "more result fields, --wide shows them:" in note and "rdma_bytes" in note
    named = set(note.split(": ", 1)[1].rstrip(")").split(", "))
    assert "hit_fraction" not in named and "scheduler" not in named   # shown, or in the heading
    assert "hit_fraction_hbm" in named and len(named) == int(note[1:].split()[0])
    wide = _out(capsys, many + ["--wide"])
    assert "more result field" not in wide
    header = next(line for line in wide.splitlines() if "policy" in line).split()
    assert header[:3] == ["setup", "policy", "requests"]       # the default table's order first
    assert width(wide) > TABLE_WIDTH and "recomputed_prefill_tokens" in wide


def test_replay_dataset_mode_fits_and_wide_has_every_column(dataset, capsys):  # noqa: F811
    argv = ["replay", "--dataset", str(dataset), "--policy", "round_robin", "power_of_two",
            "cache_aware", "btb", "btb_adaptive", "--setup", "70b_h100x4_reference", "qwen3_8b_h100x4",
            "--scheduler", "both", "--router-param", f"y_tokens={PREFIX_BLOCKS * BT}"]
    text = _out(capsys, argv)
    assert width(text) <= TABLE_WIDTH, text
    assert "speedup_vs_cache_aware" in text and "qwen3_8b_h100x4" in text and "--wide" in text
    note = _note(text)
    assert "prompt_tokens" in note and "rdma_bytes" in note and "speedup_vs_cache_aware" not in note
    wide = _out(capsys, argv + ["--wide"])
    header = next(line for line in wide.splitlines() if "policy" in line)
    for col in ("setup", "scheduler", "requests", "ttft_p50_s", "ttft_p99_s",
                "recomputed_prefill_tokens", "rdma_bytes", "prompt_tokens"):   # every result field
        assert col in header
    assert "more result field" not in wide
    assert width(wide) > TABLE_WIDTH


def test_replay_dataset_json_keeps_the_continuous_run(dataset, capsys):  # noqa: F811
    argv = ["replay", "--dataset", str(dataset), "--policy", "cache_aware", "--setup", "70b_h100x4",
            "--continuous", "--json"]
    out = json.loads(_out(capsys, argv))
    assert [(r["setup"], r["policy"]) for r in out["continuous"]] == [("70b_h100x4", "cache_aware")]
    assert out["continuous"][0]["ttft_mean_s"] > 0 and len(out["results"]) >= 1
    assert "continuous" not in json.loads(_out(capsys, argv[:-2] + ["--json"]))


def test_sweep_table_fits(dataset, tmp_path, capsys):  # noqa: F811
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"dataset: {dataset}\nsplit: test\npolicies:\n  cache_aware: {{}}\n"
                    f"  btb: {{y_tokens: {PREFIX_BLOCKS * BT}, x_repeats: [2, 3], m_replicas: [1, 2]}}\n"
                    f"setups: [70b_h100x4, qwen3_8b_h100x4]\nout: {tmp_path / 'res'}\n")
    text = _out(capsys, ["sweep", "--grid", str(grid)])
    assert width(text) <= TABLE_WIDTH, text
    assert "speedup_vs_cache_aware" in text
    # parameters only btb has: whole numbers as integers, empty for cache_aware (no 2.000, no <NA>)
    assert "<NA>" not in text and "NaN" not in text and " 2.000" not in text


def test_suite_table_fits(capsys):
    text = _out(capsys, ["suite", "--policies", "cache_aware", "btb_adaptive", "--shapes",
                         "p64k_long_suffix", "trickle", "--scale", "0.1"])
    assert width(text) <= TABLE_WIDTH
    assert "p64k_long_suffix" in text and "mean_ratio" in text
    assert "more result fields, --wide shows them:" in _note(text)


def test_gateway_check_tables_fit(capsys):
    pytest.importorskip("sglang_router")
    text = _out(capsys, ["gateway-check", "--burst", "--replicas", "4"])
    assert width(text) <= TABLE_WIDTH, text


def test_validate_engine_table_fits(capsys, monkeypatch):
    """The table `btb validate-engine` prints, from the shipped measured run (no engine needed)."""
    from btb_core.engine import validation as module
    shipped = module.load_result(module.SHIPPED_RESULT)
    seen = []
    monkeypatch.setattr(module, "validate", lambda *a, **k: seen.append(k["api_cores"]) or shipped)
    text = _out(capsys, ["validate-engine"])
    assert width(text) <= TABLE_WIDTH, text
    assert "kv_aware" in text
    _out(capsys, ["validate-engine", "--api-core", "spare"])
    assert seen == [None, "spare"]       # default: the API servers stay on their engines' cores


def test_replay_setup_help_offers_every_setup():
    from btb_core.cost import REFERENCE_SETUP
    from btb_core.specs import SETUPS

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    text = " ".join(sub.choices["replay"].format_help().split())
    for name in [*SETUPS, REFERENCE_SETUP]:
        assert name in text, name


@pytest.mark.parametrize("name", [None, *COMMANDS])
def test_help_fits_120_columns(name):
    parser = build_parser()
    if name is not None:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[name]
    assert width(parser.format_help()) <= TABLE_WIDTH


def test_replay_prints_whole_ratios_and_fractions_as_floats(dataset, head, capsys):  # noqa: F811
    """One policy: its speedup over cache_aware is exactly 1 and prints as 1.000, as beside other
    policies; a count column (rdma_copies) stays an integer."""
    text = _out(capsys, ["replay", "--dataset", str(dataset), "--policy", "cache_aware",
                         "--setup", "70b_h100x4"])
    header = next(line for line in text.splitlines() if "speedup_vs_cache_aware" in line).split()
    row = next(line for line in text.splitlines() if line.split()[:1] == ["cache_aware"]).split()
    assert row[header.index("speedup_vs_cache_aware")] == "1.000"
    assert row[header.index("rdma_copies")] == "0"
    from btb_core.commands.tables import measured_floats
    df = pd.DataFrame({"ttft_mean_s": [1.0], "hit_fraction": [0.0], "rdma_bytes": [0.0],
                       "recomputed_prefill_tokens": [3.0], "requests": [2], "policy": ["x"]})
    assert measured_floats(df) == ("ttft_mean_s", "hit_fraction")


def test_replay_and_suite_refuse_repeated_names(head, capsys):
    assert main(["replay", "--trace", str(head), "--policy", "btb", "cache_aware", "btb"]) == 2
    assert "policy btb given more than once" in capsys.readouterr().err
    assert main(["replay", "--trace", str(head), "--policy", "btb", "--setup", "70b_h100x4",
                 "qwen3_8b_h100x4", "70b_h100x4"]) == 2
    assert "setup 70b_h100x4 given more than once" in capsys.readouterr().err
    assert main(["suite", "--policies", "btb", "btb", "--shapes", "trickle"]) == 2
    assert "policy btb given more than once" in capsys.readouterr().err
    assert main(["suite", "--policies", "btb", "--shapes", "trickle", "trickle"]) == 2
    assert "shape trickle given more than once" in capsys.readouterr().err
    from btb_core.errors import ConfigError
    from btb_core.experiment import check_names, repeated
    assert repeated(["b", "a", "b", "c", "a"]) == ["a", "b"] and repeated(("a", "b")) == []
    with pytest.raises(ConfigError, match="scheduler chunked given more than once"):
        check_names(schedulers=["chunked", "prefill_first", "chunked"])


def test_ratio_columns_stay_floats_when_every_ratio_is_whole():
    """``btb suite`` with one policy: every ratio is exactly 1 and prints as ``1.000``, as beside
    other policies, while a whole-valued count column still prints as an integer."""
    df = pd.DataFrame({"policy": ["btb"], "copies": [2.0], "mean_ratio": [1.0]})
    lines = render(df, float_format="%.3f", floats=("mean_ratio",)).splitlines()
    assert lines[1].split() == ["btb", "2", "1.000"]
    assert render(df, float_format="%.3f").splitlines()[1].split() == ["btb", "2", "1"]


def test_replay_block_tokens_reads_a_trace_of_another_block_size(capsys):
    """`btb replay --block-tokens 32` replays the engine validation trace (32-token blocks),
    which the Mooncake default of 512 refuses with a hint; dataset mode refuses the option."""
    engine = DATA_DIR / "traces" / "engine_validation" / "engine_validation.jsonl"
    assert main(["replay", "--trace", str(engine)]) != 0
    assert "--block-tokens 32" in capsys.readouterr().err
    out = json.loads(_out(capsys, ["replay", "--trace", str(engine), "--block-tokens", "32",
                                   "--json"]))
    assert out["requests"] == 84 and out["ttft_mean_s"] > 0
    assert main(["replay", "--dataset", "x", "--block-tokens", "32"]) != 0
    assert "--block-tokens is for --trace" in capsys.readouterr().err
