"""The block-by-block approximate prefix index that :mod:`btb_core.routers.prefix_tree` replaced.

:class:`BlockPrefixIndex` keeps one dict entry per (replica, block) and per block; the run tree of
:class:`~btb_core.routers.prefix_tree.ApproxPrefixIndex` keeps one node per stretch of blocks and
gives the same answers (``tests/test_router_incremental.py`` runs both in lockstep). It stays as
the reference for those tests and for ``benchmarks/bench_router_scaling.py``; routers do not use it.

What follows is the original description.

This is the data structure behind SGLang's cache-aware policy (a multi-tenant radix tree, one tenant
per worker, ``sgl-model-gateway/src/policies/tree.rs``, sgl-project/sglang @ 24ce7f6c), at block
rather than character granularity. Because trace ``hash_ids`` are chained (equal id at position i
means equal first ``(i + 1) * block_tokens`` tokens; ``DESIGN.md`` section 2), a block id names one
node of one global prefix tree and its parent is the previous id of any prompt that contains it.

Invariant: a replica's node set is prefix-closed along every prompt (insertion adds the whole path;
eviction removes only leaves), so "is ``hash_ids[k]`` present" is monotone in ``k`` and the longest
match is a binary search, ``O(log L)`` per replica for an ``L``-block prompt.

Eviction follows ``Tree::evict_tenant_by_size``: while a replica's size exceeds the bound, remove
its least-recently-used leaf (a leaf for that replica: no child of it is held by the same replica;
ties in access time go to the node that entered the tree first). The leaves wait in a heap that
insertion keeps current, so a trim costs time in proportion to what it removes.
Sizes are counted in tokens (SGLang counts characters of raw text; ``max_tree_size`` in this
project is tokens).
"""

from __future__ import annotations

import heapq
from typing import Sequence

from .holder_sets import leading_held, set_bit_nested
from .prefix_tree import mask_replicas


class BlockPrefixIndex:
    """Per-replica approximate prefix trees over chained block ids.

    Parameters
    ----------
    num_replicas : int
        Replicas are ``0 .. num_replicas - 1``.

    Notes
    -----
    Memory is one dict entry per (replica, block) held plus one global entry per distinct block.
    """

    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas
        # node -> access time, lazily: exact for leaves (see insert); access_times() gives all
        self._time: list[dict] = [dict() for _ in range(num_replicas)]
        self._children: list[dict] = [dict() for _ in range(num_replicas)]  # node -> #children held
        self._rank: list[dict] = [dict() for _ in range(num_replicas)]      # node -> insertion rank
        self._next_rank = [0] * num_replicas
        self._leaves: list[list] = [[] for _ in range(num_replicas)]  # heap (time, rank, node)
        self._size_tokens = [0] * num_replicas
        self._parent: dict = {}   # node -> parent node (None at the root's children)
        self._tokens: dict = {}   # node -> tokens the block covers (last block may be partial)
        self._first: dict = {}    # node -> replica that inserted it first (the gateway's tenant)
        # node -> bitmask of the replicas holding it (bit r = replica r): the tenant set SGLang
        # keeps per node (Node::tenant_last_access_time in sgl-router/src/tree.rs,
        # sgl-project/sglang @ 8613c481). Trees are prefix-closed, so along a prompt the masks
        # only lose bits and the deepest node any replica holds is a binary search (deepest_match)
        self._holders: dict = {}

    # -- queries -------------------------------------------------------------------------------
    def match_blocks(self, replica: int, hash_ids: Sequence) -> int:
        """Number of leading ``hash_ids`` present in ``replica``'s tree (longest prefix match)."""
        return leading_held(hash_ids, self._time[replica], len(hash_ids))

    def match_tokens(self, replica: int, hash_ids: Sequence, input_length: int,
                     block_tokens: int) -> int:
        """Matched prompt tokens: ``min(matched_blocks * block_tokens, input_length)``."""
        return min(self.match_blocks(replica, hash_ids) * block_tokens, int(input_length))

    def first_holder(self, node) -> int | None:
        """The replica whose prompt first inserted block ``node`` into any tree, or None.

        In SGLang's character tree a node's cached tenant (``last_tenant``) is the tenant that
        created it, split nodes inherit it, and ``prefix_match_with_counts`` returns that tenant for
        the node where the match ends while it still holds the node (``tree.rs``, sgl-project/sglang
        @ 03744dbe). With chained ids, the creator of the characters of block ``node`` is the first
        replica that inserted a prompt containing ``node``.
        """
        return self._first.get(node)

    def root_holders(self, node) -> list[int]:
        """Replicas whose tree holds ``node`` (ascending; empty if none). For a first-block node,
        every other replica matches 0 blocks of a prompt starting with it."""
        return mask_replicas(self._holders.get(node, 0))

    def holder_mask(self, node) -> int:
        """Bitmask of the replicas whose tree holds ``node`` (bit ``r`` set for replica ``r``)."""
        return self._holders.get(node, 0)

    def holder_mask_at(self, hash_ids: Sequence, k: int) -> int:
        """:meth:`holder_mask` of ``hash_ids[k - 1]`` (``1 <= k <= len(hash_ids)``)."""
        return self.holder_mask(hash_ids[k - 1])

    def first_holder_at(self, hash_ids: Sequence, k: int) -> int | None:
        """:meth:`first_holder` of ``hash_ids[k - 1]``."""
        return self.first_holder(hash_ids[k - 1])

    def deepest_match(self, hash_ids: Sequence, allowed_mask: int = -1) -> int:
        """Largest ``k`` such that some replica in ``allowed_mask`` holds ``hash_ids[:k]`` (0 if
        none): the longest match over all replicas, by binary search on the nested holder masks,
        ``O(log L)`` whatever the number of replicas."""
        holders = self._holders
        lo, hi = 0, len(hash_ids)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if holders.get(hash_ids[mid - 1], 0) & allowed_mask:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def access_times(self, replica: int) -> dict:
        """``{node: last access s}`` of every node in ``replica``'s tree: the latest insert whose
        path went through it (the stamps an eager restamp of every path node would leave).
        ``O(nodes log nodes)``; for tests and inspection, not the hot path."""
        held, parent = self._time[replica], self._parent
        depth: dict = {}
        for h in held:
            path = []
            x = h
            while x is not None and x not in depth:
                path.append(x)
                x = parent[x]
            d = -1 if x is None else depth[x]
            for y in reversed(path):
                d += 1
                depth[y] = d
        times = dict(held)
        for h in sorted(held, key=depth.__getitem__, reverse=True):
            p = parent[h]
            if p is not None and times[p] < times[h]:
                times[p] = times[h]
        return times

    def size_tokens(self, replica: int) -> int:
        """Tokens held in ``replica``'s tree (SGLang ``tenant_char_count``, in tokens)."""
        return self._size_tokens[replica]

    def num_blocks(self, replica: int) -> int:
        """Blocks (nodes) held in ``replica``'s tree."""
        return len(self._time[replica])

    # -- updates -------------------------------------------------------------------------------
    def insert(self, replica: int, hash_ids: Sequence, input_length: int, block_tokens: int,
               now_s: float) -> None:
        """Add the prompt's whole block path to ``replica``'s tree and stamp it ``now_s``.

        Parameters
        ----------
        replica : int
        hash_ids : sequence of hashable
            Chained block ids of the prompt.
        input_length, block_tokens : int
            Prompt tokens and tokens per block (the last block covers the remainder).
        now_s : float
            Access time in simulated seconds (the LRU clock).

        Notes
        -----
        Cost: two binary searches and a few C-level dict updates over the nodes new to the
        replica's tree; no per-node Python loop. Access times are kept lazily: the insert stamps
        only its last node and the nodes it adds, and an evicted node hands its time to its parent
        (see :meth:`evict_to`). A node's stamp can lag behind the last access through it while it
        has children, but equals it whenever the node is a leaf, the only time eviction reads it,
        so the trees evolve exactly as if every node of the path were restamped.
        """
        n = len(hash_ids)
        if not n:
            return
        held = self._time[replica]
        children = self._children[replica]
        # The replica's tree is prefix-closed, so the path's nodes it holds are the first m
        m = leading_held(hash_ids, held, n)
        last = hash_ids[n - 1]
        if m < n:
            new = hash_ids[m:n]
            tokens_map = self._tokens
            # nodes ever inserted anywhere are prefix-closed too (they are never forgotten): the
            # first g are known, the rest enter the global tree now
            g = leading_held(hash_ids, tokens_map, n, m)
            if g < n:
                if g < n - 1:
                    tokens_map.update(dict.fromkeys(hash_ids[g:n - 1], block_tokens))
                tokens_map[last] = max(1, int(input_length) - (n - 1) * block_tokens)
                parent_map = self._parent
                if g:
                    parent_map.update(zip(hash_ids[g:n], hash_ids[g - 1:n - 1]))
                else:
                    parent_map[hash_ids[0]] = None
                    parent_map.update(zip(hash_ids[1:n], hash_ids[0:n - 1]))
                self._first.update(dict.fromkeys(hash_ids[g:n], replica))
                self._holders.update(dict.fromkeys(hash_ids[g:n], 1 << replica))
            if m < g:   # known nodes other replicas may hold: add this replica's bit
                set_bit_nested(self._holders, hash_ids, m, g, 1 << replica, True)
            self._size_tokens[replica] += sum(map(tokens_map.__getitem__, new))
            # every new node but the last has exactly one child (the next); the node before them
            # gains one
            if n - m > 1:
                children.update(dict.fromkeys(hash_ids[m:n - 1], 1))
            children[last] = 0
            if m:
                children[hash_ids[m - 1]] += 1
            nr = self._next_rank[replica]
            self._rank[replica].update(zip(new, range(nr, nr + n - m)))
            self._next_rank[replica] = nr + n - m
            held.update(dict.fromkeys(new, now_s))
        else:
            held[last] = now_s
        # Only the path's last node can be a leaf (every other one has the next as a child); its
        # older heap entries go stale (their time differs, or the node gained a child).
        if children[last] == 0:
            heap = self._leaves[replica]
            heapq.heappush(heap, (now_s, self._rank[replica][last], last))
            if len(heap) > 2 * len(held) + 1024:
                self._compact(replica)

    def _compact(self, replica: int) -> None:
        """Rebuild ``replica``'s leaf heap from its held leaves (drops stale entries)."""
        held, children, rank = self._time[replica], self._children[replica], self._rank[replica]
        heap = [(t, rank[h], h) for h, t in held.items() if children[h] == 0]
        heapq.heapify(heap)
        self._leaves[replica] = heap

    def evict_to(self, replica: int, max_tokens: int) -> int:
        """Remove LRU leaves of ``replica`` until its size is ``<= max_tokens``; returns blocks
        removed. Ties in access time go to the node inserted into the tree first.

        Leaves wait in a heap kept up to date by :meth:`insert` (stale entries are skipped when
        popped and compacted away when they outnumber the held nodes), so a call costs
        ``O(1 + removed x log n)`` amortised rather than a pass over the whole tree.
        """
        if self._size_tokens[replica] <= max_tokens:
            return 0
        held = self._time[replica]
        children = self._children[replica]
        rank = self._rank[replica]
        heap = self._leaves[replica]
        tokens, parent = self._tokens, self._parent
        removed = 0
        while heap and self._size_tokens[replica] > max_tokens:
            t, r, h = heapq.heappop(heap)
            if held.get(h) != t or rank.get(h) != r or children[h] != 0:
                continue  # stale entry: touched again, gained a child, or removed and re-added
            del held[h]
            del children[h]
            del rank[h]
            self._size_tokens[replica] -= tokens[h]
            removed += 1
            p = parent[h]
            m = self._holders[h] & ~(1 << replica)
            if m:
                self._holders[h] = m
            else:
                del self._holders[h]
            if p is not None and p in children:
                # the parent was accessed at least as late as its evicted child (lazy stamps,
                # see insert)
                if held[p] < t:
                    held[p] = t
                children[p] -= 1
                if children[p] == 0:
                    heapq.heappush(heap, (held[p], rank[p], p))
        return removed


__all__ = ["BlockPrefixIndex"]
