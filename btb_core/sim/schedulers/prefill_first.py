"""``prefill_first``: FIFO admission while KV fits; each admission's load + prefill runs alone.

FIFO skips requests waiting for a copy in flight (``sim.first_unheld``; holds are set by routers,
:meth:`btb_core.sim.view.ClusterView.hold_prefix`).

One admitted request's prefix load + prefill is one ``"prefill"`` operation that pauses decode; its
duration is exactly ``cost.load_s(tier, reused tokens) + cost.prefill_s(new, cached)`` plus the
cost model's ``step_overhead_s`` and ``context_s(cached)`` (both 0 on the GPU presets). With no
request to admit, the replica decodes its whole batch one token per step (the engine's
``"stretch"``), and is idle when nothing runs.
"""

from __future__ import annotations

import heapq

from ...cost import CostModel
from ..priorities import OP as _OP
from .base import Scheduler


class PrefillFirst(Scheduler):
    """Admit the head of the queue when KV and ``max_running`` allow; prefill it alone."""

    name = "prefill_first"

    def __init__(self, cluster) -> None:
        super().__init__(cluster)
        self._max_running = cluster.max_running
        self._scheduled = cluster.reuse_on == "scheduled"
        # CostModel.prefill_s's formula, computed here (no validation frames) when the cost model
        # is a CostModel's own: same operands in the same order, so the same float
        cost = cluster.cost
        self._coeffs = None
        if type(cost).prefill_s is CostModel.prefill_s:
            self._coeffs = (cost._lin_flops_per_token, cost._attn_coeff, cost._inv_flops_per_s)

    def plan(self, sim, rep) -> None:
        waiting = rep.waiting
        i = None
        if waiting and rep.n_decode + len(rep.prefilling) + rep.in_op < self._max_running:
            i = sim.first_unheld(rep) if rep.holds else 0
        if i is not None:
            job = waiting[i]
            if sim.try_admit(rep, job):
                if i:
                    del waiting[i]
                else:
                    waiting.popleft()
                rep.queued_tokens -= job.req.input_length
                sim.queue_lengths[rep.idx] -= 1
                t, r, q = sim.queue_samples      # (Simulator.sample_queue, inlined)
                t.append(sim.now)
                r.append(rep.idx)
                q.append(len(waiting))
                req = job.req
                done = job.done_tokens
                new = req.input_length - done
                co = self._coeffs
                if co is not None and new >= 0 and done >= 0:
                    compute = (co[0] * new + co[1] * (new * done + 0.5 * new * new)) * co[2]
                else:
                    compute = sim.cost.prefill_s(new, done)
                rep.in_op += 1
                if self._scheduled:
                    sim.complete(rep, job, req.input_length)
                cost = sim.cost
                duration = job.load_s + compute + cost.step_overhead_s
                e = self._context_s
                if e:
                    duration += e * done
                # (Simulator.start_op, inlined)
                rep.busy = True
                rep.op_kind = "prefill"
                token = rep.op_token = rep.op_token + 1
                now = rep.op_start_s = sim.now
                end = rep.op_end_s = now + duration
                rep.op_data = job
                sim._seq += 1
                heapq.heappush(sim._heap, (end, _OP, sim._seq, rep, token))
                return
        if rep.n_decode:
            sim.start_stretch(rep)
        else:                         # (Simulator.idle, inlined)
            rep.busy = False
            rep.op_kind = None

    def op_done(self, sim, rep, kind: str, data) -> None:
        job = data
        rep.in_op -= 1
        job.done_tokens = job.req.input_length
        sim.complete(rep, job, job.done_tokens)
        sim.first_token(rep, job)


__all__ = ["PrefillFirst"]
