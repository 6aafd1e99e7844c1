"""``Replica.queued_tokens`` (kept with the waiting queue) against the plain sum over the queue,
checked at every routing decision and every finish: both schedulers, reserve and paged admission
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
        Checked.checks += 1

    def route(self, request):
        self._check()
        return super().route(request)

    def on_request_finished(self, request, replica):
        self._check()
        super().on_request_finished(request, replica)


@pytest.mark.parametrize("scheduler", ["chunked", "prefill_first"])
@pytest.mark.parametrize("case", ["reserve", "paged", "events"])
def test_queued_tokens_equals_plain_sum(scheduler, case):
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
