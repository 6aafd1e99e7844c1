"""llm-d / Gateway API Inference Extension endpoint picker: a weighted sum of scorers.

References (kubernetes-sigs/gateway-api-inference-extension):

- default profile ``config/charts/inferencepool/templates/epp-config.yaml`` (@ 139eec85):
  ``queue-scorer`` weight 2, ``kv-cache-utilization-scorer`` weight 2, ``prefix-cache-scorer``
  weight 3, then the max-score picker (the llm-d ``inference-scheduling`` guide deploys this chart);
- ``pkg/epp/scheduling/framework/plugins/scorer/queue.go`` (@ c729d434):
  ``(maxQ - q) / (maxQ - minQ)`` over the engines' waiting queues, 1.0 when all are equal;
- ``pkg/epp/scheduling/framework/plugins/scorer/kvcache_utilization.go`` (@ 62d14799):
  ``1 - KV cache usage``;
- ``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go`` (@ 4bc4889d): the router's own
  approximate index of the block hashes it sent to each server, an LRU of
  ``DefaultLRUCapacityPerServer = 31250`` blocks per server, matching at most
  ``DefaultMaxPrefixBlocks = 256`` leading blocks; score = matched blocks / request blocks.

Two more scorers of llm-d's inference scheduler (llm-d/llm-d-inference-scheduler), off by default
because the default profile above does not enable them:

- ``load-aware-scorer`` (``pkg/plugins/scorer/load_aware.go`` @ d5cbb322): 0.5 for an empty
  waiting queue, else ``0.5 * (1 - min(q, threshold) / threshold)``, ``threshold`` 128
  (``QueueThresholdDefault``);
- ``active-request-scorer`` (``pkg/plugins/scorer/active_request.go`` @ d5cbb322): the requests
  this scheduler sent to each server and not yet answered, each forgotten after
  ``requestTimeout`` (2 minutes); score ``(max - count) / max`` over servers with a count, 1.0 for
  a server with none.

Here the prefix blocks are the trace's ``hash_ids`` (full blocks only, as the plugin hashes full
blocks), and ``prefix_mode="kv_events"`` swaps the approximate index for the true cache contents
(llm-d's "precise" prefix scorer, which listens to vLLM KV events). The picker takes the highest
total and breaks ties uniformly at random with ``view.rng`` (the max-score picker shuffles first).

How the approximate index is kept (same contents, order and evictions either way): on the
simulator's view, which hands over a request's pieces of chained ids, as one LRU segment per
accessed piece with, per block run, the replicas holding a leading part of it (a request costs its
pieces, 1-3 on the shipped traces, not its up to 256 blocks); on other views, as an LRU of block
ids with a holder bitmask per block.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import accumulate, chain, repeat, takewhile
from operator import and_

import numpy as np

from ..errors import ConfigError
from .base import IndexSyncLog, Router, cached_blocks_all, kv_usage_all, queue_length_all
from .cache_aware import parse_tiers
from .holder_sets import leading_pieces, nested_depths, piece_depths
from .id_runs import runs_of_ids
from .params import RouterParam, check_range

#: Above this many replicas with a prefix match, :meth:`LlmDRouter.scores` fills the prefix column
#: as a list and assigns it at once (faster from ~30 matches on; measured on this project's 2-core
#: machine, 2026-12-01).
_FEW_MATCHES = 24


class LlmDRouter(IndexSyncLog, Router):
    """Weighted prefix / queue / KV-utilisation scoring (see the module docstring).

    Parameters
    ----------
    prefix_weight, queue_weight, kv_cache_weight : float >= 0
        Scorer weights (3, 2, 2: GAIE chart ``epp-config.yaml``).
    prefix_mode : {"approx", "kv_events"}
        Router-side LRU index of routed blocks (default) or the replicas' true caches.
    lru_capacity_blocks : int >= 1
        Blocks remembered per replica in ``approx`` mode (31,250, ``prefix/plugin.go``).
    max_prefix_blocks : int >= 1
        Leading blocks considered (256, ``prefix/plugin.go``).
    kv_event_tiers : str
        Tiers counted in ``kv_events`` mode (default ``"hbm"``: vLLM publishes GPU block events).
    load_aware_weight : float >= 0
        Weight of llm-d's load-aware scorer (0: off).
    load_aware_threshold : int >= 1
        Waiting requests at which the load-aware score reaches 0 (128, ``load_aware.go``).
    active_request_weight : float >= 0
        Weight of llm-d's active-request scorer (0: off).
    active_request_timeout_s : float > 0
        Seconds after which a dispatched request no longer counts (120, ``active_request.go``).

    Raises
    ------
    ConfigError
        On a value outside the ranges above.
    """

    name = "llm_d"
    PARAMS = (
        RouterParam("prefix_weight", float, 3.0, "weight of the prefix-cache scorer"),
        RouterParam("queue_weight", float, 2.0, "weight of the queue scorer"),
        RouterParam("kv_cache_weight", float, 2.0, "weight of the KV-utilisation scorer"),
        RouterParam("prefix_mode", str, "approx", "router-side LRU index or true cache",
                    ("approx", "kv_events")),
        RouterParam("lru_capacity_blocks", int, 31250, "approx index blocks per replica"),
        RouterParam("max_prefix_blocks", int, 256, "leading blocks considered"),
        RouterParam("kv_event_tiers", str, "hbm", "tiers counted in kv_events mode"),
        RouterParam("load_aware_weight", float, 0.0, "weight of llm-d's load-aware scorer"),
        RouterParam("load_aware_threshold", int, 128, "waiting requests scoring 0 (load-aware)"),
        RouterParam("active_request_weight", float, 0.0, "weight of llm-d's active-request scorer"),
        RouterParam("active_request_timeout_s", float, 120.0, "seconds a dispatched request "
                    "counts as active"),
    )

    def __init__(self, prefix_weight: float = 3.0, queue_weight: float = 2.0,
                 kv_cache_weight: float = 2.0, prefix_mode: str = "approx",
                 lru_capacity_blocks: int = 31250, max_prefix_blocks: int = 256,
                 kv_event_tiers: str = "hbm", load_aware_weight: float = 0.0,
                 load_aware_threshold: int = 128, active_request_weight: float = 0.0,
                 active_request_timeout_s: float = 120.0) -> None:
        p = self.name
        for field, value in (("prefix_weight", prefix_weight), ("queue_weight", queue_weight),
                             ("kv_cache_weight", kv_cache_weight),
                             ("load_aware_weight", load_aware_weight),
                             ("active_request_weight", active_request_weight)):
            check_range(p, field, value, 0.0)
        check_range(p, "load_aware_threshold", load_aware_threshold, 1, integer=True)
        check_range(p, "active_request_timeout_s", active_request_timeout_s, 0.0, low_open=True)
        check_range(p, "lru_capacity_blocks", lru_capacity_blocks, 1, integer=True)
        check_range(p, "max_prefix_blocks", max_prefix_blocks, 1, integer=True)
        if prefix_mode not in ("approx", "kv_events"):
            raise ConfigError(f"{p}: prefix_mode={prefix_mode!r} must be 'approx' or 'kv_events'")
        self.weights = (float(prefix_weight), float(queue_weight), float(kv_cache_weight),
                        float(load_aware_weight), float(active_request_weight))
        self._weights = np.array(self.weights)
        self._extra = bool(self.weights[3] or self.weights[4])
        self.load_aware_threshold = int(load_aware_threshold)
        self.active_request_timeout_s = float(active_request_timeout_s)
        self.prefix_mode = prefix_mode
        self.lru_capacity_blocks = int(lru_capacity_blocks)
        self.max_prefix_blocks = int(max_prefix_blocks)
        self.kv_event_tiers = parse_tiers(kv_event_tiers, p, "kv_event_tiers")

    def reset(self, view) -> None:
        super().reset(view)
        # the approximate index: per replica, an LRU of block ids (oldest first)
        self._lru = [OrderedDict() for _ in range(view.num_replicas)]
        self._lru_holders: dict = {}   # block id -> bitmask of the replicas whose index holds it
        self._active_counts = [0] * view.num_replicas   # active-request scorer's book
        self._active: dict[int, int] = {}                # request index -> replica
        self._active_order: deque = deque()              # (dispatch time, request index)
        self._sync_log = None                            # routed blocks since the last exchange
        # the simulator's view hands over a request's pieces of chained ids (no id repeats): the
        # index is then kept by pieces, with run start -> {replica: leading ids of the run in its
        # LRU} instead of the per-id holder masks
        self._request_pieces = getattr(view, "request_pieces", None)
        self._by_pieces = self._request_pieces is not None
        self._lead: dict[int, dict[int, int]] = {}
        n = view.num_replicas
        #: per replica: segment id -> [run start, lo, hi, id], least recently used first
        self._segs = [OrderedDict() for _ in range(n)]
        #: per replica: run start -> its segments by offset (newest first)
        self._run_segs: list[dict] = [dict() for _ in range(n)]
        self._size = [0] * n                             # ids per replica (by pieces)
        self._next_seg = 0
        self._cached_pieces = getattr(view, "cached_blocks_all_pieces", None)

    def _prefix_blocks(self, request) -> tuple:
        return tuple(request.hash_ids[:min(request.full_blocks, self.max_prefix_blocks)])

    def _prefix_pieces(self, request):
        """Pieces ``(starts, lens)`` of the request's prefix blocks (:meth:`_prefix_blocks`) when
        the view hands over the request's pieces, else None."""
        f = self._request_pieces
        if f is None:
            return None
        pieces = f(request)
        if pieces is None:       # not a root path of the trace: its stretches of ids
            return runs_of_ids(self._prefix_blocks(request))
        n = min(request.full_blocks, self.max_prefix_blocks)
        starts, lens = pieces
        if n >= sum(lens):
            return pieces
        return leading_pieces(starts, lens, n)

    def scores(self, request, blocks: tuple | None = None, pieces=None) -> np.ndarray:
        """Per-replica scorer values, shape ``(num_replicas, 5)``: prefix, queue, KV, load-aware,
        active-request, each in [0, 1] (unweighted). ``blocks``: the request's prefix blocks, or
        ``pieces``: their ``(starts, lens)`` (of chained ids), if already computed."""
        v = self.view
        n = v.num_replicas
        if pieces is None:
            if self._by_pieces:                    # the index is kept by pieces
                pieces = (self._prefix_pieces(request) if blocks is None
                          else runs_of_ids(tuple(blocks)))
            elif blocks is None:
                blocks = self._prefix_blocks(request)
        out = np.zeros((n, 5))
        nb = sum(pieces[1]) if pieces is not None else len(blocks)
        if nb:
            if pieces is not None:
                if self.prefix_mode == "approx":
                    matches = self._lead_matches(pieces)
                elif self._cached_pieces is not None:
                    matches = self._cached_pieces(pieces[0], pieces[1], nb, self.kv_event_tiers)
                else:
                    matches = cached_blocks_all(v, tuple(_ids_of(pieces)), self.kv_event_tiers)
            elif self.prefix_mode == "approx":
                matches = self._approx_matches(blocks)
            else:
                matches = cached_blocks_all(v, blocks, self.kv_event_tiers)
            if len(matches) > _FEW_MATCHES:
                # many: the column as a list, assigned in one call (an item assignment into the
                # array costs more than a list's; the same Python quotients either way)
                col = [0.0] * n
                for r, k in matches.items():
                    col[r] = (k if k < nb else nb) / nb
                out[:, 0] = col
            else:
                for r, k in matches.items():   # every other replica matches 0 blocks: score 0
                    out[r, 0] = (k if k < nb else nb) / nb
        out[:, 2] = 1.0 - np.array(kv_usage_all(v), np.float64)
        queues = queue_length_all(v)
        qmax, qmin = max(queues), min(queues)
        # int64 differences over an int: the same correctly rounded quotients as Python's
        out[:, 1] = 1.0 if qmax == qmin else (qmax - np.array(queues, np.int64)) / (qmax - qmin)
        if self.weights[3]:
            t = self.load_aware_threshold
            out[:, 3] = [0.5 if q == 0 else 0.5 * (1.0 - min(q, t) / t) for q in queues]
        if self.weights[4]:
            self._expire_active()
            counts = self._active_counts
            cmax = max(counts)
            out[:, 4] = [1.0 if c == 0 else (cmax - c) / cmax for c in counts]
        return out

    def _approx_matches(self, blocks) -> dict[int, int]:
        """``{replica: leading blocks of blocks in its approximate index}`` for replicas matching
        at least one (``blocks``: a sequence, or an iterator of ids).

        An LRU index is not prefix-closed (it drops a path's oldest, i.e. leading, blocks first),
        so the holder masks along the blocks are intersected: a running AND, stopped at the first
        block no replica still matches, all at C level. The running masks only lose bits, so each
        replica's match is where its bit leaves them, found by bisection.
        """
        holders = self._lru_holders
        acc = list(takewhile(bool, accumulate(map(holders.get, blocks, repeat(0)), and_)))
        return nested_depths(acc)

    def _expire_active(self) -> None:
        """Forget requests dispatched ``active_request_timeout_s`` or more ago (ttlcache TTL)."""
        order, now = self._active_order, self.view.now_s
        while order and now - order[0][0] >= self.active_request_timeout_s:
            _, idx = order.popleft()
            r = self._active.pop(idx, None)
            if r is not None:
                self._active_counts[r] -= 1

    def route(self, request) -> int:
        pieces = self._prefix_pieces(request)
        blocks = self._prefix_blocks(request) if pieces is None else None
        scores = self.scores(request, blocks, pieces)
        # the three default scorers alone when the extra two are off (same sums as before)
        total = (scores @ self._weights if self._extra else scores[:, :3] @ self._weights[:3])
        cands = self.candidates()
        if len(cands) != len(total):   # cluster events: only routable replicas may win
            mask = np.full(len(total), -np.inf)
            mask[list(cands)] = 0.0
            total = total + mask
        tied = np.flatnonzero(total == total.max())
        replica = int(tied[0]) if len(tied) == 1 else int(tied[self.view.rng.integers(len(tied))])
        if self.prefix_mode == "approx":
            if pieces is None:
                self._remember(replica, blocks)
            else:
                self._remember_pieces(replica, pieces)
                if self._sync_log is not None:
                    blocks = tuple(_ids_of(pieces))
            if self._sync_log is not None:
                self._sync_log.append((replica, blocks))
        if self.weights[4]:
            self._active[request.index] = replica
            self._active_counts[replica] += 1
            self._active_order.append((self.view.now_s, request.index))
        return replica

    def _remember(self, replica: int, blocks: tuple) -> None:
        """Access ``blocks`` in ``replica``'s LRU index in order (a block seen again moves to the
        most recent end), then evict the least recently used blocks beyond the capacity."""
        lru = self._lru[replica]
        holders = self._lru_holders
        bit = 1 << replica
        for h in blocks:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                holders[h] = holders.get(h, 0) | bit
        self._evict(replica)

    def _remember_pieces(self, replica: int, pieces) -> None:
        """:meth:`_remember` of the ids of ``pieces`` (chained ids, none repeated), kept as
        *segments* instead of one LRU entry per id, with the same LRU order and evictions.

        An access of a piece ``[s, s + ln)`` puts its ids at the recent end in id order, so the
        LRU is a sequence of segments ``[s + lo, s + hi)`` of one run each, in access order, a
        segment's ids in id order (:attr:`_segs`). A run's accesses are leading parts, so its
        later ids were accessed earlier: its segments, ordered by offset, go from newest to
        oldest (:attr:`_run_segs`), and an access of ``[0, ln)`` takes over the segments below
        ``ln`` (dropped, or cut to start at ``ln``) and appends one new segment. Evicting the
        oldest ids cuts the oldest segment from its low end. Per run, the replicas whose LRU holds
        a leading part of it (:attr:`_lead`) follow from its segments: the chain of adjacent
        segments from offset 0. Cost per access: the run's few segments, not its ids.
        """
        segs = self._segs[replica]
        run_segs = self._run_segs[replica]
        lead = self._lead
        size = self._size[replica]
        for s, ln in zip(*pieces):
            old = run_segs.get(s)
            sid = self._next_seg
            self._next_seg = sid + 1
            seg = [s, 0, ln, sid]
            segs[sid] = seg
            size += ln
            if old is None:
                run_segs[s] = [seg]
                d = lead.get(s)
                if d is None:
                    lead[s] = {replica: ln}
                else:
                    d[replica] = ln
                continue
            keep = [seg]
            for o in old:               # by offset, newest first
                lo, hi = o[1], o[2]
                if hi <= ln:            # all its ids move to the new segment
                    size -= hi - lo
                    del segs[o[3]]
                elif lo < ln:           # its ids below ln move
                    size -= ln - lo
                    o[1] = ln
                    keep.append(o)
                else:
                    keep.append(o)
            run_segs[s] = keep
            k = ln                      # the leading part: adjacent segments from offset 0
            for o in keep[1:]:
                if o[1] != k:
                    break
                k = o[2]
            d = lead.get(s)
            if d is None:
                lead[s] = {replica: k}
            else:
                d[replica] = k
        over = size - self.lru_capacity_blocks
        if over > 0:
            size -= over
            for seg in segs.values():   # oldest first
                s, lo, hi = seg[0], seg[1], seg[2]
                e = hi - lo if hi - lo < over else over
                seg[1] = lo + e
                over -= e
                d = lead.get(s)
                if d is not None and lo < d.get(replica, 0):   # cut inside the leading part
                    if lo:
                        d[replica] = lo
                    else:
                        del d[replica]
                        if not d:
                            del lead[s]
                if not over:
                    break
            while True:                 # drop the emptied segments (each its run's oldest)
                seg = next(iter(segs.values()))
                if seg[1] < seg[2]:
                    break
                segs.popitem(last=False)
                rs = run_segs[seg[0]]
                rs.pop()
                if not rs:
                    del run_segs[seg[0]]
        self._size[replica] = size

    def lru_blocks(self, replica: int) -> list:
        """``replica``'s approximate index, least recently used block first."""
        if not self._by_pieces:
            return list(self._lru[replica])
        return [h for s, lo, hi, _ in self._segs[replica].values() for h in range(s + lo, s + hi)]

    def _lead_matches(self, pieces) -> dict[int, int]:
        """``{replica: leading ids of the path of pieces in its LRU}`` for the replicas holding
        at least one, from the per-run leading parts (:meth:`_remember_pieces`), by
        :func:`~btb_core.routers.holder_sets.piece_depths`."""
        return piece_depths(self._lead, pieces[0], pieces[1])

    def _evict(self, replica: int) -> None:
        """Drop ``replica``'s least recently used blocks beyond the capacity."""
        lru = self._lru[replica]
        over = len(lru) - self.lru_capacity_blocks
        if over > 0:
            holders = self._lru_holders
            keep = ~(1 << replica)
            pop = lru.popitem
            for _ in range(over):
                h = pop(last=False)[0]
                m = holders[h] & keep
                if m:
                    holders[h] = m
                else:
                    del holders[h]

    def _drop_holder(self, block, replica: int) -> None:
        m = self._lru_holders[block] & ~(1 << replica)
        if m:
            self._lru_holders[block] = m
        else:
            del self._lru_holders[block]

    def apply_index_updates(self, updates: list) -> None:
        for replica, blocks in updates:
            if self._by_pieces:
                self._remember_pieces(replica, runs_of_ids(blocks))
            else:
                self._remember(replica, blocks)

    def on_replica_removed(self, replica: int, failed: bool) -> None:
        if failed:
            if self._by_pieces:                      # kept by pieces
                lead = self._lead
                for s in self._run_segs[replica]:
                    d = lead.get(s)
                    if d is not None and d.pop(replica, None) is not None and not d:
                        del lead[s]
                self._segs[replica].clear()
                self._run_segs[replica].clear()
                self._size[replica] = 0
            else:
                lru = self._lru[replica]
                for h in lru:
                    self._drop_holder(h, replica)
                lru.clear()

    def on_request_finished(self, request, replica: int) -> None:
        r = self._active.pop(request.index, None)
        if r is not None:
            self._active_counts[r] -= 1


def _ids_of(pieces):
    """The ids of ``(starts, lens)`` pieces, in order (an iterator)."""
    return chain.from_iterable(map(range, pieces[0], map(int.__add__, pieces[0], pieces[1])))


__all__ = ["LlmDRouter"]
