"""Replay a trace against real engine servers, routed by the project's own routers.

A dispatcher thread walks the trace in arrival order, sleeps until each request's
``arrival_s`` (relative to the start of the replay), asks the router (the same class the
simulator runs) for a replica through :class:`LiveView`, and starts one streaming request in a
thread of its own. The first streamed chunk calls the router's ``on_prefill_done`` hook and marks
the prompt's complete blocks as cached on that replica; the end of the stream calls
``on_request_finished``. Router calls are serialised by one lock.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd

from ..sim.request import Request
from .client import complete
from .server import ENGINE_CHUNK_TOKENS, SERVED_MODEL_NAME
from .text import PromptBuilder


class LiveView:
    """What a router may read about real servers (the simulator's ClusterView, from the client side).

    The router learns what a gateway in front of the servers would: its own dispatches and their
    completions. ``cached_blocks`` reports the complete blocks of prompts whose first token came
    back from that replica (a KV-event feed would report them a little earlier, when the engine
    schedules them); ``running`` counts requests dispatched and not finished, ``queue_length`` those
    still waiting for their first token (``queued_prompt_tokens`` their prompt tokens);
    ``active_blocks`` the distinct blocks of running requests plus their output blocks;
    ``cached_block_count`` the blocks ``cached_blocks`` knows on that replica. Copies between replicas are not supported (``start_transfer``
    raises NotImplementedError), so the ``btb`` policies do not run on the real engine.
    """

    def __init__(self, num_replicas: int, block_tokens: int, kv_capacity_blocks: int, seed: int = 0,
                 chunk_tokens: int = ENGINE_CHUNK_TOKENS):
        self.num_replicas = num_replicas
        self.block_tokens = block_tokens
        self.chunk_tokens = chunk_tokens
        self.rng = np.random.default_rng(seed)
        self.capacity_blocks = kv_capacity_blocks
        self.t0 = time.perf_counter()
        self._cached = [set() for _ in range(num_replicas)]
        self._inflight: list[dict] = [{} for _ in range(num_replicas)]
        self._waiting = [0] * num_replicas
        self._started = [set() for _ in range(num_replicas)]

    @property
    def now_s(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def routable_replicas(self):
        return range(self.num_replicas)

    def queue_length(self, replica: int) -> int:
        return self._waiting[replica]

    def queued_prompt_tokens(self, replica: int) -> int:
        return sum(r.input_length for r in self._inflight[replica].values()
                   if r.index not in self._started[replica])

    def cached_block_count(self, replica: int) -> int:
        return len(self._cached[replica])

    def dispatch(self, request, replica: int) -> None:
        raise NotImplementedError("router-side queues (kv_aware router_queue_threshold) are not "
                                  "supported on the real engine")

    def running(self, replica: int) -> int:
        return len(self._inflight[replica])

    def kv_usage(self, replica: int) -> float:
        return min(1.0, self.active_blocks(replica) / self.capacity_blocks)

    def cached_blocks(self, replica, hash_ids, tiers=("hbm", "dram", "disk")) -> int:
        cached = self._cached[replica]
        n = 0
        for b in hash_ids:
            if b not in cached:
                break
            n += 1
        return n

    def active_blocks(self, replica: int) -> int:
        ids = set()
        extra = 0
        bt = self.block_tokens
        for req in self._inflight[replica].values():
            ids.update(req.hash_ids[:req.input_length // bt])
            partial = req.input_length % bt
            extra += -(-(partial + req.output_length) // bt)
        return len(ids) + extra

    def egress_backlog_s(self, replica: int) -> float:
        return 0.0

    def start_transfer(self, src, dst, hash_ids, pause_destination=False) -> int:
        raise NotImplementedError("KV copies between real servers are not supported")

    # bookkeeping called by the replay (under its lock)
    def dispatched(self, req: Request, replica: int) -> None:
        self._inflight[replica][req.index] = req
        self._waiting[replica] += 1

    def first_token(self, req: Request, replica: int) -> None:
        self._waiting[replica] -= 1
        self._started[replica].add(req.index)
        full = req.input_length // self.block_tokens
        self._cached[replica].update(req.hash_ids[:full])

    def finished(self, req: Request, replica: int) -> None:
        self._inflight[replica].pop(req.index, None)
        self._started[replica].discard(req.index)


def replay(trace, router, ports, *, salt: int = 0, seed: int = 0, kv_capacity_blocks: int = 65536,
           time_scale: float = 1.0, progress=None) -> pd.DataFrame:
    """Replay ``trace`` on the servers listening on ``ports`` (one per replica).

    Parameters
    ----------
    trace : btb_core.trace.Trace
        Its ``block_tokens`` words per block id (text from :class:`PromptBuilder` with ``salt``).
    router : btb_core.routers.Router
        Reset with a fresh :class:`LiveView`.
    ports : sequence of int
    salt : int
        Text salt: a new salt shares no prefix with earlier runs on the same servers.
    time_scale : float
        Arrival times are multiplied by it (1 = as in the trace).
    progress : callable(done, total), optional

    Returns
    -------
    pandas.DataFrame
        One row per request in trace order: ``request_id``, ``replica``, ``arrival_s`` (trace),
        ``sent_s`` (when it was sent, seconds from the replay start), ``input_length``,
        ``output_length``, ``ttft_s`` (sent to first chunk), ``e2e_s``, ``cached_tokens``,
        ``prompt_tokens`` (as the engine counted them).

    Raises
    ------
    RuntimeError
        A request failed (the first error is re-raised after every thread ended).
    """
    table = trace.table
    n = len(table)
    bt = int(trace.block_tokens)
    view = LiveView(len(ports), bt, kv_capacity_blocks, seed)
    router.reset(view)
    builder = PromptBuilder(bt, salt)
    lock = threading.Lock()
    out: list[dict | None] = [None] * n
    errors: list[BaseException] = []
    done = [0]
    reqs = []
    for i, row in enumerate(table.itertuples(index=False)):
        ids = tuple(int(x) for x in row.hash_ids)
        reqs.append(Request(i, row.request_id, float(row.arrival_s), int(row.input_length),
                            max(1, int(row.output_length)), ids, bt))
    texts = [builder.text(r.hash_ids, r.input_length) for r in reqs]

    def run_one(req: Request, r: int, sent_s: float) -> None:
        def first():
            with lock:
                view.first_token(req, r)
                router.on_prefill_done(req, r)
        try:
            c = complete(ports[r], SERVED_MODEL_NAME, texts[req.index], req.output_length,
                         on_first_token=first)
            out[req.index] = {"request_id": req.request_id, "replica": r,
                              "arrival_s": req.arrival_s, "sent_s": sent_s,
                              "input_length": req.input_length, "output_length": req.output_length,
                              "ttft_s": c.ttft_s, "e2e_s": c.end_s - c.start_s,
                              "cached_tokens": c.cached_tokens, "prompt_tokens": c.prompt_tokens}
        except BaseException as exc:  # reported after the replay
            errors.append(exc)
        finally:
            with lock:
                view.finished(req, r)
                router.on_request_finished(req, r)
                done[0] += 1
                if progress is not None:
                    progress(done[0], n)

    threads = []
    start = time.perf_counter()
    view.t0 = start
    for req in reqs:
        delay = start + req.arrival_s * time_scale - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if errors:
            break
        with lock:
            r = router.route(req)
            if r is None:
                raise NotImplementedError(f"router {type(router).__name__} held request "
                                          f"{req.request_id!r} back; router-side queues are not "
                                          "supported on the real engine")
            r = int(r)
            view.dispatched(req, r)
        sent = time.perf_counter() - start
        t = threading.Thread(target=run_one, args=(req, r, sent), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"replay failed: {errors[0]}") from errors[0]
    df = pd.DataFrame(out)
    bad = df[df["prompt_tokens"] != df["input_length"]]
    if len(bad):
        raise RuntimeError(f"request {bad['request_id'].iloc[0]!r}: {bad['input_length'].iloc[0]} "
                           f"words counted as {bad['prompt_tokens'].iloc[0]} tokens")
    return df


__all__ = ["LiveView", "replay"]
