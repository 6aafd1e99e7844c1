"""`btb --help` and every subcommand's help: examples, plain text, help on every option; several
policies in --trace mode; the shipped example grid."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from btb_core.cli import COMMANDS, build_parser, main
from btb_core.paths import DATA_DIR, REPO_ROOT

CONV = DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl"


def _subparsers():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, sub.choices


def test_top_help_has_an_example_per_command():
    parser, _ = _subparsers()
    text = parser.format_help()
    examples = text.split("examples (one per command")[1]
    for name in COMMANDS:
        assert f"  btb {name} " in examples, name
    assert "The btb command line" not in text


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_help_and_text_is_plain(name):
    _, subs = _subparsers()
    p = subs[name]
    missing = [a.option_strings for a in p._actions if a.option_strings and not a.help]
    assert not missing, f"btb {name}: options without help: {missing}"
    text = p.format_help()
    for markup in ("``", ":mod:", ":func:", ":class:", ":data:"):
        assert markup not in text, f"btb {name} --help shows {markup!r}"


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "head.jsonl"
    path.write_text("\n".join(CONV.read_text().splitlines()[:200]) + "\n")
    return path


def test_trace_mode_several_policies(head, capsys):
    assert main(["replay", "--trace", str(head), "--policy", "cache_aware", "btb", "llm_d",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["cache_aware", "btb", "llm_d"]
    single = []
    for policy in ("cache_aware", "llm_d"):
        assert main(["replay", "--trace", str(head), "--policy", policy, "--json"]) == 0
        single.append(json.loads(capsys.readouterr().out)["ttft_mean_s"])
    assert [rows[0]["ttft_mean_s"], rows[2]["ttft_mean_s"]] == single  # each on a fresh cluster
    assert main(["replay", "--trace", str(head), "--policy", "cache_aware", "btb"]) == 0
    table = capsys.readouterr().out
    assert max(len(line) for line in table.splitlines()) <= 120


def test_trace_mode_router_param_goes_to_its_policy(head, capsys):
    assert main(["replay", "--trace", str(head), "--policy", "cache_aware", "btb",
                 "--router-param", "x_repeats=3", "--json"]) == 0
    assert main(["replay", "--trace", str(head), "--policy", "cache_aware", "least_load",
                 "--router-param", "x_repeats=3"]) == 2
    assert "x_repeats=3" in capsys.readouterr().err


def test_example_grid_ships_and_readme_uses_it():
    from btb_core.sweep import Grid

    path = REPO_ROOT / "examples" / "sweep_grid.yaml"
    grid = Grid.from_file(path)
    assert grid.dataset.endswith("build/bursted-quick") and grid.split == "train"
    # paths relative to the grid file are normalised: no "examples/../build" in what is printed
    assert ".." not in Path(grid.dataset).parts and ".." not in Path(grid.out).parts
    assert Path(grid.out) == REPO_ROOT / "build" / "sweeps" / "example"
    assert "btb sweep --grid examples/sweep_grid.yaml" in (REPO_ROOT / "README.md").read_text()


def test_suite_help_counts_the_shapes_there_are():
    from btb_core.suite import SHAPES

    _, subs = _subparsers()
    text = " ".join(subs["suite"].format_help().split())
    assert f"the whole suite, {len(SHAPES)} shapes" in text


@pytest.mark.parametrize("argv", [["audit", "--trace", "x.jsonl"], ["cost", "--nope", "1"]])
def test_unknown_option_shows_the_commands_usage(argv, capsys):
    # argparse reports a subcommand's unknown option with the top-level usage ("btb COMMAND ...");
    # the command's own usage says which options exist
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith(f"usage: btb {argv[0]} ")
    assert f"btb {argv[0]}: error: unrecognized arguments: {argv[1]}" in err
