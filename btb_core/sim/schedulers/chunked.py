"""``chunked``: vLLM/SGLang-style iterations with one token budget for prefill chunks and decode.

One ``"iter"`` operation is one engine step: ``cluster.chunk_tokens`` tokens shared by one decode
token per decoding request, then prefill chunks of the admitted requests still prefilling (FIFO),
then of newly admitted ones. Its duration is ``max(compute, memory) + loads`` where compute =
prefill-chunk FLOPs (with the causal attention term over the tokens already cached) + 2 x active
params per decode token, over the node's peak x MFU; memory = (active weights + decode context KV)
/ (HBM bandwidth x MBU); loads = tier loads of the requests admitted in this step; plus the cost
model's fixed ``step_overhead_s`` and its ``context_s_per_token`` x each chunk's tokens already
computed or cached (both 0 on the GPU presets). With ``ClusterConfig.reuse_on =
"scheduled"`` a chunk's complete blocks become reusable when it is planned (vLLM v1), else when the
step ends. With no prefill work the replica decodes (the engine's ``"stretch"``) or is idle.
"""

from __future__ import annotations

from .base import Scheduler


class Chunked(Scheduler):
    """Chunked prefill under a per-iteration token budget (``ClusterConfig.chunk_tokens``)."""

    name = "chunked"
    decodes_in_ops = True

    def plan(self, sim, rep) -> None:
        cluster = self.cluster
        budget = cluster.chunk_tokens - rep.n_decode
        cost = sim.cost
        prefill_flops = cost.prefill_flops
        early = cluster.reuse_on == "scheduled"   # vLLM: blocks cached when scheduled
        chunks = []
        flops = 0.0
        loads = 0.0
        # each job's next chunk within the budget: (job, tokens), its FLOPs counted
        for job in rep.prefilling:
            if budget <= 0:
                break
            done = job.done_tokens
            c = job.req.input_length - done
            if c > budget:
                c = budget
            flops += prefill_flops(c, done)
            chunks.append((job, c))
            if early:
                sim.complete(rep, job, done + c)
            budget -= c
        waiting = rep.waiting
        admitted = False
        max_running = cluster.max_running
        i = 0
        while budget > 0 and waiting and rep.n_decode + len(rep.prefilling) + rep.in_op < max_running:
            if rep.holds:             # skip requests waiting for a copy in flight
                i = sim.first_unheld(rep, i)
                if i is None:
                    break
            job = waiting[i]
            if not sim.try_admit(rep, job):
                break
            if i:
                del waiting[i]
            else:
                waiting.popleft()
            rep.queued_tokens -= job.req.input_length
            sim.queue_lengths[rep.idx] -= 1
            admitted = True
            rep.prefilling.append(job)
            loads += job.load_s
            done = job.done_tokens
            c = job.req.input_length - done
            if c > budget:
                c = budget
            flops += prefill_flops(c, done)
            chunks.append((job, c))
            if early:
                sim.complete(rep, job, done + c)
            budget -= c
        if admitted:
            sim.sample_queue(rep)
        if not chunks:
            if rep.n_decode:
                sim.start_stretch(rep)
            else:
                sim.idle(rep)
            return
        d = sim.decode
        n_dec = rep.n_decode
        compute = cost.compute_s(flops) + d.g * n_dec
        memory = d.a + d.c * rep.ctx_tokens
        duration = (compute if compute > memory else memory) + loads + cost.step_overhead_s
        e = self._context_s
        if e:     # per chunk: its request's tokens already in the KV cache when it starts
            duration += e * sum(job.done_tokens for job, _ in chunks)
        sim.start_op(rep, "iter", duration, chunks)

    def op_done(self, sim, rep, kind: str, data) -> None:
        if rep.n_decode:
            rep.steps_done += 1
            rep.ctx_tokens += rep.n_decode
            sim.finish_decodes(rep)
        finished = []
        for job, c in data:
            job.done_tokens += c
            sim.complete(rep, job, job.done_tokens)
            if job.done_tokens >= job.req.input_length:
                finished.append(job)
        if finished:
            rep.prefilling = [j for j in rep.prefilling if j.done_tokens < j.req.input_length]
            for job in finished:
                sim.first_token(rep, job)


__all__ = ["Chunked"]
