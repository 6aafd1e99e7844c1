"""Dataset windows streamed from parquet (btb_core.trace.stream) equal the whole-split loader's, and
the experiment's tables do not depend on the worker count (issue 14, points 4 and 5)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from btb_core import synth
from btb_core.errors import TraceError
from btb_core.experiment import run_experiment, window_kind
from btb_core.trace import load_bursted
from btb_core.trace.stream import SplitWindows


def _legacy_windows(path, split):
    out = []
    for w in load_bursted(path, split=split).groups("trace_id"):
        first = float(w.table["arrival_s"].iloc[0])
        if first != 0.0:
            w = w.window(first, None, rebase=True)
        out.append(w)
    return out


def _assert_same(src: SplitWindows, legacy) -> None:
    assert len(src) == len(legacy)
    for k, old in enumerate(legacy):
        new = src.window(k)
        assert new.name == old.name
        assert new.block_tokens == old.block_tokens and new.group_column == old.group_column
        np.testing.assert_array_equal(new.hash_flat, old.hash_flat)
        np.testing.assert_array_equal(new.hash_offsets, old.hash_offsets)
        assert new.hash_flat.dtype == np.int32
        a, b = new.table.drop(columns="hash_ids"), old.table.drop(columns="hash_ids")
        pd.testing.assert_frame_equal(a, b)
        assert all(np.array_equal(x, y) for x, y in zip(new.table["hash_ids"], old.table["hash_ids"]))
        assert src.ids[k] == str(old.table["trace_id"].iloc[0])
        assert src.kinds[k] == window_kind(old)
        assert src.rows[k] == len(old)


@pytest.fixture(scope="module")
def quick_dataset(tmp_path_factory):
    """The ``quick`` Bursted preset (2 + 2 windows, int64 ids as `btb synth` writes them)."""
    d = tmp_path_factory.mktemp("quick") / "bursted"
    synth.write(synth.build(None, "quick", seed=0), d)
    return d


def test_streamed_windows_equal_whole_split_loader(quick_dataset):
    for split in ("test", "train"):
        src = SplitWindows(quick_dataset, split)
        assert src.streamed
        _assert_same(src, _legacy_windows(quick_dataset, split))


def _write(d, rows, row_group_size=None):
    d.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    df.insert(0, "request_id", np.arange(len(df)))
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), d / "test.parquet",
                   row_group_size=row_group_size)
    (d / "manifest.json").write_text(json.dumps({"block_tokens": 4}))
    return d


def _row(t, trace_id, ids, kind="normal"):
    return {"arrival_s": t, "input_length": 4 * len(ids), "output_length": 2, "hash_ids": ids,
            "trace_id": trace_id, "metadata": json.dumps({"window_kind": kind})}


def test_windows_across_row_groups_and_shared_ids(tmp_path):
    """Windows cut across small row groups; ids shared between windows keep the split's numbering
    (first appearance over the whole split), string ids too."""
    rows = []
    for w in range(3):
        for r in range(5):
            ids = [100, 200 + w, 300 + 10 * w + r] if r % 2 else [100, 999, 7 * w + r]
            rows.append(_row(1.0 + 0.5 * r, f"w{w}", ids, "synthetic" if w == 1 else "normal"))
    for ids_as in (int, str):
        rs = [{**r, "hash_ids": [ids_as(x) for x in r["hash_ids"]]} for r in rows]
        d = _write(tmp_path / ids_as.__name__, rs, row_group_size=4)
        src = SplitWindows(d, "test")
        assert src.streamed and src.kinds == ["normal", "synthetic", "normal"]
        _assert_same(src, _legacy_windows(d, "test"))


def test_unchained_ids_fall_back_to_whole_split_loader(tmp_path):
    """Raw id 5 follows two different prefixes: re-chaining needs the whole split; same result."""
    rows = [_row(0.0, "w0", [1, 5]), _row(0.5, "w0", [2, 5]), _row(0.0, "w1", [1, 5])]
    d = _write(tmp_path / "d", rows)
    src = SplitWindows(d, "test")
    assert not src.streamed
    _assert_same(src, _legacy_windows(d, "test"))


def test_bad_row_raises_the_whole_split_loaders_error(tmp_path):
    rows = [_row(0.0, "w0", [1, 2]), _row(0.5, "w1", [3, 4])]
    rows[1]["input_length"] = 100         # needs 25 blocks, has 2
    d = _write(tmp_path / "d", rows)
    with pytest.raises(TraceError) as new:
        SplitWindows(d, "test")
    with pytest.raises(TraceError) as old:
        load_bursted(d, split="test")
    assert str(new.value) == str(old.value)
    assert "row 1" in str(new.value)


def test_experiment_tables_identical_for_1_and_2_workers(quick_dataset):
    kw = dict(policies=("cache_aware", "btb", "round_robin"), setups=("70b_h100x4", "qwen3_8b_h100x4"),
              schedulers=("prefill_first",), progress=False, continuous=True)
    one = run_experiment(quick_dataset, "test", workers=1, **kw)
    two = run_experiment(quick_dataset, "test", workers=2, **kw)
    pd.testing.assert_frame_equal(one.results, two.results)
    pd.testing.assert_frame_equal(one.windows, two.windows)
    pd.testing.assert_frame_equal(one.requests, two.requests)
    pd.testing.assert_frame_equal(one.info.pop("continuous"), two.info.pop("continuous"))
    assert one.info == two.info
    # tables in setup x scheduler x policy x window order, whatever order cells finished in
    order = one.windows[["setup", "policy", "window"]].apply(tuple, axis=1).tolist()
    assert order == [(s, p, w) for s in kw["setups"] for p in kw["policies"]
                     for w in one.windows["window"].unique()]


def test_replay_cli_workers_flag(quick_dataset, tmp_path, capsys):
    from btb_core.cli import main

    assert main(["replay", "--dataset", str(quick_dataset), "--policy", "cache_aware", "--workers", "0"]) == 2
    assert "--workers 0: must be >= 1" in capsys.readouterr().err
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    assert main(["replay", "--trace", str(trace), "--workers", "2"]) == 2
    assert "--workers is for --dataset mode" in capsys.readouterr().err
    # an existing --out is refused before the replay runs, not after it
    out = tmp_path / "req.parquet"
    out.write_bytes(b"keep")
    assert main(["replay", "--dataset", str(quick_dataset), "--policy", "cache_aware", "--out", str(out),
                 "--workers", "1", "--json"]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err and out.read_bytes() == b"keep"
    assert main(["replay", "--dataset", str(quick_dataset), "--policy", "cache_aware", "--workers", "2",
                 "--json"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert main(["replay", "--dataset", str(quick_dataset), "--policy", "cache_aware", "--workers", "1",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == two


def test_dataset_rebuilt_in_place_is_read_again(tmp_path):
    # a notebook kernel keeps its process; `btb synth --overwrite` into the same folder must not
    # leave it replaying the old windows (the per-process cache is keyed on the files' state)
    from btb_core.experiment import split_windows

    d = tmp_path / "ds"
    synth.write(synth.build(None, "quick", seed=10), d)
    old = split_windows(d, "train")
    old_first = old.window(0).table[["arrival_s", "input_length"]].to_numpy().copy()
    assert split_windows(d, "train") is old            # unchanged files: the cached scan
    synth.write(synth.build(None, "quick", seed=11), d, overwrite=True)
    new = split_windows(d, "train")
    assert new is not old
    assert not np.array_equal(new.window(0).table[["arrival_s", "input_length"]].to_numpy(),
                              old_first)
