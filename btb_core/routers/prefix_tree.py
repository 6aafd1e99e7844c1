"""A router's own approximate prefix index: per-replica block trees of the prompts it routed there.

This is the data structure behind SGLang's cache-aware policy (a multi-tenant radix tree, one tenant
per worker, ``sgl-model-gateway/src/policies/tree.rs``, sgl-project/sglang @ 24ce7f6c), at block
rather than character granularity. Because trace ``hash_ids`` are chained (equal id at position i
means equal first ``(i + 1) * block_tokens`` tokens; ``DESIGN.md`` section 2), a block id names one
node of one global prefix tree and its parent is the previous id of any prompt that contains it.

Each replica's tree is a prefix-closed part of that global tree (insertion adds the whole path;
eviction removes only leaves), and every block carries, per replica holding it, an access time
(the latest insert whose path went through it) and an insertion rank (the order in which blocks
entered that replica's tree).

Eviction follows ``Tree::evict_tenant_by_size``: while a replica's size exceeds the bound, remove
its least-recently-used leaf (a leaf for that replica: no child of it is held by the same replica;
ties in access time go to the block that entered the replica's tree first). Sizes are counted in
tokens (SGLang counts characters of raw text; ``max_tree_size`` in this project is tokens).

Layout: a radix tree of runs
----------------------------
The blocks are stored as a radix tree whose nodes are *runs*: chains of blocks in which every block
but the last has exactly one child, and on which every replica holds all blocks or none, with one
access time per holder and consecutive ranks (SGLang's nodes are likewise runs of tokens split
where prompts diverge). A node is split when a prompt diverges or ends inside it, or when a
replica's eviction trims it; nodes are never merged. A node stores its ids as a ``range`` when
they are consecutive ints (trace ids are interned in order of first appearance, so a prompt is a
few runs of consecutive ids, :mod:`btb_core.trace.runs`) and as a tuple otherwise. Per replica, a
dict maps each node it holds to ``[access time, rank of the first block, children held]``.

So a request costs a walk over the few nodes of its path (one dict look-up and, where the path
leaves a node, one binary search over it) instead of a dict operation per block, and memory is one
entry per node and per (replica, node) held instead of one per block and per (replica, block): on
100,000 rows of the Bursted-shaped trace with ``btb`` on 256 replicas, 95,902 nodes for 1,077,229
blocks and 97,567 (replica, node) pairs for 1,318,843 (replica, block) pairs
(``benchmarks/bench_policies.py --fleet`` measures the whole replay).

Why eviction can work node by node. Along a node all of a holder's blocks share one access time
and ranks grow towards the tail, so the holder's next leaf after removing the node's tail block is
the block before it, with the same time and a smaller rank: still the least recently used. A trim
therefore removes the tail blocks of its least-recently-used leaf node in one step (as many as
the bound needs, splitting the node if it keeps a head part), and only a node that empties
completely can make its parent a leaf. Access times are stamped on every node of an inserted path
(eager, as the node count of a path is small); with a non-decreasing clock (the simulator's) this
equals the lazily stamped per-block index it replaced
(:class:`~btb_core.routers.prefix_tree_blocks.BlockPrefixIndex`, kept as the tests' reference).
"""

from __future__ import annotations

import heapq
from itertools import count
from typing import Sequence


def _matched(id_at, p: int, cids, lim: int) -> int:
    """How many of a node's ids ``cids`` the request's ids from position ``p`` match, given that
    the first matches and the ``lim``-th does not (``id_at(q)`` = the request's id at ``q``).
    Block ids are chained (equal at a position means equal at every earlier one), so the
    boundary is found by binary search."""
    lo, hi = 1, lim - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if id_at(p + mid - 1) == cids[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Node:
    """A run of blocks of the global tree (see the module docstring)."""

    __slots__ = ("ids", "parent", "children", "holders", "first", "bt", "last_tok")

    def __init__(self, ids, parent, holders: int, first: int, bt: int, last_tok: int) -> None:
        self.ids = ids              # range (consecutive ints) or tuple of the blocks' ids
        self.parent = parent        # _Node (the root for a prompt's first node)
        self.children = None        # None or {first id of the child: child _Node}
        self.holders = holders      # bitmask of the replicas holding every block of the node
        self.first = first          # replica whose insert created these blocks
        self.bt = bt                # tokens of every block but the last
        self.last_tok = last_tok    # tokens of the last block (a prompt's last may be partial)

    def tokens(self) -> int:
        return (len(self.ids) - 1) * self.bt + self.last_tok


def _as_ids(seq) -> range | tuple:
    """``seq`` as a ``range`` when it is consecutive ints (the common case), else a tuple."""
    seq = tuple(seq)
    a = seq[0]
    if type(a) is int and type(seq[-1]) is int and seq[-1] - a == len(seq) - 1:
        r = range(a, a + len(seq))
        if len(seq) <= 2 or seq == tuple(r):
            return r
    return seq


class PiecePath:
    """A block path given as pieces of runs instead of an id tuple: ids ``starts[k], starts[k] +
    1, ..., starts[k] + lens[k] - 1`` piece after piece (the simulator's request pieces,
    :mod:`btb_core.sim.blocks`), its first ``n`` (default all). Every method of
    :class:`ApproxPrefixIndex` that takes ``hash_ids`` takes one, with the same answers as for
    the tuple of its ids; walks and inserts then read ids from the pieces instead of a tuple
    built for the request. Treated as immutable (the walk cache keys on its identity).
    """

    __slots__ = ("starts", "lens", "n")

    def __init__(self, starts, lens, n: int | None = None) -> None:
        self.starts = starts
        self.lens = lens
        self.n = sum(lens) if n is None else n

    def __len__(self) -> int:
        return self.n

    def id_at(self, i: int):
        """The id at path position ``i`` (``0 <= i < n``)."""
        lens = self.lens
        k = 0
        while i >= lens[k]:
            i -= lens[k]
            k += 1
        return self.starts[k] + i

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.to_tuple()[i]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("PiecePath index out of range")
        return self.id_at(i)

    def to_tuple(self) -> tuple:
        """The path's ids as a tuple."""
        out = []
        for s, ln in zip(self.starts, self.lens):
            out.extend(range(s, s + ln))
        return tuple(out[:self.n])

    def tail_ids(self, p: int) -> range | tuple:
        """``_as_ids`` of the ids at positions ``p .. n - 1`` (``p < n``): a ``range`` straight from
        the pieces when they lie in one piece."""
        lens = self.lens
        k, o = 0, p
        while o >= lens[k]:
            o -= lens[k]
            k += 1
        if lens[k] - o >= self.n - p:
            a = self.starts[k] + o
            return range(a, a + self.n - p)
        return _as_ids(self.to_tuple()[p:])


class ApproxPrefixIndex:
    """Per-replica approximate prefix trees over chained block ids (a radix tree of runs).

    Parameters
    ----------
    num_replicas : int
        Replicas are ``0 .. num_replicas - 1``.

    Notes
    -----
    Memory is one node per run of blocks (see the module docstring) plus one entry per (replica,
    node) held; nodes, like the blocks of the per-block index before them, are never forgotten
    (:meth:`first_holder` answers for evicted blocks too). Access times must not decrease from one
    :meth:`insert` to the next (the simulated clock).
    """

    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas
        self._root = _Node((), None, 0, -1, 0, 0)
        # per replica: node -> [access time, rank of its first block, child nodes held]
        self._state: list[dict] = [dict() for _ in range(num_replicas)]
        self._next_rank = [0] * num_replicas
        # per replica: heap of leaf nodes (time, rank of the last block, seq, node), built by the
        # first trim that removes something (_compact) and kept current from then on; a replica
        # never trimmed pays nothing for it
        self._leaves: list[list] = [[] for _ in range(num_replicas)]
        self._heap_on = [False] * num_replicas
        self._seq = count()
        self._size_tokens = [0] * num_replicas
        self._num_blocks = [0] * num_replicas
        self._version = 0           # bumped by every change (the walk cache's key)
        self._walk_ids = None       # the last walked sequence (identity), its version and path
        self._walk_version = -1
        self._walk_path: list = []
        self._where = None          # block id -> node, built on demand for per-block queries

    # -- the walk ------------------------------------------------------------------------------
    def _walk(self, ids) -> list:
        """``[(node, j), ...]``: the nodes along ``ids`` from the root and how many of each node's
        blocks ``ids`` follows (all but possibly the last one's). Cached for the last sequence
        when it is a tuple (immutable: a request's ``hash_ids``) until the tree changes."""
        if ids is self._walk_ids and self._walk_version == self._version:
            return self._walk_path
        if type(ids) is PiecePath:
            return self._walk_pieces(ids)
        path = []
        n = len(ids)
        p = 0
        node = self._root
        while p < n:
            ch = node.children
            if ch is None:
                break
            c = ch.get(ids[p])
            if c is None:
                break
            cids = c.ids
            size = len(cids)
            lim = size if size < n - p else n - p
            if lim == 1 or ids[p + lim - 1] == cids[lim - 1]:
                j = lim
            else:   # chained ids: equal at a position means equal before it
                j = _matched(ids.__getitem__, p, cids, lim)
            path.append((c, j))
            p += j
            if j < size:
                break
            node = c
        self._walk_ids = ids if type(ids) is tuple else None
        self._walk_version = self._version
        self._walk_path = path
        return path

    def _walk_pieces(self, ids: PiecePath) -> list:
        """:meth:`_walk` along a :class:`PiecePath`: the same path, with each id read from the
        pieces (a node's last compared id straight from the piece it lies in)."""
        starts, lens, n = ids.starts, ids.lens, ids.n
        path = []
        p = 0
        k = o = 0                 # piece and offset of path position p
        node = self._root
        while p < n:
            ch = node.children
            if ch is None:
                break
            c = ch.get(starts[k] + o)
            if c is None:
                break
            cids = c.ids
            size = len(cids)
            lim = size if size < n - p else n - p
            if lim == 1:
                j = 1
            else:
                last = (starts[k] + o + lim - 1 if lim <= lens[k] - o
                        else ids.id_at(p + lim - 1))
                if last == cids[lim - 1]:
                    j = lim
                else:   # chained ids: equal at a position means equal before it
                    j = _matched(ids.id_at, p, cids, lim)
            path.append((c, j))
            p += j
            if j < size:
                break
            o += j
            while o >= lens[k] and p < n:
                o -= lens[k]
                k += 1
            node = c
        self._walk_ids = ids
        self._walk_version = self._version
        self._walk_path = path
        return path

    def _locate(self, block):
        """The node holding block id ``block``, or None (per-block queries; builds an index of
        every block on first use after a change, so not for the hot path)."""
        where = self._where
        if where is None:
            where = {}
            stack = [self._root]
            while stack:
                node = stack.pop()
                if node.children:
                    stack.extend(node.children.values())
                where.update(dict.fromkeys(node.ids, node))
            self._where = where
        try:
            return where.get(block)
        except TypeError:   # unhashable: not a block of this tree
            return None

    # -- queries -------------------------------------------------------------------------------
    def match_blocks(self, replica: int, hash_ids: Sequence) -> int:
        """Number of leading ``hash_ids`` present in ``replica``'s tree (longest prefix match)."""
        k = 0
        for node, j in self._walk(hash_ids):
            if not node.holders >> replica & 1:
                break
            k += j
        return k

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
        replica that inserted a prompt containing ``node``. Per-block look-up (see :meth:`_locate`);
        routers use :meth:`first_holder_at`.
        """
        n = self._locate(node)
        return None if n is None else n.first

    def first_holder_at(self, hash_ids: Sequence, k: int) -> int | None:
        """:meth:`first_holder` of ``hash_ids[k - 1]`` (``1 <= k <= len(hash_ids)``), found on
        the walk along ``hash_ids``."""
        node = self._node_at(hash_ids, k)
        return self.first_holder(hash_ids[k - 1]) if node is None else node.first

    def root_holders(self, node) -> list[int]:
        """Replicas whose tree holds ``node`` (ascending; empty if none). For a first-block node,
        every other replica matches 0 blocks of a prompt starting with it."""
        return mask_replicas(self.holder_mask(node))

    def holder_mask(self, node) -> int:
        """Bitmask of the replicas whose tree holds ``node`` (bit ``r`` set for replica ``r``).
        Per-block look-up (see :meth:`_locate`); routers use :meth:`holder_mask_at`."""
        n = self._locate(node)
        return 0 if n is None else n.holders

    def holder_mask_at(self, hash_ids: Sequence, k: int) -> int:
        """:meth:`holder_mask` of ``hash_ids[k - 1]`` (``1 <= k <= len(hash_ids)``), found on the
        walk along ``hash_ids``: 0 past the tree."""
        node = self._node_at(hash_ids, k)
        return 0 if node is None else node.holders

    def _node_at(self, hash_ids, k: int):
        """The node holding ``hash_ids[k - 1]`` on the walk along ``hash_ids``, or None."""
        if k < 1:
            return None
        p = 0
        for node, j in self._walk(hash_ids):
            p += j
            if p >= k:
                return node
        return None

    def deepest_match(self, hash_ids: Sequence, allowed_mask: int = -1) -> int:
        """Largest ``k`` such that some replica in ``allowed_mask`` holds ``hash_ids[:k]`` (0 if
        none): the longest match over all replicas, from one walk along the prompt's nodes (the
        holder sets only shrink going down), whatever the number of replicas."""
        k = 0
        for node, j in self._walk(hash_ids):
            if not node.holders & allowed_mask:
                break
            k += j
        return k

    def access_times(self, replica: int) -> dict:
        """``{block: last access s}`` of every block in ``replica``'s tree: the latest insert
        whose path went through it. ``O(blocks)``; for tests and inspection, not the hot path."""
        out: dict = {}
        for node, (t, _, _) in self._state[replica].items():
            out.update(dict.fromkeys(node.ids, t))
        return out

    def block_table(self, replica: int) -> dict:
        """``{block: (access time, insertion rank, children held)}`` of every block in
        ``replica``'s tree (the per-block view of the runs; for tests and inspection)."""
        out: dict = {}
        for node, (t, rank, kids) in self._state[replica].items():
            ids = node.ids
            for i, h in enumerate(ids):
                out[h] = (t, rank + i, kids if i == len(ids) - 1 else 1)
        return out

    def global_table(self) -> dict:
        """``{block: (parent block or None, tokens, first holder, holder mask)}`` of every block
        ever inserted (for tests and inspection)."""
        out: dict = {}
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            ids = node.ids
            if not ids:
                continue
            prev = node.parent.ids[-1] if node.parent.ids else None
            for i, h in enumerate(ids):
                tok = node.last_tok if i == len(ids) - 1 else node.bt
                out[h] = (prev, tok, node.first, node.holders)
                prev = h
        return out

    def _nodes(self) -> list:
        """Every node of the tree (not the root), parents before children."""
        out = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            out.append(node)
        return out[1:]

    def num_nodes(self) -> tuple[int, int]:
        """``(nodes, (replica, node) pairs held)``: the index's size in entries."""
        return len(self._nodes()), sum(len(s) for s in self._state)

    def size_tokens(self, replica: int) -> int:
        """Tokens held in ``replica``'s tree (SGLang ``tenant_char_count``, in tokens)."""
        return self._size_tokens[replica]

    def num_blocks(self, replica: int) -> int:
        """Blocks held in ``replica``'s tree."""
        return self._num_blocks[replica]

    # -- updates -------------------------------------------------------------------------------
    def _split(self, node: _Node, j: int) -> _Node:
        """Cut ``node`` after its first ``j`` blocks (``0 < j < len``); returns the tail node,
        which takes the children, holders and per-holder state (ranks shifted by ``j``)."""
        ids = node.ids
        tail = _Node(ids[j:], node, node.holders, node.first, node.bt, node.last_tok)
        tail.children = node.children
        if tail.children:
            for c in tail.children.values():
                c.parent = tail
        node.ids = ids[:j]
        node.last_tok = node.bt
        node.children = {tail.ids[0]: tail}
        mask = node.holders
        seq = self._seq
        while mask:
            low = mask & -mask
            r = low.bit_length() - 1
            mask ^= low
            state = self._state[r]
            x = state[node]
            state[tail] = [x[0], x[1] + j, x[2]]
            if not x[2] and self._heap_on[r]:   # the leaf is now the tail, same (time, rank)
                heapq.heappush(self._leaves[r], (x[0], x[1] + len(ids) - 1, next(seq), tail))
            x[2] = 1
        self._version += 1
        self._where = None
        return tail

    def insert(self, replica: int, hash_ids: Sequence, input_length: int, block_tokens: int,
               now_s: float) -> None:
        """Add the prompt's whole block path to ``replica``'s tree and stamp it ``now_s``.

        Parameters
        ----------
        replica : int
        hash_ids : sequence of hashable
            Chained block ids of the prompt.
        input_length, block_tokens : int
            Prompt tokens and tokens per block (the last block covers the remainder). A block's
            tokens are fixed by the first insert that contains it.
        now_s : float
            Access time in simulated seconds (the LRU clock; must not decrease between calls).

        Notes
        -----
        Cost: one walk over the path's nodes (at most one split where the prompt ends or diverges
        inside a node) and one new node for the blocks no replica had; nothing per block but the
        ``range`` test of the new blocks' ids.
        """
        pp = type(hash_ids) is PiecePath
        n = hash_ids.n if pp else len(hash_ids)
        if not n:
            return
        if hash_ids is self._walk_ids and self._walk_version == self._version:
            path = self._walk_path            # (the walk cache of _walk, checked here)
        else:
            path = self._walk_pieces(hash_ids) if pp else self._walk(hash_ids)
        if path:
            node, j = path[-1]
            if j < len(node.ids):
                self._split(node, j)
        bit = 1 << replica
        state = self._state[replica]
        rank = self._next_rank[replica]
        added_tokens = added_blocks = 0
        parent = self._root
        p = 0
        for node, j in path:
            x = state.get(node)
            if x is not None:
                x[0] = now_s
            else:   # the replica holds a prefix of the path: the rest joins its tree here
                node.holders |= bit
                state[node] = [now_s, rank, 0]
                rank += j
                added_blocks += j
                added_tokens += (len(node.ids) - 1) * node.bt + node.last_tok   # (_Node.tokens)
                if parent is not self._root:
                    state[parent][2] += 1
            parent = node
            p += j
        if p < n:   # blocks no replica had: one new node
            ids = hash_ids.tail_ids(p) if pp else _as_ids(hash_ids[p:n])
            last_tok = int(input_length) - (n - 1) * block_tokens
            node = _Node(ids, parent, bit, replica, block_tokens, last_tok if last_tok > 1 else 1)
            if parent.children is None:
                parent.children = {ids[0]: node}
            else:
                parent.children[ids[0]] = node
            state[node] = [now_s, rank, 0]
            rank += n - p
            added_blocks += n - p
            added_tokens += (n - p - 1) * block_tokens + node.last_tok   # (_Node.tokens)
            if parent is not self._root:
                state[parent][2] += 1
            parent = node
            self._where = None
        self._next_rank[replica] = rank
        self._size_tokens[replica] += added_tokens
        self._num_blocks[replica] += added_blocks
        self._version += 1
        x = state[parent]
        if not x[2] and self._heap_on[replica]:   # the path's last node is a leaf: to the heap
            heap = self._leaves[replica]
            heapq.heappush(heap, (now_s, x[1] + len(parent.ids) - 1, next(self._seq), parent))
            if len(heap) > 2 * len(state) + 1024:
                self._compact(replica)

    def _compact(self, replica: int) -> None:
        """Rebuild ``replica``'s leaf heap from its leaves (drops stale entries)."""
        seq = self._seq
        heap = [(x[0], x[1] + len(node.ids) - 1, next(seq), node)
                for node, x in self._state[replica].items() if not x[2]]
        heapq.heapify(heap)
        self._leaves[replica] = heap

    def evict_to(self, replica: int, max_tokens: int) -> int:
        """Remove LRU leaves of ``replica`` until its size is ``<= max_tokens``; returns blocks
        removed. Ties in access time go to the block inserted into the tree first.

        Leaf nodes wait in a heap built by the first trim that has to remove something and kept
        up to date by :meth:`insert` from then on (stale entries are skipped when popped and
        compacted away when they outnumber the held nodes); a leaf node loses as many tail blocks
        as the bound needs in one step (see the module docstring), so a call costs
        ``O(1 + nodes touched x log n)`` amortised.
        """
        if self._size_tokens[replica] <= max_tokens:
            return 0
        if not self._heap_on[replica]:
            self._compact(replica)
            self._heap_on[replica] = True
        state = self._state[replica]
        bit = 1 << replica
        heap = self._leaves[replica]
        root = self._root
        removed = 0
        while heap and self._size_tokens[replica] > max_tokens:
            t, r, _, node = heapq.heappop(heap)
            x = state.get(node)
            size = len(node.ids)
            if x is None or x[2] or x[0] != t or x[1] + size - 1 != r:
                continue  # stale: touched again, gained a child, split, or removed
            excess = self._size_tokens[replica] - max_tokens
            last = node.last_tok
            if last >= excess:
                k = 1
            else:
                k = 1 + -(-(excess - last) // node.bt)
            if k < size:   # keep the head: the tail becomes its own node, removed below
                node = self._split(node, size - k)
                x = state[node]
            else:
                k = size
            # the whole node leaves this replica's tree
            self._size_tokens[replica] -= node.tokens()
            self._num_blocks[replica] -= k
            removed += k
            del state[node]
            node.holders &= ~bit
            parent = node.parent
            if parent is not root:
                y = state[parent]
                y[2] -= 1
                if not y[2]:   # its access time is at least the child's (eager stamps)
                    heapq.heappush(heap, (y[0], y[1] + len(parent.ids) - 1, next(self._seq),
                                          parent))
        if removed:
            self._version += 1
        return removed


def mask_replicas(mask: int) -> list[int]:
    """Replica numbers of the set bits of ``mask``, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


__all__ = ["ApproxPrefixIndex", "PiecePath", "mask_replicas"]
