"""Compact block ids (issue 14, fleet scale): ids held as runs of consecutive ids (BlockRuns), a
compact Trace that never expands them, the simulator's block index built from runs, and the
simulator's per-request records dropped when a request finishes. Each compact structure is checked
against the plain representation it replaces."""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btb_core.bursted_shaped import bursted_shaped_trace
from btb_core.errors import TraceError
from btb_core.routers import make_router
from btb_core.sim import ClusterConfig, simulate
from btb_core.sim.blocks import BlockIndex
from btb_core.sim.engine import Simulator
from btb_core.sim.replica import Job
from btb_core.trace import BlockRuns, Trace
from btb_core.trace.runs import tuple_of_pieces
from strategies import family_traces

BT = 256


def chained_traces():
    """Small traces whose rows share prefixes in families (chained, interned by make_trace)."""
    return family_traces(BT, max_gap_s=2.0, max_shared_blocks=8, extra_tokens=(0, 3 * BT),
                         max_output=5)


def compact_of(trace: Trace) -> Trace:
    """The same trace held compact (runs only, table without hash_ids)."""
    return Trace(trace.table.drop(columns="hash_ids"), trace.block_tokens, trace.name,
                 trace.has_prefix_info, None, None, trace.group_column,
                 hash_runs=BlockRuns.from_flat(trace.hash_flat, trace.hash_offsets))


# ---------------------------------------------------------------------------------- BlockRuns
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(), data=st.data())
def test_runs_expand_to_the_flat_ids_and_are_maximal(trace, data):
    flat, off = trace.hash_flat, trace.hash_offsets
    runs = BlockRuns.from_flat(flat, off)
    np.testing.assert_array_equal(runs.to_flat(), flat)
    np.testing.assert_array_equal(runs.offsets, off)
    assert runs.num_ids == len(flat) and len(runs) == len(trace)
    for i in range(len(trace)):
        np.testing.assert_array_equal(runs.row(i), trace.row_hash_ids(i))
        starts, lens = runs.row_pieces(i)
        assert tuple_of_pieces(starts, lens) == tuple(trace.row_hash_ids(i).tolist())
        # maximal: a run never continues the previous run of its row
        assert all(starts[k + 1] != starts[k] + lens[k] for k in range(len(starts) - 1))
    a = data.draw(st.integers(0, len(trace)))
    b = data.draw(st.integers(a, len(trace)))
    part = runs.take(a, b)
    np.testing.assert_array_equal(part.to_flat(), flat[off[a]:off[b]])
    assert part.equals(BlockRuns.from_flat(flat[off[a]:off[b]], off[a:b + 1] - off[a]))


def test_runs_are_made_canonical_and_checked():
    # row 0: [5, 6] then [7] continue each other -> one run; row 1 empty; row 2: [9] [3, 4]
    runs = BlockRuns([5, 7, 9, 3], [2, 1, 1, 2], [0, 2, 2, 4])
    assert runs.start.tolist() == [5, 9, 3] and runs.length.tolist() == [3, 1, 2]
    assert runs.row_runs.tolist() == [0, 1, 1, 3] and runs.offsets.tolist() == [0, 3, 3, 6]
    assert runs.to_flat().tolist() == [5, 6, 7, 9, 3, 4]
    # a run may continue the previous row's last run: rows are never merged
    two = BlockRuns([0, 2], [2, 1], [0, 1, 2])
    assert two.row_pieces(1) == ([2], [1])
    for bad, msg in ((([0], [0], [0, 1]), "empty"), (([-1], [1], [0, 1]), "negative"),
                     (([0], [1], [0, 2]), "row_runs"), (([0, 1], [1], [0, 1]), "one shape")):
        with pytest.raises(TraceError, match=msg):
            BlockRuns(*bad)


# ---------------------------------------------------------------------------------- compact trace
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(), data=st.data())
def test_compact_trace_equals_the_plain_trace(trace, data):
    c = compact_of(trace)
    assert c.compact and len(c) == len(trace) and c.columns == list(trace.table.columns)
    for prop in ("arrival_s", "input_length", "output_length", "n_blocks", "full_blocks"):
        np.testing.assert_array_equal(getattr(c, prop), getattr(trace, prop))
    for i in range(len(trace)):
        np.testing.assert_array_equal(c.row_hash_ids(i), trace.row_hash_ids(i))
    a = data.draw(st.integers(0, len(trace)))
    b = data.draw(st.integers(a, len(trace)))
    part, ref = c.rows(a, b), trace.rows(a, b)
    assert part.compact and part.name == ref.name
    t0 = float(trace.arrival_s[0])
    win, win_ref = c.window(t0 + 0.5, None, rebase=True), trace.window(t0 + 0.5, None, rebase=True)
    for got, want in ((part, ref), (win, win_ref)):
        assert got.compact
        np.testing.assert_array_equal(got.hash_offsets, want.hash_offsets)
        np.testing.assert_array_equal(got.hash_flat, want.hash_flat)
        pd.testing.assert_frame_equal(got.table.drop(columns="hash_ids"),
                                      want.table.drop(columns="hash_ids"), check_exact=True)
    # the expanded table equals the plain one, hash_ids column included
    full = c.table
    assert list(full.columns) == list(trace.table.columns)
    assert all(np.array_equal(x, y) for x, y in zip(full["hash_ids"], trace.table["hash_ids"]))
    pd.testing.assert_frame_equal(full.drop(columns="hash_ids"), trace.table.drop(columns="hash_ids"))


def test_compact_trace_is_frozen_and_smaller():
    import dataclasses

    plain = bursted_shaped_trace(windows=3, compact=False)
    c = bursted_shaped_trace(windows=3)
    assert c.compact and not plain.compact
    assert c.hash_runs.equals(plain.hash_runs)
    assert c.memory_bytes() * 10 < plain.memory_bytes()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "other"
    back = pickle.loads(pickle.dumps(c))             # process pools ship traces to workers
    assert back.compact and back.hash_runs.equals(c.hash_runs) and back.name == c.name
    with pytest.raises(TraceError, match="must start with"):
        Trace(plain.table, BT, "x", True, None, None, hash_runs=plain.hash_runs)


# ---------------------------------------------------------------------------------- block index
def _segments(ids):
    """(starts, lengths) of the maximal stretches of consecutive ids."""
    starts, lens = [], []
    for y in ids:
        if starts and y == starts[-1] + lens[-1]:
            lens[-1] += 1
        else:
            starts.append(y)
            lens.append(1)
    return starts, lens


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(), cut=st.integers(1, 12))
def test_block_index_from_runs_equals_the_flat_build_and_the_definition(trace, cut):
    ref = BlockIndex(trace.hash_flat, trace.hash_offsets)
    got = BlockIndex.from_runs(trace.hash_runs)
    rows = [tuple(trace.row_hash_ids(i).tolist()) for i in range(len(trace))]
    parent = {}                         # the definition: every id's one parent (-1: first block)
    for ids in rows:
        for k, y in enumerate(ids):
            parent[y] = ids[k - 1] if k else -1

    def run_of(y):                      # run start: walk down while the parent is the id below
        if y not in parent:
            return None
        s = y
        while s > 0 and parent[s] == s - 1:
            s -= 1
        return s, y - s

    assert got.num_ids == ref.num_ids == (max(parent) + 1 if parent else 0)
    for y in range(-1, got.num_ids + 2):
        assert got.run_of(y) == ref.run_of(y) == run_of(y)
    for i, ids in enumerate(rows):
        assert got.row_pieces(i) == ref.row_pieces(i) == _segments(ids)
        for part in (ids, ids[:cut]):
            want = _segments(part) if part else ([], [])
            assert got.path_pieces(part) == ref.path_pieces(part) == want
        if len(ids) > 1:
            assert got.path_pieces(ids[1:]) is None       # not from the first block


@pytest.mark.parametrize("flat,off", [
    ([0, 1, 2, 0, 2], [0, 3, 5]),            # 2 follows 1, then 0
    ([0, 1, 2, 3, 2], [0, 3, 5]),            # 2 starts a run after 3, and sits inside 0..2
    ([4, 5, 0, 5], [0, 2, 4]),               # 5 after 4, then after 0
    ([0, 1, 7, 2, 7], [0, 3, 5]),            # 7 after 1, then after 2
])
def test_block_index_from_runs_refuses_unchained_ids_as_the_flat_build(flat, off):
    flat, off = np.array(flat, np.int32), np.array(off, np.int64)
    with pytest.raises(TraceError) as want:
        BlockIndex(flat, off)
    with pytest.raises(TraceError) as got:
        BlockIndex.from_runs(BlockRuns.from_flat(flat, off), "trace")
    assert str(got.value) == str(want.value) and "not chained" in str(got.value)


# ---------------------------------------------------------------------------------- simulator
@pytest.mark.parametrize("policy", ["round_robin", "btb"])
def test_replay_of_a_compact_trace_equals_the_plain_one_and_keeps_it_compact(policy):
    c = bursted_shaped_trace(windows=2).rows(0, 4700)
    plain = bursted_shaped_trace(windows=2, compact=False).rows(0, 4700)
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=4)
    got = simulate(c, make_router(policy), cluster, progress=False)
    want = simulate(plain, make_router(policy), cluster, progress=False)
    assert c.compact                                   # nothing expanded the ids
    for name in ("requests", "transfers", "queue_samples", "busy_intervals"):
        pd.testing.assert_frame_equal(getattr(got, name), getattr(want, name), check_exact=True)
    assert got.metrics == want.metrics


def test_finished_requests_leave_no_record_behind():
    trace = bursted_shaped_trace(windows=1).rows(0, 900)
    gc.collect()
    before = sum(type(o) is Job for o in gc.get_objects())
    sim = Simulator(trace, make_router("cache_aware"),
                    ClusterConfig.from_setup("70b_h100x4", num_replicas=4))
    res = sim.run()
    gc.collect()
    # every request's figures are in the result, and no Job record outlives its request
    assert len(res.requests) == 900 and (res.requests["finish_s"] > 0).all()
    assert sum(type(o) is Job for o in gc.get_objects()) == before
