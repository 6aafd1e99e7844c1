"""``btb_adaptive``'s pending book (a :class:`~btb_core.routers.holder_sets.RunBook`, kept per run of
ids; issue 14) against the plain computation: a reference count per block id and per replica, and
a replica's pending depth, up to a limit, counted id by id."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from btb_core.routers.holder_sets import RunBook
from btb_core.routers.id_runs import request_runs, runs_of_ids, truncate_runs
from btb_core.sim.request import Request

from test_router_incremental import chain, interned

OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 3),
                         st.lists(st.integers(0, 2), min_size=1, max_size=9)), max_size=40)


def plain_runs(ids):
    starts, lens = [], []
    for h in ids:
        if lens and h == starts[-1] + lens[-1]:
            lens[-1] += 1
        else:
            starts.append(h)
            lens.append(1)
    return starts, lens


def relabel(paths, seed):
    """The same chained paths with ids renamed at random: still chained, no longer increasing
    along a path (runs are shorter and the binary search meets ids it must not trust)."""
    ids = sorted({h for p in paths for h in p})
    perm = ids[:]
    random.Random(seed).shuffle(perm)
    table = dict(zip(ids, perm))
    return [tuple(table[h] for h in p) for p in paths]


@settings(max_examples=300, deadline=None)
@given(ops=OPS, layout=st.sampled_from(["interned", "relabelled"]), seed=st.integers(0, 9))
def test_pending_depths_equal_a_refcount_per_id(ops, layout, seed):
    paths = interned([chain(p) for _, _, p in ops])
    if layout == "relabelled":
        paths = relabel(paths, seed)
    book = RunBook(4)
    ref = [dict() for _ in range(4)]
    booked: list = []
    for (add, r, _), ids in zip(ops, paths):
        assert runs_of_ids(ids) == plain_runs(ids)
        if add or not booked:
            for h in ids:
                ref[r][h] = ref[r].get(h, 0) + 1
            book.add(r, *runs_of_ids(ids))
            booked.append((r, ids))
        else:
            r0, ids0 = booked.pop(len(ids) % len(booked))
            for h in ids0:
                ref[r0][h] -= 1
                if not ref[r0][h]:
                    del ref[r0][h]
            book.remove(r0, *runs_of_ids(ids0))
        for q in paths:
            runs = runs_of_ids(q)
            for limit in range(len(q) + 2):
                want = {}
                for s in range(4):
                    k = 0
                    while k < min(limit, len(q)) and q[k] in ref[s]:
                        k += 1
                    if k:
                        want[s] = k
                    assert book.depth(s, *runs, limit) == k
                assert book.depths(*runs, limit) == want
            assert book.depths(*runs) == book.depths(*runs, len(q))     # no limit = the whole path
        for s in range(4):
            assert book.sizes[s] == len(ref[s])
    if not booked:
        assert book.runs == {} and book.pieces == [{}] * 4


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 12), min_size=0, max_size=12), n=st.integers(0, 14))
def test_runs_of_any_ids_and_their_truncation(ids, n):
    """Any id sequence (chained or not) splits into its maximal stretches of consecutive ids;
    truncating the runs is splitting the truncated ids."""
    ids = tuple(ids)
    assert runs_of_ids(ids) == plain_runs(ids)
    assert runs_of_ids(ids, n) == plain_runs(ids[:n])
    assert truncate_runs(*runs_of_ids(ids), n) == plain_runs(ids[:n])


def test_request_runs_from_the_simulators_pieces_or_the_ids():
    # pieces as the simulator builds them, and the same ids given explicitly
    sim = Request(0, 0, 0.0, 10 * 16, 1, None, 16, ([5, 40], [3, 7]))
    assert request_runs(sim) == ([5, 40], [3, 7])
    assert request_runs(Request(1, 1, 0.0, 10 * 16, 1, sim.hash_ids, 16)) == ([5, 40], [3, 7])
    # pieces that continue each other are one run (the book keys runs by their first id)
    split = Request(2, 2, 0.0, 10 * 16, 1, None, 16, ([5, 8, 40], [3, 2, 5]))
    assert request_runs(split) == ([5, 40], [5, 5])
