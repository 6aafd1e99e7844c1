"""Tests for btb_core.audit: closed-form cases, a brute-force reference, pinned numbers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from btb_core.audit import (burstiness, extension_arrival_s, fanout, fanout_table,
                            trace_summary)
from btb_core.errors import ConfigError, TraceError
from btb_core.trace import load_trace, make_trace, shipped_traces

FIXTURES = Path(__file__).parent / "fixtures"


# ---- brute-force reference ---------------------------------------------------------------

def brute_fanout(arrival_s, prompts, block_tokens, depth_tokens, window_s, exclude):
    """O(n^3) reference on raw block-label lists (prompts[i] = list of block labels, all full
    except that input_length is implied by len * block_tokens - partial[i])."""
    n = len(arrival_s)
    k = -(-depth_tokens // block_tokens)
    full = [p[1] for p in prompts]
    labels = [p[0] for p in prompts]
    ext = []
    for a in range(n):
        e = math.inf
        fa = full[a]
        if fa >= 1:
            for b in range(a + 1, n):
                if full[b] > fa and labels[b][:fa] == labels[a][:fa]:
                    e = arrival_s[b]
                    break
        ext.append(e)
    eligible = [i for i in range(n) if full[i] >= k]
    starts = set()
    for i in eligible:
        starts.add(arrival_s[i])
        if ext[i] != math.inf:
            starts.add(ext[i] - window_s)
    best = 0
    for s in starts:
        groups = {}
        for i in eligible:
            if s <= arrival_s[i] < s + window_s and not (exclude and ext[i] < s + window_s):
                key = tuple(labels[i][:k])
                groups[key] = groups.get(key, 0) + 1
        if groups:
            best = max(best, max(groups.values()))
    return best


@st.composite
def small_traces(draw):
    n = draw(st.integers(1, 14))
    rows = []
    for _ in range(n):
        t = draw(st.integers(0, 40)) / 2.0  # coarse times make ties likely
        nb = draw(st.integers(0, 6))
        # labels from a tiny alphabet so prefixes collide often
        labels = [draw(st.sampled_from("ab")) for _ in range(nb)]
        partial = draw(st.integers(0, 3)) if nb else 0  # tokens missing from the last block
        rows.append((t, labels, partial))
    rows.sort(key=lambda r: r[0])
    return rows


BT = 4  # block tokens for the property tests


def _build(rows):
    arrival = [r[0] for r in rows]
    labels = [r[1] for r in rows]
    inp = [max(0, len(r[1]) * BT - r[2]) for r in rows]
    hids = [["/".join(lab[:i + 1]) for i in range(len(lab))] for lab in labels]
    tr = make_trace(arrival, inp, [1] * len(rows), hids, block_tokens=BT)
    prompts = [(lab, x // BT) for lab, x in zip(labels, inp)]
    return tr, arrival, prompts


@settings(max_examples=150, deadline=None)
@given(small_traces(), st.sampled_from([1, 4, 5, 8, 12]), st.sampled_from([0.5, 1.0, 3.0, 10.0]),
       st.booleans())
def test_fanout_matches_brute_force(rows, depth_tokens, window_s, exclude):
    tr, arrival, prompts = _build(rows)
    got = fanout(tr, depth_tokens, window_s, exclude_sessions=exclude).max_fanout
    assert got == brute_fanout(arrival, prompts, BT, depth_tokens, window_s, exclude)


@settings(max_examples=60, deadline=None)
@given(small_traces(), st.sampled_from([1, 4, 8]), st.sampled_from([1.0, 10.0]))
def test_exclusion_never_increases_fanout(rows, depth_tokens, window_s):
    tr, _, _ = _build(rows)
    a = fanout(tr, depth_tokens, window_s).max_fanout
    b = fanout(tr, depth_tokens, window_s, exclude_sessions=True).max_fanout
    assert 0 <= b <= a <= len(tr)


# ---- closed-form cases -------------------------------------------------------------------

def test_burst_of_identical_prefixes_counts_every_request():
    # 10 requests, 1 s apart, sharing 3 full blocks, each with a private 4th block.
    hids = [["p1", "p2", "p3", f"own{i}"] for i in range(10)]
    tr = make_trace(np.arange(10.0), [16] * 10, [1] * 10, hids, block_tokens=4)
    assert fanout(tr, 12, 60).max_fanout == 10
    assert fanout(tr, 12, 5).max_fanout == 5        # [s, s+5) holds 5 of the 1-s-spaced arrivals
    assert fanout(tr, 12, 5.0001).max_fanout == 6
    assert fanout(tr, 16, 60).max_fanout == 1       # 4th block is private
    assert fanout(tr, 16, 60).keys_at_max == 10
    assert fanout(tr, 17, 60).max_fanout == 0       # nobody has 5 full blocks
    assert math.isnan(fanout(tr, 17, 60).window_start_s)
    # identical full blocks are not "earlier turns": exclusion keeps the burst
    assert fanout(tr, 12, 60, exclude_sessions=True).max_fanout == 10


def test_partial_last_block_is_not_a_full_block():
    # 2 blocks of 4 tokens; input 7 tokens -> 1 full block only.
    tr = make_trace([0.0, 1.0], [7, 8], [1, 1], [["a", "b"], ["a", "b"]], block_tokens=4)
    assert fanout(tr, 8, 10).max_fanout == 1        # only row 1 has 2 full blocks
    assert fanout(tr, 4, 10).max_fanout == 2


def test_growing_conversation_is_excluded():
    # three turns at 0, 3, 20 s: 2, 4, 6 full blocks, each extending the previous one
    hids = [["c1", "c2"], ["c1", "c2", "c3", "c4"], ["c1", "c2", "c3", "c4", "c5", "c6"]]
    tr = make_trace([0.0, 3.0, 20.0], [8, 16, 24], [1, 1, 1], hids, block_tokens=4)
    np.testing.assert_array_equal(extension_arrival_s(tr), [3.0, 20.0, np.inf])
    assert fanout(tr, 8, 10).max_fanout == 2
    assert fanout(tr, 8, 10, exclude_sessions=True).max_fanout == 1
    assert fanout(tr, 8, 60).max_fanout == 3
    assert fanout(tr, 8, 60, exclude_sessions=True).max_fanout == 1


def test_extension_must_arrive_inside_the_window():
    # turn 1 at 0 s, turn 2 at 9 s: a 5 s window holding turn 1 ends before turn 2 arrives,
    # so turn 1 counts there (with another request sharing the prefix at 1 s).
    hids = [["c1", "c2"], ["c1", "c2", "x"], ["c1", "c2", "c3", "c4"]]
    tr = make_trace([0.0, 1.0, 9.0], [8, 10, 16], [1, 1, 1], hids, block_tokens=4)
    assert fanout(tr, 8, 5, exclude_sessions=True).max_fanout == 2
    # 10 s windows [s, s + 10) with s in (-9, -1] hold rows 0 and 1 but not row 2 (it needs
    # s + 10 > 9), so neither is excluded there -> 2; windows that also hold row 2 count only it.
    assert fanout(tr, 8, 10, exclude_sessions=True).max_fanout == 2
    assert fanout(tr, 8, 10, exclude_sessions=True).window_start_s == -1.0
    prompts = [(h, x // 4) for h, x in zip(hids, [8, 10, 16])]
    assert brute_fanout([0.0, 1.0, 9.0], prompts, 4, 8, 10, True) == 2


def test_bad_grid_values_raise_config_error():
    tr = make_trace([0.0], [8], [1], [["a", "b"]], block_tokens=4)
    with pytest.raises(ConfigError, match="depth_tokens = 0"):
        fanout(tr, 0, 10)
    with pytest.raises(ConfigError, match="window_s = -1"):
        fanout(tr, 4, -1)
    with pytest.raises(ConfigError, match="bin_s = 0"):
        burstiness(tr, [0])


def test_burstiness_closed_form():
    # 100 arrivals evenly 0.1 s apart -> 10 per 1 s bin: peak == mean
    tr = make_trace(np.arange(100) * 0.1, [1] * 100, [1] * 100, None, block_tokens=4)
    b = burstiness(tr, [1.0]).iloc[0]
    assert b["bins"] == 10 and b["mean_rps"] == pytest.approx(10.0)
    assert b["peak_to_mean"] == pytest.approx(1.0) and b["cv"] == pytest.approx(0.0)
    # all 100 at once, then one more at 9.5 s: 10 bins, peak 100 rps, mean 10.1 rps
    tr = make_trace([0.0] * 100 + [9.5], [1] * 101, [1] * 101, None, block_tokens=4)
    b = burstiness(tr, [1.0]).iloc[0]
    assert (b["bins"], b["peak_rps"], b["mean_rps"]) == (10, 100.0, pytest.approx(10.1))
    assert b["zero_bins_frac"] == pytest.approx(0.8)


# ---- fixtures and shipped traces -----------------------------------------------------------

def test_art_fixture_fanout():
    tr = load_trace(FIXTURES / "art_small.jsonl")
    assert fanout(tr, 1024, 10).max_fanout == 4                 # the 4-request burst
    assert fanout(tr, 1024, 10).keys_at_max == 1
    assert fanout(tr, 1024, 2).max_fanout == 2
    assert fanout(tr, 1280, 60).max_fanout == 1                 # burst rows differ at block 5
    conv = tr.rows(4, 7)                                        # the 3-turn conversation
    assert fanout(conv, 512, 60).max_fanout == 3
    assert fanout(conv, 512, 60, exclude_sessions=True).max_fanout == 1
    assert fanout(conv, 512, 10).max_fanout == 2


def test_azure_fanout_says_it_needs_prefix_info():
    tr = load_trace(shipped_traces()["azure_code_2023"])
    with pytest.raises(TraceError, match="deep-prefix fan-out needs prefix hash ids; this trace "
                                         r"\(Azure CSV\) has none"):
        fanout(tr, 1024, 10)
    df = fanout_table(tr, [1024], [10.0], [False])
    assert df["max_fanout"].isna().all() and "needs prefix hash ids" in df["note"].iloc[0]
    b = burstiness(tr).set_index("bin_s")
    assert b.loc[1.0, "requests"] == 8819
    assert b.loc[1.0, "peak_rps"] == 67.0
    assert b.loc[10.0, "peak_rps"] == pytest.approx(32.7)


@pytest.fixture(scope="module")
def conversation():
    return load_trace(shipped_traces()["mooncake_conversation"])


def test_mooncake_conversation_pinned(conversation):
    df = fanout_table(conversation).set_index(["exclude_sessions", "window_s", "depth_tokens"])
    got = {k: int(v) for k, v in df["max_fanout"].items()}
    want = {(False, 10.0, 1024): 2, (False, 10.0, 4096): 2, (False, 10.0, 8192): 2,
            (False, 60.0, 1024): 5, (False, 60.0, 4096): 4, (False, 60.0, 8192): 4,
            (True, 10.0, 1024): 2, (True, 10.0, 4096): 2, (True, 10.0, 8192): 2,
            (True, 60.0, 1024): 5, (True, 60.0, 4096): 4, (True, 60.0, 8192): 4}
    assert got == want
    assert int(df.loc[(False, 10.0, 1024), "eligible_requests"]) == 10677
    assert int(df.loc[(False, 10.0, 1024), "keys_at_max"]) == 22


def test_mooncake_conversation_first_block_is_shared(conversation):
    s = trace_summary(conversation)
    assert s["first_block_shared_frac"] == 1.0          # every request starts with id 0
    assert (s["distinct_arrivals"], s["max_same_arrival"], s["median_gap_s"]) == (1180, 28, 3.0)
    # so at one block (512 tokens) the fan-out is just the arrival count of the busiest window
    t = conversation.arrival_s
    busiest_10s = max(np.searchsorted(t, x + 10, "left") - i for i, x in enumerate(t))
    assert fanout(conversation, 512, 10).max_fanout == busiest_10s


def test_grouped_trace_is_audited_window_by_window():
    # two windows on their own clocks: a 3-request burst in w0, unrelated requests in w1
    hids = [["p", "q", f"a{i}"] for i in range(3)] + [[f"x{i}", "y", "z"] for i in range(3)]
    tr = make_trace([0.0, 1.0, 2.0, 0.0, 1.0, 2.0], [12] * 6, [1] * 6, hids, block_tokens=4,
                    trace_id=["w0"] * 3 + ["w1"] * 3, group_column="trace_id", name="ds")
    df = fanout_table(tr, [8], [10.0], [False])
    assert df[["trace", "max_fanout"]].values.tolist() == [["ds/w0", 3], ["ds/w1", 1]]
    with pytest.raises(TraceError, match="split it with .groups"):
        fanout(tr, 8, 10.0)


def test_notebook_loader_adds_art_when_given():
    from btb_core.audit import load_audit_traces

    names = [t.name for t in load_audit_traces(art_path=str(FIXTURES / "art_small.parquet"))]
    assert names == ["conversation_trace", "synthetic_trace", "art_small",
                     "AzureLLMInferenceTrace_code", "AzureLLMInferenceTrace_conv"]
