"""The discrete-event loop: arrivals, replica operations, RDMA transfers, the router.

Events are ordered by ``(time_s, priority, sequence)`` so ties break the same way every run
(as in SimPy's ``Environment``): transfer completions (priority 0) come before replica operation
ends (1), which come before arrivals at the same instant (2), which come before an idle replica's
scheduler wake-up (3), which come before a stale-load snapshot (4, only with ``load_lag_s > 0``,
:mod:`btb_core.sim.lag`). So a request arriving exactly when a prefill completes sees its blocks, one
arriving when a copy lands sees the copy, and requests arriving at the same instant at an idle
replica are scheduled together (as an engine's step loop would pick them up together).
Arrivals are read from the sorted trace with a pointer rather than pushed on the heap.
"""

from __future__ import annotations

import gc
import heapq
import sys
from array import array
from functools import partial

import numpy as np

from ..errors import ConfigError
from .blocks import BlockIndex, piece_at
from .holders import HolderIndex
from .kvcache import DiskTier, KVCache
from .lag import LaggedView, LoggedKVCache
from .metrics import RequestColumns, SimResult, build_result
from .replica import DecodeModel, Job, Replica
from .request import Request
from .rng import router_rng
from .schedulers import SCHEDULERS
from .view import ClusterView
from .priorities import (ARRIVAL as _ARRIVAL, CLUSTER as _CLUSTER, KICK as _KICK, OP as _OP,
                         SNAP as _SNAP, TRANSFER as _TRANSFER)


def _column(trace, name: str):
    """A trace column other than ``hash_ids`` (pandas Series), without expanding a compact
    trace's ids (:meth:`btb_core.trace.Trace.column`)."""
    col = getattr(trace, "column", None)
    return col(name) if col is not None else trace.table[name]


def _hook(router, name: str):
    """``router``'s bound method ``name``, or None if it is the base :class:`Router`'s no-op (not
    overridden by its class or set on the instance): calling it would do nothing."""
    from ..routers.base import Router

    if name not in getattr(router, "__dict__", {}) and \
            getattr(type(router), name, None) is getattr(Router, name):
        return None
    fn = getattr(router, name, None)
    if fn is None:        # a duck-typed router without it: fail where the call is, as before
        return lambda *args: getattr(router, name)(*args)
    return fn


class Transfer:
    """One RDMA copy of a prefix's blocks from ``src`` to ``dst``."""

    __slots__ = ("tid", "src", "dst", "hash_ids", "num_blocks", "bytes", "request_s", "start_s",
                 "end_s", "landed_blocks", "served", "src_pinned", "piece_starts", "piece_lens",
                 "epochs")

    def __init__(self, tid, src, dst, hash_ids, num_bytes, request_s, start_s, end_s,
                 piece_starts=(), piece_lens=()):
        self.tid = tid
        self.src = src
        self.dst = dst
        self.hash_ids = hash_ids
        self.num_blocks = len(hash_ids)
        self.bytes = num_bytes
        self.request_s = request_s
        self.start_s = start_s
        self.end_s = end_s
        self.landed_blocks = 0
        self.served = 0
        self.src_pinned = 0           # leading blocks pinned on the source (those in its HBM)
        self.epochs = None            # (src, dst) failure counts at the start (cluster events)
        self.piece_starts = piece_starts  # the path's pieces: run start ids and lengths
        self.piece_lens = piece_lens      # (btb_core.sim.blocks)


class _Resumed:
    """A preempted request being recomputed: prompt + tokens generated before the preemption, and
    the tokens still to generate (``orig`` is the trace's request, restored at finish)."""

    __slots__ = ("orig", "index", "request_id", "arrival_s", "input_length", "output_length")

    def __init__(self, orig, input_length, output_length):
        self.orig = orig
        self.index = orig.index
        self.request_id = orig.request_id
        self.arrival_s = orig.arrival_s
        self.input_length = input_length
        self.output_length = output_length

    def drop_hash_ids(self):
        pass


class Simulator:
    """Runs one trace through one router on one cluster.

    Use :func:`simulate`. The router sees the run only through :attr:`view` (a
    :class:`~btb_core.sim.view.ClusterView`); the replica's scheduler
    (:data:`btb_core.sim.schedulers.SCHEDULERS`) drives each replica through the scheduling
    primitives below (``try_admit``, ``start_op``, ``start_stretch``, ``idle``, ``sample_queue``,
    ``complete``, ``first_token``, ``finish_decodes``).
    """

    def __init__(self, trace, router, cluster, seed: int = 0, progress: bool | None = None,
                 kv_event_lag_s: float = 0.0, load_lag_s: float = 0.0, sessions=None,
                 think_s: float | None = None, events=None):
        if sessions is not None and sessions.trace is not trace:
            raise ConfigError("simulate(sessions=plan): trace must be plan.trace (the planned trace)")
        if think_s is not None and not (isinstance(think_s, (int, float)) and not isinstance(think_s, bool)
                                        and np.isfinite(think_s) and think_s >= 0):
            raise ConfigError(f"think_s={think_s!r}: must be a number >= 0 (mean think time, seconds)")
        if think_s is not None and sessions is None:
            raise ConfigError("think_s needs closed-loop sessions (sessions=plan)")
        self.sessions = sessions
        self.think_s = think_s
        self._pending_turns = 0       # closed loop: later turns not yet released and arrived
        self.trace = trace
        self.router = router
        self.cluster = cluster
        self.cost = cluster.cost
        self.block_tokens = int(trace.block_tokens)
        self.num_replicas = cluster.num_replicas
        self.cluster_events = ()
        if events:
            from .cluster import check_events

            self.cluster_events = check_events(events, cluster.num_replicas)
            self.num_replicas += sum(1 for e in self.cluster_events if e.action == "add")
        #: Replicas that accept new requests now (routers pick among these; all without events).
        self.routable_replicas = range(self.num_replicas)
        self.replica_state = ["up"] * cluster.num_replicas + \
            ["absent"] * (self.num_replicas - cluster.num_replicas)
        if self.cluster_events:
            self.routable_replicas = tuple(range(cluster.num_replicas))
        self.retries = 0
        self.event_log = []
        self.rng = router_rng(np.random.default_rng(seed))   # numpy's draws, cheaper (sim/rng.py)
        self.seed = seed
        self.chunk_tokens = cluster.chunk_tokens
        self.progress = progress
        self.scheduler = SCHEDULERS[cluster.scheduler](cluster)
        self.decode = DecodeModel(self.cost)
        self._arrival_s = self.cost.arrival_overhead_s    # 0: the arrival loop adds nothing
        self.kv_bytes_per_token = self.cost.kv_bytes_per_token
        self.capacity_blocks = cluster.hbm_capacity_blocks(self.block_tokens)
        dram_blocks = cluster.tier_capacity_blocks(cluster.dram_capacity_bytes, self.block_tokens)
        disk_blocks = cluster.tier_capacity_blocks(cluster.disk_capacity_bytes, self.block_tokens)
        shared_disk = DiskTier(disk_blocks) if (disk_blocks and cluster.disk_shared) else None
        for field, value in (("kv_event_lag_s", kv_event_lag_s), ("load_lag_s", load_lag_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0.0 <= value < float("inf"):
                raise ConfigError(f"{field}={value!r} must be a finite number of seconds >= 0")
        self.kv_event_lag_s = float(kv_event_lag_s)
        self.load_lag_s = float(load_lag_s)
        #: Cache operations in call order, kept for routers that see KV events late (sim/lag.py).
        self.kv_log: list | None = [] if self.kv_event_lag_s > 0 else None
        self.replicas = []
        #: ``len(replicas[r].waiting)`` per replica, kept with the queues (one list for the view's
        #: ``queue_length_all``, instead of a pass over the replicas per routing decision)
        self.queue_lengths = [0] * self.num_replicas
        #: Block run -> replicas holding it (HBM, DRAM), fed by the caches (sim/holders.py)
        self.holder_index = HolderIndex()
        #: True when some replica has a disk tier (the holder index does not cover disk)
        self.has_disk = bool(disk_blocks)
        for r in range(self.num_replicas):
            disk = shared_disk if cluster.disk_shared else (DiskTier(disk_blocks) if disk_blocks else None)
            if self.kv_log is None:
                cache = KVCache(self.capacity_blocks, dram_blocks, disk)
            else:
                cache = LoggedKVCache(r, self.kv_log, self._clock, self.capacity_blocks,
                                      dram_blocks, disk)
            cache.attach_index(self.holder_index, r)
            self.replicas.append(Replica(r, cache))
        self.now = 0.0
        self._heap = []
        self._seq = 0
        self.transfers: list[Transfer] = []
        # time series as typed columns (8 bytes a value): (time_s, replica, queue_length) and
        # (replica, start_s, end_s)
        self.queue_samples = (array("d"), array("q"), array("q"))
        self.busy_intervals = (array("q"), array("d"), array("d"))
        self.events = 0
        #: Every request's record, by row (closed-loop runs only: later turns are released by
        #: earlier ones). Otherwise records are made a chunk of arrivals at a time and dropped
        #: when the request finishes; finished requests live on as :attr:`results` columns.
        self.jobs: list[Job] = []
        self._held_jobs: dict[int, Job] = {}   # row -> record of a request the router held back
        self.results: RequestColumns | None = None
        self.blocks: BlockIndex | None = None
        self._on_blocks = getattr(router, "on_blocks_complete", None)
        #: The router's on_prefill_done / on_request_finished, or None where it keeps the base
        #: class's no-op (set again after ``router.reset``, in ``_run``)
        self._on_prefill = self._on_finished = None
        #: What the router sees: a ClusterView, or a LaggedView (stale KV events / loads, sim/lag.py)
        self.view = ClusterView(self)
        self._schedule = partial(self.scheduler.plan, self)   # (no extra frame per planning)
        self.paged = cluster.kv_admission == "paged"
        if self.paged:
            self._paged_setup()

    def _clock(self) -> float:
        return self.now

    def _kick(self, rep) -> None:
        """Plan an idle replica with waiting requests at this instant, after the current event."""
        if not rep.busy and rep.waiting and not rep.kick_pending:
            rep.kick_pending = True
            self._push(self.now, _KICK, rep)

    def pin_prefix(self, replica: int, pieces, num_blocks: int) -> int:
        """Pin the leading blocks (at most ``num_blocks``) of a path that sit in ``replica``'s
        HBM; returns how many were pinned (:meth:`ClusterView.pin_prefix`)."""
        cache = self.replicas[replica].cache
        k = cache.hbm_prefix(pieces[0], pieces[1], num_blocks)
        cache.pin_existing(pieces[0], pieces[1], k)
        return k

    def unpin_prefix(self, replica: int, pieces, num_blocks: int) -> None:
        """Undo :meth:`pin_prefix` of ``num_blocks`` leading blocks; waiting requests may now fit."""
        if self.cluster_events and self.replica_state[replica] == "failed":
            return                    # the failure dropped every pin with the cache
        self.replicas[replica].cache.unpin(pieces[0], pieces[1], num_blocks)
        self._kick(self.replicas[replica])

    def hold_prefix(self, replica: int, hash_ids: tuple, until_s: float) -> None:
        """Requests on ``replica`` that would reuse more of ``hash_ids`` than it holds wait until
        ``until_s`` or :meth:`release_hold` (:meth:`ClusterView.hold_prefix`)."""
        if not until_s > self.now:
            return
        rep = self.replicas[replica]
        rep.holds.append((hash_ids[0], hash_ids, float(until_s), None))
        self._push(float(until_s), _KICK, rep, 1)   # token 1: a hold expires (ends a decode stretch)

    def release_hold(self, replica: int, hash_ids: tuple) -> None:
        """End the :meth:`hold_prefix` holds of exactly ``hash_ids`` on ``replica``."""
        rep = self.replicas[replica]
        before = len(rep.holds)
        rep.holds = [h for h in rep.holds if h[1] != hash_ids or h[3] is not None]
        if len(rep.holds) != before and rep.waiting:
            if rep.busy:
                self._wake_held(rep)
            else:
                self._kick(rep)

    # ------------------------------------------------------------------ router actions (via the view)
    def dispatch(self, request, replica: int) -> None:
        """Send ``request``, which the router held back (``route`` returned None), to ``replica``
        now. Raises ``ValueError`` on an invalid replica or a request not held back."""
        job = self._held_jobs.get(request.index)
        if job is None or job.replica >= 0 or not (0 <= replica < self.num_replicas):
            raise ValueError(f"dispatch: request {request.request_id!r} to replica {replica!r}: "
                             "not a held request or not a valid replica")
        del self._held_jobs[request.index]
        self._enqueue(job, replica, plan_now=True)

    def start_transfer(self, src: int, dst: int, hash_ids: tuple, pieces, pause_destination: bool,
                       from_block: int = 0, hold: bool = False) -> int:
        """Queue an RDMA copy already validated by :meth:`ClusterView.start_transfer`; returns its id.

        ``pieces`` is ``(run starts, lengths)`` of ``hash_ids`` (:mod:`btb_core.sim.blocks`);
        ``from_block`` > 0 sends only blocks ``from_block ..`` (time and bytes count those only);
        ``hold`` makes the destination's requests that would reuse more of ``hash_ids`` than it
        holds wait for the copy (see :meth:`ClusterView.start_transfer`).
        """
        source = self.replicas[src]
        run_starts, run_lens = pieces
        tokens = (len(hash_ids) - from_block) * self.block_tokens
        dest = self.replicas[dst]
        start = max(self.now, source.egress_free_s, dest.ingress_free_s)
        end = start + self.cost.load_s("rdma", tokens)
        source.egress_free_s = end
        dest.ingress_free_s = end
        tr = Transfer(len(self.transfers), src, dst, hash_ids, tokens * self.kv_bytes_per_token,
                      self.now, start, end, run_starts, run_lens)
        tr.num_blocks = len(hash_ids) - from_block    # blocks sent (a pipelined chunk: the new ones)
        cache = source.cache
        pinned = cache.hbm_prefix(run_starts, run_lens, len(hash_ids))  # blocks in HBM: a leading part
        cache.pin_existing(run_starts, run_lens, pinned)
        tr.src_pinned = pinned
        if self.cluster_events:
            tr.epochs = (source.epoch, dest.epoch)
        self.transfers.append(tr)
        if pause_destination and end > dest.paused_until:
            dest.paused_until = end
        self._push(end, _TRANSFER, tr)
        if hold:
            dest.holds.append((hash_ids[0], hash_ids, float("inf"), tr.tid))
        return tr.tid

    # ------------------------------------------------------------------ event plumbing
    def _push(self, t, prio, obj, token=0):
        self._seq += 1
        heapq.heappush(self._heap, (t, prio, self._seq, obj, token))

    def sample_queue(self, rep):
        t, r, q = self.queue_samples
        t.append(self.now)
        r.append(rep.idx)
        q.append(len(rep.waiting))

    # ------------------------------------------------------------------ main loop
    def run(self) -> SimResult:
        """Replay the whole trace and return the result.

        Python's cyclic garbage collector is paused while the run builds its per-request records
        and replays events (a run creates no reference cycles per event, and the collector's
        full passes over ~10^5 live records per 10^3 allocations cost about a third of the run
        time); it is restored on exit, also on errors.
        """
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if gc_was_enabled:
                gc.enable()

    def _run(self) -> SimResult:
        trace = self.trace
        n = len(trace)
        arrival = _column(trace, "arrival_s").to_numpy(dtype=np.float64)
        if n and (not np.all(np.isfinite(arrival)) or np.any(np.diff(arrival) < 0)):
            raise ConfigError(f"trace {getattr(trace, 'name', '?')}: arrival_s must be finite and sorted")
        plan = self.sessions
        name = getattr(trace, "name", "trace")
        if plan is None:
            runs = getattr(trace, "hash_runs", None)
            self.blocks = (BlockIndex.from_runs(runs, name) if runs is not None
                           else BlockIndex(trace.hash_flat, trace.hash_offsets, name))
        else:   # rows n..2n-1: every row's extended path (full prompt blocks, then output blocks)
            flat = trace.hash_flat
            self.blocks = BlockIndex(
                np.concatenate([flat, plan.ext_flat]),
                np.concatenate([trace.hash_offsets, plan.ext_offsets[1:] + len(flat)]), name)
        self._rows = (arrival, _column(trace, "input_length").to_numpy(dtype=np.int64),
                      _column(trace, "output_length").to_numpy(dtype=np.int64),
                      _column(trace, "request_id"), np.diff(trace.hash_offsets))
        self.results = RequestColumns(n, cluster_events=bool(self.cluster_events),
                                      fixed=None if plan is not None else self._rows[:3])
        if plan is not None:
            self.jobs = self._make_jobs(0, n)
            arrive_jobs, arrive_s = self._closed_loop_setup(n)
            chunks = iter([(arrive_jobs, arrive_s)])
        else:
            chunks = self._arrival_chunks(n)
        arrive_jobs, arrive_s = next(chunks, ((), ()))
        n_chunk = len(arrive_s)
        j = 0                     # next arrival in the current chunk

        router = self.router
        if self.kv_event_lag_s > 0 or self.load_lag_s > 0:
            self.view = LaggedView(self, self.kv_event_lag_s, self.load_lag_s)
            if self.load_lag_s > 0 and n:
                self._push(self.load_lag_s, _SNAP, self.view)
        router.reset(self.view)
        self._on_prefill = _hook(router, "on_prefill_done")
        self._on_finished = _hook(router, "on_request_finished")
        heap = self._heap
        replicas = self.replicas
        route = router.route
        if self.cluster_events:
            route = self._checked_route
            for ev in self.cluster_events:
                self._push(ev.t_s, _CLUSTER, ev)
        bar = self._progress_bar(n)
        i = 0                     # arrivals so far
        events = 0
        inf = float("inf")
        held = self._held_jobs
        q_time, q_replica, q_len = self.queue_samples
        queue_lengths = self.queue_lengths
        heappop = heapq.heappop
        arrival_s = self._arrival_s
        while True:
            next_arrival = arrive_s[j] if j < n_chunk else inf
            if heap and ((top := heap[0])[0] < next_arrival
                         or (top[0] == next_arrival and top[1] < _ARRIVAL)):
                t, prio, _, obj, token = heappop(heap)
                self.now = t
                events += 1
                if prio == _OP:
                    if token == obj.op_token and obj.busy:
                        self._op_done(obj)
                elif prio == _KICK:
                    obj.kick_pending = False
                    if not obj.busy:
                        self._plan(obj)
                    elif token == 1:            # a hold expired (hold_prefix)
                        self._wake_held(obj)
                elif prio == _TRANSFER:
                    self._transfer_done(obj)
                elif prio == _SNAP:
                    obj.snapshot()
                    if j < n_chunk or self._pending_turns:   # routers look while arrivals remain
                        self._push(t + self.load_lag_s, _SNAP, obj)
                elif prio == _CLUSTER:
                    self._apply_event(obj)
                else:
                    self._arrive_released(obj)
                continue
            if j >= n_chunk:
                break
            # arrival
            self.now = next_arrival
            events += 1
            job = arrive_jobs[j]
            j += 1
            if j == n_chunk:      # the next chunk of records, so the look-ahead below sees it
                arrive_jobs, arrive_s = next(chunks, ((), ()))
                n_chunk = len(arrive_s)
                j = 0
            i += 1
            if bar is not None and (i & 1023) == 0:
                bar.update(1024)
            r = route(job.req)
            req = job.req
            if r is None:     # held in the router's own queue; it calls dispatch() later
                held[req.index] = job
                continue
            if req._source is not None:   # (Request.drop_hash_ids, inlined)
                req._hash_ids = None
            if not (0 <= r < self.num_replicas):
                raise ValueError(f"router {type(router).__name__} returned replica {r!r} for request "
                                 f"{job.req.request_id!r}; valid replicas are 0..{self.num_replicas - 1}")
            rep = replicas[r]
            job.replica = r
            rep.waiting.append(job)
            rep.queued_tokens += req.input_length
            queue_lengths[r] += 1
            q_time.append(next_arrival)
            q_replica.append(r)
            q_len.append(len(rep.waiting))
            if rep.busy:
                if rep.op_kind == "stretch":
                    self._cut_stretch(rep)
                if arrival_s:
                    self._arrival_overhead(rep)
            elif not rep.kick_pending:    # (a wake-up already pending plans it)
                if j < n_chunk and arrive_s[j] == next_arrival:
                    # more arrivals at this instant: schedule together, after all of them
                    rep.kick_pending = True
                    self._push(self.now, _KICK, rep)
                elif next_arrival < rep.paused_until:
                    self._plan(rep)
                else:                     # (Simulator._plan, inlined)
                    self._schedule(rep)
        self.events = events
        end_hook = getattr(router, "on_run_end", None)
        if end_hook is not None:
            end_hook()
        if bar is not None:
            bar.update(n - bar.n)
            bar.close()
        unfinished = np.flatnonzero(self.results.column("finish_s") < 0)
        if len(unfinished):
            k = int(unfinished[0])
            first = self._rows[3].iloc[k:k + 1].tolist()[0]
            raise RuntimeError(f"simulation ended with {len(unfinished)} unfinished requests "
                               f"(first: {first!r}); this is a simulator bug")
        return build_result(self)

    # ------------------------------------------------------------------ per-request records
    def _make_jobs(self, a: int, b: int) -> list:
        """Records (:class:`Job` + :class:`Request`) of trace rows ``a .. b-1``. A request's
        ``hash_ids`` are built from its row's pieces when a router first reads them."""
        arrival, in_len, out_len, req_ids, n_ids = self._rows
        blocks = self.blocks
        p_off = blocks.piece_offsets[a:b + 1].tolist()
        p0 = p_off[0]
        ps = blocks.piece_start[p0:p_off[-1]].tolist()
        pl = blocks.piece_len[p0:p_off[-1]].tolist()
        t = arrival[a:b].tolist()
        inl = in_len[a:b].tolist()
        outl = out_len[a:b].tolist()
        rid = req_ids.iloc[a:b].tolist()
        nb = n_ids[a:b].tolist()
        bt = self.block_tokens
        out = []
        for k in range(b - a):
            x, y = p_off[k] - p0, p_off[k + 1] - p0
            starts, lens = ps[x:y], pl[x:y]
            o = outl[k]
            req = Request(a + k, rid[k], t[k], inl[k], o if o > 1 else 1, None, bt, (starts, lens))
            full = inl[k] // bt           # complete blocks (capped: ids may be missing)
            if full > nb[k]:
                full = nb[k]
            out.append(Job(req, starts, lens, full))
        return out

    def _arrival_chunks(self, n: int, size: int = 4096):
        """``(records, arrival times)`` of the trace's rows, :data:`size` rows at a time, made as
        the replay reaches them (a run holds records of the requests in flight, not of the trace)."""
        arrival = self._rows[0]
        for a in range(0, n, size):
            b = min(n, a + size)
            yield self._make_jobs(a, b), arrival[a:b].tolist()

    # ------------------------------------------------------------------ closed-loop sessions
    def _closed_loop_setup(self, n):
        """Closed-loop replay: jobs walk their extended paths; only first turns arrive from the
        trace, later turns are released by :meth:`_finish_closed` (see btb_core.sessions)."""
        plan = self.sessions
        prev = plan.prev.tolist()
        nxt = [-1] * n
        for b in range(n):
            if prev[b] >= 0:
                nxt[prev[b]] = b
        if self.think_s is None:
            think = plan.gap_s.tolist()
        else:   # exponential think times, seeded apart from the router's generator
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, 12]))
            think = (rng.exponential(self.think_s, n) if self.think_s > 0 else np.zeros(n)).tolist()
        self._next_turn = nxt
        self._think = think
        ext_off = plan.ext_offsets.tolist()
        blocks = self.blocks
        for i, job in enumerate(self.jobs):
            job.piece_starts, job.piece_lens = blocks.row_pieces(n + i)
            job.ext_full = ext_off[i + 1] - ext_off[i]
            if job.full > job.ext_full:   # cannot happen for a plan; guards hand-built ones
                raise ConfigError(f"sessions plan: row {i} has fewer extended blocks than prompt blocks")
        self._finish = self._finish_closed
        self._pending_turns = sum(1 for p in prev if p >= 0)
        first = [i for i in range(n) if prev[i] < 0]
        t = self.jobs
        return [t[i] for i in first], [t[i].req.arrival_s for i in first]

    def _finish_closed(self, rep, job):
        """Finish a turn: its output blocks become reusable, and the next turn is released after
        the think time."""
        n = job.ext_full
        if n > job.pinned:
            rep.cache.complete_blocks(job.piece_starts, job.piece_lens, job.pinned, n)
            job.private -= n - job.pinned
            job.pinned = n
        Simulator._finish(self, rep, job)
        b = self._next_turn[job.req.index]
        if b >= 0:
            self._push(self.now + self._think[b], _ARRIVAL, self.jobs[b])

    def _arrive_released(self, job):
        """A closed-loop turn arrives (released by its previous turn's finish)."""
        req = job.req
        req.arrival_s = self.now
        self._pending_turns -= 1
        r = self._checked_route(req) if self.cluster_events else self.router.route(req)
        if r is None:     # held in the router's own queue; it calls dispatch() later
            self._held_jobs[req.index] = job
            return
        self._enqueue(job, r)

    def _enqueue(self, job, r: int, plan_now: bool = False) -> None:
        """Put a routed job in replica ``r``'s queue (the main arrival loop inlines the same steps).

        The replica is planned now with ``plan_now`` (a held request dispatched by the router),
        else by a wake-up at this instant, after every arrival at it, as the trace path does.
        Raises ``ValueError`` if ``r`` is not a replica.
        """
        req = job.req
        req.drop_hash_ids()
        if not (0 <= r < self.num_replicas):
            raise ValueError(f"router {type(self.router).__name__} returned replica {r!r} for request "
                             f"{req.request_id!r}; valid replicas are 0..{self.num_replicas - 1}")
        rep = self.replicas[r]
        job.replica = r
        rep.waiting.append(job)
        rep.queued_tokens += req.input_length
        self.queue_lengths[r] += 1
        self.sample_queue(rep)
        if not rep.busy:
            if not rep.kick_pending:
                if plan_now:
                    self._plan(rep)
                else:
                    rep.kick_pending = True
                    self._push(self.now, _KICK, rep)
        else:
            if rep.op_kind == "stretch":
                self._cut_stretch(rep)
            if self._arrival_s:
                self._arrival_overhead(rep)

    # ------------------------------------------------------------------ cluster events
    def routable(self, replica: int) -> bool:
        """True if ``replica`` accepts new requests now (present, not failed, not draining)."""
        return self.replica_state[replica] == "up"

    def _checked_route(self, req):
        r = self.router.route(req)
        if r is not None and 0 <= r < self.num_replicas and self.replica_state[r] != "up":
            raise ValueError(f"router {type(self.router).__name__} sent request {req.request_id!r} "
                             f"to replica {r}, which is {self.replica_state[r]} at "
                             f"t={self.now:.6g} s (routers pick among view.routable_replicas)")
        return r

    def _set_routable(self):
        self.routable_replicas = tuple(r for r, st in enumerate(self.replica_state) if st == "up")

    def _apply_event(self, ev):
        r = ev.replica
        router = self.router
        if ev.action == "add":
            self.replica_state[r] = "up"
            self._set_routable()
            self.event_log.append((self.now, "add", r, 0))
            router.on_replica_added(r)
            return
        if ev.action == "drain":
            self.replica_state[r] = "draining"
            self._set_routable()
            self.event_log.append((self.now, "drain", r, 0))
            router.on_replica_removed(r, False)
            return
        # fail: the cache and every request held there are lost; the requests are retried
        rep = self.replicas[r]
        self.replica_state[r] = "failed"
        self._set_routable()
        lost = list(rep.waiting) + list(rep.prefilling) + [e[2] for e in rep.decode_heap]
        if rep.op_kind == "prefill":
            lost.append(rep.op_data)
        rep.waiting.clear()
        rep.queued_tokens = 0
        self.queue_lengths[r] = 0
        rep.prefilling = []
        rep.decode_heap = []
        rep.n_decode = rep.ctx_tokens = rep.in_op = 0
        if rep.busy:
            rs, a, b = self.busy_intervals
            rs.append(r)
            a.append(rep.op_start_s)
            b.append(self.now)
        rep.busy = False
        rep.op_kind = None
        rep.op_data = None
        rep.op_token += 1             # the operation in progress never completes
        rep.paused_until = 0.0
        rep.copy_marks = {}
        rep.copy_lengths = set()
        rep.holds = []
        rep.epoch += 1
        rep.cache.clear(not self.cluster.disk_shared)
        self.sample_queue(rep)
        self.event_log.append((self.now, "fail", r, len(lost)))
        router.on_replica_removed(r, True)
        lost.sort(key=lambda j: j.req.index)
        for job in lost:
            if self.paged:
                if isinstance(job.req, _Resumed):
                    job.req = job.req.orig
                self._first_admit.pop(job, None)
            job.pinned = job.private = 0
            job.done_tokens = 0
            job.first_token_s = -1.0
            job.admit_s = -1.0
            job.replica = -1
            job.retries += 1
            self.retries += 1
            self._route_new(job)

    def _route_new(self, job):
        """Route a job that is not on any replica (a retry after a failure)."""
        req = job.req
        r = self._checked_route(req)
        if r is None:
            self._held_jobs[req.index] = job
            return
        self._enqueue(job, r)

    def _transfer_lost(self, tr) -> bool:
        """A copy whose source or destination failed while it was in flight lands nothing."""
        src, dst = self.replicas[tr.src], self.replicas[tr.dst]
        src_ok = src.epoch == tr.epochs[0]
        dst_ok = dst.epoch == tr.epochs[1]
        if src_ok and dst_ok:
            return False
        if src_ok:
            src.cache.unpin(tr.piece_starts, tr.piece_lens, tr.src_pinned)
            if not src.busy and src.waiting:
                self._plan(src)
        tr.landed_blocks = 0
        if dst_ok and dst.holds:      # requests held for this copy on a live destination go on
            dst.holds = [h for h in dst.holds if h[3] != tr.tid]
            if not dst.busy and dst.waiting and not dst.kick_pending:
                dst.kick_pending = True
                self._push(self.now, _KICK, dst)
        self.router.on_transfer_done(tr.tid, tr.src, tr.dst, 0)
        return True

    # ------------------------------------------------------------------ paged KV admission
    def _paged_setup(self):
        """``kv_admission="paged"``: wrap admission, stretches, chunked iterations, first tokens and
        finishes (the reserve path keeps the plain methods, untouched)."""
        self.preemptions = 0
        self.preempted_tokens = 0          # KV tokens discarded by preemptions
        self.recomputed_after_preemption = 0   # tokens prefilled again at re-admission
        self._admit_seq = 0
        self._no_admit = None              # a replica that preempted in this planning round
        self._first_admit = {}             # job -> its first admission's per-request figures
        self._n_preempt = {}               # row -> preemptions
        self._base_try_admit = self.try_admit
        self.try_admit = self._try_admit_paged
        self.start_stretch = self._start_stretch_paged
        if self.scheduler.decodes_in_ops:     # its operations run decode steps: allocate first
            self._base_schedule = self._schedule
            self._schedule = self._plan_decoding_op_paged
        self._base_first_token = self.first_token
        self.first_token = self._first_token_paged

    def _try_admit_paged(self, rep, job) -> bool:
        if self._no_admit is rep:
            return False
        req = job.req
        bt = self.block_tokens
        if -(-(req.input_length + req.output_length) // bt) > rep.cache.capacity_blocks:
            raise ConfigError(
                f"request {req.request_id!r} needs {-(-(req.input_length + req.output_length) // bt)} "
                f"KV blocks ({req.input_length} + {req.output_length} tokens) but replica HBM holds "
                f"{rep.cache.capacity_blocks}; use a larger node or a smaller request")
        if not self._base_try_admit(rep, job):
            return False
        self._admit_seq += 1
        job.admit_seq = self._admit_seq
        if isinstance(req, _Resumed):
            self.recomputed_after_preemption += req.input_length - job.reused_tokens
        return True

    def _decode_jobs(self, rep):
        return [e[2] for e in rep.decode_heap]

    def _growth(self, rep, jobs, k):
        """Blocks the decode batch must add to run ``k`` more steps (per job: KV of its context
        after those steps, in blocks, minus the blocks it holds)."""
        bt = self.block_tokens
        steps = rep.steps_done
        total = 0
        for j in jobs:
            need = -(-(j.join_ctx - 1 + steps - j.join_step + k) // bt) - j.pinned - j.private
            if need > 0:
                total += need
        return total

    def _allocate_decode(self, rep, k):
        """Allocate what the decode batch needs for ``k`` steps; returns the largest ``k' <= k``
        that fits (0: not even one step fits). Allocation happens for ``k'`` steps at once."""
        jobs = self._decode_jobs(rep)
        cache = rep.cache
        free = cache.capacity_blocks - cache.used_slots
        if self._growth(rep, jobs, k) > free:
            lo, hi = 0, k - 1                # largest k' in [0, k) that fits
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._growth(rep, jobs, mid) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        if k:
            bt = self.block_tokens
            steps = rep.steps_done
            add = 0
            for j in jobs:
                need = -(-(j.join_ctx - 1 + steps - j.join_step + k) // bt) - j.pinned - j.private
                if need > 0:
                    j.private += need
                    add += need
            if add:
                cache.reserve_private(add)
        return k

    def _preempt_newest(self, rep):
        """Preempt the most recently admitted running request of ``rep`` (recompute later)."""
        victims = self._decode_jobs(rep) + list(rep.prefilling)
        job = max(victims, key=lambda j: j.admit_seq)
        req = job.req
        if job.first_token_s >= 0 and job in self._decode_jobs(rep):
            done = rep.steps_done - job.join_step          # decode steps done
            rep.decode_heap = [e for e in rep.decode_heap if e[2] is not job]
            heapq.heapify(rep.decode_heap)
            rep.n_decode -= 1
            rep.ctx_tokens -= job.join_ctx + done
            generated = 1 + done                           # the prefill's token + decode steps
            kv_tokens = req.input_length + done
        else:
            rep.prefilling.remove(job)
            generated = 0
            kv_tokens = job.done_tokens
        rep.cache.release(job.piece_starts, job.piece_lens, job.pinned, job.private)
        job.pinned = job.private = 0
        job.done_tokens = 0
        if job not in self._first_admit:
            self._first_admit[job] = (job.admit_s, job.reused_tokens, job.hit_hbm, job.hit_dram,
                                      job.hit_disk, job.load_s, job.reuse_tier)
        self._n_preempt[req.index] = self._n_preempt.get(req.index, 0) + 1
        if generated:
            orig = req.orig if isinstance(req, _Resumed) else req
            job.req = _Resumed(orig, req.input_length + generated, req.output_length - generated)
        self.preemptions += 1
        self.preempted_tokens += kv_tokens
        rep.waiting.appendleft(job)
        rep.queued_tokens += job.req.input_length
        self.queue_lengths[rep.idx] += 1
        self.sample_queue(rep)
        self._no_admit = rep

    def _start_stretch_paged(self, rep):
        while rep.n_decode:
            k = rep.decode_heap[0][0] - rep.steps_done
            k = self._allocate_decode(rep, k)
            if k:
                n, ctx = rep.n_decode, rep.ctx_tokens
                self.start_op(rep, "stretch", self.decode.stretch_s(n, ctx, k), (n, ctx, k))
                self._no_admit = None
                return
            self._preempt_newest(rep)
        # everything was preempted: idle, and plan again at once (the next engine step)
        self._no_admit = None
        rep.busy = False
        rep.op_kind = None
        if not rep.kick_pending:
            rep.kick_pending = True
            self._push(self.now, _KICK, rep)

    def _plan_decoding_op_paged(self, rep):
        before = self.preemptions
        while rep.n_decode and not self._allocate_decode(rep, 1):
            self._preempt_newest(rep)
        try:
            self._base_schedule(rep)
        finally:
            self._no_admit = None
        if self.preemptions != before and not rep.busy and rep.waiting and not rep.kick_pending:
            rep.kick_pending = True
            self._push(self.now, _KICK, rep)

    def _first_token_paged(self, rep, job):
        if isinstance(job.req, _Resumed):     # recomputed after a preemption: the user already
            if job.req.output_length <= 1:    # has its first token
                self._finish(rep, job)
            else:
                req = job.req
                job.join_ctx = req.input_length + 1
                job.join_step = rep.steps_done
                rep.ctx_tokens += job.join_ctx
                rep.n_decode += 1
                self._seq += 1
                heapq.heappush(rep.decode_heap, (rep.steps_done + req.output_length - 1, self._seq, job))
            return
        self._base_first_token(rep, job)

    def _restore_paged(self, job):
        """At finish: the original request and its first admission's figures back on the job."""
        if isinstance(job.req, _Resumed):
            job.req = job.req.orig
        first = self._first_admit.pop(job, None)
        if first is not None:
            (job.admit_s, job.reused_tokens, job.hit_hbm, job.hit_dram, job.hit_disk, job.load_s,
             job.reuse_tier) = first

    def _progress_bar(self, n):
        show = self.progress
        if show is None:
            show = n >= 20000 and sys.stderr.isatty()
        if not show:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=n, desc="simulating", unit="req", mininterval=0.5)

    # ------------------------------------------------------------------ admission
    def try_admit(self, rep, job) -> bool:
        """Look up the prefix, decide tier loads, reserve KV. False if it does not fit now."""
        req = job.req
        bt = self.block_tokens
        cache = rep.cache
        limit = (req.input_length - 1) // bt
        if limit > job.full:
            limit = job.full
        starts, lens = job.piece_starts, job.piece_lens
        n_h, n_d, n_k, lru_hits = cache.admit_lookup(starts, lens, limit) if limit > 0 else (0, 0, 0, 0)
        cost = self.cost
        load = 0.0
        if n_d or n_k:
            cached_h = n_h * bt
            lower_tokens = (n_d + n_k) * bt
            if n_d:
                load += cost.load_s("dram", n_d * bt)
            if n_k:
                load += cost.load_s("nvme", n_k * bt)
            # load only if it beats recomputing those tokens
            if load >= cost.prefill_s(lower_tokens, cached_h):
                n_d = n_k = 0
                load = 0.0
        m = n_h + n_d + n_k
        total_blocks = -(-(req.input_length + (0 if self.paged else req.output_length)) // bt)
        private = total_blocks - m
        # slots needed: loaded blocks + new prompt blocks + private tail; LRU hits move to pinned
        need = n_d + n_k + private + lru_hits
        if need > cache.capacity_blocks - cache.used_slots:
            if cache.used_slots == 0 and not rep.running:
                raise ConfigError(
                    f"request {req.request_id!r} needs {total_blocks} KV blocks "
                    f"({req.input_length} + {req.output_length} tokens) but replica HBM holds "
                    f"{cache.capacity_blocks}; use a larger node or a smaller request")
            return False
        cache.pin_prefix(starts, lens, n_h, n_d + n_k)
        cache.reserve_private(private)
        job.pinned = m
        job.private = private
        job.reused_tokens = m * bt
        job.done_tokens = m * bt
        job.hit_hbm = n_h * bt
        job.hit_dram = n_d * bt
        job.hit_disk = n_k * bt
        job.load_s = load
        job.reuse_tier = "disk" if n_k else ("dram" if n_d else ("hbm" if n_h else "none"))
        job.admit_s = self.now
        if m and rep.copy_lengths:
            self._mark_served(rep, job, m)
        return True

    def first_unheld(self, rep, start: int = 0):
        """Index of the first waiting request from ``start`` that no hold makes wait (requests
        waiting for a copy in flight are skipped, as vLLM's scheduler skips requests waiting for
        remote KV), or None."""
        waiting = rep.waiting
        if not rep.holds:
            return start if start < len(waiting) else None
        bt = self.block_tokens
        for i in range(start, len(waiting)):
            job = waiting[i]
            limit = (job.req.input_length - 1) // bt
            if limit > job.full:
                limit = job.full
            if limit <= 0:
                return i
            matched = sum(rep.cache.match(job.piece_starts, job.piece_lens, limit))
            if not self._held(rep, job, limit, matched):
                return i
        return None

    def _held(self, rep, job, limit, matched) -> bool:
        """A hold (an in-flight copy started with ``hold=True``, or :meth:`hold_prefix`) covers
        more of this request's leading blocks than it can reuse now: it waits."""
        now = self.now
        live = [h for h in rep.holds if h[2] > now]
        if len(live) != len(rep.holds):
            rep.holds = live
        if not live:
            return False
        ids = None
        for first, hids, _until, _tid in live:
            n = len(hids)
            if n <= matched:
                continue
            if ids is None:
                ids = job.req.hash_ids
            if ids[0] != first:
                continue
            k = n if n <= limit else limit
            if k > matched and ids[k - 1] == hids[k - 1]:
                return True
        return False

    def _mark_served(self, rep, job, m):
        starts, lens = job.piece_starts, job.piece_lens
        for length in rep.copy_lengths:
            if length <= m:
                k, o = piece_at(lens, length - 1)
                recs = rep.copy_marks.get(starts[k] + o)
                if recs:
                    for tr in recs:
                        tr.served += 1

    def complete(self, rep, job, upto_tokens):
        """Make blocks fully prefilled up to ``upto_tokens`` reusable."""
        new_pinned = upto_tokens // self.block_tokens
        if new_pinned > job.full:
            new_pinned = job.full
        if new_pinned > job.pinned:
            rep.cache.complete_blocks(job.piece_starts, job.piece_lens, job.pinned, new_pinned)
            job.private -= new_pinned - job.pinned
            job.pinned = new_pinned
            if self._on_blocks is not None:
                self._on_blocks(job.req, rep.idx, new_pinned)

    def _finish(self, rep, job):
        if self.paged:
            self._restore_paged(job)
        job.finish_s = self.now
        cache = rep.cache
        if type(cache) is KVCache:        # (KVCache.release, inlined; a logged cache logs the call)
            if job.pinned:
                cache.unpin(job.piece_starts, job.piece_lens, job.pinned)
            cache.used_slots -= job.private
        else:
            cache.release(job.piece_starts, job.piece_lens, job.pinned, job.private)
        job.pinned = job.private = 0
        self.results.record(job)
        req = job.req
        if self._on_finished is not None:
            self._on_finished(req, rep.idx)
        if req._source is not None:       # (Request.drop_hash_ids, inlined)
            req._hash_ids = None

    def first_token(self, rep, job):
        job.first_token_s = self.now
        req = job.req
        if self._on_prefill is not None:
            self._on_prefill(req, rep.idx)
        if req.output_length <= 1:
            self._finish(rep, job)
        else:
            job.join_ctx = req.input_length + 1
            job.join_step = steps = rep.steps_done
            rep.ctx_tokens += req.input_length + 1
            rep.n_decode += 1
            self._seq += 1
            heapq.heappush(rep.decode_heap, (steps + req.output_length - 1, self._seq, job))

    def finish_decodes(self, rep):
        heap = rep.decode_heap
        steps = rep.steps_done
        while heap and heap[0][0] <= steps:
            target, _, job = heapq.heappop(heap)
            rep.n_decode -= 1
            rep.ctx_tokens -= job.join_ctx + (target - job.join_step)
            self._finish(rep, job)

    # ------------------------------------------------------------------ planning
    def start_op(self, rep, kind, duration, data):
        rep.busy = True
        rep.op_kind = kind
        token = rep.op_token = rep.op_token + 1
        now = rep.op_start_s = self.now
        end = rep.op_end_s = now + duration
        rep.op_data = data
        self._seq += 1
        heapq.heappush(self._heap, (end, _OP, self._seq, rep, token))

    def idle(self, rep):
        """Leave ``rep`` idle until the next arrival, transfer or wake-up plans it again."""
        rep.busy = False
        rep.op_kind = None

    def _plan(self, rep):
        """Start the replica's next operation, or leave it idle."""
        if self.now < rep.paused_until:
            self.start_op(rep, "pause", rep.paused_until - self.now, None)
            return
        self._schedule(rep)

    def _schedule(self, rep):
        """Ask the scheduler for ``rep``'s next operation (``__init__`` binds this straight to the
        scheduler's ``plan``; paged admission wraps it)."""
        self.scheduler.plan(self, rep)

    def start_stretch(self, rep):
        k = rep.decode_heap[0][0] - rep.steps_done
        n, ctx = rep.n_decode, rep.ctx_tokens
        self.start_op(rep, "stretch", self.decode.stretch_s(n, ctx, k), (n, ctx, k))

    def _cut_stretch(self, rep):
        """An arrival during a decode stretch: end it at the end of the step in progress."""
        n, ctx, k = rep.op_data
        if k <= 1:
            return
        m = self.decode.steps_within(n, ctx, k, self.now - rep.op_start_s)
        if m >= k:
            return
        end = rep.op_end_s = rep.op_start_s + self.decode.stretch_s(n, ctx, m)
        rep.op_data = (n, ctx, m)
        rep.op_token += 1
        self._push(end, _OP, rep, rep.op_token)

    def _arrival_overhead(self, rep) -> None:
        """A request arrived at busy ``rep``: its running operation ends
        ``CostModel.arrival_overhead_s`` later (not a pause; see the cost model's docstring).

        Called after :meth:`_cut_stretch`, so a decode stretch is already cut to the step in
        progress and is never cut again (a later cut finds that step still in progress)."""
        if rep.op_kind == "pause":
            return
        s = self._arrival_s
        end = rep.op_end_s = rep.op_end_s + s
        rep.op_token += 1
        self._push(end, _OP, rep, rep.op_token)

    # ------------------------------------------------------------------ completions
    def _op_done(self, rep):
        kind = rep.op_kind
        r, a, b = self.busy_intervals
        r.append(rep.idx)
        a.append(rep.op_start_s)
        b.append(self.now)
        if kind == "stretch":
            n, ctx, k = rep.op_data
            rep.steps_done += k
            rep.ctx_tokens += n * k
            self.finish_decodes(rep)
        elif kind != "pause":
            self.scheduler.op_done(self, rep, kind, rep.op_data)
        rep.busy = False
        rep.op_kind = None
        if self.now < rep.paused_until:          # (Simulator._plan, inlined)
            self.start_op(rep, "pause", rep.paused_until - self.now, None)
        else:
            self._schedule(rep)

    def _transfer_done(self, tr):
        if tr.epochs is not None and self._transfer_lost(tr):
            return
        src = self.replicas[tr.src]
        src.cache.unpin(tr.piece_starts, tr.piece_lens, tr.src_pinned)
        if not src.busy and src.waiting:
            self._plan(src)
        dst = self.replicas[tr.dst]
        landed = dst.cache.land(tr.piece_starts, tr.piece_lens, len(tr.hash_ids))
        tr.landed_blocks = landed
        if landed:
            key = tr.hash_ids[landed - 1]
            dst.copy_marks.setdefault(key, []).append(tr)
            dst.copy_lengths.add(landed)
        had_holds = bool(dst.holds)
        if had_holds:
            dst.holds = [h for h in dst.holds if h[3] != tr.tid]
        self.router.on_transfer_done(tr.tid, tr.src, tr.dst, landed)
        if not dst.busy and dst.waiting:
            self._plan(dst)
        elif had_holds:
            self._wake_held(dst)

    def _wake_held(self, rep):
        """Requests that waited for a copy may start now: end a decode stretch at its current step
        (as an arrival does) so the scheduler admits them."""
        if rep.busy and rep.op_kind == "stretch" and rep.waiting:
            self._cut_stretch(rep)


def simulate(trace, router, cluster, seed: int = 0, progress: bool | None = None,
             kv_event_lag_s: float = 0.0, load_lag_s: float = 0.0, *, sessions=None,
             think_s: float | None = None, events=None) -> SimResult:
    """Replay ``trace`` through ``router`` on ``cluster``.

    Parameters
    ----------
    trace : btb_core.trace.Trace
        Requests sorted by ``arrival_s`` with chained, interned ``hash_ids`` and ``block_tokens``.
    router : btb_core.routers.Router
        A fresh or reusable router; :meth:`Router.reset` is called first.
    cluster : ClusterConfig
    seed : int
        Seeds the ``numpy.random.Generator`` given to the router (``view.rng``, a
        :class:`~btb_core.sim.rng.RouterRng`: the same draws, cheaper). Same trace,
        router parameters, cluster and seed give an identical result.
    progress : bool or None
        Show a tqdm progress bar; default: only for long runs on a terminal.
    kv_event_lag_s : float >= 0
        Seconds by which cache-content changes reach the router (:mod:`btb_core.sim.lag`); 0 =
        instantly (bit-identical to a run without lag).
    load_lag_s : float >= 0
        Load figures are snapshots refreshed every this many seconds; 0 = live.
    sessions : btb_core.sessions.SessionPlan, optional
        Closed-loop replay (``trace`` must be ``sessions.trace``): a session's first turn arrives
        at its trace time; turn k+1 is released when turn k finishes plus a think time, and a
        finished turn's output blocks stay cached (its extended path), so turn k+1 can reuse them.
        The per-request table then gains ``session_id`` and ``turn`` (``arrival_s`` is the release
        time), and the metrics per-session keys (:func:`btb_core.sessions.session_table`).
    think_s : float, optional
        Mean of exponential think times (seconds, seeded from ``seed``); default: the trace's gap
        between consecutive turns' arrivals (``sessions.gap_s``).
    events : sequence of ClusterEvent, optional
        Replicas added, failing or draining during the run (:class:`ClusterEvent`,
        :func:`load_events`). Routers see ``view.num_replicas`` = initial + added replicas from the
        start, pick among ``view.routable_replicas`` and get ``on_replica_added`` /
        ``on_replica_removed`` calls; the per-request table gains ``retries``, the metrics
        ``retries`` and ``cluster_events``.

    Returns
    -------
    SimResult
        ``.requests`` (per-request table), ``.metrics`` (run metrics dict), ``.transfers``, and
        queue-length / busy-fraction time series.

    Raises
    ------
    ConfigError
        If a request can never fit a replica's KV budget, or arrivals are not sorted.
    """
    try:
        return Simulator(trace, router, cluster, seed=seed, progress=progress,
                         kv_event_lag_s=kv_event_lag_s, load_lag_s=load_lag_s, sessions=sessions,
                         think_s=think_s, events=events).run()
    finally:
        close = getattr(router, "close", None)  # duck-typed routers may not define it
        if close is not None:
            close()  # external resources (the real gateway) end with the run, whatever happens
