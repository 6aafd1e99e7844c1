"""Static chain structure of a trace's block ids: runs, pieces and path look-ups.

A trace's ids are interned and chained (:mod:`btb_core.trace`): every id has one parent (the id
before it in any row holding it) or none (a first block), so the ids form a forest and a row's ids
are the root path to its last block. Call an id *linked* when its parent is the id just below it
(``parent[y] == y - 1``). A *run* is a maximal interval of ids ``[s, s + len)`` in which every id
but the first is linked; it is named by its first id ``s``. Interning numbers new ids in order of
first appearance, so the blocks a row introduces form one run, and a row's ids split into a few
*pieces*: each piece is a leading part ``[s, s + k)`` of a run (a path enters a run only at its
first id, and may leave it early where another row branched off).

The simulator keeps its cache state per run (see :mod:`btb_core.sim.kvcache`), so per-request cache
work is proportional to the number of pieces (1-3 on the shipped traces) instead of the number of
blocks (up to 257 on Bursted prefixes).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

import numpy as np

from ..errors import TraceError
from ..trace.runs import BlockRuns

#: Rows of ``hash_flat`` processed per numpy step when checking the chain, to bound temporaries.
_CHUNK = 1 << 22


def piece_at(lens, pos: int) -> tuple[int, int]:
    """(piece index, offset in that piece) of path position ``pos``, given the pieces' lengths."""
    k = 0
    while pos >= lens[k]:
        pos -= lens[k]
        k += 1
    return k, pos


def path_spans(starts, lens, a: int, b: int) -> list[tuple[int, int, int]]:
    """The path's blocks ``[a, b)`` as ``(run, lo, hi)`` spans of its pieces, in path order: piece
    ``k`` contributes offsets ``[lo, hi)`` of run ``starts[k]``."""
    if lens and b <= lens[0]:  # the common case on the hot path: the range lies in the first piece
        return [(starts[0], a, b)] if a < b else []
    out = []
    pos = 0
    for k in range(len(starts)):
        ln = lens[k]
        if pos + ln <= a:
            pos += ln
            continue
        if pos >= b:
            break
        out.append((starts[k], a - pos if a > pos else 0, b - pos if b - pos < ln else ln))
        pos += ln
    return out


def _check_negative(flat, offsets, name) -> None:
    if len(flat) and int(flat.min()) < 0:
        j = int(np.flatnonzero(flat < 0)[0])
        raise TraceError(f"{name}, row {int(np.searchsorted(offsets, j, 'right') - 1)}: "
                         f"block id {int(flat[j])} is negative")


def _chain_violation(start, length, head_parent) -> bool:
    """True if some id would get two parents: a run head seen with two different parents, or a
    run head that also lies inside a run (``start`` < id < ``start + length``) elsewhere."""
    r = len(start)
    if not r:
        return False
    keys = np.unique((start << 32) | (head_parent + 1))   # (head, parent) pairs, sorted by head
    heads = keys >> 32
    if len(heads) > 1 and np.any(heads[1:] == heads[:-1]):
        return True
    # inside-run test: runs sorted by start, the largest end among runs starting before the head
    order = np.argsort(start, kind="stable")
    s_sorted = start[order]
    end_max = np.maximum.accumulate(start[order] + length[order])
    k = np.searchsorted(s_sorted, heads, "left")      # runs starting strictly before each head
    inside = np.zeros(len(heads), bool)
    has = k > 0
    inside[has] = end_max[k[has] - 1] > heads[has]
    return bool(inside.any())


def _check_chain_flat(flat, offsets, name) -> None:
    """The flat-array chain check: raises :class:`TraceError` at the first occurrence of an id
    whose parent differs from the one recorded for it (the message names the row and ids)."""
    m = len(flat)
    num_ids = int(flat.max()) + 1 if m else 0
    starts = np.zeros(m, bool)
    lengths = np.diff(offsets)
    starts[offsets[:-1][lengths > 0]] = True
    parent = np.full(num_ids, -2, np.int32)            # -2: never seen, -1: a first block
    for lo in range(0, m, _CHUNK):                     # scatter: parent[id] = previous id
        hi = min(m, lo + _CHUNK)
        prev = np.empty(hi - lo, np.int32)
        prev[1:] = flat[lo:hi - 1]
        prev[0] = flat[lo - 1] if lo else -1
        prev[starts[lo:hi]] = -1
        parent[flat[lo:hi]] = prev
    for lo in range(0, m, _CHUNK):                     # gather: check every occurrence agrees
        hi = min(m, lo + _CHUNK)
        prev = np.empty(hi - lo, np.int32)
        prev[1:] = flat[lo:hi - 1]
        prev[0] = flat[lo - 1] if lo else -1
        prev[starts[lo:hi]] = -1
        bad = parent[flat[lo:hi]] != prev
        if bad.any():
            j = lo + int(np.flatnonzero(bad)[0])
            row = int(np.searchsorted(offsets, j, "right") - 1)
            raise TraceError(f"{name}, row {row}: block id {int(flat[j])} follows "
                             f"{int(prev[j - lo])} here but {int(parent[flat[j]])} elsewhere: "
                             "ids are not chained (build the trace with make_trace)")


class BlockIndex:
    """Parents, run starts and per-row pieces of a trace's chained ids.

    Parameters
    ----------
    hash_flat : numpy.ndarray
        int32, shape (m,): every row's ids concatenated (``Trace.hash_flat``).
    hash_offsets : numpy.ndarray
        int64, shape (n + 1,): row ``i`` is ``hash_flat[hash_offsets[i]:hash_offsets[i + 1]]``.
    name : str
        Trace name for error messages.

    :meth:`from_runs` builds the same index from the ids held as runs (``Trace.hash_runs``) without
    the flat array: a row's pieces are exactly its runs.

    Attributes
    ----------
    num_ids : int
        ``max(id) + 1``.
    heads, head_len, head_parent : array.array of int32
        The runs of the id space, ascending: run ``k`` holds ids ``heads[k] .. heads[k] +
        head_len[k] - 1``, and the parent of its first id is ``head_parent[k]`` (-1: a first
        block). Ids in no run do not occur in the trace. (One entry per run, not per id: 12 bytes
        per run where per-id arrays took 8 bytes per id, ~120 MB at 1,000,000 Bursted-shaped rows.)
    piece_offsets : numpy.ndarray
        int64, length n + 1: row ``i``'s pieces are ``piece_start[piece_offsets[i]:piece_offsets[i+1]]``.
    piece_start, piece_len : numpy.ndarray
        int32: first id and length (blocks) of every piece, row after row.

    Raises
    ------
    TraceError
        If an id is negative or has two different parents (the ids are not chained), naming the
        trace, the row and the id.
    """

    __slots__ = ("num_ids", "heads", "head_len", "head_parent", "piece_offsets", "piece_start",
                 "piece_len")

    def __init__(self, hash_flat: np.ndarray, hash_offsets: np.ndarray, name: str = "trace") -> None:
        flat = np.asarray(hash_flat)
        offsets = np.asarray(hash_offsets, dtype=np.int64)
        _check_negative(flat, offsets, name)
        self._build(BlockRuns.from_flat(flat, offsets), name, (flat, offsets))

    @classmethod
    def from_runs(cls, runs: BlockRuns, name: str = "trace") -> "BlockIndex":
        """The index of ids held as runs (``Trace.hash_runs``); equal to ``BlockIndex(hash_flat,
        hash_offsets)`` of the same ids, errors included, without expanding them."""
        self = object.__new__(cls)
        self._build(runs, name, None)
        return self

    def _build(self, runs: BlockRuns, name: str, flat_offsets) -> None:
        start = runs.start.astype(np.int64)
        length = runs.length.astype(np.int64)
        row_runs = runs.row_runs
        r = len(start)
        num_ids = int((start + length).max()) if r else 0
        # parent of each run's first id: the previous run's last id in its row, -1 at a row start
        first_of_row = np.zeros(r, bool)
        first_of_row[row_runs[:-1][np.diff(row_runs) > 0]] = True
        head_parent = np.empty(r, np.int64)
        if r:
            head_parent[0] = -1
            head_parent[1:] = start[:-1] + length[:-1] - 1
            head_parent[first_of_row] = -1
        # chained iff every id has one parent: a run's first id never gets two different parents,
        # and never also appears inside a run (where its parent is the id before it)
        bad = _chain_violation(start, length, head_parent)
        if bad:
            flat, offsets = flat_offsets if flat_offsets is not None else (runs.to_flat(), runs.offsets)
            _check_chain_flat(flat, offsets, name)     # raises with the first bad occurrence
            raise TraceError(f"{name}: block ids are not chained (build the trace with make_trace)")
        # the runs of the id space: a head's run is [head, head + its longest piece), its parent
        # the head's (a chained trace puts every seen id in exactly one such run)
        order = np.argsort(start, kind="stable")
        s_sorted = start[order]
        first = np.ones(r, bool)
        if r > 1:
            first[1:] = s_sorted[1:] != s_sorted[:-1]
        at = np.flatnonzero(first)
        heads = s_sorted[at]
        longest = np.maximum.reduceat(length[order], at) if r else length
        parents = head_parent[order][at]
        self.num_ids = num_ids
        self.heads = array("i", heads.astype(np.int32).tobytes())
        self.head_len = array("i", longest.astype(np.int32).tobytes())
        self.head_parent = array("i", parents.astype(np.int32).tobytes())
        self.piece_offsets = row_runs
        self.piece_start = runs.start
        self.piece_len = runs.length

    def row_pieces(self, i: int) -> tuple[list[int], list[int]]:
        """(run start ids, lengths) of row ``i``'s pieces, in path order (Python lists)."""
        a, b = int(self.piece_offsets[i]), int(self.piece_offsets[i + 1])
        return self.piece_start[a:b].tolist(), self.piece_len[a:b].tolist()

    def _run_index(self, y: int) -> int:
        """Index ``k`` of the run holding id ``y``, or -1 if ``y`` does not occur."""
        heads = self.heads
        k = bisect_right(heads, y) - 1
        if k < 0 or y >= heads[k] + self.head_len[k]:
            return -1
        return k

    def path_pieces(self, hash_ids) -> tuple[list[int], list[int]] | None:
        """Pieces of ``hash_ids`` if it is a root path of this trace's ids, else None.

        A root path is a leading part of some row's ids (first block included). Cost: one walk up
        the runs (a binary search each) plus one C-level comparison of the ids.
        """
        n = len(hash_ids)
        if n == 0:
            return [], []
        y = hash_ids[-1]
        if not isinstance(y, (int, np.integer)) or not (0 <= y < self.num_ids):
            return None
        y = int(y)
        k = self._run_index(y)
        if k < 0:
            return None
        starts, lens = [], []
        heads, parents = self.heads, self.head_parent
        total = 0
        while True:
            s = heads[k]
            starts.append(s)
            lens.append(y - s + 1)
            total += y - s + 1
            if total > n:
                return None
            y = parents[k]
            if y < 0:
                break
            k = bisect_right(heads, y) - 1
        if total != n:
            return None
        starts.reverse()
        lens.reverse()
        expect = []
        for s, k in zip(starts, lens):
            expect.extend(range(s, s + k))
        if list(hash_ids) != expect:
            return None
        return starts, lens

    def run_of(self, block) -> tuple[int, int] | None:
        """(run start, offset in the run) of one block id, or None if the id is not in the trace."""
        if not isinstance(block, (int, np.integer)) or not (0 <= block < self.num_ids):
            return None
        block = int(block)
        k = self._run_index(block)
        if k < 0:
            return None
        s = self.heads[k]
        return s, block - s
