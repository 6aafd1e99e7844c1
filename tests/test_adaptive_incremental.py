"""``btb_adaptive``'s faster parts (issue 14) against the plain computations they replaced.

- The detection index: every grid node keeps its arrival times and its last X arrivals, and every
  arrival walks the grid of an arrival ``rate_window_s`` old again to delete the nodes it touched
  that have been idle since (the router keeps chains of grid nodes with one history, split where
  paths part, and follows a detected node through later splits).
- The least-score choice: every replica within the tolerance of the minimum, ascending, and one
  draw from the run's generator when there are several.
- One view query per arrival for the warm-set check and the scores: asking the view at each.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from btb_core.bursted_shaped import bursted_shaped_trace
from btb_core.routers.btb_adaptive import BTBAdaptiveRouter, common_prefix, grid_depths
from btb_core.sim import ClusterConfig, simulate

from test_router_incremental import chain, interned


class _RefNode:
    def __init__(self, x, now):
        self.times = deque()
        self.recent = deque(maxlen=x)
        self.first_s = now


class ReferenceDetector:
    """The node-by-node index with eager expiry (``btb_adaptive`` before issue 14's round)."""

    def __init__(self, x, z, w, min_copy_blocks):
        self.x, self.z, self.w, self.min_copy = x, z, w, min_copy_blocks
        self.nodes, self.order = {}, deque()

    def observe(self, now, ids, full):
        if full < 1:
            return None
        x, z, w = self.x, self.z + 1e-9, self.w
        found = None
        for d in grid_depths(full):
            node = self.nodes.get(ids[d - 1])
            if node is None:
                node = self.nodes[ids[d - 1]] = _RefNode(x, now)
            node.times.append(now)
            while now - node.times[0] > w:
                node.times.popleft()
            node.recent.append((now, ids))
            if len(node.recent) == x and now - node.recent[0][0] <= z:
                found = (d, node)
            elif found is not None:
                break
        self.order.append((now, full, ids))
        while self.order and now - self.order[0][0] > w:
            _, f, old = self.order.popleft()
            for d in grid_depths(f):
                node = self.nodes.get(old[d - 1])
                if node is not None and now - node.recent[-1][0] > w:
                    del self.nodes[old[d - 1]]
        if found is None:
            return None
        d, node = found
        depth = full
        for _t, other in list(node.recent)[:-1]:
            depth = min(depth, common_prefix(ids, other, d))
        return None if depth < self.min_copy else (depth, node)

    def rate(self, node, now):
        return len(node.times) / max(self.z, min(self.w, now - node.first_s))


def fast_detector(x, z, w, min_copy_blocks, clock):
    router = BTBAdaptiveRouter(x_repeats=x, z_s=z, rate_window_s=w)
    router.view = clock
    router.min_copy_blocks = min_copy_blocks
    router._nodes, router._grid_cache = {}, {}
    router._expired_s, router._sweep_at = float("-inf"), 6     # sweep often
    return router


ARRIVALS = st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=0, max_size=40),  # tokens
                              st.integers(0, 8),                                      # time step
                              st.integers(0, 3)),                                     # ids past full
                    min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(arrivals=ARRIVALS, x=st.integers(2, 4), z=st.sampled_from([0.5, 1.0, 3.0]),
       w=st.sampled_from([0.5, 2.0, 10.0]), min_copy=st.integers(1, 20))
def test_detection_equals_the_node_by_node_index(arrivals, x, z, w, min_copy):
    """Same detected depth, same node histories (rate, first arrival) for every live node, and
    the same set of live nodes after every arrival, for any X, z_s and rate_window_s (a window
    shorter than z_s too: the nodes then keep their last X arrivals past the window)."""
    # long shared prefixes (repeat each token so paths run past the grid's dense part)
    paths = interned([chain([t for t in toks for _ in range(3)]) for toks, _, _ in arrivals])
    clock = SimpleNamespace(now_s=0.0)
    ref = ReferenceDetector(x, z, w, min_copy)
    fast = fast_detector(x, z, w, min_copy, clock)
    detected = []       # (reference node, the router's (chain, key) handle), as an _Active keeps
    now = 0.0
    for (_, dt, cut), ids in zip(arrivals, paths):
        now += dt / 4
        clock.now_s = now
        full = max(0, len(ids) - cut)
        req = SimpleNamespace(hash_ids=ids, full_blocks=full)
        want = ref.observe(now, ids, full)
        got = fast._observe(req)
        assert (want is None) == (got is None)
        if want is not None:
            assert want[0] == got[0]
            assert ref.rate(want[1], now) == fast._rate(got[1])
            assert got[2] in got[1].keys
            detected.append((want[1], [got[1], got[2]]))
        # live: not idle for rate_window_s at the last expiry (an arrival without a complete
        # block expires nothing, in both)
        live = {k: n for k, n in fast._nodes.items()
                if not fast._expired_s - n.hist[-1][0] > w}
        assert set(live) == set(ref.nodes)
        for k, node in ref.nodes.items():
            assert k in live[k].keys
            assert all(fast._nodes[j] is live[k] for j in live[k].keys)
            assert live[k].first_s == node.first_s
            assert fast._rate(live[k]) == ref.rate(node, now)
            assert [t for t, _ in list(live[k].hist)[-x:]] == [t for t, _ in node.recent]
        # a detected node, followed through later splits, has the reference node's history
        # (frozen once it died, as the reference's object is)
        for ref_node, handle in detected:
            handle[0] = fast._node_of(handle[0], handle[1])
            assert fast._rate(handle[0]) == ref.rate(ref_node, now)
            assert [t for t, _ in list(handle[0])[-x:]] == [t for t, _ in ref_node.recent]


@settings(max_examples=500, deadline=None)
@given(values=st.lists(st.sampled_from([0.0, 1.0, 1.0 + 1e-10, 1.0 + 3e-9, 2.5, 1e6, 1e6 + 1e-4,
                                        0.3, 0.1 + 0.2]), min_size=1, max_size=70),
       seed=st.integers(0, 3))
def test_least_score_choice_equals_the_plain_rule(values, seed):
    """Same replica and the same random draws (so the same generator state after) as taking
    every replica within the tolerance of the minimum and drawing one."""
    lo = min(values)
    tol = 1e-9 + 1e-9 * abs(lo)
    tied = [r for r, x in enumerate(values) if x - lo <= tol]
    ref_rng = np.random.default_rng(seed)
    want = tied[0] if len(tied) == 1 else tied[int(ref_rng.integers(len(tied)))]
    router = BTBAdaptiveRouter()
    router.view = SimpleNamespace(rng=np.random.default_rng(seed), num_replicas=len(values),
                                  routable_replicas=range(len(values)))
    assert router._argmin(list(values)) == want
    assert router.view.rng.integers(1 << 30) == ref_rng.integers(1 << 30)


@pytest.mark.parametrize("scheduler", ["prefill_first", "chunked"])
def test_one_view_query_per_arrival_equals_asking_again(scheduler, monkeypatch):
    """Reusing the arrival's view query (and pending-book walk) for the warm-set check and the
    scores gives the same replay (requests, transfers, ledger) as asking at each of them."""
    trace = bursted_shaped_trace(windows=1).rows(0, 700)
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=12, scheduler=scheduler)
    fast_router = BTBAdaptiveRouter()
    fast = simulate(trace, fast_router, cluster, seed=3)
    orig = BTBAdaptiveRouter._size_warm_set

    def asking_again(self, act, request=None, cached=None, pend=None):
        orig(self, act, request, None, None)
        self._acted = True             # route then asks the view again for the scores
    monkeypatch.setattr(BTBAdaptiveRouter, "_size_warm_set", asking_again)
    orig_scores = BTBAdaptiveRouter._scores

    def walking_again(self, request, runs, cached=None, pend=None):
        return orig_scores(self, request, runs, cached, None)
    monkeypatch.setattr(BTBAdaptiveRouter, "_scores", walking_again)
    slow_router = BTBAdaptiveRouter()
    slow = simulate(trace, slow_router, cluster, seed=3)
    assert fast.requests.equals(slow.requests)
    assert fast.transfers.equals(slow.transfers)
    assert fast_router.ledger_frame().equals(slow_router.ledger_frame())
    assert len(fast.transfers) > 0
