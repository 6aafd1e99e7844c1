"""``btb_adaptive``: a burst-aware router that needs no per-trace tuning (issue 10, item 2).

Where the literal :mod:`~btb_core.routers.btb` rule takes four constants (X, Y, Z, M) from one
dataset, this policy takes its decisions from the cost model and what it sees. Per arrival:

a. **Detection at any depth.** A prefix index counts arrivals per prefix node (a chained block id
   names the prefix that ends at it) on a grid of depths (every block up to 16, then 8 depths per
   doubling); the deepest grid node that ``x_repeats`` arrivals share within ``z_s`` seconds is
   refined to the exact depth those arrivals share (longest common prefix by binary search on the
   chained ids). A detected prefix is worth copying only from :attr:`min_copy_blocks` up: the
   smallest depth whose RDMA copy (setup + bytes / bandwidth) is faster than its prefill, from the
   cost model.
b. **Cost and room checks.** A copy of ``n`` blocks to ``dst`` is started only when its predicted
   landing (``max(source egress backlog, destination ingress backlog)`` + setup + ``n`` x block
   bytes / RDMA bandwidth) beats ``dst`` computing the prefix itself (its predicted backlog +
   prefill of the prefix), and ``dst`` has ``n`` free HBM blocks without evicting blocks in use
   (``view.hbm_free_blocks``: budget minus pinned and private blocks). Declined copies go to the
   ledger with the reason.
c. **Demand-sized warm set.** The number of replicas that should hold an active prefix is the
   smallest ``k`` with ``rate x service / k <= target_utilization``: ``rate`` = arrivals of the
   prefix over the last ``rate_window_s`` seconds (at least ``z_s``), ``service`` = the predicted
   prefill of a request's own tokens after the cached prefix. It is recomputed on every arrival of
   the prefix and every completed prefill, so the set grows with the burst (no cap but the
   cluster), re-warms a replica whose copy was evicted, and stays at one replica for a trickle.
d. **Load in predicted seconds.** Each replica's backlog is the router's own book of the
   predicted prefill seconds it dispatched there and that have not completed (each request's
   uncached tokens at the cost model's rate, after the prefix it will find; under ``chunked`` plus
   the decode tokens sharing each iteration), reconciled at every completed prefill, plus a
   destination pause while a copy lands. Replicas whose KV usage is at least ``kv_full_fraction``
   are avoided while another replica is below it. Ties are broken uniformly at random
   (``view.rng``), never by index.
e. **Least predicted TTFT.** Each request goes to the replica with the least predicted TTFT among
   warm replicas (complete blocks now, or a prefill of the prefix already queued there), replicas
   whose copy lands soon (the request waits for it), and cold replicas (recomputing): on an idle
   cluster it spreads cold prefills when that is faster than queueing behind the one holder.
f. **Copy fan-out.** Any replica holding the prefix's complete blocks can be a source (the first
   prefill's replica, or a replica whose copy landed: a broadcast tree); each copy takes the source
   whose copy would finish first.
g. **Pipelined copies** (``chunked`` only, ``pipelined_copies``): when the warm set must grow while
   the first prefill of the prefix is still running, the router copies the blocks completed so far
   after each prefill chunk (``on_blocks_complete``), so the destination is warm about when the
   first prefill ends instead of a copy-time later.
h. **Pinning.** While a prefix is active its complete blocks are pinned in HBM on each holder
   (``view.pin_prefix``), so a burst's hot prefix is not evicted by other traffic; released when
   no arrival of the prefix came for ``rate_window_s`` seconds, and at the end of the run.

Every decision goes to :attr:`ledger` (copies made or skipped and why, warm-set changes, pins) and
every request to :attr:`requests` (replica, kind of choice, predicted and actual TTFT): see
:meth:`ledger_frame` and :meth:`requests_frame`.

Defaults need no tuning: ``x_repeats = 2`` and ``z_s = 1 s`` only decide when to *look* at a prefix
(copies follow from demand and cost, so a decoy that repeats twice costs nothing);
``target_utilization = 0.7`` is the usual headroom of a queue kept out of saturation;
``rate_window_s = 10 s`` is long enough to average a Poisson burst of a few requests per second.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import repeat
from operator import itemgetter

import pandas as pd

from ..errors import ConfigError
from .base import Router, cached_blocks_all, kv_usage_all, kv_usage_max
from .params import RouterParam, check_range
from .holder_sets import RunBook
from .id_runs import request_runs, truncate_runs

#: Depth grid: every block up to this depth, then ``_PER_OCTAVE`` depths per doubling.
_DENSE = 16
_PER_OCTAVE = 8


def grid_depths(n: int) -> list[int]:
    """Depths (blocks, 1-based) of the detection grid up to ``n``: 1..16, then 8 per doubling."""
    out = list(range(1, min(n, _DENSE) + 1))
    d = _DENSE
    while d < n:
        step = max(1, d // _PER_OCTAVE)
        d += step
        out.append(min(d, n))
    if out and out[-1] != n and n > 0:
        out.append(n)
    return sorted(set(out))


def common_prefix(a, b, lo: int = 0) -> int:
    """Length of the common leading run of chained id sequences ``a`` and ``b`` (binary search:
    chained ids are equal at position i exactly when the first i + 1 blocks are equal).
    ``lo`` is a known common length."""
    hi = min(len(a), len(b))
    if hi == 0 or a[0] != b[0]:
        return 0
    lo = max(lo, 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Node(deque):
    """A chain of consecutive grid nodes of the detection index that have had the same arrivals
    since they were created together (a radix-tree edge of grid nodes): a deque of those
    arrivals, as ``(time, hash_ids)`` (one tuple per arrival, shared by every node it touches),
    oldest first; ``first_s``, the nodes' creation time; ``keys``, the nodes' ids (grid ids of one
    path, shallowest first); ``next``, the node that took over the tail of ``keys`` when this one
    was split (see :meth:`BTBAdaptiveRouter._node_of`). Every grid node in ``keys`` has this
    history, so an arrival walks the chains of its path, not its grid nodes one by one. Kept:
    every arrival within ``rate_window_s`` of the last one (the rate estimate) and at least the
    last X (the detection test), so the front may hold up to X older ones."""

    __slots__ = ("first_s", "keys", "next")

    @property
    def hist(self) -> "_Node":
        return self


class _Active:
    """An active prefix: its ids, demand and warm set."""

    __slots__ = ("key", "ids", "runs", "pieces", "depth", "node", "node_key", "last_s", "target",
                 "pins", "pipes", "queued", "own_tokens", "svc_tokens", "svc")

    def __init__(self, key, ids, runs, pieces, node, node_key, now):
        self.key = key
        self.ids = ids
        self.runs = runs         # (starts, lens) of ids
        self.pieces = pieces     # the view's pieces of a path that starts with ids, or None
        self.depth = len(ids)
        self.node = node         # the chain that held grid node node_key when it was detected
        self.node_key = node_key
        self.last_s = now
        self.target = 1
        self.pins: dict = {}     # replica -> blocks pinned
        self.pipes: dict = {}    # dst replica -> blocks sent so far by pipelined copies
        self.queued = 0          # requests of the prefix routed and not yet past prefill
        self.own_tokens = 1      # the last request's tokens after the prefix
        self.svc_tokens = 0      # own_tokens of svc, the predicted prefill of them
        self.svc = 0.0


class BTBAdaptiveRouter(Router):
    """Burst-aware router without per-trace tuning (see the module docstring).

    Parameters
    ----------
    x_repeats : int >= 2
        Arrivals sharing a prefix within ``z_s`` that make the router look at it (2).
    z_s : float > 0
        Detection window, seconds (1.0).
    target_utilization : float in (0, 1]
        Warm-set sizing: load per warm replica kept at or below this (0.7).
    rate_window_s : float > 0
        Window of the prefix arrival-rate estimate, and idle time after which an active prefix is
        released (10.0 s).
    kv_full_fraction : float in (0, 1]
        Replicas at or above this KV usage are avoided (1.0: only a replica whose KV budget is
        all in use). Until 2026-12-02 the default was 0.95, which turned away from a replica that
        holds a long conversation's context whenever its KV was nearly full, so the next turn
        recomputed that context elsewhere: on the Mooncake conversation trace at 4 replicas mean
        TTFT 32.6 s against 4.0 s at 1.0 (``cache_aware`` 4.2 s); 1.0 is also better on the Bursted
        test split, and the same on every shape of the suite (README section 13).
    pipelined_copies : bool
        Copy completed chunks of a running first prefill under ``chunked`` (True); False sends
        a planned copy whole, as soon as the first prefill completes.
    pin_hot : bool
        Pin an active prefix's blocks in HBM on its holders (True).
    prefill_error : float > 0
        Multiplies every prefill time the router predicts (1.0). The router reads the cluster's
        cost model, which in the simulator is exact; a deployed router would use a profiled model.
        Values like 0.7 or 1.5 measure how much the policy depends on an accurate model.

    Raises
    ------
    ConfigError
        On a value outside the ranges above.
    """

    name = "btb_adaptive"
    PARAMS = (
        RouterParam("x_repeats", int, 2, "arrivals sharing a prefix within z_s that mark it"),
        RouterParam("z_s", float, 1.0, "detection window, seconds"),
        RouterParam("target_utilization", float, 0.7, "load per warm replica kept at or below"),
        RouterParam("rate_window_s", float, 10.0, "prefix arrival-rate window, seconds"),
        RouterParam("kv_full_fraction", float, 1.0, "avoid replicas at or above this KV usage"),
        RouterParam("pipelined_copies", bool, True, "copy completed prefill chunks (chunked)"),
        RouterParam("pin_hot", bool, True, "pin an active prefix's blocks in HBM"),
        RouterParam("prefill_error", float, 1.0,
                    "router's prefill-time estimates x this (1 = the simulator's own cost model)"),
    )

    def __init__(self, x_repeats: int = 2, z_s: float = 1.0, target_utilization: float = 0.7,
                 rate_window_s: float = 10.0, kv_full_fraction: float = 1.0,
                 pipelined_copies: bool = True, pin_hot: bool = True,
                 prefill_error: float = 1.0) -> None:
        p = self.name
        check_range(p, "x_repeats", x_repeats, 2, integer=True)
        check_range(p, "z_s", z_s, 0.0, low_open=True)
        check_range(p, "target_utilization", target_utilization, 0.0, 1.0, low_open=True)
        check_range(p, "rate_window_s", rate_window_s, 0.0, low_open=True)
        check_range(p, "kv_full_fraction", kv_full_fraction, 0.0, 1.0, low_open=True)
        check_range(p, "prefill_error", prefill_error, 0.0, low_open=True)
        for f, v in (("pipelined_copies", pipelined_copies), ("pin_hot", pin_hot)):
            if not isinstance(v, bool):
                raise ConfigError(f"{p}: {f}={v!r} must be a bool")
        self.x_repeats = x_repeats
        self.z_s = float(z_s)
        self.target_utilization = float(target_utilization)
        self.rate_window_s = float(rate_window_s)
        self.kv_full_fraction = float(kv_full_fraction)
        self.pipelined_copies = pipelined_copies
        self.pin_hot = pin_hot
        self.prefill_error = float(prefill_error)

    # -- lifecycle -----------------------------------------------------------------------------
    def reset(self, view) -> None:
        super().reset(view)
        n = view.num_replicas
        self.cost = view.cost
        self.bt = view.block_tokens
        self.chunked = view.scheduler == "chunked"
        self.chunk_tokens = view.chunk_tokens
        self._decode_g = self.cost.compute_s(2.0 * self.cost.model.params_active)
        self._decode_a = self.cost.decode_step_s(1, 0)
        self.min_copy_blocks = self._min_copy_blocks()
        self._nodes: dict = {}                       # grid node id -> _Node
        self._expired_s = -math.inf                  # time of the last expiry (see _observe)
        self._sweep_at = 4096                        # sweep dead nodes past this many
        self._active: dict = {}                      # prefix key -> _Active
        self._free_at = [0.0] * n                    # predicted end of dispatched prefill work
        self._out = [dict() for _ in range(n)]       # request index -> service s
        self._out_end = [dict() for _ in range(n)]   # request index -> not before s + service s
        self._decoding = [0] * n                     # requests past prefill, not finished
        # per replica: the paths of its queued prefills, kept per run of ids (one walk of the
        # query's runs finds every replica's pending depth)
        self._pend = RunBook(n)
        self._incoming = [list() for _ in range(n)]  # (ids, land_s, tid or ("pipe", key))
        self._inc_any: set = set()                    # replicas whose _incoming is not empty
        self._tid: dict = {}                          # transfer id -> (key, dst, ids, row)
        self._req: dict = {}                          # request index -> (row, replica, ids, full)
        self._grid_cache: dict = {}
        self._own_cache: dict = {}                   # (depth, input tokens) -> _own(depth, isl)
        self._idle_bound = math.inf                  # <= every active prefix's last_s
        # the view answers matches from a request's pieces (ClusterView, LaggedView)
        self._by_pieces = all(hasattr(view, f) for f in (
            "request_pieces", "cached_blocks_hbm_dram_pieces", "cached_blocks_all_pieces"))
        self._acted = False                          # a copy, pin or hold started (see route)
        #: Decision ledger: one dict per copy made / skipped, warm-set change and pin.
        self.ledger: list[dict] = []
        #: One row per routed request (replica, choice, predicted / actual TTFT).
        self.requests: list[list] = []

    def _min_copy_blocks(self) -> int:
        """Smallest depth (blocks) whose RDMA copy beats recomputing it (cost model)."""
        for n in range(1, 1 << 16):
            tok = n * self.bt
            if self.cost.load_s("rdma", tok) < self.cost.prefill_s(tok, 0):
                return n
        return 1 << 16

    # -- predicted times -----------------------------------------------------------------------
    def service_s(self, new_tokens: int, cached_tokens: int, replica: int) -> float:
        """Predicted prefill seconds of ``new_tokens`` after ``cached_tokens`` on ``replica``:
        the cost model's prefill time, plus, under ``chunked``, the decode tokens of the requests
        decoding there sharing each iteration (``ceil(new / chunk)`` iterations)."""
        t = self.cost.prefill_s(new_tokens, cached_tokens) * self.prefill_error
        if self.chunked:
            iters = max(1, -(-new_tokens // self.chunk_tokens))
            t = max(t, iters * self._decode_a) + iters * self._decode_g * self._decoding[replica]
        return t

    def backlog_s(self, replica: int) -> float:
        """Predicted seconds until ``replica`` has done the prefills dispatched to it (and any
        pause for a landing copy)."""
        now = self.view.now_s
        end = self._free_at[replica]
        return end - now if end > now else 0.0

    def _pending_blocks(self, replica: int, runs, limit: int) -> int:
        """Leading blocks of the ids with runs ``runs`` that a prefill already dispatched to
        ``replica`` will complete."""
        if limit <= 0:
            return 0
        return self._pend.depth(replica, runs[0], runs[1], limit)

    def _set_incoming(self, replica: int, entries: list) -> None:
        self._incoming[replica] = entries
        if entries:
            self._inc_any.add(replica)
        else:
            self._inc_any.discard(replica)

    def _landing(self, replica: int, ids) -> tuple[int, float]:
        """Deepest in-flight copy to ``replica`` that is a prefix of ``ids``: (blocks, land_s)."""
        best = (0, 0.0)
        for cids, land_s, _tid in self._incoming[replica]:
            n = len(cids)
            if n > best[0] and n <= len(ids) and ids[n - 1] == cids[-1]:
                best = (n, land_s)
        return best

    def predict(self, request) -> list[tuple[float, float, str, int, float]]:
        """Per replica ``(score, predicted TTFT seconds, choice, reused blocks, start_s)``.

        ``choice`` is ``"warm"``, ``"landing"`` or ``"cold"``; ``start_s`` the earliest time its
        prefill can start (a landing copy's predicted landing). ``score`` (what the router
        minimises) is the predicted TTFT plus, under ``chunked``, the delay the request adds to the
        requests already waiting there (they share its iteration), plus a large penalty at or above
        ``kv_full_fraction``."""
        pred = self._scores(request, request_runs(request))
        return [self._entry(r, pred) for r in range(self.view.num_replicas)]

    def _cached(self, request):
        """(HBM, HBM+DRAM) matches of ``request.hash_ids`` per replica from the view (dicts;
        absent = 0): from the request's pieces when the view hands them over (no id tuple to
        look up), else from its ids."""
        v = self.view
        ids = request.hash_ids
        if self._by_pieces:
            pieces = v.request_pieces(request)
            if pieces is not None:
                return v.cached_blocks_hbm_dram_pieces(pieces[0], pieces[1], len(ids))
        both = getattr(v, "cached_blocks_hbm_dram", None)
        if both is not None:
            return both(ids)
        return cached_blocks_all(v, ids, ("hbm",)), cached_blocks_all(v, ids, ("hbm", "dram"))

    def _matches(self, request, runs, limit, cached=None, pend=None):
        """(HBM, HBM+DRAM, pending) matches of ``request.hash_ids`` (runs ``runs``) per replica
        (dicts; absent = 0). ``cached``: :meth:`_cached` of the request taken earlier in this
        arrival with no copy, pin or hold started since (the view's answer is the same)."""
        if limit <= 0:
            return {}, {}, {}
        hbm, hbm_dram = cached if cached is not None else self._cached(request)
        if pend is None:
            pend = self._pend.depths(runs[0], runs[1], limit)
        return hbm, hbm_dram, pend

    def _own(self, depth: int, isl: int):
        """``(prefill seconds of the tokens after ``depth`` reused blocks before the decode share,
        decode share per decoding request, chunk share cap)``: the per-depth part of
        :meth:`service_s` (the decode share is ``iters x decode_g``, times the replica's decoding
        requests), asked once per distinct depth and kept for the next request of the same
        length (the cost model is fixed for a run)."""
        key = (depth, isl)
        got = self._own_cache.get(key)
        if got is not None:
            return got
        new = isl - depth * self.bt
        t0 = self.cost.prefill_s(new, depth * self.bt) * self.prefill_error
        if not self.chunked:
            got = (t0, 0.0, 0)
        else:
            iters = max(1, -(-new // self.chunk_tokens))
            t0 = max(t0, iters * self._decode_a)
            got = (t0, iters * self._decode_g, self.chunk_tokens // max(1, new))
        if len(self._own_cache) >= 8192:
            self._own_cache.clear()
        self._own_cache[key] = got
        return got

    def _scores(self, request, runs, cached=None, pend=None):
        """Every replica's score, without building every replica's :meth:`predict` tuple:
        ``(scores, reused, special, own, now, isl)`` (:meth:`_entry` turns it into one replica's
        tuple; ``own`` maps a reuse depth to :meth:`_own`).

        ``scores`` is a list over replicas; ``special`` the full tuples of the replicas whose
        choice needs the per-replica rule of :meth:`_predict_one` (a prefix part in DRAM worth
        loading, or a copy landing there); ``reused`` the blocks every other replica with a match
        reuses (``max(HBM match, pending depth)``; absent: 0, cold). Those replicas start now and
        are scored with the same IEEE-754 operations in the same order as :meth:`_predict_one`
        (the cost model asked once per distinct reuse depth, :meth:`_own`), so both agree bit for
        bit. The matches come from one walk of the view's holder index and of the pending book
        each; the per-replica part is one pass over plain lists."""
        v = self.view
        ids = request.hash_ids
        isl = int(request.input_length)
        limit = min((isl - 1) // self.bt, request.full_blocks, len(ids))
        now = v.now_s
        n = v.num_replicas
        full = self.kv_full_fraction
        # every replica's KV usage only when one is at the threshold (else each special one's)
        usage = kv_usage_all(v) if kv_usage_max(v) >= full else None
        special = {}
        reused = {}
        if limit > 0:
            hbm, hbm_dram, pend = self._matches(request, runs, limit, cached, pend)
            if self._inc_any:
                nids = len(ids)
                incoming = self._incoming
                for r in self._inc_any:
                    # a copy landing there that is a prefix of ids: the per-replica rule
                    # (without one, _predict_one gives what the common rule below gives)
                    for cids, _land, _tid in incoming[r]:
                        k = len(cids)
                        if k <= nids and ids[k - 1] == cids[-1]:
                            special[r] = None
                            break
            # every holder reuses max(min(HBM, limit), pending), but a replica whose DRAM holds
            # more than its HBM (capped at limit) takes the per-replica rule (load or
            # recompute); a special replica's entry here is never read (one comprehension per
            # pass: the holder index names about every replica when they share a system prompt)
            if hbm and max(hbm.values()) > limit:
                reused = {r: (m if m < limit else limit) for r, m in hbm.items()}
            else:
                reused = hbm.copy()
            if hbm_dram != hbm:
                capped = reused.get
                more = [r for r, md in hbm_dram.items()
                        if (md if md < limit else limit) > capped(r, 0)]
                if more:
                    special.update(dict.fromkeys(more))
            for r, p in pend.items():
                if p > reused.get(r, 0):
                    reused[r] = p
            for r in special:
                special[r] = self._predict_one(r, ids, isl, limit, now, hbm.get(r, 0),
                                               hbm_dram.get(r, 0), pend.get(r, 0),
                                               usage[r] if usage is not None else v.kv_usage(r))
        own = {0: self._own(0, isl)}
        for d in set(reused.values()):
            if d not in own:
                own[d] = self._own(d, isl)
        free = self._free_at
        if not self.chunked:
            own0 = own[0][0]
            if len(reused) == n and len(own) == 2:
                # every replica reuses the same depth (a system prompt they all cache)
                o = own[next(iter(reused.values()))][0]
                scores = [(f - now) + o if f > now else 0.0 + o for f in free]
            elif len(reused) > 8:
                # each replica's own prefill seconds, set by C-level maps (no per-holder loop)
                per = [own0] * n
                if len(own) == 2:
                    any(map(per.__setitem__, reused.keys(),
                            repeat(own[next(iter(reused.values()))][0])))
                else:
                    first = {d: o[0] for d, o in own.items()}
                    any(map(per.__setitem__, reused.keys(),
                            map(first.__getitem__, reused.values())))
                scores = [(f - now) + o if f > now else 0.0 + o for f, o in zip(free, per)]
            else:
                scores = [(f - now) + own0 if f > now else 0.0 + own0 for f in free]
                for r, d in reused.items():       # the few holders: their own depth
                    o = own[d][0]
                    f = free[r]
                    scores[r] = (f - now) + o if f > now else 0.0 + o
        else:
            dec = self._decoding
            out = self._out
            scores = [0.0] * n
            for r in range(n):
                o0, og, cap = own[reused.get(r, 0)]
                f = free[r]
                o = o0 + og * dec[r]
                s = (f - now if f > now else 0.0) + o
                q = len(out[r])
                if q > 0:
                    share = q - 1 if q - 1 < cap else cap
                    if share > 0:
                        s += o * share
                scores[r] = s
        if usage is not None:
            for r in range(n):
                if usage[r] >= full:
                    scores[r] += 1e6
        for r, p in special.items():
            scores[r] = p[0]
        return scores, reused, special, own, now, isl

    def _entry(self, r, pred):
        """Replica ``r``'s :meth:`predict` tuple from :meth:`_scores`' result."""
        scores, reused, special, own, now, isl = pred
        p = special.get(r)
        if p is not None:
            return p
        m = reused.get(r, 0)
        o0, og, _cap = own[m]
        o = o0 + og * self._decoding[r] if self.chunked else o0
        f = self._free_at[r]
        t = (f - now if f > now else 0.0) + o
        return (scores[r], t, "warm" if m else "cold", m, now)

    def _predict_one(self, r, ids, isl, limit, now, m, md, p, usage):
        """One replica's :meth:`predict` tuple, given its HBM match ``m``, HBM+DRAM match
        ``md`` and pending depth ``p`` (uncapped)."""
        bt = self.bt
        f = self._free_at[r]
        wait = f - now if f > now else 0.0       # backlog_s(r)
        m = min(m, limit)
        extra = 0.0
        if m < limit:
            md = min(md, limit)
            if md > m:
                load = self.cost.load_s("dram", (md - m) * bt)
                if load < self.cost.prefill_s((md - m) * bt, m * bt):
                    extra, m = load, md
            if p > m:
                m, extra = p, 0.0
        kind = "warm" if m else "cold"
        ready = now
        if self._incoming[r]:
            n, land_s = self._landing(r, ids)
            n = min(n, limit)
            if n > m:
                m, extra, kind, ready = n, 0.0, "landing", land_s
                wait = max(wait, land_s - now)
        # service_s(isl - m x bt, m x bt, r), the cost model's part kept per depth (_own)
        o0, og, cap = self._own(m, isl)
        own = o0 + og * self._decoding[r] if self.chunked else o0
        t = wait + extra + own
        score = t
        if self.chunked and self._out[r]:
            # chunked prefill admits queued requests into one iteration: joining it delays
            # the requests already waiting there by our own compute
            share = min(len(self._out[r]) - 1, cap)
            if share > 0:
                score += own * share
        if usage >= self.kv_full_fraction:
            score += 1e6       # avoided while any replica is below the threshold
        return (score, t, kind, m, ready)

    def _argmin(self, values: list[float]) -> int:
        cands = self.candidates()
        if len(cands) != len(values):    # cluster events: only routable replicas
            lo = min(values[r] for r in cands)
            tol = 1e-9 + 1e-9 * abs(lo)
            tied = [r for r in cands if values[r] - lo <= tol]
        else:
            # tied = [r for r, x in enumerate(values) if x - lo <= tol], found from the sorted
            # values (C-level sort; x - lo only grows with x, so the tied are the k smallest)
            srt = sorted(values)
            lo = srt[0]
            tol = 1e-9 + 1e-9 * abs(lo)
            n = len(srt)
            if n == 1 or srt[1] - lo > tol:
                return values.index(lo)
            a = values.count(lo)     # exact minima: srt[:a]
            if a == n or srt[a] - lo > tol:
                # every tied replica scores exactly lo: the j-th of them
                j = int(self.view.rng.integers(a))
                i = values.index(lo)
                for _ in range(j):
                    i = values.index(lo, i + 1)
                return i
            tied = [r for r, x in enumerate(values) if x - lo <= tol]
        if len(tied) == 1:
            return tied[0]
        return tied[int(self.view.rng.integers(len(tied)))]

    # -- detection -----------------------------------------------------------------------------
    def _grid(self, n: int) -> list[int]:
        return self._grid_keys(n)[0]

    def _grid_keys(self, n: int):
        """``(grid_depths(n), getter)``: ``getter(ids)`` is the tuple of the grid nodes' ids
        ``ids[d - 1]`` (one C-level call)."""
        g = self._grid_cache.get(n)
        if g is None:
            depths = grid_depths(n)
            get = itemgetter(*[d - 1 for d in depths])
            if len(depths) == 1:
                get = (lambda one: lambda ids: (one(ids),))(get)
            g = self._grid_cache[n] = (depths, get)
        return g

    def _observe(self, request):
        """Update the prefix index with ``request``; return ``(depth, node, key)``: the deepest
        prefix X arrivals share within ``z_s`` (depth >= :attr:`min_copy_blocks`), the chain
        holding the grid node where it was detected and that node's id; or None.

        Each grid node on the request's path is touched in depth order: the arrival joins its
        history, and the node is *detected* when its X-th last arrival is within ``z_s``; after a
        detected node the walk stops at the first node that is not (deeper nodes are shared by
        fewer arrivals). A node expires ``rate_window_s`` after its last arrival: after each
        arrival at ``now`` exactly the nodes with ``now - last > rate_window_s`` are gone, so a
        node found dead by that test (against the time of the last arrival) is taken as absent and
        replaced, and dead nodes are swept from the dict only when it has grown (not per arrival).

        Grid nodes are kept in chains (:class:`_Node`) of consecutive nodes with one history, so
        the walk touches each chain once: every node of a chain gets the same arrival and the same
        test result. A chain is split where the path leaves it or where the walk stops inside it
        (the tail keeps the history without this arrival); the nodes past a missing or dead one
        are missing or dead too (a live node's arrivals all walked its ancestors), so they become
        one new chain. Same histories, detections and creation times as node by node
        (tests/test_adaptive_incremental.py)."""
        now = self.view.now_s
        ids = request.hash_ids
        full = min(request.full_blocks, len(ids))
        if full < 1:
            return None
        nodes = self._nodes
        get = nodes.get
        x, z, w = self.x_repeats, self.z_s + 1e-9, self.rate_window_s
        x1 = x - 1
        expired = self._expired_s     # time of the last arrival: nodes idle since are gone
        entry = (now, ids)
        found_d, found, found_key = 0, None, None
        depths, keyget = self._grid_keys(full)
        keys = keyget(ids)
        nk = len(keys)
        i = 0
        while i < nk:
            key = keys[i]
            node = get(key)
            if node is None or expired - node[-1][0] > w:
                # missing or dead, and so is every deeper node of the path: one new chain (a
                # single node after a detection: it holds one arrival, not detected, X >= 2)
                new = _Node((entry,))
                new.first_s = now
                new.next = None
                if found is not None or i == nk - 1:
                    new.keys = (key,)
                    nodes[key] = new
                else:
                    new.keys = nk_keys = keys[i:]
                    nodes.update(dict.fromkeys(nk_keys, new))
                break
            ck = node.keys
            if ck[0] != key:          # (not reached: a live chain is entered at its first node)
                node = self._split(node, ck.index(key))
                ck = node.keys
            cl = len(ck)
            # path nodes in this chain: chained ids agree at a position exactly when they agree
            # at every earlier one
            if keys[i:i + cl] == ck:
                q = cl
            else:
                lo, hi = 1, min(cl, nk - i)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if keys[i + mid - 1] == ck[mid - 1]:
                        lo = mid
                    else:
                        hi = mid - 1
                q = lo
            # the test after this arrival joins (trimming keeps the X-th last one)
            det = len(node) >= x1 and now - node[-x1][0] <= z
            if not det and found is not None:
                q = 1                 # the walk stops after this chain's first node
            if q < cl:
                self._split(node, q)
            node.append(entry)
            if now - node[0][0] > w:
                while now - node[0][0] > w and len(node) > x:
                    node.popleft()
            if det:
                i += q
                found_d, found, found_key = depths[i - 1], node, keys[i - 1]
            elif found is not None:
                break
            else:
                i += q
        self._expired_s = now
        if len(nodes) > self._sweep_at:
            self._sweep(now)
        if found is None:
            return None
        depth = full
        for k in range(len(found) - x, len(found) - 1):
            depth = min(depth, common_prefix(ids, found[k][1], found_d))
        if depth < self.min_copy_blocks:
            return None
        return depth, found, found_key

    def _split(self, node: _Node, m: int) -> _Node:
        """Cut chain ``node`` after its first ``m`` grid nodes: the rest become a new chain with
        the same history (a copy), linked from ``node.next``. Returns the new chain."""
        tail = _Node(node)
        tail.first_s = node.first_s
        tail.keys = tk = node.keys[m:]
        tail.next = node.next
        node.keys = node.keys[:m]
        node.next = tail
        self._nodes.update(dict.fromkeys(tk, tail))
        return tail

    @staticmethod
    def _node_of(node: _Node, key) -> _Node:
        """The chain that holds grid node ``key`` now, from the chain that held it earlier (a
        split moves a chain's tail to the chains linked by ``next``; a node replaced after it
        died is a new chain, so the old one keeps the dead node's history, as it stopped)."""
        while key not in node.keys:
            node = node.next
        return node

    def _sweep(self, now: float) -> None:
        """Drop the nodes expired at ``now`` (no arrival for ``rate_window_s``)."""
        w = self.rate_window_s
        self._nodes = {k: n for k, n in self._nodes.items() if not now - n[-1][0] > w}
        self._sweep_at = max(4096, 2 * len(self._nodes))

    # -- warm set ------------------------------------------------------------------------------
    def _rate(self, node) -> float:
        now = self.view.now_s
        span = max(self.z_s, min(self.rate_window_s, now - node.first_s))
        hist = node.hist
        w = self.rate_window_s
        last = hist[-1][0]
        k = 0
        while last - hist[k][0] > w:     # older arrivals kept only for the detection test
            k += 1
        return (len(hist) - k) / span

    def _act_rate(self, act) -> float:
        """:meth:`_rate` of the grid node where ``act`` was detected."""
        node = act.node
        if act.node_key not in node.keys:
            node = act.node = self._node_of(node, act.node_key)
        return self._rate(node)

    def _holders(self, act, cached=None, pend=None) -> tuple[list[int], list[int]]:
        """Replicas with the prefix complete (HBM or DRAM), and those with it pending or landing.
        ``cached``: the view's :meth:`_cached` of a request's ids that start with the prefix
        (a replica holds the whole prefix exactly when it matches at least its depth there);
        ``pend``: the pending book's depths of such ids, up to at least the prefix's depth."""
        ids, n = act.ids, act.depth
        if cached is not None:
            held = cached[1]
        elif act.pieces is not None:
            held = self.view.cached_blocks_all_pieces(act.pieces[0], act.pieces[1], n,
                                                      ("hbm", "dram"))
        else:
            held = cached_blocks_all(self.view, ids, ("hbm", "dram"))
        if held and min(held.values()) >= n:
            complete = sorted(held)     # every holder has it all (C-level)
        else:
            complete = sorted([r for r, m in held.items() if m >= n])
        done = set(complete)
        if pend is None:
            pend = self._pend.depths(act.runs[0], act.runs[1], n)
        coming = {r for r, k in pend.items() if k >= n and r not in done}
        if self._inc_any:
            # a copy of the whole prefix landing there (_landing(r, ids)[0] >= n)
            key = ids[n - 1]
            incoming = self._incoming
            for r in self._inc_any:
                if r not in done:
                    for cids, _land, _tid in incoming[r]:
                        if len(cids) == n and cids[-1] == key:
                            coming.add(r)
                            break
        if act.pipes:
            coming.update(r for r in act.pipes if r not in done)
        return complete, sorted(coming)

    def _size_warm_set(self, act, request=None, cached=None, pend=None) -> None:
        v = self.view
        n_blocks = act.depth
        if request is not None:
            act.own_tokens = max(1, int(request.input_length) - n_blocks * self.bt)
        if act.svc_tokens != act.own_tokens:
            act.svc_tokens = act.own_tokens
            act.svc = self.cost.prefill_s(act.own_tokens, n_blocks * self.bt) * self.prefill_error
        service = act.svc
        rate = self._act_rate(act)
        # steady demand: rate x service per warm replica at most the target utilisation
        k_rate = math.ceil(rate * service / self.target_utilization)
        # start of a burst: while no replica holds the prefix complete, the requests that arrive
        # wait for the first prefill and are then served in one batch; split over k replicas each
        # costs a copy time more, so k = queued x service / copy time (at most queued + 1)
        complete, coming = self._holders(act, cached, pend)
        k_backlog = 1
        if not complete and act.queued:
            copy_s = self.cost.load_s("rdma", n_blocks * self.bt)
            k_backlog = min(act.queued + 1, math.ceil(act.queued * service / copy_s))
        target = max(1, min(v.num_replicas, max(k_rate, k_backlog)))
        if target != act.target:
            self.ledger.append({"time_s": v.now_s, "event": "warm_set", "prefix_blocks": n_blocks,
                                "rate_per_s": rate, "service_s": service, "target": target,
                                "src": -1, "dst": -1, "reason": f"{act.target} -> {target}",
                                "predicted_land_s": float("nan")})
            act.target = target
        if self.pin_hot:
            self._pin(act, complete)
        need = act.target - len(complete) - len(coming)
        if need <= 0:
            return
        if not complete:
            self._plan_pipes(act, coming, need)
            return
        self._copy(act, complete, coming, need)

    def _copy(self, act, complete, coming, need: int) -> None:
        v = self.view
        now = v.now_s
        n = act.depth
        tokens = n * self.bt
        copy_s = self.cost.load_s("rdma", tokens)
        recompute = self.cost.prefill_s(tokens, 0) * self.prefill_error
        held = set(complete) | set(coming)
        cands = sorted((r for r in self.candidates() if r not in held),
                       key=lambda r: (self.backlog_s(r), v.kv_usage(r), r))
        for dst in cands:
            if need <= 0:
                break
            if v.hbm_free_blocks(dst) < n:
                self._skip(act, dst, "no HBM room without evicting blocks in use")
                continue
            src = min(complete, key=lambda s: (max(v.egress_backlog_s(s), v.ingress_backlog_s(dst)), s))
            start = max(v.egress_backlog_s(src), v.ingress_backlog_s(dst))
            land = start + copy_s
            if land >= self.backlog_s(dst) + recompute:
                self._skip(act, dst, "copy slower than recomputing")
                continue
            self._start(act, src, dst, act.ids, now + land)
            need -= 1

    def _start(self, act, src, dst, ids, land_s, first_block: int = 0) -> None:
        v = self.view
        # hold: requests on dst that would reuse the copy wait for it instead of recomputing
        self._acted = True
        tid = v.start_transfer(src, dst, ids, from_block=first_block, hold=True)
        self._incoming[dst].append((ids, land_s, tid))
        self._inc_any.add(dst)
        row = len(self.ledger)
        self._tid[tid] = (act.key, dst, ids, row)
        self.ledger.append({"time_s": v.now_s, "event": "copy", "prefix_blocks": len(ids),
                            "rate_per_s": self._act_rate(act), "service_s": float("nan"),
                            "target": act.target, "src": src, "dst": dst,
                            "reason": "pipelined chunk" if first_block or ids is not act.ids
                            else "warm set below demand",
                            "predicted_land_s": land_s, "landed_s": float("nan")})

    def _skip(self, act, dst, reason) -> None:
        self.ledger.append({"time_s": self.view.now_s, "event": "skip", "prefix_blocks": act.depth,
                            "rate_per_s": self._act_rate(act), "service_s": float("nan"),
                            "target": act.target, "src": -1, "dst": dst, "reason": reason,
                            "predicted_land_s": float("nan")})

    # -- pipelined copies (g) ------------------------------------------------------------------
    def _plan_pipes(self, act, coming, need: int) -> None:
        """Choose destinations that will receive the prefix chunk by chunk from the replica whose
        first prefill of it is running."""
        v = self.view
        srcs = [r for r in coming if self._pending_blocks(r, act.runs, act.depth) >= act.depth
                and r not in act.pipes]
        if not srcs:
            return
        held = set(coming)
        cands = sorted((r for r in self.candidates() if r not in held),
                       key=lambda r: (self.backlog_s(r), v.kv_usage(r), r))
        for dst in cands[:need]:
            if v.hbm_free_blocks(dst) < act.depth:
                self._skip(act, dst, "no HBM room without evicting blocks in use")
                continue
            src = srcs[0]
            act.pipes[dst] = [src, 0]
            # the destination holds requests of the prefix until the last chunk lands
            ready = (self._free_at[src] + self.cost.load_s("rdma", self.chunk_tokens)
                     + self.cost.setup_latency_s["rdma"])
            self._acted = True
            v.hold_prefix(dst, act.ids, ready + self.rate_window_s)
            self._incoming[dst].append((act.ids, ready, ("pipe", act.key)))
            self._inc_any.add(dst)
            self.ledger.append({"time_s": v.now_s, "event": "pipe", "prefix_blocks": act.depth,
                                "rate_per_s": self._act_rate(act), "service_s": float("nan"),
                                "target": act.target, "src": srcs[0], "dst": dst,
                                "reason": "first prefill running: copy each completed chunk",
                                "predicted_land_s": float("nan")})

    def on_blocks_complete(self, request, replica: int, complete_blocks: int) -> None:
        """Engine hook: ``complete_blocks`` leading blocks of ``request``'s prompt just became
        complete on ``replica`` (after each chunk under ``chunked``, at the end of the prefill
        under ``prefill_first``); extend the pipelined copies of active prefixes sourced there."""
        if not self._active:
            return
        hash_ids = None
        for act in list(self._active.values()):
            if not act.pipes:
                continue
            n = min(complete_blocks, act.depth)
            if n <= 0 or (n < act.depth and not self.pipelined_copies):
                continue
            if hash_ids is None:
                hash_ids = request.hash_ids
            if len(hash_ids) < n or hash_ids[n - 1] != act.ids[n - 1]:
                continue
            for dst, state in list(act.pipes.items()):
                src, sent = state
                if src != replica or n <= sent:
                    continue
                v = self.view
                copy_s = self.cost.load_s("rdma", (n - sent) * self.bt)
                land = max(v.egress_backlog_s(src), v.ingress_backlog_s(dst)) + copy_s
                self._start(act, src, dst, act.ids[:n], v.now_s + land, first_block=sent)
                state[1] = n
                if n >= act.depth:
                    del act.pipes[dst]

    # -- pinning (h) ---------------------------------------------------------------------------
    def _pin(self, act, complete) -> None:
        v = self.view
        if act.pins.keys() >= set(complete):
            return            # every complete holder pinned already (C-level check)
        for r in complete:
            if r not in act.pins:
                self._acted = True
                k = v.pin_prefix(r, act.ids)
                if k:
                    act.pins[r] = k
                    self.ledger.append({"time_s": v.now_s, "event": "pin", "prefix_blocks": k,
                                        "rate_per_s": float("nan"), "service_s": float("nan"),
                                        "target": act.target, "src": -1, "dst": r,
                                        "reason": "hot prefix pinned in HBM",
                                        "predicted_land_s": float("nan")})

    def _release_idle(self) -> None:
        now = self.view.now_s
        w = self.rate_window_s
        if not now - self._idle_bound > w:
            return            # every last_s >= the bound: none idle (x - y falls as y grows)
        for key in [k for k, a in self._active.items() if now - a.last_s > w]:
            self._release(self._active.pop(key))
        self._idle_bound = min((a.last_s for a in self._active.values()), default=math.inf)

    def _release(self, act) -> None:
        v = self.view
        for r, k in act.pins.items():
            v.unpin_prefix(r, act.ids, k)
            self.ledger.append({"time_s": v.now_s, "event": "unpin", "prefix_blocks": k,
                                "rate_per_s": float("nan"), "service_s": float("nan"),
                                "target": act.target, "src": -1, "dst": r,
                                "reason": "burst over", "predicted_land_s": float("nan")})
        act.pins = {}

    # -- routing -------------------------------------------------------------------------------
    def route(self, request) -> int:
        v = self.view
        now = v.now_s
        runs = request_runs(request)
        found = self._observe(request)
        if self._active:
            self._release_idle()
        cached = pend = None
        if found is not None:
            depth, node, node_key = found
            key = request.hash_ids[depth - 1]
            act = self._active.get(key)
            if act is None:
                pieces = v.request_pieces(request) if self._by_pieces else None
                act = self._active[key] = _Active(key, tuple(request.hash_ids[:depth]),
                                                  truncate_runs(runs[0], runs[1], depth), pieces,
                                                  node, node_key, now)
                if now < self._idle_bound:
                    self._idle_bound = now
            act.last_s = now
            # one view query serves the warm-set check and the scores below, unless this
            # arrival started a copy, pin or hold in between
            cached = self._cached(request)
            # one walk of the pending book serves the warm-set check and the scores when the
            # prefix is no deeper than the scores' limit (the book does not change in between)
            ids = request.hash_ids
            limit = min((int(request.input_length) - 1) // self.bt, request.full_blocks, len(ids))
            if act.depth <= limit:
                pend = self._pend.depths(runs[0], runs[1], limit)
            self._acted = False
            self._size_warm_set(act, request, cached, pend)
            if self._acted:
                cached = None
        pred = self._scores(request, runs, cached, pend)
        r = self._argmin(pred[0])
        _score, t, kind, m, ready = self._entry(r, pred)
        # book it
        # = service_s(isl - m x bt, m x bt, r): the same operations, the cost model asked once
        o0, og, _cap = self._own(m, pred[5])
        service = o0 + og * self._decoding[r] if self.chunked else o0
        start = max(now, self._free_at[r], ready)
        self._free_at[r] = start + service
        self._out[r][request.index] = service
        self._out_end[r][request.index] = ready + service
        ids = request.hash_ids
        full = min(request.full_blocks, len(ids))
        fruns = truncate_runs(runs[0], runs[1], full)
        self._pend.add(r, fruns[0], fruns[1])
        keys = []
        for key, act in self._active.items():
            if full >= act.depth and ids[act.depth - 1] == key:
                act.queued += 1
                keys.append(key)
        self._req[request.index] = (len(self.requests), r, fruns, keys)
        self.requests.append([request.index, now, r, kind, m, t, float("nan")])
        return r

    # -- hooks ---------------------------------------------------------------------------------
    def on_prefill_done(self, request, replica: int) -> None:
        v = self.view
        out = self._out[replica]
        out.pop(request.index, None)
        ends = self._out_end[replica]
        ends.pop(request.index, None)
        # reconcile: the work still dispatched there, after now; a request waiting for a copy
        # cannot start before its landing (the others do not wait for it)
        now = v.now_s
        end = now + sum(out.values())
        if ends:
            last = max(ends.values())
            if last > end:
                end = last
        self._free_at[replica] = end
        info = self._req.pop(request.index, None)
        if info is not None:
            row, r, fruns, keys = info
            for key in keys:
                act = self._active.get(key)
                if act is not None:
                    act.queued -= 1
            self._pend.remove(r, fruns[0], fruns[1])
            self.requests[row][6] = v.now_s - self.requests[row][1]
        if request.output_length > 1:
            self._decoding[replica] += 1
        # a completed prefill may give an active prefix its first complete holder: size now
        for act in list(self._active.values()):
            if act.target > 1:
                self._size_warm_set(act)

    def on_request_finished(self, request, replica: int) -> None:
        if request.output_length > 1:
            self._decoding[replica] -= 1

    def on_transfer_done(self, transfer_id: int, src: int, dst: int, num_blocks: int) -> None:
        entry = self._tid.pop(transfer_id, None)
        if entry is None:
            return
        key, dst, ids, row = entry
        inc = [x for x in self._incoming[dst] if x[2] != transfer_id]
        if len(ids) >= len(self._active[key].ids if key in self._active else ids):
            # the last chunk of a pipelined copy landed: the destination is warm
            inc = [x for x in inc if x[2] != ("pipe", key)]
            self.view.release_hold(dst, ids)
        self._set_incoming(dst, inc)
        self.ledger[row]["landed_s"] = self.view.now_s
        self.ledger[row]["landed_blocks"] = num_blocks
        act = self._active.get(key)
        if act is not None and act.target > 1:
            self._size_warm_set(act)

    def on_replica_removed(self, replica: int, failed: bool) -> None:
        """A failed replica's copies, pins, pipelined copies and dispatched work are forgotten, so
        the warm set is re-sized (and re-warmed elsewhere, a new replica included) on the next
        arrival of each active prefix. A draining replica keeps its copies until its work ends."""
        if not failed:
            return
        v = self.view
        for act in self._active.values():
            act.pins.pop(replica, None)
            act.pipes.pop(replica, None)
            for dst, (src, _) in list(act.pipes.items()):
                if src == replica:
                    del act.pipes[dst]
                    v.release_hold(dst, act.ids)
                    self._set_incoming(dst, [x for x in self._incoming[dst]
                                             if x[2] != ("pipe", act.key)])
        for tid, entry in list(self._tid.items()):
            if entry[1] == replica:
                del self._tid[tid]
        for idx, (_, r, fruns, keys) in list(self._req.items()):
            if r == replica:        # lost before its prefill ended: it no longer queues there,
                for key in keys:    # nor will its blocks be computed there (pending book)
                    act = self._active.get(key)
                    if act is not None and act.queued > 0:
                        act.queued -= 1
                self._pend.remove(r, fruns[0], fruns[1])
                del self._req[idx]
        self._set_incoming(replica, [])
        self._out[replica] = {}
        self._out_end[replica] = {}
        self._free_at[replica] = v.now_s
        self._decoding[replica] = 0

    def on_run_end(self) -> None:
        """Release every pin (the simulator calls this after the last event)."""
        for act in self._active.values():
            self._release(act)

    # -- tables --------------------------------------------------------------------------------
    def ledger_frame(self) -> pd.DataFrame:
        """The decision ledger: ``time_s, event, prefix_blocks, rate_per_s, service_s, target,
        src, dst, reason, predicted_land_s, landed_s, landed_blocks`` (event in ``copy, skip,
        pipe, warm_set, pin, unpin``)."""
        cols = ["time_s", "event", "prefix_blocks", "rate_per_s", "service_s", "target", "src",
                "dst", "reason", "predicted_land_s", "landed_s", "landed_blocks"]
        return pd.DataFrame(self.ledger, columns=cols)

    def requests_frame(self) -> pd.DataFrame:
        """One row per request: ``request_index, arrival_s, replica, choice, reused_blocks,
        predicted_ttft_s, actual_ttft_s``."""
        return pd.DataFrame(self.requests, columns=["request_index", "arrival_s", "replica",
                                                     "choice", "reused_blocks", "predicted_ttft_s",
                                                     "actual_ttft_s"])


__all__ = ["BTBAdaptiveRouter", "common_prefix", "grid_depths"]
