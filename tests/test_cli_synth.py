"""`btb synth`: printed counts, written files, and one-line errors (exit 2)."""

import json

import pytest

from btb_core.cli import main
from btb_core.trace import load_bursted


def run(capsys, *argv):
    code = main(["synth", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def count_rows(out):
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] in ("train", "test", "total"):
            rows[parts[0]] = [int(p.replace(",", "")) for p in parts[1:]]
    return rows


def test_default_preset_prints_counts(tmp_path, capsys, monkeypatch, default_dataset):
    # the CLI's generate() call for the default preset returns the session's default build
    # (tests/conftest.py) instead of generating it a second time
    import btb_core.commands.synth as cmd

    real = cmd.generate

    def generate(base, config, rng, seed=0, preset_name=None, base_info=None):
        if config == cmd.PRESETS["default"] and seed == 0 and preset_name == "default":
            return default_dataset
        return real(base, config, rng, seed=seed, preset_name=preset_name, base_info=base_info)

    monkeypatch.setattr(cmd, "generate", generate)
    code, out, err = run(capsys, "--out", str(tmp_path / "bd"))
    assert code == 0, err
    assert count_rows(out) == {"train": [10, 5, 5, 23_600], "test": [30, 15, 15, 70_800],
                               "total": [40, 20, 20, 94_400]}
    assert "synthetic window = 8 jobs x 500 + 120 decoys x 1 = 4,120 rows" in out
    assert "block_tokens = 512" in out
    man = json.loads((tmp_path / "bd" / "manifest.json").read_text())
    assert man["preset"] == "default" and man["base"]["format"] == "mooncake"


def test_quick_preset_with_overrides(tmp_path, capsys):
    out_dir = tmp_path / "q"
    code, out, err = run(capsys, "--out", str(out_dir), "--preset", "quick", "--seed", "5",
                         "--decoy-requests", "3", "--background-rows", "10")
    assert code == 0, err
    assert count_rows(out)["train"] == [2, 1, 1, 200 + 3 * 50 + 10 * 3 + 10]
    assert "overrides: decoy_requests=3, background_rows=10" in out
    tr = load_bursted(out_dir, split="train")
    assert len(tr) == 390
    card = (out_dir / "README.md").read_text()
    assert "btb synth --preset quick --seed 5 --decoy-requests 3 --background-rows 10 --out DIR" in card
    assert "license: apache-2.0" in card


@pytest.mark.parametrize("argv,message", [
    (["--preset", "reference"], "base trace too short: 12,031 rows, but 20 normal windows x 1,000 "
                                "rows need 20,000. What fits: normal_rows <= 601 (--normal-rows 601)"),
    (["--preset", "quick", "--jobs", "-2"], "--jobs = -2: must be an integer >= 0"),
    (["--preset", "quick", "--prefix-tokens", "1000"], "--prefix-tokens = 1000: must be a multiple"),
    (["--preset", "quick", "--span-s", "0"], "--span-s = 0.0: must be a finite number of seconds > 0"),
    (["--preset", "quick", "--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--preset", "quick", "--base", "no/such/file.jsonl"], "no/such/file.jsonl: no such file"),
    (["--preset", "quick", "--push-to-hub", "justaname"], "must be a Hub dataset id 'owner/name'"),
])
def test_errors_are_one_line_exit_2(tmp_path, capsys, argv, message):
    code, out, err = run(capsys, "--out", str(tmp_path / "bd"), *argv)
    assert code == 2
    assert err.startswith("btb synth: error: ") and err.count("\n") == 1
    assert message in err
    assert not (tmp_path / "bd").exists()


def test_refuses_non_empty_out_without_overwrite(tmp_path, capsys):
    out_dir = tmp_path / "bd"
    assert run(capsys, "--out", str(out_dir), "--preset", "quick")[0] == 0
    code, _, err = run(capsys, "--out", str(out_dir), "--preset", "quick", "--seed", "1")
    assert code == 2 and "directory exists and is not empty; pass --overwrite" in err
    assert json.loads((out_dir / "manifest.json").read_text())["seed"] == 0
    code, _, err = run(capsys, "--out", str(out_dir), "--preset", "quick", "--seed", "1",
                       "--overwrite")
    assert code == 0 and json.loads((out_dir / "manifest.json").read_text())["seed"] == 1


def test_push_to_hub_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = run(capsys, "--out", str(tmp_path / "bd"), "--preset", "quick",
                         "--push-to-hub", "me/bursted")
    assert code == 2
    assert err.strip() == (f"btb synth: error: --push-to-hub me/bursted: cannot push while offline "
                           f"(HF_HUB_OFFLINE is set); the dataset is complete locally in "
                           f"{tmp_path / 'bd'}; push it later with --push-to-hub")
    assert "Traceback" not in err and count_rows(out)["test"][-1] == 360


def test_counts_in_the_singular_and_no_none_default_in_help(tmp_path, capsys):
    code, out, err = run(capsys, "--out", str(tmp_path / "one"), "--preset", "quick",
                         "--train-windows", "1", "--test-windows", "1", "--jobs", "1",
                         "--job-size", "1", "--decoys", "0", "--normal-rows", "1")
    assert code == 0, err
    assert "normal window = 1 row; synthetic window = 1 job x 1 + 0 decoys x 1 = 1 row" in out
    from btb_core.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    text = " ".join(sub.choices["synth"].format_help().split())
    assert "(default preset: None)" not in text and "(default preset: 8)" in text
