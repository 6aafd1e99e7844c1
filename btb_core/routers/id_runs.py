"""Runs of block ids: a request's ids as a few stretches of consecutive ids, which the routers'
books keep instead of blocks (:class:`~btb_core.routers.holder_sets.RunBook`: ``kv_aware``'s book of
active blocks, ``btb_adaptive``'s book of pending prefills; ``llm_d``'s index).

Keeping such a book block by block (:class:`~btb_core.routers.holder_sets.BookHolders`) costs a
dict operation per block of every request added and removed (a Bursted-shaped request has ~220
blocks).

A trace's ids are interned in order of first appearance (:mod:`btb_core.trace.runs`), so a
request's ids are a few *runs*: maximal stretches of consecutive ids ``s, s + 1, ..``. Ids are
chained (every id has one parent), so an id ``y`` starts a run in every path that holds it or in
none (it does exactly when its parent is not ``y - 1``), and a path that holds a run's first id
``s`` holds the same ids before ``s`` as every other path through ``s``. A book of whole root
paths then holds id ``s + j`` of run ``s`` exactly when one of its paths has a run at ``s`` longer
than ``j``, and holds everything before ``s`` whenever it holds ``s``. So per run start and
replica the book keeps the multiset of run lengths of its paths and their maximum (the *reach*):
adding or removing a request is one dict update per run (1-3 on the shipped traces), and a
replica's matched depth is the first run of the query the replica's reach does not cover, as
SGLang's radix tree compresses a chain of single-child nodes into one edge
(``sgl-model-gateway/src/policies/tree.rs``, sgl-project/sglang @ 24ce7f6c).
"""

from __future__ import annotations


def runs_of_ids(ids, n: int | None = None) -> tuple[list[int], list[int]]:
    """``(starts, lengths)``: the maximal stretches of consecutive ids of ``ids[:n]``, in order.

    Chained ids interned in order of first appearance increase along a path, so each stretch's
    end is found by a binary search and checked in one C-level comparison; ids that are not
    (hand-written test ids) fall back to a scan of that stretch. Same answer either way.
    """
    n = len(ids) if n is None or n > len(ids) else n
    starts: list[int] = []
    lens: list[int] = []
    a = 0
    while a < n:
        s = ids[a]
        lo, hi = a + 1, n          # ids[a:lo] is consecutive
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ids[mid - 1] - s == mid - 1 - a:
                lo = mid
            else:
                hi = mid - 1
        if lo - a > 2 and tuple(ids[a:lo]) != tuple(range(s, s + lo - a)):
            lo = a + 1             # not increasing: scan
            while lo < n and ids[lo] == ids[lo - 1] + 1:
                lo += 1
        starts.append(s)
        lens.append(lo - a)
        a = lo
    return starts, lens


def request_runs(request) -> tuple[list[int], list[int]]:
    """The runs of ``request.hash_ids`` (see :func:`runs_of_ids`). A simulator request carries
    its row's pieces (``(run starts, lengths)`` its ``hash_ids`` are built from,
    :mod:`btb_core.sim.blocks`), which are these runs without reading the ids; any other request
    (a real engine's replay, a test's) is split from its ids."""
    src = getattr(request, "_source", None)
    if src is not None and len(src) == 2:
        starts, lens = src
        for k in range(1, len(starts)):
            if starts[k] == starts[k - 1] + lens[k - 1]:
                break
        else:
            return starts, lens
        out_s, out_l = [starts[0]], [lens[0]]   # canonical: merge pieces that continue each other
        for s, ln in zip(starts[1:], lens[1:]):
            if s == out_s[-1] + out_l[-1]:
                out_l[-1] += ln
            else:
                out_s.append(s)
                out_l.append(ln)
        return out_s, out_l
    return runs_of_ids(request.hash_ids)


def truncate_runs(starts, lens, n: int) -> tuple[list[int], list[int]]:
    """The runs (or pieces) of the first ``n`` ids of a path given as ``(starts, lens)``; the
    whole path when ``n`` is at least its length, nothing when ``n <= 0`` (new lists either way)."""
    out_s: list[int] = []
    out_l: list[int] = []
    for s, ln in zip(starts, lens):
        if n <= 0:
            break
        out_s.append(s)
        if ln >= n:
            out_l.append(n)
            break
        out_l.append(ln)
        n -= ln
    return out_s, out_l


__all__ = ["request_runs", "runs_of_ids", "truncate_runs"]
