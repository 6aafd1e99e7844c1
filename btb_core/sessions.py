"""Conversation sessions in a trace: inferring them, checking them, and planning closed-loop replay.

A trace may carry ``session_id`` (any hashable label) and ``turn`` (0, 1, 2, ... within a session)
columns. Sources that record them keep them on load; the Mooncake conversation trace does not, and
:func:`infer_sessions` recovers them from its chained prefixes (rule below).

Inference rule (chained prefixes)
---------------------------------
Rows are visited in arrival order. A row ``b`` *continues* an earlier row ``a`` (``b`` is the next
turn of ``a``'s session) when all of the following hold:

1. the deepest run of full blocks ``b`` shares with any earlier row, capped at ``b``'s full blocks minus one (the
   continuation must be strict), ends exactly at the last full block of ``a``'s prompt;
2. that block is held by exactly one earlier row, ``a`` (so a prefix shared by many requests, such
   as the system prompt every Mooncake conversation request starts with, or a burst's common prefix,
   never links two requests);
3. ``a`` has no continuation yet (a conversation is a chain, not a tree).

Every other row starts a new session. Sessions are numbered 0, 1, ... in order of their first
turn. On the shipped conversation trace (12,031 rows) this finds 2,529 continuations: 9,502 sessions,
1,675 of them multi-turn (up to 16 turns); the trace's gap between consecutive turns has a median
of 144 s, and the later turn's prompt is at least the earlier prompt plus its answer in 94% of the
pairs (median surplus 52 tokens: the user's new message), which is how a chat client builds its
next prompt.

Closed-loop plan
----------------
:func:`plan_sessions` rewrites the prompts so that turn ``k + 1`` starts with turn ``k``'s prompt
*and its output*: with ``H = input_length_k + output_length_k`` tokens of history, turn ``k + 1``'s
first ``input_length_k // block_tokens`` block ids are turn ``k``'s full prompt blocks, and the
next ``H // block_tokens - input_length_k // block_tokens`` ids are turn ``k``'s *output blocks*
(the full blocks of its prompt + answer beyond the full prompt blocks). A turn whose prompt is
shorter than ``H + 1`` tokens is lengthened to ``H + 1`` (the answer plus a one-token message).
Where the trace already has that structure (an inferred Mooncake session whose next prompt holds
the answer), the trace's own ids are kept, so the open-loop replay of the planned trace equals the
replay of the original trace in the blocks it can reuse. Each row also gets an *extended path*
(its full prompt blocks then its output blocks): in closed-loop replay a finished turn leaves its
output blocks in the cache (as vLLM and SGLang cache generated tokens' KV), so the next turn can
reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .errors import TraceError
from .trace import Trace, _show


def infer_sessions(trace: Trace) -> Trace:
    """A copy of ``trace`` with ``session_id`` and ``turn`` inferred from chained prefixes.

    Parameters
    ----------
    trace : Trace
        With prefix info, one time line (not a grouped Bursted split).

    Returns
    -------
    Trace
        The same rows, ids and arrivals, with int64 columns ``session_id`` (sessions numbered in
        order of their first turn) and ``turn`` (0 for a session's first request). Existing
        ``session_id`` / ``turn`` columns are replaced. See the module docstring for the rule.

    Raises
    ------
    TraceError
        No prefix info, or a grouped trace.
    """
    trace.require_prefix_info("inferring sessions from chained prefixes")
    trace._require_ungrouped("inferring sessions")
    prev = _infer_prev(trace)
    n = len(trace)
    sid = np.empty(n, np.int64)
    turn = np.empty(n, np.int64)
    s = 0
    for b in range(n):
        a = prev[b]
        if a >= 0:
            sid[b] = sid[a]
            turn[b] = turn[a] + 1
        else:
            sid[b] = s
            turn[b] = 0
            s += 1
    return _with_columns(trace, session_id=sid, turn=turn)


def _infer_prev(trace: Trace) -> np.ndarray:
    """Previous turn of every row by the chained-prefix rule (-1: a session's first turn)."""
    n = len(trace)
    flat = trace.hash_flat.tolist()
    off = trace.hash_offsets.tolist()
    full = trace.full_blocks.tolist()
    prev = np.full(n, -1, np.int64)
    continued = np.zeros(n, bool)
    ends: dict[int, list[int]] = {}      # id -> rows whose last full block it is
    holders: dict[int, int] = {}         # id -> earlier rows holding it as a full block
    seen: set[int] = set()               # every full-block id of the earlier rows
    for b in range(n):
        lo, hi = off[b], off[b + 1]
        fb = full[b] if full[b] <= hi - lo else hi - lo
        m = 0
        while m < fb - 1 and flat[lo + m] in seen:
            m += 1
        if m >= 1:
            key = flat[lo + m - 1]
            rows = ends.get(key)
            if rows and holders.get(key) == 1:
                a = rows[-1]
                if not continued[a]:
                    prev[b] = a
                    continued[a] = True
        for j in range(lo, lo + fb):
            x = flat[j]
            holders[x] = holders.get(x, 0) + 1
        if fb:
            ends.setdefault(flat[lo + fb - 1], []).append(b)
        seen.update(flat[lo:lo + fb])
    return prev


def _with_columns(trace: Trace, **cols) -> Trace:
    table = trace.table.copy()
    for name, vals in cols.items():
        table[name] = vals
    return Trace(table, trace.block_tokens, trace.name, trace.has_prefix_info, trace.hash_flat,
                 trace.hash_offsets, trace.group_column)


def session_structure(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Previous turn of every row, from the trace's ``session_id`` (and ``turn``) columns.

    Parameters
    ----------
    trace : Trace
        Must have a ``session_id`` column; ``turn`` is optional (default: order of arrival within
        the session). A missing session id (None/NaN) makes the row a session of its own.

    Returns
    -------
    prev : numpy.ndarray
        int64, shape (n,): row index of the previous turn, -1 for a first turn.
    session : numpy.ndarray
        int64, shape (n,): session number (first-appearance order).
    turn : numpy.ndarray
        int64, shape (n,).

    Raises
    ------
    TraceError
        No ``session_id`` column; a ``turn`` that is not a non-negative integer; turns of one
        session that are not 0, 1, 2, ... in arrival order. Messages name the trace, row and field.
    """
    table = trace.table
    if "session_id" not in table.columns:
        raise TraceError(f"{trace.name}: no 'session_id' column (infer sessions from chained "
                         "prefixes with btb_core.sessions.infer_sessions)")
    n = len(trace)
    raw = table["session_id"]
    missing = raw.isna().to_numpy()
    codes, _ = pd.factorize(raw, use_na_sentinel=True)
    codes = codes.astype(np.int64)
    nxt = int(codes.max()) + 1 if n else 0
    for i in np.flatnonzero(missing):
        codes[i] = nxt
        nxt += 1
    session, _ = pd.factorize(codes)
    session = session.astype(np.int64)
    if "turn" in table.columns:
        t = table["turn"]
        vals = pd.to_numeric(t, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~np.isfinite(vals) | (vals < 0) | (vals != np.floor(vals))
        bad &= ~missing
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TraceError(f"{trace.name}, row {i}: field 'turn' = {_show(t.iloc[i])}: must be an "
                             "integer >= 0")
        turn = np.where(missing, 0, np.nan_to_num(vals)).astype(np.int64)
    else:
        turn = None
    prev = np.full(n, -1, np.int64)
    last: dict[int, int] = {}
    count: dict[int, int] = {}
    derived = np.empty(n, np.int64)
    for i in range(n):
        s = int(session[i])
        k = count.get(s, 0)
        if turn is not None and turn[i] != k:
            raise TraceError(f"{trace.name}, row {i}: field 'turn' = {int(turn[i])} but this is "
                             f"request {k} of session {raw.iloc[i]!r} in arrival order (turns must "
                             "be 0, 1, 2, ... in arrival order)")
        derived[i] = k
        count[s] = k + 1
        if s in last:
            prev[i] = last[s]
        last[s] = i
    return prev, session, derived


@dataclass(frozen=True, eq=False)
class SessionPlan:
    """A trace prepared for closed-loop replay (see the module docstring).

    Attributes
    ----------
    trace : Trace
        Same rows and arrivals as the input; prompts rewritten so that each later turn starts with
        the previous turn's full prompt blocks and output blocks (``input_length`` may grow).
    prev : numpy.ndarray
        int64, shape (n,): row of the previous turn, -1 for a first turn.
    session, turn : numpy.ndarray
        int64, shape (n,).
    gap_s : numpy.ndarray
        float64, shape (n,): the trace's gap between the previous turn's arrival and this one's
        (0 for first turns); the default think time of closed-loop replay.
    ext_flat : numpy.ndarray
        int32: every row's extended path (full prompt blocks, then output blocks) concatenated,
        in the id space of ``trace.hash_flat``.
    ext_offsets : numpy.ndarray
        int64, shape (n + 1,).
    lengthened : int
        Rows whose prompt was shorter than the previous turn's prompt + output and was lengthened.
    """

    trace: Trace
    prev: np.ndarray
    session: np.ndarray
    turn: np.ndarray
    gap_s: np.ndarray
    ext_flat: np.ndarray
    ext_offsets: np.ndarray
    lengthened: int

    @property
    def num_sessions(self) -> int:
        return int(self.session.max()) + 1 if len(self.session) else 0


def plan_sessions(trace: Trace) -> SessionPlan:
    """Prepare ``trace`` (with ``session_id``, optionally ``turn``) for closed-loop replay.

    Parameters
    ----------
    trace : Trace
        With prefix info, one time line, and a ``session_id`` column (see :func:`infer_sessions`).

    Returns
    -------
    SessionPlan

    Raises
    ------
    TraceError
        As :func:`session_structure`; no prefix info; a grouped trace.
    """
    trace.require_prefix_info("closed-loop sessions")
    trace._require_ungrouped("closed-loop sessions")
    prev, session, turn = session_structure(trace)
    n = len(trace)
    bt = int(trace.block_tokens)
    flat = trace.hash_flat.tolist()
    off = trace.hash_offsets.tolist()
    inp = trace.input_length.astype(np.int64).copy()
    out = np.maximum(trace.output_length.astype(np.int64), 1)
    nxt_row = np.full(n, -1, np.int64)
    for b in range(n):
        if prev[b] >= 0:
            nxt_row[prev[b]] = b
    fresh = [int(trace.hash_flat.max()) + 1 if len(flat) else 0]

    def new_ids(k):
        a = fresh[0]
        fresh[0] += k
        return list(range(a, a + k))

    keys: list[list[int]] = [None] * n          # rewritten prompt ids per row (raw, pre-intern)
    ext: list[list[int]] = [None] * n
    same = np.zeros(n, bool)                    # row kept its original ids and length
    lengthened = 0
    for b in range(n):
        a = int(prev[b])
        orig = flat[off[b]:off[b + 1]]
        if a < 0:
            keys[b] = orig
            same[b] = True
            continue
        fa = int(inp[a]) // bt
        hist = int(inp[a]) + int(out[a])
        fh = hist // bt
        need = hist + 1
        if same[a] and inp[b] >= need and orig[:fa] == flat[off[a]:off[a] + fa]:
            keys[b] = orig
            same[b] = True
        else:
            if inp[b] < need:
                inp[b] = need
                lengthened += 1
            nb = -(-int(inp[b]) // bt)
            keys[b] = keys[a][:fa] + new_ids(fh - fa) + new_ids(nb - fh)
    for a in range(n):
        fa = int(inp[a]) // bt
        fh = (int(inp[a]) + int(out[a])) // bt
        b = int(nxt_row[a])
        tail = keys[b][fa:fh] if b >= 0 else new_ids(fh - fa)
        ext[a] = keys[a][:fa] + tail
    # intern in one id space: prompts first (first-appearance order, so a trace whose ids are
    # already numbered that way keeps them), then the output blocks of the extended paths
    lens_p = [len(k) for k in keys]
    lens_e = [len(k) for k in ext]
    raw = np.fromiter((x for k in keys for x in k), np.int64, sum(lens_p))
    raw_e = np.fromiter((x for k in ext for x in k), np.int64, sum(lens_e))
    codes, _ = pd.factorize(np.concatenate([raw, raw_e]))
    codes = codes.astype(np.int32)
    p_flat = codes[:len(raw)].copy()
    e_flat = codes[len(raw):].copy()
    p_off = np.zeros(n + 1, np.int64)
    np.cumsum(lens_p, out=p_off[1:])
    e_off = np.zeros(n + 1, np.int64)
    np.cumsum(lens_e, out=e_off[1:])
    p_flat.flags.writeable = False
    table = trace.table.copy()
    table["input_length"] = inp
    views = np.empty(n, dtype=object)
    for i in range(n):
        views[i] = p_flat[p_off[i]:p_off[i + 1]]
    table["hash_ids"] = views
    table["turn"] = turn
    planned = Trace(table, bt, trace.name, True, p_flat, p_off, None)
    t = trace.arrival_s
    gap = np.where(prev >= 0, t - t[np.maximum(prev, 0)], 0.0)
    return SessionPlan(planned, prev, session, turn, gap.astype(np.float64), e_flat, e_off,
                       lengthened)


def session_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per-session latency and throughput from a per-request table with ``session_id``.

    Parameters
    ----------
    requests : pandas.DataFrame
        :attr:`btb_core.sim.SimResult.requests` of a run that had sessions (columns
        ``session_id``, ``turn``, ``arrival_s``, ``finish_s``, ``ttft_s``, ``e2e_s``,
        ``output_length``).

    Returns
    -------
    pandas.DataFrame
        One row per session: ``session_id``, ``turns``, ``start_s`` (first arrival), ``end_s``
        (last finish), ``duration_s``, ``ttft_mean_s``, ``e2e_mean_s`` (per turn),
        ``output_tokens``, ``output_tokens_per_s`` (output tokens over the session's duration).
    """
    g = requests.groupby("session_id", sort=True)
    df = pd.DataFrame({
        "turns": g.size(),
        "start_s": g["arrival_s"].min(),
        "end_s": g["finish_s"].max(),
        "ttft_mean_s": g["ttft_s"].mean(),
        "e2e_mean_s": g["e2e_s"].mean(),
        "output_tokens": g["output_length"].sum(),
    }).reset_index()
    df["duration_s"] = df["end_s"] - df["start_s"]
    dur = df["duration_s"].to_numpy()
    df["output_tokens_per_s"] = np.where(dur > 0, df["output_tokens"] / np.where(dur > 0, dur, 1),
                                         np.nan)
    return df[["session_id", "turns", "start_s", "end_s", "duration_s", "ttft_mean_s",
               "e2e_mean_s", "output_tokens", "output_tokens_per_s"]]


__all__ = ["SessionPlan", "infer_sessions", "plan_sessions", "session_structure", "session_table"]
