"""Tests for btb_core.trace: loaders, validation errors, interning/chaining, windows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from btb_core.errors import TraceError
from btb_core.trace import (CORE_COLUMNS, TraceWarning, detect_format, load_art,
                            load_azure, load_bursted, load_mooncake, load_trace, make_trace,
                            shipped_traces)

FIXTURES = Path(__file__).parent / "fixtures"
SHIPPED = shipped_traces()


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def mc(ts=0, inp=1000, out=10, hids=(0, 1)):
    return {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": list(hids)}


# ---- shipped traces -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def conversation():
    return load_trace(SHIPPED["mooncake_conversation"])


def test_mooncake_conversation_loads(conversation):
    tr = conversation
    assert len(tr) == 12031 and tr.block_tokens == 512 and tr.has_prefix_info
    assert list(tr.table.columns) == list(CORE_COLUMNS)
    assert [str(d) for d in tr.table.dtypes] == ["int64", "float64", "int64", "int64", "object"]
    assert tr.arrival_s[0] == 0.0 and tr.arrival_s[-1] == pytest.approx(3536.999)
    assert (np.diff(tr.arrival_s) >= 0).all()
    assert len(tr.hash_flat) == 288500 and tr.hash_flat.dtype == np.int32
    # Mooncake ids are already chained and numbered in first-appearance order: kept as is
    with open(SHIPPED["mooncake_conversation"]) as fh:
        first = [json.loads(next(fh)) for _ in range(50)]
    for i, rec in enumerate(first):
        np.testing.assert_array_equal(tr.row_hash_ids(i), rec["hash_ids"])
        assert tr.table["hash_ids"][i].base is not None  # a view, not a copy
    assert tr.memory_bytes() / len(tr) < 400


def test_mooncake_synthetic_and_azure_load():
    syn = load_trace(SHIPPED["mooncake_synthetic"])
    assert (len(syn), len(syn.hash_flat), syn.block_tokens) == (3993, 121877, 512)
    code = load_trace(SHIPPED["azure_code_2023"])
    conv = load_trace(SHIPPED["azure_conv_2023"])
    assert (len(code), len(conv)) == (8819, 19366)
    assert not code.has_prefix_info and len(code.hash_flat) == 0
    assert code.arrival_s[0] == 0.0
    # 2023-11-16 18:17:03.9799600 -> 18:17:04.0319600: 52 ms, 100 ns resolution kept
    assert code.arrival_s[1] == pytest.approx(0.052, abs=1e-9)
    assert code.duration_s == pytest.approx(3435.948056)
    with pytest.raises(TraceError, match=r"AzureLLMInferenceTrace_code: replay needs prefix hash ids; "
                                         r"this trace \(Azure CSV\) has none"):
        code.require_prefix_info("replay")


# ---- ART fixtures -------------------------------------------------------------------------

def test_art_jsonl_and_parquet_agree():
    a = load_trace(FIXTURES / "art_small.jsonl")
    b = load_trace(FIXTURES / "art_small.parquet")
    for tr in (a, b):
        assert len(tr) == 10 and tr.block_tokens == 256
        assert "messages" not in tr.table.columns
        assert tr.table["source_request_id"][0] == "decoded_llm_responses_fixture_000000"
        assert "token_hash" in tr.table.columns
    np.testing.assert_array_equal(a.hash_flat, b.hash_flat)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    # hex-string ids interned to 0.. in first-appearance order; the burst shares ids 0-3
    np.testing.assert_array_equal(a.row_hash_ids(0), [0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(a.row_hash_ids(1), [0, 1, 2, 3, 6, 7])
    assert a.arrival_s.tolist()[:3] == [1.0, 2.0, 3.0]
    assert a.input_length[0] == 1290


def test_art_directory_and_missing_hub_id(tmp_path):
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "a.parquet").write_bytes((FIXTURES / "art_small.parquet").read_bytes())
    assert len(load_art(tmp_path / "part")) == 10
    assert detect_format("someone/some-dataset") == "art"


# ---- validation: one test per error ------------------------------------------------------

def test_malformed_json_line(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [mc(), '{"timestamp": 5, "input_length": ', mc()])
    with pytest.raises(TraceError, match=r"t\.jsonl, line 2: malformed JSON"):
        load_mooncake(p)


def test_missing_field(tmp_path):
    bad = mc()
    del bad["output_length"]
    p = write_jsonl(tmp_path / "t.jsonl", [mc(), mc(), bad])
    with pytest.raises(TraceError, match=r"line 3: missing field 'output_length'"):
        load_mooncake(p)


@pytest.mark.parametrize("value, shown", [(-5, "-5"), ("NaN", "nan"), (12.5, "12.5"),
                                           ('"12"', "'12'")])
def test_bad_length(tmp_path, value, shown):
    line = '{"timestamp": 0, "input_length": %s, "output_length": 1, "hash_ids": [0]}' % value
    p = write_jsonl(tmp_path / "t.jsonl", [mc(), line])
    with pytest.raises(TraceError, match=rf"line 2: field 'input_length' = {shown}: must be a "
                                         r"non-negative integer"):
        load_mooncake(p)


def test_integral_float_length_is_accepted(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [mc(inp=1000.0)])
    assert load_mooncake(p).input_length[0] == 1000


@pytest.mark.parametrize("value, shown", [("NaN", "nan"), (-1, r"-1\.0")])
def test_bad_timestamp(tmp_path, value, shown):
    line = '{"timestamp": %s, "input_length": 10, "output_length": 1, "hash_ids": [0]}' % value
    p = write_jsonl(tmp_path / "t.jsonl", [mc(), line])
    with pytest.raises(TraceError, match=rf"line 2: field 'timestamp' = {shown}: must be finite"):
        load_mooncake(p)


def test_hash_ids_inconsistent_with_block_count(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [mc(), mc(inp=1025, hids=[0, 1])])
    with pytest.raises(TraceError, match=r"line 2: field 'hash_ids' has 2 ids but input_length = "
                                         r"1025 needs ceil\(1025 / 512\) = 3 blocks"):
        load_mooncake(p)


def test_a_trace_of_another_block_size_is_named_in_the_error(tmp_path):
    """Every row fits 32-token blocks: the error says so and how to load it; no hint when no
    block size fits every row (the row above)."""
    p = write_jsonl(tmp_path / "t.jsonl", [mc(inp=100, hids=[0, 1, 2, 3]), mc(inp=64, hids=[0, 1])])
    with pytest.raises(TraceError, match=r"line 1: .* needs ceil\(100 / 512\) = 1 blocks \(every row "
                                         r"fits 32-token blocks: give block_tokens=32, `btb replay "
                                         r"--block-tokens 32`\)"):
        load_mooncake(p)
    assert list(load_trace(p, block_tokens=32).input_length) == [100, 64]
    with pytest.raises(TraceError) as info:
        load_mooncake(write_jsonl(tmp_path / "u.jsonl", [mc(), mc(inp=1025, hids=[0, 1])]))
    assert "every row fits" not in str(info.value)


def test_hash_ids_not_a_list(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [mc(), {**mc(), "hash_ids": 7}])
    with pytest.raises(TraceError, match=r"line 2: field 'hash_ids' = 7: must be a list"):
        load_mooncake(p)


def test_empty_file(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("\n\n")
    with pytest.raises(TraceError, match=r"t\.jsonl: empty file"):
        load_mooncake(p)
    (tmp_path / "a.csv").write_text("")
    with pytest.raises(TraceError, match=r"a\.csv: empty file"):
        load_azure(tmp_path / "a.csv")
    (tmp_path / "b.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(TraceError, match=r"b\.csv: empty file \(header only\)"):
        load_azure(tmp_path / "b.csv")


def test_unsorted_arrivals_sorted_with_warning_or_strict_error(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [mc(0, hids=[0, 1]), mc(5000, hids=[0, 2]),
                                           mc(2000, hids=[3, 4])])
    with pytest.warns(TraceWarning, match=r"line 3: field 'timestamp' = 2000(\.0)? is earlier than the "
                                          r"previous row's 5000(\.0)?"):
        tr = load_mooncake(p)
    assert tr.arrival_s.tolist() == [0.0, 2.0, 5.0]
    assert tr.table["request_id"].tolist() == [0, 2, 1]          # file order kept as the id
    # ids interned after the sort, in first-appearance order of the sorted rows
    assert [tr.row_hash_ids(i).tolist() for i in range(3)] == [[0, 1], [2, 3], [0, 4]]
    with pytest.raises(TraceError, match=r"line 3: .* arrivals are not sorted"):
        load_mooncake(p, strict=True)


def test_azure_validation(tmp_path):
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    (tmp_path / "a.csv").write_text(head + "2023-11-16 18:17:03.9799600,10,2\nyesterday,5,1\n")
    with pytest.raises(TraceError, match=r"a\.csv, line 3: field 'TIMESTAMP' = 'yesterday'"):
        load_azure(tmp_path / "a.csv")
    (tmp_path / "b.csv").write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,10\n")
    with pytest.raises(TraceError, match=r"missing field 'GeneratedTokens'"):
        load_azure(tmp_path / "b.csv")
    (tmp_path / "c.csv").write_text(head + "2023-11-16 18:17:03,10,2\n2023-11-16 18:17:04,-3,1\n")
    with pytest.raises(TraceError, match=r"c\.csv, line 3: field 'ContextTokens' = -3: must"):
        load_azure(tmp_path / "c.csv")
    (tmp_path / "d.csv").write_text(head + "2023-11-16 18:17:03,ten,2\n")
    with pytest.raises(TraceError, match=r"d\.csv, line 2: field 'ContextTokens' = 'ten': must"):
        load_azure(tmp_path / "d.csv")


def test_make_trace_errors_name_row():
    with pytest.raises(TraceError, match=r"mine, row 1: field 'output_length' = -1"):
        make_trace([0, 1], [4, 4], [1, -1], [[1], [2]], block_tokens=4, name="mine")
    with pytest.raises(TraceError, match=r"empty trace"):
        make_trace([], [], [], [], block_tokens=4)
    with pytest.raises(TraceError, match=r"block_tokens = 0"):
        make_trace([0], [4], [1], [[1]], block_tokens=0)
    with pytest.raises(TraceError, match=r"row 0: field 'hash_ids' has element 1.5"):
        make_trace([0], [4], [1], [[1.5]], block_tokens=4)


# ---- interning and chaining ------------------------------------------------------------------

def test_interning_first_appearance_and_rechaining():
    # already chained ("b" always follows "a"): kept, numbered by first appearance
    tr = make_trace([0, 1], [8, 8], [1, 1], [["a", "b"], ["a", "c"]], block_tokens=4)
    assert [tr.row_hash_ids(i).tolist() for i in range(2)] == [[0, 1], [0, 2]]
    # not chained: id 7 follows both 1 and 3, so it is re-chained into two different ids
    tr = make_trace([0, 1, 2], [8, 8, 8], [1, 1, 1], [[1, 7], [3, 7], [1, 7]], block_tokens=4)
    assert [tr.row_hash_ids(i).tolist() for i in range(3)] == [[0, 1], [2, 3], [0, 1]]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=12))
def test_chained_ids_mean_equal_prefixes(raw):
    tr = make_trace(list(range(len(raw))), [4 * len(r) for r in raw], [1] * len(raw), raw,
                    block_tokens=4)
    ids = [tr.row_hash_ids(i).tolist() for i in range(len(raw))]
    for i, a in enumerate(raw):
        for j, b in enumerate(raw):
            for k in range(min(len(a), len(b))):
                assert (ids[i][k] == ids[j][k]) == (a[:k + 1] == b[:k + 1])
    # compact: ids are exactly 0..m-1, first appearance in row-major order
    flat = [x for r in ids for x in r]
    seen = list(dict.fromkeys(flat))
    assert seen == list(range(len(seen)))


# ---- windows -------------------------------------------------------------------------------

def _toy(n=10):
    return make_trace(np.arange(n) * 1.5, [8] * n, [1] * n, [[i, i + 100] for i in range(n)],
                      block_tokens=4, name="toy")


def test_window_by_time_half_open_and_rebase():
    tr = _toy()                                                  # arrivals 0, 1.5, ..., 13.5
    w = tr.window(3.0, 7.5)
    assert w.arrival_s.tolist() == [3.0, 4.5, 6.0]
    assert w.window(None, None).arrival_s.tolist() == [3.0, 4.5, 6.0]
    assert tr.window(3.0, 7.5, rebase=True).arrival_s.tolist() == [0.0, 1.5, 3.0]
    assert tr.window(2.0, None, rebase=True).arrival_s[0] == 1.0
    np.testing.assert_array_equal(w.row_hash_ids(0), tr.row_hash_ids(2))
    assert w.hash_offsets.tolist() == [0, 2, 4, 6]
    with pytest.raises(TraceError, match="end_s = 1 is before start_s = 2"):
        tr.window(2, 1)


def test_rows_and_windows_partition_the_trace():
    tr = _toy()
    assert [len(w) for w in tr.windows(rows=4)] == [4, 4, 2]
    assert tr.rows(8, 20).arrival_s.tolist() == [12.0, 13.5]
    parts = tr.windows(span_s=5.0)
    assert [p.arrival_s.tolist() for p in parts] == [[0.0, 1.5, 3.0, 4.5], [6.0, 7.5, 9.0],
                                                    [10.5, 12.0, 13.5]]
    assert tr.windows(span_s=5.0, rebase=True)[1].arrival_s.tolist() == [1.0, 2.5, 4.0]
    assert sum(len(p) for p in tr.windows(span_s=0.7)) == len(tr)
    with pytest.raises(TraceError, match="exactly one of"):
        tr.windows()
    with pytest.raises(TraceError, match="exactly one of"):
        tr.windows(span_s=1, rows=2)


# ---- Bursted ---------------------------------------------------------------------------------

def _write_bursted(root: Path, manifest: bool = True) -> Path:
    root.mkdir()
    rows = []
    for split, windows in (("train", ["w0"]), ("test", ["w1", "w2"])):
        part = []
        for w in windows:
            for i in range(3):
                part.append({"request_id": len(rows) + len(part), "arrival_s": float(i),
                             "input_length": 8, "output_length": 1,
                             "hash_ids": [1, 2 + i] if w != "w2" else [9, 10],
                             "session_id": i, "group_id": 0, "source": "synthetic", "trace_id": w,
                             "split": split, "metadata": json.dumps({"job": "labeling"})})
        pq.write_table(pa.Table.from_pylist(part), root / f"{split}.parquet")
        rows += part
    if manifest:
        (root / "manifest.json").write_text(json.dumps({"block_tokens": 4, "seed": 0}))
    return root


def test_load_bursted_directory_split_and_groups(tmp_path):
    root = _write_bursted(tmp_path / "ds")
    assert detect_format(root) == "bursted"
    test = load_trace(root, split="test")
    assert len(test) == 6 and test.block_tokens == 4 and test.group_column == "trace_id"
    assert list(test.table.columns[5:]) == ["session_id", "group_id", "source", "trace_id", "split",
                                            "metadata"]
    assert json.loads(test.table["metadata"][0]) == {"job": "labeling"}
    w1, w2 = test.groups()
    assert (w1.name, len(w1), w2.name) == ("ds/test/w1", 3, "ds/test/w2")
    with pytest.raises(TraceError, match="split it with .groups"):
        test.window(0, 1)
    train = load_bursted(root / "train.parquet")                  # manifest next to the file
    assert len(train) == 3 and train.group_column is None
    assert len(load_bursted(root)) == 9


def test_load_bursted_without_block_size(tmp_path):
    root = _write_bursted(tmp_path / "ds", manifest=False)
    with pytest.raises(TraceError, match="no 'block_tokens' column and no manifest.json"):
        load_bursted(root / "train.parquet")
    assert load_bursted(root / "train.parquet", block_tokens=4).block_tokens == 4


def test_detect_format_errors(tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(TraceError, match=r"unknown trace file type '.txt'"):
        detect_format(tmp_path / "x.txt")
    p = write_jsonl(tmp_path / "y.jsonl", [{"when": 1}])
    with pytest.raises(TraceError, match=r"y\.jsonl, line 1: cannot tell the trace format"):
        load_trace(p)
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "nope.jsonl")


def test_groups_need_contiguous_rows():
    tr = make_trace([0.0, 1.0, 2.0], [4] * 3, [1] * 3, [[1], [2], [3]], block_tokens=4,
                    trace_id=["a", "b", "a"], name="g")
    with pytest.raises(TraceError, match=r"g: rows of 'trace_id' are not contiguous \(row 2 "
                                         r"returns to 'a'"):
        tr.groups("trace_id")


def test_binary_file_is_a_one_line_error(tmp_path):
    from btb_core.cli import main

    path = tmp_path / "binary.jsonl"
    path.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(TraceError, match=r"binary.jsonl, line 1: not UTF-8 text \(byte 0xff at column 1\)"):
        load_trace(path)
    assert main(["audit", str(path)]) == 2


def test_unsorted_art_rows_name_the_files_own_time_field(tmp_path):
    """ART's arrival field is ``timestamp_ms``: an unsorted row is reported in it, in ms."""
    import pandas as pd

    df = pd.read_parquet(FIXTURES / "art_small.parquet")
    df.loc[2, "timestamp_ms"] = 500
    df.to_parquet(tmp_path / "u.parquet")
    with pytest.warns(TraceWarning, match=r"field 'timestamp_ms' = 500(\.0)? is earlier than the "
                                          r"previous row's 2000(\.0)?"):
        load_art(tmp_path / "u.parquet")
