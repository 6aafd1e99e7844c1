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
"""

from __future__ import annotations


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
        """Count every id of ``ids`` once more on ``replica``; returns how many were new there."""
        book = self.books[replica]
        get = book.get
        holders = self.holders
        hget = holders.get
        bit = 1 << replica
        new = 0
        for h in ids:
            c = get(h)
            if c is None:
                book[h] = 1
                new += 1
                holders[h] = hget(h, 0) | bit
            else:
                book[h] = c + 1
        return new

    def remove(self, replica: int, ids) -> int:
        """Undo :meth:`add` of ``ids`` on ``replica`` (ids it does not hold are ignored);
        returns how many ids left its book."""
        book = self.books[replica]
        get = book.get
        holders = self.holders
        keep = ~(1 << replica)
        gone = 0
        for h in ids:
            c = get(h, 0) - 1
            if c > 0:
                book[h] = c
            elif c == 0:
                del book[h]
                gone += 1
                m = holders[h] & keep
                if m:
                    holders[h] = m
                else:
                    del holders[h]
        return gone

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


def _bits(mask: int):
    """Replica numbers of the set bits of ``mask``, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


__all__ = ["BookHolders"]
