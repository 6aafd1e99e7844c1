"""Routers' incremental structures (issue 14) against the straightforward computation they replace.

- :class:`~btb_core.routers.prefix_tree.ApproxPrefixIndex` keeps runs of blocks as radix-tree
  nodes; :class:`EagerPrefixIndex` below is the node-by-node tree (every insert restamps its whole
  path), and :class:`~btb_core.routers.prefix_tree_blocks.BlockPrefixIndex` the per-block index with
  lazy stamps the run tree replaced. Random inserts and trims on several replicas must leave the
  same trees read block by block (times, ranks, children, sizes, holder masks, first holders,
  tokens, parents), evict the same blocks, and answer every query as the per-block index does.
- :class:`~btb_core.routers.kv_aware.LogitKeys` orders kv_aware's replicas by integer keys; its
  minimum-logit set must be the float logits' and the router's picks and random draws the same
  with and without it.
"""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from btb_core.routers.prefix_tree import ApproxPrefixIndex
from btb_core.routers.prefix_tree_blocks import BlockPrefixIndex
from tests.test_routers_unit import BT as UNIT_BT, req, setup

BT = 16


class EagerPrefixIndex:
    """The reference: per-replica trees kept node by node, every insert restamps its whole path,
    LRU-leaf eviction by (access time, insertion rank) recomputed from all leaves."""

    def __init__(self, num_replicas: int) -> None:
        self.time = [dict() for _ in range(num_replicas)]
        self.children = [dict() for _ in range(num_replicas)]
        self.rank = [dict() for _ in range(num_replicas)]
        self.next_rank = [0] * num_replicas
        self.size = [0] * num_replicas
        self.parent, self.tokens, self.first = {}, {}, {}

    def insert(self, replica, ids, input_length, block_tokens, now_s):
        held, children, rank = self.time[replica], self.children[replica], self.rank[replica]
        prev = None
        for i, h in enumerate(ids):
            if h not in self.tokens:
                self.tokens[h] = (block_tokens if i < len(ids) - 1
                                  else max(1, input_length - (len(ids) - 1) * block_tokens))
                self.parent[h] = prev
                self.first[h] = replica
            if h not in held:
                self.size[replica] += self.tokens[h]
                children[h] = 0
                rank[h] = self.next_rank[replica]
                self.next_rank[replica] += 1
                if prev is not None:
                    children[prev] += 1
            held[h] = now_s
            prev = h

    def evict_to(self, replica, max_tokens):
        held, children, rank = self.time[replica], self.children[replica], self.rank[replica]
        removed = []
        while self.size[replica] > max_tokens and held:
            _, _, h = min((t, rank[h], h) for h, t in held.items() if children[h] == 0)
            del held[h], children[h], rank[h]
            self.size[replica] -= self.tokens[h]
            removed.append(h)
            p = self.parent[h]
            if p is not None:
                children[p] -= 1
        return removed

    def holders(self, node):
        return sum(1 << r for r in range(len(self.time)) if node in self.time[r])


def chain(tokens):
    """Chained ids: the id of block i names the first i + 1 tokens."""
    return tuple(tuple(tokens[: i + 1]) for i in range(len(tokens)))


def interned(paths):
    """The same paths with ids numbered in order of first appearance, as the trace loader does:
    runs of consecutive ints, the layout the simulator's traces have."""
    table: dict = {}
    return [tuple(table.setdefault(h, len(table)) for h in p) for p in paths]


OPS = st.lists(st.tuples(st.integers(0, 2),                                   # replica
                         st.lists(st.integers(0, 2), min_size=1, max_size=7),  # prompt tokens
                         st.integers(0, 5),                                    # extra tokens
                         st.integers(0, 3),                                    # time step
                         st.one_of(st.none(), st.integers(0, 14))),            # trim budget
               min_size=1, max_size=30)


def assert_same(tree: ApproxPrefixIndex, ref: EagerPrefixIndex):
    """The run tree, read block by block, is the reference's per-block state."""
    for r in range(tree.num_replicas):
        table = tree.block_table(r)
        assert tree.access_times(r) == ref.time[r]
        assert {h: t for h, (t, _, _) in table.items()} == ref.time[r]
        assert {h: k for h, (_, k, _) in table.items()} == ref.rank[r]
        assert {h: c for h, (_, _, c) in table.items()} == ref.children[r]
        assert tree.size_tokens(r) == ref.size[r]
        assert tree.num_blocks(r) == len(ref.time[r])
    nodes = set(ref.tokens)
    table = tree.global_table()
    assert set(table) == nodes
    assert {h: m for h, (_, _, _, m) in table.items() if m} == {h: ref.holders(h) for h in nodes
                                                               if ref.holders(h)}
    assert all(tree.first_holder(h) == ref.first[h] for h in nodes)
    assert all(table[h][2] == ref.first[h] for h in nodes)
    assert {h: tok for h, (_, tok, _, _) in table.items()} == ref.tokens
    assert {h: par for h, (par, _, _, _) in table.items()} == ref.parent


@settings(max_examples=300, deadline=None)
@given(ops=OPS, use_ints=st.booleans())
def test_prefix_tree_equals_the_eager_node_by_node_tree(ops, use_ints):
    paths = [chain(p) for _, p, _, _, _ in ops]
    if use_ints:
        paths = interned(paths)
    tree, ref, blocks = ApproxPrefixIndex(3), EagerPrefixIndex(3), BlockPrefixIndex(3)
    now = 0.0
    for (r, p, extra, dt, budget), ids in zip(ops, paths):
        now += dt                      # equal times happen: ties go to the insertion rank
        isl = (len(ids) - 1) * BT + 1 + extra
        tree.insert(r, ids, isl, BT, now)
        ref.insert(r, ids, isl, BT, now)
        blocks.insert(r, ids, isl, BT, now)
        if budget is not None:
            victim = (r + int(now)) % 3
            before = set(tree.access_times(victim))
            removed = ref.evict_to(victim, budget * BT)
            assert tree.evict_to(victim, budget * BT) == len(removed)
            assert blocks.evict_to(victim, budget * BT) == len(removed)
            assert before - set(tree.access_times(victim)) == set(removed)
        assert_same(tree, ref)
        for q in paths:
            want_any = 0
            for s in range(3):
                want = 0
                while want < len(q) and q[want] in ref.time[s]:
                    want += 1
                assert tree.match_blocks(s, q) == want == blocks.match_blocks(s, q)
                want_any = max(want_any, want)
            assert tree.deepest_match(q) == want_any == blocks.deepest_match(q)
            for k in range(1, len(q) + 1):
                assert tree.holder_mask_at(q, k) == blocks.holder_mask(q[k - 1])
                assert tree.first_holder_at(q, k) == blocks.first_holder(q[k - 1])


def test_prefix_tree_lazy_stamp_reaches_the_parent_at_eviction():
    """A path inserted again later (t=5) through an old node (created at t=0): the node's access
    time is 5, so once its child is evicted it outlives an older sibling branch (t=1). (The
    per-block index kept a stale stamp there and handed t=5 up at eviction; the run tree stamps
    every node of the path.)"""
    tree = ApproxPrefixIndex(1)
    tree.insert(0, (1, 2), 2 * BT, BT, 0.0)          # 1 -> 2 at t=0
    tree.insert(0, (1, 3), 2 * BT, BT, 1.0)          # 1 -> 3 at t=1
    tree.insert(0, (1, 2, 4), 3 * BT, BT, 5.0)       # through 2 again, at t=5
    assert tree.access_times(0)[2] == 5.0            # its access time is 5
    assert tree.evict_to(0, 3 * BT) == 1             # leaf 3 (t=1) goes, not 4 (t=5)
    assert set(tree.access_times(0)) == {1, 2, 4}
    assert tree.evict_to(0, 2 * BT) == 1             # then 4, leaving node 2 at t=5
    assert tree.access_times(0)[2] == 5.0


# -- BookHolders: bulk counting against a plain refcount per id ------------------------------------
BOOK_OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 5),
                              st.lists(st.integers(0, 2), min_size=1, max_size=7)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=BOOK_OPS, use_ints=st.booleans())
def test_book_counts_equal_a_refcount_per_id(ops, use_ints):
    """add/remove keep, per replica, exactly the reference counts of the ids of the paths booked
    there (ids at count 0 absent), the holder masks of those books, and return what entered or
    left."""
    from btb_core.routers.holder_sets import BookHolders

    paths = [chain(p) for _, _, p in ops]
    if use_ints:
        paths = interned(paths)
    book = BookHolders(6)
    booked: list = []
    ref = [dict() for _ in range(6)]
    for (add, r, _), ids in zip(ops, paths):
        if add or not booked:
            new = sum(1 for h in ids if h not in ref[r])
            for h in ids:
                ref[r][h] = ref[r].get(h, 0) + 1
            assert book.add(r, ids) == new
            booked.append((r, ids))
        else:
            r0, ids0 = booked.pop(len(ids) % len(booked))
            gone = 0
            for h in ids0:
                ref[r0][h] -= 1
                if not ref[r0][h]:
                    del ref[r0][h]
                    gone += 1
            assert book.remove(r0, ids0) == gone
        assert book.books == ref
        want = {}
        for s, held in enumerate(ref):
            for h in held:
                want[h] = want.get(h, 0) | 1 << s
        assert book.holders == want


# -- llm_d's approximate index: holder masks and the running-AND match ----------------------------
class _View:
    num_replicas = 3
    now_s = 0.0


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 9), min_size=1,
                                                           max_size=8)), max_size=40),
       capacity=st.integers(1, 10))
def test_llm_d_holder_masks_and_matches_follow_the_lru(ops, capacity):
    """Any block sequences (repeats and unchained ones included): the holder masks name exactly
    the replicas whose LRU holds each block, and the one-pass match equals each replica's walk."""
    from collections import OrderedDict

    from btb_core.routers.llm_d import LlmDRouter

    router = LlmDRouter(lru_capacity_blocks=capacity)
    router.reset(_View())
    ref = [OrderedDict() for _ in range(3)]
    for r, blocks in ops:
        router._remember(r, tuple(blocks))
        lru = ref[r]
        for h in blocks:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > capacity:
            lru.popitem(last=False)
        assert [list(x) for x in router._lru] == [list(x) for x in ref]
        want = {}
        for s, lru in enumerate(ref):
            for h in lru:
                want[h] = want.get(h, 0) | 1 << s
        assert router._lru_holders == want
        for query in (blocks, ops[0][1]):
            expect = {}
            for s, lru in enumerate(ref):
                k = 0
                while k < len(query) and query[k] in lru:
                    k += 1
                if k:
                    expect[s] = k
            assert router._approx_matches(tuple(query)) == expect


def test_prefix_tree_keeps_one_node_per_run_and_splits_where_paths_part():
    """Runs of consecutive ids are one node each; a prompt that leaves a run inside it splits the
    run once; an eviction that trims a run's tail splits it again, and both halves keep their
    ids as ranges."""
    tree = ApproxPrefixIndex(2)
    tree.insert(0, tuple(range(100)), 100 * BT, BT, 0.0)
    assert tree.num_nodes() == (1, 1)
    tree.insert(1, tuple(range(50)) + tuple(range(100, 150)), 100 * BT, BT, 1.0)
    assert tree.num_nodes() == (3, 4)        # [0, 50) held by both, [50, 100) by 0, [100, 150) by 1
    assert tree.match_blocks(0, tuple(range(150))) == 100
    assert tree.deepest_match(tuple(range(50)) + (100, 101, 999)) == 52
    assert tree.holder_mask_at(tuple(range(50)), 50) == 0b11
    assert tree.evict_to(0, 80 * BT) == 20   # replica 0's leaf run loses its last 20 blocks
    assert tree.num_nodes() == (4, 4)
    assert sorted(tree.access_times(0)) == list(range(80))
    assert all(type(n.ids) is range for n in tree._nodes())


def test_prefix_tree_walk_cache_does_not_reuse_a_mutated_list():
    tree = ApproxPrefixIndex(1)
    ids = [1, 2, 3]
    tree.insert(0, ids, 3 * BT, BT, 0.0)
    assert tree.match_blocks(0, ids) == 3
    ids[2] = 9
    assert tree.match_blocks(0, ids) == 2


# -- RunBook: kv_aware's book kept per block run, against a plain refcount per id ------------------
RUN_BOOK_OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 2),      # few replicas, few tokens:
                                  st.lists(st.integers(0, 1), min_size=1, max_size=6)),  # nested
                        max_size=40)                                    # pieces of one run


@settings(max_examples=400, deadline=None)
@given(ops=RUN_BOOK_OPS, queries=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8),
                                      min_size=1, max_size=4),
       cut=st.integers(1, 8))
def test_run_book_equals_a_refcount_per_id(ops, queries, cut):
    """Interned chained paths (the simulator's ids): a book kept as one length per (run,
    replica) holds exactly the ids a per-id refcount holds, counts what enters and leaves, and
    matches every replica's leading blocks of any path as a walk id by id does; the pieces found
    from the ids are the block index's."""
    import numpy as np

    from btb_core.routers.holder_sets import RunBook, leading_pieces
    from btb_core.routers.id_runs import runs_of_ids
    from btb_core.sim.blocks import BlockIndex

    paths = interned([chain(p) for _, _, p in ops] + [chain(q) for q in queries])
    paths, qpaths = paths[:len(ops)], paths[len(ops):]
    flat = np.array([h for p in paths + qpaths for h in p], np.int32)
    offsets = np.cumsum([0] + [len(p) for p in paths + qpaths])
    index = BlockIndex(flat, offsets)
    for p in paths + qpaths:
        assert runs_of_ids(p) == index.path_pieces(p)
    book = RunBook(3)
    booked: list = []
    ref = [dict() for _ in range(3)]
    for (add, r, _), ids in zip(ops, paths):
        if add or not booked:
            new = sum(1 for h in ids if h not in ref[r])
            for h in ids:
                ref[r][h] = ref[r].get(h, 0) + 1
            assert book.add(r, *runs_of_ids(ids)) == new
            booked.append((r, ids))
        else:
            r0, ids0 = booked.pop(len(ids) % len(booked))
            gone = 0
            for h in ids0:
                ref[r0][h] -= 1
                if not ref[r0][h]:
                    del ref[r0][h]
                    gone += 1
            assert book.remove(r0, *runs_of_ids(ids0)) == gone
        for s in range(3):
            held = {h for run, k in book.held(s).items() for h in range(run, run + k)}
            assert held == set(ref[s])
            assert book.sizes[s] == len(ref[s])
        for q in qpaths + paths[-1:]:
            want = {}
            for s in range(3):
                k = 0
                while k < min(cut, len(q)) and q[k] in ref[s]:
                    k += 1
                if k:
                    want[s] = k
            assert book.depths(*leading_pieces(*runs_of_ids(q), cut)) == want


def test_run_book_falls_back_to_the_next_longest_piece():
    """Paths of 1, 2 and 3 blocks of run 10 and one of 2 blocks of run 10 then run 20 on replica
    0: removing the 3-block path leaves the 2-block coverage (not the shortest piece), and the
    matches follow."""
    from btb_core.routers.holder_sets import RunBook

    book = RunBook(2)
    assert book.add(0, [10], [1]) == 1
    assert book.add(0, [10], [3]) == 2
    assert book.add(0, [10, 20], [2, 2]) == 2
    assert book.add(1, [10], [2]) == 2
    assert book.depths([10], [3]) == {0: 3, 1: 2}
    assert book.remove(0, [10], [3]) == 1
    assert book.held(0) == {10: 2, 20: 2} and book.sizes == [4, 2]
    assert book.depths([10, 20], [2, 2]) == {0: 4, 1: 2}
    assert book.remove(0, [10, 20], [2, 2]) == 3
    assert book.held(0) == {10: 1} and book.runs == {10: {0: 1, 1: 2}}


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 2), min_size=1,
                                                           max_size=8)), min_size=1, max_size=40),
       capacity=st.integers(1, 12), fail_every=st.integers(2, 50))
def test_llm_d_remember_by_pieces_equals_block_by_block(ops, capacity, fail_every):
    """Interned chained paths (the simulator's ids): accessing a path a stretch of consecutive ids
    at a time (bulk inserts, bulk moves) leaves every replica's LRU in the same order, with the
    same evictions, as accessing it id by id; the per-run leading parts are exactly the ids each
    LRU holds contiguously from each run's start, and the matches from them equal the per-id
    running AND."""
    from btb_core.routers.id_runs import runs_of_ids
    from btb_core.routers.llm_d import LlmDRouter

    paths = interned([chain(p) for _, p in ops])
    runs = sorted({s for ids in paths for s in runs_of_ids(ids)[0]})
    fast, slow = LlmDRouter(lru_capacity_blocks=capacity), LlmDRouter(lru_capacity_blocks=capacity)
    fast.reset(_View())
    slow.reset(_View())
    fast._by_pieces = True                   # as on the simulator's view
    for i, ((r, _), ids) in enumerate(zip(ops, paths)):
        if i % fail_every == fail_every - 1:  # now and then a replica fails: its index is gone
            fast.on_replica_removed(r, True)
            slow.on_replica_removed(r, True)
        fast._remember_pieces(r, runs_of_ids(ids))
        slow._remember(r, ids)
        assert [fast.lru_blocks(s) for s in range(3)] == [list(x) for x in slow._lru]
        assert fast._size == [len(x) for x in slow._lru]
        want = {}
        for s, lru in enumerate(slow._lru):
            for run in runs:                 # its leading part: ids held from the run's start
                k = run
                while k in lru and (k == run or k not in runs):
                    k += 1
                if k > run:
                    want.setdefault(run, {})[s] = k - run
        assert fast._lead == want
        for q in paths:
            assert fast._lead_matches(runs_of_ids(q)) == slow._approx_matches(q)


def test_llm_d_lead_after_an_evicted_first_id():
    """Run 0 (ids 0-4) accessed, its first id evicted (ids 1-4 stay, the oldest), then its first
    two ids accessed again: id 0 enters, so the oldest, id 2, leaves: 2 ids match, not 5."""
    from btb_core.routers.llm_d import LlmDRouter

    router = LlmDRouter(lru_capacity_blocks=7)
    router.reset(_View())
    router._by_pieces = True
    router._remember_pieces(0, ([0], [5]))
    router._remember_pieces(0, ([5], [3]))            # 8 ids: id 0 is evicted
    assert router.lru_blocks(0) == [1, 2, 3, 4, 5, 6, 7]
    assert router._lead == {5: {0: 3}}
    assert router._lead_matches(([0], [5])) == {}
    router._remember_pieces(0, ([0], [2]))            # id 0 back, id 1 moved, id 2 evicted
    assert router.lru_blocks(0) == [3, 4, 5, 6, 7, 0, 1]
    assert router._lead == {5: {0: 3}, 0: {0: 2}}
    assert router._lead_matches(([0], [5])) == {0: 2}


class _Req:
    def __init__(self, index):
        self.index = index


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "finish", "drop", "poke", "spread"]),
                          st.integers(0, 2), st.integers(0, 40)), max_size=120))
def test_spread_load_extremes_equal_max_and_min_of_the_loads(ops):
    """``SpreadLoad`` (the cache-aware router's loads) keeps max and min of the loads as routes
    and finishes move them, equal to scanning the list after every operation, also when the list
    is rewritten from outside (tests set loads directly) and after a replica is dropped; its loads
    and ``argmin`` equal the plain ``InFlightLoad``'s."""
    from btb_core.routers.least_load import InFlightLoad, SpreadLoad

    fast, plain = SpreadLoad(3), InFlightLoad(3)   # few replicas: extremes move often
    live = []
    for op, r, x in ops:
        if op == "add":
            req = _Req(len(live) + 1000 * x)
            live.append(req)
            fast.add(req, r)
            plain.add(req, r)
        elif op == "finish" and live:
            req = live.pop(x % len(live))
            fast.finish(req)
            plain.finish(req)
        elif op == "drop":
            fast.drop_replica(r)
            plain.drop_replica(r)
        elif op == "poke":   # the list rewritten from outside, as tests do
            fast.loads[r] = plain.loads[r] = x
        assert fast.loads == plain.loads
        assert fast.spread() == (max(plain.loads), min(plain.loads))
        assert fast.argmin() == plain.argmin()


def test_spread_load_extremes_when_the_last_replica_leaves_a_value():
    """Closed form: the minimum rises when the last replica at it gets a request, the maximum
    falls when the last one at it finishes one."""
    from btb_core.routers.least_load import SpreadLoad

    load = SpreadLoad(2)
    a, b, c = _Req(0), _Req(1), _Req(2)
    load.add(a, 0)
    assert load.spread() == (1, 0)
    load.add(b, 1)
    assert load.spread() == (1, 1)          # nobody is left at 0
    load.add(c, 1)
    assert load.spread() == (2, 1)
    load.finish(c)
    assert load.spread() == (1, 1)          # nobody is left at 2
    load.finish(a)
    load.finish(b)
    assert load.spread() == (0, 0)


def pieces_of(ids, cuts=()):
    """``ids`` (ints) as pieces of consecutive ids ``(starts, lens)``, also cut at the positions in
    ``cuts`` (pieces need not be maximal)."""
    starts, lens = [], []
    for i, h in enumerate(ids):
        if lens and h == starts[-1] + lens[-1] and i not in cuts:
            lens[-1] += 1
        else:
            starts.append(h)
            lens.append(1)
    return starts, lens


@settings(max_examples=300, deadline=None)
@given(ops=OPS, cuts=st.sets(st.integers(1, 7), max_size=3), short=st.integers(0, 2))
def test_prefix_tree_by_pieces_equals_the_tree_by_ids(ops, cuts, short):
    """A tree fed each prompt as a ``PiecePath`` (pieces of consecutive ids, cut anywhere, also a
    leading part ``n`` of them) holds exactly what a tree fed the id tuples holds, node for node,
    evicts the same blocks, and answers every query the same whichever form the query takes."""
    from btb_core.routers.prefix_tree import PiecePath

    paths = interned([chain(p) for _, p, _, _, _ in ops])
    a, b = ApproxPrefixIndex(3), ApproxPrefixIndex(3)
    now = 0.0
    for (r, _, extra, dt, budget), ids in zip(ops, paths):
        now += dt
        n = max(1, len(ids) - short)
        starts, lens = pieces_of(ids, cuts)
        path = PiecePath(starts, lens, n)
        assert len(path) == n and path.to_tuple() == ids[:n] and path[n - 1] == ids[n - 1]
        isl = (n - 1) * BT + 1 + extra
        a.insert(r, ids[:n], isl, BT, now)
        b.insert(r, path, isl, BT, now)
        if budget is not None:
            victim = (r + int(now)) % 3
            assert a.evict_to(victim, budget * BT) == b.evict_to(victim, budget * BT)
        assert a.global_table() == b.global_table()
        for s in range(3):
            assert a.block_table(s) == b.block_table(s)
        assert sorted(tuple(nd.ids) for nd in a._nodes()) == sorted(tuple(nd.ids) for nd in b._nodes())
        for q in paths:
            qp = PiecePath(*pieces_of(q, cuts))
            for tree in (a, b):
                assert tree.deepest_match(qp) == tree.deepest_match(q)
                for s in range(3):
                    assert tree.match_blocks(s, qp) == tree.match_blocks(s, q)
                for k in range(1, len(q) + 1):
                    assert tree.holder_mask_at(qp, k) == tree.holder_mask_at(q, k)
                    assert tree.first_holder_at(qp, k) == tree.first_holder_at(q, k)


# -- LogitKeys: kv_aware's minimum-logit set from integer keys --------------------------------------
def _plain_ties(prefill, sizes, isl, bt, found, book, nfull):
    """The minimum-logit replicas, ascending, from the float logits of kv_aware's formula (weight
    1), replica by replica."""
    req_blocks = -(-isl // bt)
    logits = []
    for r in range(len(prefill)):
        u = max(0, isl - min(found.get(r, 0), req_blocks) * bt)
        logits.append(1.0 * ((prefill[r] + u) / bt) + (sizes[r] + nfull - book.get(r, 0)))
    lo = min(logits)
    return [r for r, x in enumerate(logits) if x == lo]


@settings(max_examples=400, deadline=None)
@given(n=st.integers(1, 12), bt_log=st.integers(0, 6), isl=st.integers(1, 300),
       ops=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 600), st.integers(0, 30)),
                    max_size=30),
       found=st.dictionaries(st.integers(0, 11), st.integers(0, 40), max_size=12),
       book=st.dictionaries(st.integers(0, 11), st.integers(1, 30), max_size=12),
       nfull=st.integers(0, 40), poke=st.booleans())
def test_logit_keys_ties_equal_the_minimum_of_the_float_logits(n, bt_log, isl, ops, found, book,
                                                               nfull, poke):
    """``LogitKeys`` (kv_aware's integer keys, kept per update) gives exactly the replicas, in
    order, whose float logits equal their minimum, for every power-of-two block size and every
    overlap (also past the request's blocks) and book match; updates and lists rewritten from
    outside (as tests do) leave the keys equal to a recomputation; small ranges force ties."""
    from btb_core.routers.kv_aware import LogitKeys

    bt = 1 << bt_log
    found = {r: v for r, v in found.items() if r < n}
    book = {r: v for r, v in book.items() if r < n}
    prefill, sizes = [0] * n, [0] * n
    keys = LogitKeys(n)
    assert keys.sync(prefill, sizes, bt)
    for r, p, a in ops:
        r %= n
        prefill[r], sizes[r] = p, a
        if poke and r % 2:          # rewritten without an update: sync notices
            continue
        keys.update(r, p, a)
    assert keys.sync(prefill, sizes, bt)
    assert keys.keys == [p + bt * a for p, a in zip(prefill, sizes)]
    assert (keys.ties(isl, bt, -(-isl // bt), found, book)
            == _plain_ties(prefill, sizes, isl, bt, found, book, nfull))


def test_logit_keys_refuse_what_they_cannot_order_exactly():
    """Block sizes that are not powers of two, and keys at the exactness bound, make ``sync``
    return False (kv_aware then computes the float logits)."""
    from btb_core.routers.kv_aware import _KEY_LIMIT, LogitKeys

    keys = LogitKeys(2)
    assert not keys.sync([0, 0], [0, 0], 24)
    assert keys.sync([0, 0], [0, 0], 16)
    keys.update(1, _KEY_LIMIT, 0)
    assert keys.bt is None and not keys.sync([0, _KEY_LIMIT], [0, 0], 16)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 3),
       cache=st.lists(st.lists(st.integers(0, 5), max_size=6), min_size=6, max_size=6),
       ops=st.lists(st.tuples(st.sampled_from(["route", "route", "prefill", "finish", "fail"]),
                              st.lists(st.integers(0, 5), min_size=1, max_size=5),
                              st.integers(0, 40), st.integers(0, 100)), max_size=30))
def test_kv_aware_keyed_picks_equal_the_float_logits(n, seed, cache, ops):
    """kv_aware with its integer-key shortcut and with the float logits only (the shortcut off)
    pick the same replicas and draw the same random numbers over random routes, completed
    prefills, finished requests and failed replicas (fake view: the prefix ids stand for
    chained blocks)."""
    from btb_core.routers.kv_aware import KvAwareRouter

    routers, views = [], []
    for keyed in (True, False):
        router = KvAwareRouter()
        view = setup(router, n=n, seed=seed)
        router._keyed = keyed
        for r in range(n):
            view.cache[r]["hbm"].update(cache[r])
        routers.append(router)
        views.append(view)
    live = []
    for i, (op, ids, extra, k) in enumerate(ops):
        if op == "route":
            prefix = tuple(range(ids[0])) + tuple(100 + 10 * i + j for j in range(len(ids)))
            r = req(i, prefix, input_length=len(prefix) * UNIT_BT - extra % UNIT_BT)
            picks = [router.route(r) for router in routers]
            assert picks[0] == picks[1]
            live.append((r, picks[0]))
        elif op in ("prefill", "finish") and live:
            r, pick = live[k % len(live)]
            if op == "finish":
                live.remove((r, pick))
            for router in routers:
                getattr(router, f"on_{op}_done" if op == "prefill" else "on_request_finished")(
                    r, pick)
        elif op == "fail":
            for router in routers:
                router.on_replica_removed(k % n, True)
        assert routers[0]._keys.bt in (None, UNIT_BT)
        assert views[0].rng.random() == views[1].rng.random()
