"""``Replica.queued_tokens`` and ``Simulator.queue_lengths`` (kept with the waiting queues) against
the plain sum over the queue and its length, and the view's per-replica lists against the
per-replica calls, checked at every routing decision and every finish: both schedulers, reserve and paged admission
(with preemptions), and cluster events (a failure clears a queue, retries re-queue)."""

from __future__ import annotations

import pytest

from btb_core.routers import policy_class
from btb_core.sim import ClusterConfig, ClusterEvent, simulate
from btb_core.trace import load_trace, shipped_traces

PowerOfTwo = policy_class("power_of_two")


class Checked(PowerOfTwo):
    checks = 0

    def _check(self):
        v = self.view
        for r, rep in enumerate(v._replicas):
            assert v.queued_prompt_tokens(r) == sum(job.req.input_length for job in rep.waiting)
        n = v.num_replicas
        assert v.queue_length_all() == [len(rep.waiting) for rep in v._replicas]
        assert v.queue_length_all() == [v.queue_length(r) for r in range(n)]
        assert v.kv_usage_all() == [v.kv_usage(r) for r in range(n)]
        assert v.kv_usage_max() == max(v.kv_usage(r) for r in range(n))
        Checked.checks += 1

    def route(self, request):
        self._check()
        return super().route(request)

    def on_request_finished(self, request, replica):
        self._check()
        super().on_request_finished(request, replica)


@pytest.mark.parametrize("scheduler", ["chunked", "prefill_first"])
@pytest.mark.parametrize("case", ["reserve", "paged", "events"])
def test_kept_queue_figures_equal_plain_ones(scheduler, case):
    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 400)
    kw = dict(num_replicas=3, scheduler=scheduler)
    events = None
    if case == "paged":
        kw.update(kv_admission="paged", hbm_kv_capacity_bytes=int(48e9))
    cluster = ClusterConfig.from_setup("70b_h100x4", **kw)
    if case == "events":
        t = float(tr.table["arrival_s"].iloc[150])
        events = [ClusterEvent(t, "fail", 1), ClusterEvent(t + 5, "drain", 2), ClusterEvent(t + 20, "add", 3)]
    Checked.checks = 0
    res = simulate(tr, Checked(), cluster, events=events)
    assert Checked.checks >= 2 * len(tr)
    if case == "paged":
        assert res.metrics["preemptions"] > 0
    res2 = simulate(tr, PowerOfTwo(), cluster, events=events)   # the check changes nothing
    assert res.requests.equals(res2.requests)


def test_queue_length_all_is_a_copy():
    """A router may change the list it is given; the simulator's own lengths stay as they are."""
    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 50)
    seen = []

    class Scribbler(PowerOfTwo):
        def route(self, request):
            q = self.view.queue_length_all()
            seen.append(list(q))
            q[:] = [99] * len(q)
            return super().route(request)

    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=3)
    res = simulate(tr, Scribbler(), cluster)
    assert all(max(q) < 99 for q in seen)
    assert res.requests.equals(simulate(tr, PowerOfTwo(), cluster).requests)
