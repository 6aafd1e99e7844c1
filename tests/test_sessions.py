"""Sessions: inference from chained prefixes, validation, the closed-loop plan, per-session table."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from btb_core.errors import TraceError
from btb_core.sessions import infer_sessions, plan_sessions, session_structure, session_table
from btb_core.trace import load_mooncake, load_trace, make_trace, shipped_traces

BT = 4


def trace_of(rows, **cols):
    """rows: (arrival_s, input_length, output_length, hash_ids)."""
    t, i, o, h = zip(*rows)
    return make_trace(list(t), list(i), list(o), [list(x) for x in h], block_tokens=BT, **cols)


def test_infer_links_strict_extensions_and_never_through_shared_prefixes():
    tr = trace_of([
        (0.0, 12, 2, (0, 1, 2)),           # A: 3 full blocks
        (1.0, 8, 1, (0, 9)),               # C: shares only block 0 with A (held by A too)
        (2.0, 22, 2, (0, 1, 2, 3, 4, 5)),  # B: extends A's 3 full blocks -> turn 1 of A
        (3.0, 14, 1, (0, 1, 2, 7)),        # E: extends A again, but A is already continued
        (4.0, 30, 1, (0, 1, 2, 3, 4, 5, 6, 8)),  # D: extends B's 5 full blocks -> turn 2
    ])
    s = infer_sessions(tr)
    assert s.table["session_id"].tolist() == [0, 1, 0, 2, 0]
    assert s.table["turn"].tolist() == [0, 0, 1, 0, 2]
    # a prefix held by two earlier rows (a burst's common prefix) links nobody
    burst = trace_of([(0.0, 8, 1, (0, 1)), (0.5, 8, 1, (0, 1)), (1.0, 16, 1, (0, 1, 2, 3))])
    assert infer_sessions(burst).table["turn"].tolist() == [0, 0, 0]


def test_infer_on_shipped_conversation_trace():
    tr = load_trace(shipped_traces()["mooncake_conversation"])
    s = infer_sessions(tr)
    turn = s.table["turn"].to_numpy()
    assert (int((turn > 0).sum()), int(s.table["session_id"].nunique()), int(turn.max())) == \
        (2529, 9502, 15)
    prev, _, _ = session_structure(s)
    b = np.flatnonzero(prev >= 0)
    a = prev[b]
    # every later turn starts with its previous turn's full prompt blocks and is longer
    for x, y in zip(a[:200], b[:200]):
        fa = tr.full_blocks[x]
        np.testing.assert_array_equal(tr.row_hash_ids(y)[:fa], tr.row_hash_ids(x)[:fa])
        assert tr.full_blocks[y] > fa
    assert (tr.arrival_s[b] >= tr.arrival_s[a]).all()


def test_session_structure_validates_turns():
    base = [(0.0, 8, 1, (0, 1)), (1.0, 8, 1, (5, 6)), (2.0, 16, 1, (0, 1, 2, 3))]
    prev, sess, turn = session_structure(trace_of(base, session_id=["a", "b", "a"]))
    assert prev.tolist() == [-1, -1, 0] and turn.tolist() == [0, 0, 1] and sess.tolist() == [0, 1, 0]
    with pytest.raises(TraceError, match=r"row 2: field 'turn' = 3 but this is request 1 of session 'a'"):
        session_structure(trace_of(base, session_id=["a", "b", "a"], turn=[0, 0, 3]))
    with pytest.raises(TraceError, match=r"row 1: field 'turn' = -1.*integer >= 0"):
        session_structure(trace_of(base, session_id=["a", "b", "a"], turn=[0, -1, 1]))
    with pytest.raises(TraceError, match="no 'session_id' column"):
        session_structure(trace_of(base))
    # a missing session id is a session of its own
    prev, _, _ = session_structure(trace_of(base, session_id=["a", None, "a"]))
    assert prev.tolist() == [-1, -1, 0]


def test_plan_puts_previous_prompt_and_output_blocks_first():
    # turn 0: 10 tokens (2 full blocks + partial), 7 output tokens -> history 17 = 4 full blocks
    # turn 1 in the trace: 9 tokens, shorter than history + 1 -> lengthened to 18
    # turn 2: 40 tokens, holds turn 1's history (18 + 3 = 21 tokens)
    tr = trace_of([(0.0, 10, 7, (0, 1, 2)), (5.0, 9, 3, (0, 1, 3)),
                   (9.0, 40, 1, (0, 1, 3, 4, 5, 6, 7, 8, 9, 10))], session_id=[0, 0, 0])
    plan = plan_sessions(tr)
    t = plan.trace
    assert t.input_length.tolist() == [10, 18, 40] and plan.lengthened == 1
    assert plan.prev.tolist() == [-1, 0, 1] and plan.gap_s.tolist() == [0.0, 5.0, 4.0]
    ext = [plan.ext_flat[plan.ext_offsets[i]:plan.ext_offsets[i + 1]] for i in range(3)]
    assert [len(e) for e in ext] == [4, 5, 10]        # (in + out) // BT full blocks
    for i in range(2):
        np.testing.assert_array_equal(ext[i][:t.full_blocks[i]], t.row_hash_ids(i)[:t.full_blocks[i]])
        # turn k+1 starts with turn k's full prompt blocks, then turn k's output blocks
        np.testing.assert_array_equal(t.row_hash_ids(i + 1)[:len(ext[i])], ext[i])
    # output blocks are new blocks, not the trace's partial prompt block
    assert ext[0][2] != t.row_hash_ids(0)[2]
    assert len(t.row_hash_ids(1)) == 5 and len(t.row_hash_ids(2)) == 10


def test_plan_keeps_a_trace_that_already_holds_the_answer():
    tr = trace_of([(0.0, 8, 8, (0, 1)), (5.0, 20, 3, (0, 1, 2, 3, 4))], session_id=[7, 7])
    plan = plan_sessions(tr)
    np.testing.assert_array_equal(plan.trace.hash_flat, tr.hash_flat)
    assert plan.lengthened == 0
    np.testing.assert_array_equal(plan.ext_flat[:4], [0, 1, 2, 3])


def test_mooncake_loader_keeps_session_fields(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [0, 1],
             "session_id": "s1", "turn": 0},
            {"timestamp": 10, "input_length": 16, "output_length": 1, "hash_ids": [0, 1, 2, 3],
             "session_id": "s1", "turn": 1}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tr = load_mooncake(p, block_tokens=BT)
    assert tr.table["session_id"].tolist() == ["s1", "s1"] and tr.table["turn"].tolist() == [0, 1]
    assert plan_sessions(tr).prev.tolist() == [-1, 0]


def test_session_table():
    req = pd.DataFrame({"session_id": [1, 1, 2], "turn": [0, 1, 0], "arrival_s": [0.0, 5.0, 1.0],
                        "finish_s": [2.0, 9.0, 1.5], "ttft_s": [1.0, 2.0, 0.25],
                        "e2e_s": [2.0, 4.0, 0.5], "output_length": [10, 20, 5]})
    tab = session_table(req)
    assert tab["turns"].tolist() == [2, 1]
    assert tab["duration_s"].tolist() == [9.0, 0.5]
    assert tab["output_tokens_per_s"].tolist() == pytest.approx([30 / 9.0, 10.0])
    assert tab["ttft_mean_s"].tolist() == pytest.approx([1.5, 0.25])
