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

import numpy as np

from ..errors import TraceError

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

    Attributes
    ----------
    num_ids : int
        ``max(id) + 1``.
    piece_offsets : list[int]
        Length n + 1: row ``i``'s pieces are ``piece_start[piece_offsets[i]:piece_offsets[i+1]]``.
    piece_start, piece_len : list[int]
        First id and length (blocks) of every piece, row after row.

    Raises
    ------
    TraceError
        If an id is negative or has two different parents (the ids are not chained), naming the
        trace, the row and the id.
    """

    __slots__ = ("num_ids", "parent", "run_start", "piece_offsets", "piece_start", "piece_len")

    def __init__(self, hash_flat: np.ndarray, hash_offsets: np.ndarray, name: str = "trace") -> None:
        flat = np.asarray(hash_flat)
        offsets = np.asarray(hash_offsets, dtype=np.int64)
        m = len(flat)
        if m and int(flat.min()) < 0:
            j = int(np.flatnonzero(flat < 0)[0])
            raise TraceError(f"{name}, row {int(np.searchsorted(offsets, j, 'right') - 1)}: "
                             f"block id {int(flat[j])} is negative")
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
        ids = np.arange(num_ids, dtype=np.int64)
        linked = parent.astype(np.int64) == ids - 1
        run_start = np.maximum.accumulate(np.where(linked, 0, ids)) if num_ids else ids
        # pieces: break wherever a row starts or the next id is not the previous id + 1
        brk = starts
        for lo in range(1, m, _CHUNK):                     # int32 differences never overflow
            hi = min(m, lo + _CHUNK)
            brk[lo:hi] |= (flat[lo:hi] - flat[lo - 1:hi - 1]) != 1
        pidx = np.flatnonzero(brk)
        plen = np.diff(np.append(pidx, m))
        self.num_ids = num_ids
        self.parent = array("i", parent.tobytes())
        self.run_start = array("i", run_start.astype(np.int32).tobytes())
        self.piece_offsets = np.searchsorted(pidx, offsets[:-1]).tolist() + [len(pidx)]
        self.piece_start = flat[pidx].tolist()
        self.piece_len = plen.tolist()

    def row_pieces(self, i: int) -> tuple[list[int], list[int]]:
        """(run start ids, lengths) of row ``i``'s pieces, in path order."""
        a, b = self.piece_offsets[i], self.piece_offsets[i + 1]
        return self.piece_start[a:b], self.piece_len[a:b]

    def path_pieces(self, hash_ids) -> tuple[list[int], list[int]] | None:
        """Pieces of ``hash_ids`` if it is a root path of this trace's ids, else None.

        A root path is a leading part of some row's ids (first block included). Cost: one walk up
        the runs plus one C-level comparison of the ids.
        """
        n = len(hash_ids)
        if n == 0:
            return [], []
        y = hash_ids[-1]
        if not isinstance(y, (int, np.integer)) or not (0 <= y < self.num_ids):
            return None
        y = int(y)
        if self.parent[y] == -2:
            return None
        starts, lens = [], []
        parent, run_start = self.parent, self.run_start
        total = 0
        while y >= 0:
            s = run_start[y]
            starts.append(s)
            lens.append(y - s + 1)
            total += y - s + 1
            if total > n:
                return None
            y = parent[s]
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
        if self.parent[block] == -2:
            return None
        s = self.run_start[block]
        return s, block - s
