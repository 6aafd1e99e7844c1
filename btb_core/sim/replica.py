"""One replica: waiting queue, running batch under a KV budget, closed-form decode.

The scheduler that drives a replica lives in :mod:`btb_core.sim.schedulers` (one file each).

A replica alternates *operations*, each one event in the simulator:

- ``prefill`` (``prefill_first`` only): one admitted request's prefix load + prefill, alone, pausing
  decode; its duration is exactly ``cost.load_s(tier, reused tokens) + cost.prefill_s(new, cached)``.
- ``iter`` (``chunked`` only): one iteration with a token budget shared by prefill chunks (FIFO over
  admitted requests, then newly admitted ones) and one decode token per decoding request; its
  duration is ``max(compute, memory) + loads`` where compute = prefill-chunk FLOPs (with the causal
  attention term over the tokens already cached) + 2 x active params per decode token, over the
  node's peak x MFU; memory = (active weights + decode context KV) / (HBM bandwidth x MBU).
- ``stretch``: k decode-only steps coalesced into one event (nothing changes in between but token
  counts). The step time is ``cost.decode_step_s(batch, context)``; context grows by the batch size
  every step, so the stretch's duration has a closed form. An arrival (or anything that may let
  a waiting request in) cuts the stretch at the end of the step in progress, exactly where a real
  engine would next look at its queue.

Admission reserves KV for prompt + output tokens up front, so no preemption is modelled.
"""

from __future__ import annotations

from collections import deque
from math import ceil


class Job:
    """Mutable per-request state during a run (the immutable part is the Request)."""

    __slots__ = ("req", "piece_starts", "piece_lens", "full", "replica", "admit_s", "first_token_s",
                 "finish_s", "done_tokens", "reused_tokens", "hit_hbm", "hit_dram", "hit_disk",
                 "load_s", "pinned", "private", "join_ctx", "join_step", "reuse_tier", "ext_full", "admit_seq", "retries")

    def __init__(self, req, piece_starts, piece_lens, full):
        self.req = req
        self.piece_starts = piece_starts  # the prompt's ids as pieces of runs: run start ids
        self.piece_lens = piece_lens      # and lengths (btb_core.sim.blocks)
        self.full = full
        self.replica = -1
        self.admit_s = -1.0
        self.first_token_s = -1.0
        self.finish_s = -1.0
        self.done_tokens = 0
        self.reused_tokens = 0
        self.hit_hbm = 0
        self.hit_dram = 0
        self.hit_disk = 0
        self.load_s = 0.0
        self.pinned = 0
        self.private = 0
        self.join_ctx = 0
        self.join_step = 0
        self.reuse_tier = "none"
        self.retries = 0


class Replica:
    """State of one replica; scheduling logic is driven by the engine (see module docstring)."""

    __slots__ = ("idx", "cache", "waiting", "prefilling", "decode_heap", "n_decode", "ctx_tokens",
                 "steps_done", "busy", "op_kind", "op_token", "op_start_s", "op_end_s", "op_data",
                 "paused_until", "in_op", "copy_marks", "copy_lengths",
                 "egress_free_s", "ingress_free_s", "kick_pending", "holds", "epoch", "queued_tokens")

    def __init__(self, idx, cache):
        self.idx = idx
        self.cache = cache
        self.waiting = deque()
        self.queued_tokens = 0        # sum of job.req.input_length over waiting (kept with it)
        self.prefilling = []          # chunked: admitted, prefill not finished (FIFO)
        self.decode_heap = []         # (target_step, seq, job)
        self.n_decode = 0
        self.ctx_tokens = 0           # total context tokens of the decode batch
        self.steps_done = 0
        self.busy = False
        self.op_kind = None
        self.op_token = 0
        self.op_start_s = 0.0
        self.op_end_s = 0.0           # when the operation in progress ends
        self.op_data = None
        self.paused_until = 0.0
        self.in_op = 0                # requests in a prefill op (prefill_first)
        self.copy_marks = {}          # last block of a landed copy -> list of transfer records
        self.copy_lengths = set()
        self.egress_free_s = 0.0
        self.ingress_free_s = 0.0
        self.kick_pending = False
        self.holds = []               # (first block id, blocks, until_s, key): see Simulator.hold_prefix
        self.epoch = 0                # failures so far (cluster events)

    @property
    def running(self) -> int:
        return self.n_decode + len(self.prefilling) + self.in_op


class DecodeModel:
    """Closed-form decode-step time ``max(a + c * T, g * n) + o`` for batch n and context T tokens.

    ``a`` = active weight bytes / (HBM bandwidth x MBU), ``c`` = KV bytes per token / (HBM
    bandwidth x MBU), ``g`` = 2 x active params / (peak FLOP/s x MFU): the memory-bound and
    compute-bound limits of one decode step; ``o`` = the cost model's fixed ``step_overhead_s``
    (0 on the GPU presets). Coefficients are read off the cost model and checked
    against ``cost.decode_step_s`` in the tests.
    """

    __slots__ = ("a", "c", "g", "o")

    def __init__(self, cost):
        big = 1_000_000
        self.a = cost.decode_step_s(1, 0)
        self.c = (cost.decode_step_s(1, big) - self.a) / big
        self.g = cost.compute_s(2.0 * cost.model.params_active)
        self.o = float(getattr(cost, "step_overhead_s", 0.0))   # fixed seconds per step

    def step_s(self, n, ctx):
        mem = self.a + self.c * ctx
        comp = self.g * n
        return (mem if mem >= comp else comp) + self.o

    def stretch_s(self, n, ctx0, k):
        """Duration of ``k`` decode steps of batch ``n`` starting at context ``ctx0``."""
        a, c, g = self.a, self.c, self.g
        comp = g * n
        # steps j < J are compute-bound: a + c*(ctx0 + j*n) < g*n
        if c > 0:
            j_star = (comp - a - c * ctx0) / (c * n)
            big_j = 0 if j_star <= 0 else min(k, ceil(j_star))
        else:
            big_j = k if comp > a else 0
        mem_steps = k - big_j
        total = big_j * comp
        if mem_steps:
            total += mem_steps * (a + c * ctx0) + c * n * (k * (k - 1) - big_j * (big_j - 1)) / 2
        if self.o:
            total += k * self.o
        return total

    def steps_within(self, n, ctx0, k, elapsed_s):
        """Smallest m in [1, k] with ``stretch_s(n, ctx0, m) >= elapsed_s`` (step in progress ends)."""
        lo, hi = 1, k
        while lo < hi:
            mid = (lo + hi) // 2
            if self.stretch_s(n, ctx0, mid) >= elapsed_s:
                hi = mid
            else:
                lo = mid + 1
        return lo


__all__ = ["Job", "Replica", "DecodeModel"]
