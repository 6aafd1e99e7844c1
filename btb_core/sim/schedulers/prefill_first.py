"""``prefill_first``: FIFO admission while KV fits; each admission's load + prefill runs alone.

FIFO skips requests waiting for a copy in flight (``sim.first_unheld``; holds are set by routers,
:meth:`btb_core.sim.view.ClusterView.hold_prefix`).

One admitted request's prefix load + prefill is one ``"prefill"`` operation that pauses decode; its
duration is exactly ``cost.load_s(tier, reused tokens) + cost.prefill_s(new, cached)``. With no
request to admit, the replica decodes its whole batch one token per step (the engine's
``"stretch"``), and is idle when nothing runs.
"""

from __future__ import annotations

from .base import Scheduler


class PrefillFirst(Scheduler):
    """Admit the head of the queue when KV and ``max_running`` allow; prefill it alone."""

    name = "prefill_first"

    def __init__(self, cluster) -> None:
        super().__init__(cluster)
        self._max_running = cluster.max_running
        self._scheduled = cluster.reuse_on == "scheduled"

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
                t, r, q = sim.queue_samples      # (Simulator.sample_queue, inlined)
                t.append(sim.now)
                r.append(rep.idx)
                q.append(len(waiting))
                req = job.req
                compute = sim.cost.prefill_s(req.input_length - job.done_tokens, job.done_tokens)
                rep.in_op += 1
                if self._scheduled:
                    sim.complete(rep, job, req.input_length)
                sim.start_op(rep, "prefill", job.load_s + compute + sim.cost.step_overhead_s, job)
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
