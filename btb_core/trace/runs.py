"""A trace's block ids stored as runs of consecutive ids: :class:`BlockRuns`.

Interning numbers ids in order of first appearance (:func:`btb_core.trace.make_trace`), so the blocks
a row introduces are consecutive ids, and a row's ids are a few *runs* ``[s, s + length)``: a shared
prefix, then its own blocks. A Bursted-shaped row of 257 blocks is one or two runs (a 65,536-token
job prefix, then its own suffix), so a 1,000,000-row trace whose flat int32 ids take 827 MB takes
~25 MB as runs. :class:`~btb_core.trace.Trace` can hold its ids this way (``hash_runs``) and expands
them only when a caller asks for the flat array or the ``hash_ids`` column; the simulator works on
the runs directly (:class:`btb_core.sim.blocks.BlockIndex`: a trace's pieces are its runs).

Runs are kept canonical: within a row, a run never continues where the previous one ended (two such
runs are one run), so the runs of a row are exactly the maximal stretches of consecutive ids, the
same as :meth:`BlockRuns.from_flat` finds in the flat ids.
"""

from __future__ import annotations

import numpy as np

from ..errors import TraceError

#: Ids processed per numpy step by :meth:`BlockRuns.from_flat` (bounds its temporaries).
_CHUNK = 1 << 22


class BlockRuns:
    """Every row's block ids as runs of consecutive ids.

    Parameters
    ----------
    start : array of int
        Shape (r,): first id of every run, rows one after another (cast to int32; ids >= 0).
    length : array of int
        Shape (r,): ids in every run (>= 1; cast to int32).
    row_runs : array of int
        Shape (n + 1,), int64: row ``i``'s runs are ``start[row_runs[i]:row_runs[i + 1]]``
        (``row_runs[0] == 0``, ``row_runs[-1] == r``, non-decreasing; a row may have none).

    Attributes
    ----------
    start, length : numpy.ndarray
        int32, shape (r,), canonical (adjacent runs of a row that continue each other are merged).
    row_runs : numpy.ndarray
        int64, shape (n + 1,).
    offsets : numpy.ndarray
        int64, shape (n + 1,): row ``i``'s ids are positions ``offsets[i]:offsets[i + 1]`` of the
        flat array (``Trace.hash_offsets``).

    Raises
    ------
    TraceError
        On inconsistent shapes, a negative id, an id above the int32 range or an empty run.
    """

    __slots__ = ("start", "length", "row_runs", "offsets")

    def __init__(self, start, length, row_runs) -> None:
        start = np.asarray(start)
        length = np.asarray(length)
        row_runs = np.asarray(row_runs, dtype=np.int64)
        if start.ndim != 1 or start.shape != length.shape:
            raise TraceError(f"BlockRuns: start and length must be 1-D of one shape, got "
                             f"{start.shape} and {length.shape}")
        r = len(start)
        if row_runs.ndim != 1 or len(row_runs) < 1 or row_runs[0] != 0 or row_runs[-1] != r \
                or np.any(np.diff(row_runs) < 0):
            raise TraceError(f"BlockRuns: row_runs must run non-decreasing from 0 to {r}")
        if r:
            if int(length.min()) < 1:
                raise TraceError(f"BlockRuns: run {int(np.argmin(length))} is empty (length "
                                 f"{int(length.min())})")
            if int(start.min()) < 0:
                raise TraceError(f"BlockRuns: run {int(np.argmin(start))} starts at a negative id "
                                 f"{int(start.min())}")
            if int(start.max()) + int(length.max()) > np.iinfo(np.int32).max:
                raise TraceError("BlockRuns: ids must fit int32")
        start = start.astype(np.int32, copy=False)
        length = length.astype(np.int32, copy=False)
        # canonical: merge a run into the previous one of the same row when it continues it
        if r > 1:
            cont = start[1:].astype(np.int64) == start[:-1].astype(np.int64) + length[:-1]
            first = np.zeros(r, bool)
            first[row_runs[:-1][np.diff(row_runs) > 0]] = True
            cont &= ~first[1:]
            if cont.any():
                keep = np.ones(r, bool)
                keep[1:] = ~cont
                head = np.flatnonzero(keep)
                totals = np.add.reduceat(length.astype(np.int64), head)
                start = start[head]
                length = totals.astype(np.int32)
                row_runs = np.searchsorted(head, row_runs, "left").astype(np.int64)
        self.start = start
        self.length = length
        self.row_runs = row_runs
        cum = np.zeros(len(length) + 1, np.int64)
        np.cumsum(length, out=cum[1:])
        offsets = cum[row_runs]
        self.offsets = offsets

    # ---- building -----------------------------------------------------------------------------
    @classmethod
    def from_flat(cls, flat: np.ndarray, offsets: np.ndarray) -> "BlockRuns":
        """The runs of flat ids (``Trace.hash_flat``, ``Trace.hash_offsets``): a run breaks where a
        row starts or an id is not the previous id + 1. Raises :class:`TraceError` on a negative id."""
        flat = np.asarray(flat)
        offsets = np.asarray(offsets, dtype=np.int64)
        m = len(flat)
        lengths = np.diff(offsets)
        brk = np.zeros(m, bool)
        brk[offsets[:-1][lengths > 0]] = True
        for lo in range(1, m, _CHUNK):                 # int32 differences never overflow
            hi = min(m, lo + _CHUNK)
            brk[lo:hi] |= (flat[lo:hi] - flat[lo - 1:hi - 1]) != 1
        at = np.flatnonzero(brk)
        run_len = np.diff(np.append(at, m))
        return cls(flat[at], run_len, np.searchsorted(at, offsets, "left"))

    # ---- reading ------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Rows."""
        return len(self.row_runs) - 1

    @property
    def num_ids(self) -> int:
        """Total ids over all rows (``len(Trace.hash_flat)``)."""
        return int(self.offsets[-1])

    @property
    def nbytes(self) -> int:
        """Bytes of the four arrays."""
        return self.start.nbytes + self.length.nbytes + self.row_runs.nbytes + self.offsets.nbytes

    def to_flat(self, a: int = 0, b: int | None = None) -> np.ndarray:
        """Rows ``a:b``'s ids concatenated, int32 (``Trace.hash_flat[offsets[a]:offsets[b]]``)."""
        b = len(self) if b is None else b
        r0, r1 = int(self.row_runs[a]), int(self.row_runs[b])
        starts = self.start[r0:r1].astype(np.int64)
        lens = self.length[r0:r1].astype(np.int64)
        total = int(lens.sum())
        first = np.zeros(len(lens), np.int64)          # position of each run in the output
        if len(lens) > 1:
            np.cumsum(lens[:-1], out=first[1:])
        return (np.arange(total, dtype=np.int64) - np.repeat(first - starts, lens)).astype(np.int32)

    def row(self, i: int) -> np.ndarray:
        """Row ``i``'s ids, int32, shape (its block count,)."""
        return self.to_flat(i, i + 1)

    def row_pieces(self, i: int) -> tuple[list[int], list[int]]:
        """(run starts, lengths) of row ``i`` as Python lists."""
        a, b = int(self.row_runs[i]), int(self.row_runs[i + 1])
        return self.start[a:b].tolist(), self.length[a:b].tolist()

    def take(self, a: int, b: int) -> "BlockRuns":
        """Rows ``a:b`` (``0 <= a <= b <= len``) as their own :class:`BlockRuns` (arrays sliced)."""
        r0, r1 = int(self.row_runs[a]), int(self.row_runs[b])
        out = object.__new__(BlockRuns)
        out.start = self.start[r0:r1]
        out.length = self.length[r0:r1]
        out.row_runs = self.row_runs[a:b + 1] - r0
        out.offsets = self.offsets[a:b + 1] - self.offsets[a]
        return out

    def equals(self, other: "BlockRuns") -> bool:
        """Same rows and ids (canonical runs make this an array comparison)."""
        return (np.array_equal(self.row_runs, other.row_runs)
                and np.array_equal(self.start, other.start)
                and np.array_equal(self.length, other.length))

    def __repr__(self) -> str:
        return f"BlockRuns(rows={len(self)}, runs={len(self.start)}, ids={self.num_ids})"


#: Runs of at least this many ids keep their id tuple in :data:`_RUN_TUPLES` (a shared prefix is
#: read by every request of its burst).
_CACHED_RUN = 32
_RUN_TUPLES: dict = {}
_RUN_TUPLES_MAX = 256


def tuple_of_pieces(starts, lens) -> tuple:
    """The ids ``s, s + 1, ..., s + l - 1`` of every piece ``(s, l)``, in order, as a tuple of ints.

    Tuples of long runs are kept (a bounded cache: the value depends only on ``(s, l)``), so the
    requests of a burst share their prefix's tuple and only join their own ids to it.
    """
    out = ()
    cache = _RUN_TUPLES
    for s, ln in zip(starts, lens):
        if ln >= _CACHED_RUN:
            key = (s, ln)
            t = cache.get(key)
            if t is None:
                if len(cache) >= _RUN_TUPLES_MAX:
                    cache.clear()
                t = cache[key] = tuple(range(s, s + ln))
        else:
            t = tuple(range(s, s + ln))
        out = t if not out else out + t
    return out


__all__ = ["BlockRuns", "tuple_of_pieces"]
