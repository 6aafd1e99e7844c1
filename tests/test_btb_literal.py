"""`btb` is the seed's literal rule (issue 10, item 1); each documented property pinned here.

1. A burst is detected only when requests share at least Y tokens (one block short: no copy, and
   the run equals cache_aware exactly).
2. Exactly Y blocks are copied, even when the shared prefix is longer (the rest is recomputed on
   every warm replica).
3. At most M copies per prefix per run: a second burst of the same prefix later in the run starts
   no new copy.
"""

from __future__ import annotations

import pandas as pd
import pytest

from btb_core.routers.btb import BTBRouter
from btb_core.scenarios import ScenarioSpec, build, run
from btb_core.sim import ClusterConfig
from btb_core.trace import make_trace

from test_routers_unit import BT, burst_req, req, setup  # noqa: F401

SC_BT = 512


@pytest.fixture(scope="module")
def cluster():
    return ClusterConfig.from_setup("70b_h100x4", num_replicas=4)


def test_prefix_one_block_shorter_than_y_is_never_detected():
    router = BTBRouter(y_tokens=5 * BT)
    view = setup(router, n=4)
    prefix = (1, 2, 3, 4)                                   # 4 shared blocks, Y = 5
    for i in range(6):
        view.now_s = 0.1 * i
        router.route(req(i, prefix + (100 + i, 200 + i)))  # 6 blocks each, only 4 shared
        view.cache[0]["hbm"].update(prefix)
    assert view.transfers == [] and router.decisions["warm"] == 0
    # the same arrivals sharing Y = 5 blocks do start copies
    router = BTBRouter(y_tokens=5 * BT)
    view = setup(router, n=4)
    prefix = (1, 2, 3, 4, 5)
    for i in range(3):
        view.now_s = 0.1 * i
        router.route(req(i, prefix + (100 + i,)))
        view.cache[0]["hbm"].update(prefix)
    assert len(view.transfers) == 3


def test_default_btb_is_inert_below_65536_tokens_and_equals_cache_aware(cluster):
    trace = build(ScenarioSpec("burst", 60, 6.0, 32_768))
    btb = run(trace, "btb", cluster)
    ca = run(trace, "cache_aware", cluster)
    assert btb.metrics["rdma_copies"] == 0
    pd.testing.assert_series_equal(btb.requests["ttft_s"], ca.requests["ttft_s"])
    assert btb.info["router"].decisions["warm"] == 0


def test_exactly_y_blocks_are_copied_when_the_prefix_is_longer(cluster):
    trace = build(ScenarioSpec("burst", 40, 8.0, 98_304))     # 192 shared blocks of 512 tokens
    res = run(trace, "btb", cluster)
    tr = res.transfers
    assert len(tr) > 0
    assert set(tr["blocks"]) == {65_536 // SC_BT}               # Y = 128 blocks, not 192
    # the first request on a copy's destination reuses exactly the Y copied blocks and recomputes
    # the other 64 shared blocks
    req_ = res.requests
    for dst in tr["dst"]:
        first = req_[req_["replica"] == dst].sort_values("arrival_s").iloc[0]
        assert first["reused_tokens"] == 65_536


def test_at_most_m_copies_per_prefix_per_run(cluster):
    # two bursts of the same 64k prefix, 40 s apart: copies only during the first
    one = build(ScenarioSpec("burst", 48, 12.0, 65_536))
    tab = one.table
    prefix = [list(h[:128]) for h in tab["hash_ids"]]
    ids, arr = [], []
    nxt = 10_000
    for rep, offset in ((0, 0.0), (1, 40.0)):
        for i, t in enumerate(tab["arrival_s"].tolist()):
            ids.append(prefix[i] + [nxt])
            nxt += 1
            arr.append(t + offset)
    trace = make_trace(arr, [65_536 + 256] * len(arr), [1] * len(arr), ids, block_tokens=SC_BT)
    for m in (1, 2):
        res = run(trace, "btb", cluster, m_replicas=m)
        assert len(res.transfers) == m
        assert (res.transfers["request_s"] < 40.0).all()
