"""Router-side holder sets: block id -> the replicas whose router book holds it.

Several routers keep a per-replica book of the chained block ids of requests they sent there
(Dynamo's active blocks in ``kv_aware``, ``btb_adaptive``'s queued prefills). Such a book is
*prefix-closed*: every request adds or removes a whole root path, so a replica that holds block
``ids[k]`` also holds ``ids[k - 1]``. Along one request's ids the holder sets are then nested,
``H(ids[k]) <= H(ids[k - 1])``, and a replica's matched depth is the last ``k`` whose set still
names it. :class:`BookHolders` keeps the sets incrementally as the book changes, and
:meth:`BookHolders.depths` finds every replica's depth by binary search on the set sizes (they only
shrink along the path): ``O(d log L)`` size look-ups for ``d`` distinct depths plus one C-level set
difference per depth, instead of one binary search per replica (SGLang's radix tree keeps the same
per-node tenant sets, ``sgl-model-gateway/src/policies/tree.rs``, sgl-project/sglang @ 24ce7f6c).

The same nesting makes the updates cheap. Reference counts only fall along a root path (every
request through ``ids[k]`` also passes ``ids[k - 1]``), so adding a request enters a trailing
stretch of new ids and removing it drops a trailing stretch whose count reaches 0, each found by
one binary search; only the counts themselves change id by id, the holder masks change once per
stretch of equal masks (:func:`set_bit_nested`).
"""

from __future__ import annotations

from .id_runs import truncate_runs


class BookHolders:
    """Per-replica reference-counted books of block ids plus, per block, the replicas holding it.

    Parameters
    ----------
    num_replicas : int

    Attributes
    ----------
    books : list[dict]
        ``books[r]`` maps block id -> reference count (>= 1) on replica ``r``.
    holders : dict
        Block id -> bitmask of the replicas whose book holds it (bit ``r`` for replica ``r``).
    """

    __slots__ = ("books", "holders")

    def __init__(self, num_replicas: int) -> None:
        self.books: list[dict] = [dict() for _ in range(num_replicas)]
        self.holders: dict = {}

    def add(self, replica: int, ids) -> int:
        """Count every id of ``ids`` (a root path of chained ids) once more on ``replica``;
        returns how many were new there.

        The book is prefix-closed, so the ids it already holds are the first ``m`` (one binary
        search): those are counted up and the rest entered in C-level dict updates, and the
        holder masks change only along the new part, one update per stretch of equal masks.
        """
        book = self.books[replica]
        n = len(ids)
        m = leading_held(ids, book, n)
        for h in ids[:m]:
            book[h] += 1
        if m < n:
            book.update(dict.fromkeys(ids[m:n], 1))
            set_bit_nested(self.holders, ids, m, n, 1 << replica, True)
        return n - m

    def remove(self, replica: int, ids) -> int:
        """Undo :meth:`add` of ``ids`` on ``replica`` (ids past the leading run it holds are
        ignored); returns how many ids left its book.

        Counts only fall along a root path (every path through an id passes its parent), so the
        ids whose count reaches 0 are a trailing stretch of the held run (one binary search).
        """
        book = self.books[replica]
        k = leading_held(ids, book, len(ids))
        if not k:
            return 0
        lo, hi = 0, k              # first position whose count is 1 (non-increasing counts)
        while lo < hi:
            mid = (lo + hi) // 2
            if book[ids[mid]] > 1:
                lo = mid + 1
            else:
                hi = mid
        for h in ids[:lo]:
            book[h] -= 1
        if lo < k:
            _delete(book, ids[lo:k])
            set_bit_nested(self.holders, ids, lo, k, 1 << replica, False)
        return k - lo

    def drop_replica(self, replica: int) -> None:
        """Forget ``replica``'s whole book (a failed replica)."""
        holders = self.holders
        keep = ~(1 << replica)
        for h in self.books[replica]:
            m = holders[h] & keep
            if m:
                holders[h] = m
            else:
                del holders[h]
        self.books[replica] = {}

    def holder_set(self, block) -> set[int]:
        """The replicas whose book holds ``block``."""
        return set(_bits(self.holders.get(block, 0)))

    def depths(self, ids, limit: int | None = None) -> dict[int, int]:
        """``{replica: k}``: the longest leading run of ``ids`` (at most ``limit``) in each
        replica's book, for the replicas where ``k >= 1`` (the others hold 0).

        Valid for prefix-closed books (see the module docstring); equal to a binary search per
        replica, as ``kv_aware`` and ``btb_adaptive`` did before.
        """
        n = len(ids) if limit is None or limit > len(ids) else limit
        if n <= 0:
            return {}
        holders = self.holders
        first = holders.get(ids[0], 0)
        if not first:
            return {}
        out: dict[int, int] = {}
        if first.bit_count() <= 4:   # few holders: a binary search in each one's book is cheaper
            for r in _bits(first):
                out[r] = leading_held(ids, self.books[r], n, 1)
            return out
        # mask(k) = replicas holding the first k ids; the masks only lose bits as k grows. Find
        # every k in [1, n) where it changes (the replicas that stop there) by bisection.
        masks = {1: first}

        def mask(k):
            m = masks.get(k)
            if m is None:
                m = masks[k] = holders.get(ids[k - 1], 0)
            return m

        stack = [(1, n)]
        while stack:
            lo, hi = stack.pop()
            if mask(lo) == mask(hi):
                continue
            if hi == lo + 1:
                for r in _bits(mask(lo) & ~mask(hi)):
                    out[r] = lo
                continue
            mid = (lo + hi) // 2
            stack.append((mid, hi))
            stack.append((lo, mid))
        for r in _bits(mask(n)):
            out[r] = n
        return out


class RunBook:
    """Per-replica reference-counted books of root paths, kept per block run, with, per run, the
    replicas holding part of it: :class:`BookHolders`' books at the cost of a path's pieces instead
    of its blocks.

    A path is given by its pieces ``(starts, lens)``: piece ``k`` is ids ``starts[k] ..
    starts[k] + lens[k] - 1``, a leading part of the run (maximal stretch of consecutive chained
    ids) that starts at ``starts[k]`` (:meth:`btb_core.sim.blocks.BlockIndex.path_pieces`, or
    :func:`~btb_core.routers.id_runs.runs_of_ids` of the ids). Chained ids give every id one parent, so any path holding id
    ``s + j`` of a run holds ``s .. s + j`` as well: a book of whole root paths holds, of every run,
    a leading part, as long as the longest piece booked there. One length per (run, replica) then
    says what the book holds, and a path's match is one walk over its pieces (as
    :meth:`btb_core.sim.holders.HolderIndex.matched` does for the caches).

    Parameters
    ----------
    num_replicas : int

    Attributes
    ----------
    runs : dict[int, dict[int, int]]
        Run start -> {replica: leading blocks of the run in its book (>= 1)}; replicas holding
        none are absent.
    pieces : list[dict[int, dict[int, int]]]
        ``pieces[r]``: run start -> {piece length: paths booked on ``r`` with that piece}.
    sizes : list[int]
        ``sizes[r]``: distinct blocks in replica ``r``'s book (a shared prefix counted once).
    """

    __slots__ = ("runs", "pieces", "sizes")

    def __init__(self, num_replicas: int) -> None:
        self.runs: dict[int, dict[int, int]] = {}
        self.pieces: list[dict] = [dict() for _ in range(num_replicas)]
        self.sizes: list[int] = [0] * num_replicas

    def add(self, replica: int, starts, lens) -> int:
        """Book the path of pieces ``(starts, lens)`` (lengths >= 1) once more on ``replica``;
        returns how many of its blocks were new in that replica's book."""
        runs = self.runs
        mine = self.pieces[replica]
        new = 0
        for s, ln in zip(starts, lens):
            counts = mine.get(s)
            if counts is None:
                mine[s] = {ln: 1}
                d = runs.get(s)
                if d is None:
                    runs[s] = {replica: ln}
                else:
                    d[replica] = ln
                new += ln
            else:
                counts[ln] = counts.get(ln, 0) + 1
                d = runs[s]
                c = d[replica]
                if ln > c:
                    d[replica] = ln
                    new += ln - c
        self.sizes[replica] += new
        return new

    def remove(self, replica: int, starts, lens) -> int:
        """Undo one :meth:`add` of the same pieces on ``replica``; returns how many blocks left
        its book. Raises ``KeyError`` if that path is not booked there."""
        runs = self.runs
        mine = self.pieces[replica]
        gone = 0
        for s, ln in zip(starts, lens):
            counts = mine[s]
            k = counts[ln] - 1
            if k:
                counts[ln] = k
                continue
            del counts[ln]
            d = runs[s]
            c = d[replica]
            if ln == c:                 # the longest piece left: the run shrinks to the next one
                if counts:
                    m = max(counts)
                    d[replica] = m
                    gone += c - m
                else:
                    del mine[s]
                    del d[replica]
                    if not d:
                        del runs[s]
                    gone += c
        self.sizes[replica] -= gone
        return gone

    def drop_replica(self, replica: int) -> None:
        """Forget ``replica``'s whole book (a failed replica)."""
        runs = self.runs
        for s in self.pieces[replica]:
            d = runs[s]
            del d[replica]
            if not d:
                del runs[s]
        self.pieces[replica] = {}
        self.sizes[replica] = 0

    def held(self, replica: int) -> dict[int, int]:
        """``{run start: leading blocks held}`` of ``replica``'s book."""
        return {s: self.runs[s][replica] for s in self.pieces[replica]}

    def depths(self, starts, lens, limit: int | None = None) -> dict[int, int]:
        """``{replica: k}``: how many leading blocks of the path of pieces ``(starts, lens)``, at
        most ``limit`` (None: no limit), each replica's book holds, for the replicas where
        ``k >= 1`` (the others hold 0); equal to :meth:`BookHolders.depths` of the same ids
        (checked in tests/test_router_incremental.py and, with a limit, tests/test_pending_runs.py).
        See :func:`piece_depths`."""
        if limit is not None and sum(lens) > limit:
            starts, lens = truncate_runs(starts, lens, limit)
        return piece_depths(self.runs, starts, lens)

    def depth(self, replica: int, starts, lens, limit: int) -> int:
        """:meth:`depths` of one replica, at most ``limit`` (0 when its book holds none of the
        path)."""
        runs = self.runs
        acc = 0
        for s, k in zip(starts, lens):
            if acc >= limit:
                break
            if k > limit - acc:
                k = limit - acc
            rs = runs.get(s)
            m = rs.get(replica, 0) if rs else 0
            if m < k:
                return acc + m
            acc += k
        return acc


def piece_depths(runs: dict, starts, lens) -> dict[int, int]:
    """``{replica: k}`` for a map ``runs`` of ``{first id of a run: {replica: leading ids of that
    run it holds}}``: how many leading ids of the path of pieces ``(starts, lens)`` (each piece a
    run of consecutive ids starting at ``starts[k]``, ``lens[k]`` long) each replica holds, for the
    replicas where ``k >= 1``.

    One walk over the pieces, visiting at each piece only the replicas that held every earlier
    piece whole. Used by :class:`RunBook` (``kv_aware``'s book of active blocks) and by
    ``llm_d``'s approximate index (its leading parts per run).
    """
    out: dict[int, int] = {}
    if not starts:
        return out
    d = runs.get(starts[0])
    if not d:
        return out
    ln = lens[0]
    alive = []
    for r, c in d.items():
        if c >= ln:
            alive.append(r)
        else:
            out[r] = c
    pos = ln
    for k in range(1, len(starts)):
        if not alive:
            return out
        d = runs.get(starts[k])
        if not d:
            break
        ln = lens[k]
        nxt = []
        for r in alive:
            c = d.get(r, 0)
            if c >= ln:
                nxt.append(r)
            else:
                out[r] = pos + c
        alive = nxt
        pos += ln
    for r in alive:
        out[r] = pos
    return out


#: The pieces of a path's first ``n`` blocks: :func:`~btb_core.routers.id_runs.truncate_runs`
#: (pieces and runs are cut the same way).
leading_pieces = truncate_runs


def leading_held(ids, held, limit: int, known: int = 0) -> int:
    """How many leading ids of ``ids[:limit]`` are in ``held``, given that the first ``known`` are
    (binary search: a held set of chained prefixes holds every id before a held one)."""
    lo, hi = known, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ids[mid - 1] in held:
            lo = mid
        else:
            hi = mid - 1
    return lo


def nested_depths(acc) -> dict[int, int]:
    """``{replica: k}`` from nested masks ``acc`` (``acc[k]``: bitmask of the replicas matching at
    least ``k + 1`` leading blocks, only losing bits as ``k`` grows): ``k`` is the number of masks
    holding the replica's bit, for every replica of ``acc[0]``. Found by bisection on the masks,
    ``O(d log L)`` for ``d`` distinct masks."""
    n = len(acc)
    out: dict[int, int] = {}
    if not n:
        return out
    stack = [(0, n - 1)]
    while stack:
        lo, hi = stack.pop()
        if acc[lo] == acc[hi]:
            continue
        if hi == lo + 1:
            for r in _bits(acc[lo] & ~acc[hi]):
                out[r] = lo + 1
            continue
        mid = (lo + hi) // 2
        stack.append((mid, hi))
        stack.append((lo, mid))
    for r in _bits(acc[n - 1]):
        out[r] = n
    return out


def set_bit_nested(masks: dict, ids, lo: int, hi: int, bit: int, on: bool) -> None:
    """Set (``on``) or clear ``bit`` in ``masks[ids[k]]`` for ``k`` in ``[lo, hi)`` (absent = 0;
    a mask that becomes 0 is deleted), given masks that only lose bits along ``ids`` (holder sets
    of prefix-closed books or trees). Equal masks at both ends of a range then mean one value over
    it, so the range is split only where the mask changes and each constant stretch is one
    C-level update: ``O(d log L)`` look-ups for ``d`` distinct masks instead of one step per id."""
    get = masks.get
    stack = [(lo, hi)]
    while stack:
        a, b = stack.pop()
        va = get(ids[a], 0)
        if b - a == 1 or va == get(ids[b - 1], 0):
            v = va | bit if on else va & ~bit
            if v:
                masks.update(dict.fromkeys(ids[a:b], v))
            elif va:
                _delete(masks, ids[a:b])
            continue
        mid = (a + b) // 2
        stack.append((mid, b))
        stack.append((a, mid))


def _delete(d: dict, keys) -> None:
    """``del d[k]`` for every ``k`` of ``keys`` (all present)."""
    for k in keys:
        del d[k]


def _bits(mask: int):
    """Replica numbers of the set bits of ``mask``, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


__all__ = ["BookHolders", "RunBook", "leading_held", "leading_pieces", "nested_depths",
           "set_bit_nested"]
