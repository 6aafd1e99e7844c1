"""Bite the Bullet (BTB): detect a same-prefix burst, copy its KV to M replicas, spread the burst.

Rule (``DESIGN.md`` sections 1 and 5, issue 5), per arrival:

1. If the prompt has at least ``Y`` full blocks, feed its prefix key (the chained id of block ``Y``,
   which names the first ``Y`` blocks) to the :class:`~btb_core.detector.BurstDetector`: the prefix
   is *active* when ``X`` arrivals of it fall within ``Z`` seconds.
2. While it is active and some replica holds those ``Y`` blocks as complete blocks (any tier of
   ``source_tiers``; ``view.cached_blocks`` reports only blocks whose prefill finished or whose copy
   landed, so a copy never starts from a prefill still running), start RDMA copies of the ``Y``
   blocks to the least-loaded replicas that neither hold it nor were ever sent it, until ``M``
   copies of this prefix have been started in total (a copy to a (prefix, destination) pair is
   never started twice; fewer than ``M`` when fewer replicas are eligible). Each copy's source is a
   holder with the shortest egress backlog at that moment (ties: lower index).
3. Route: once at least one copy of the prefix has landed, send the request to the least-loaded
   replica that holds the prefix now (a landed copy, the source, or a replica that computed it
   itself: the KV-event view, ``view.cached_blocks`` over ``source_tiers``); otherwise (and for
   every request without the prefix) use the contained SGLang-style
   :class:`~btb_core.routers.cache_aware.CacheAwareRouter`. Every decision, whichever branch made
   it, is recorded in that router's prefix tree and in-flight loads, so its picture stays right.

What the literal rule does, and does not do (each pinned by ``tests/test_btb_literal.py``;
``btb`` is kept as the seed's rule for reproduction, issue 10; :mod:`btb_core.routers.btb_adaptive`
is the policy that needs no tuning):

- a burst is detected only when requests share at least ``Y`` tokens: with the default ``Y =
  65,536`` a burst sharing 32,768 tokens makes no copy and the run equals ``cache_aware``;
- exactly ``Y`` blocks are copied: a longer shared prefix is recomputed past block ``Y`` on every
  warm replica;
- at most ``M`` copies per prefix per run: a later burst of the same prefix starts no new copy,
  even if the earlier copies were evicted;
- a copy is started whatever its predicted landing time or the destination's free HBM, and warm
  ties go to the lower replica index.

Load is the in-flight request count this router dispatched (shared with the contained router).
X, Y, Z, M are one :class:`~btb_core.btb_config.BTBConfig` (defaults: the reference study's,
stated there once).

``pause_compute_while_receiving`` (default ``False``): a warm copy is written into the destination's
HBM by its NIC (GPUDirect RDMA), which uses no streaming multiprocessors, so the destination keeps
running its batch while the copy lands; this is how Mooncake's Transfer Engine (Qin et al.,
"Mooncake: A KVCache-centric Architecture for Serving LLM Chatbot", FAST 2025) and DistServe
(Zhong et al., OSDI 2024) move KV between instances that keep serving. ``True`` makes the
destination start no new iteration until the copy lands
(``view.start_transfer(..., pause_destination=True)``), a pessimistic bound for HBM-bandwidth
contention.
"""

from __future__ import annotations

from ..btb_config import DEFAULT_BTB, BTBConfig
from ..detector import BurstDetector, prefix_key
from ..errors import ConfigError
from .base import Router, cached_blocks_all
from .cache_aware import CacheAwareRouter, parse_tiers
from .params import RouterParam


class BTBRouter(Router):
    """Bite the Bullet replicating router (see the module docstring for the rule).

    Parameters
    ----------
    x_repeats, y_tokens, z_s, m_replicas
        X (arrivals), Y (prefix tokens; ``Y = y_tokens // block_tokens`` blocks), Z (seconds), M
        (copies per active prefix; 0 disables copying: pure cache-aware): the fields of
        :class:`~btb_core.btb_config.BTBConfig`, which validates them and holds their defaults.
        Available together as :attr:`config`.
    pause_compute_while_receiving : bool
        Destination pauses compute while a copy lands (``False``; see the module docstring).
    source_tiers : str
        Comma list of tiers in which a replica counts as holding the prefix (``"hbm,dram,disk"``).
    **cache_aware
        Parameters of the fallback :class:`CacheAwareRouter` (``cache_threshold`` etc.).

    Raises
    ------
    ConfigError
        On a value outside the ranges above or an unknown cache-aware parameter; at
        :meth:`reset`, when ``y_tokens`` is shorter than one block.
    """

    name = "btb"
    PARAMS = (
        RouterParam("x_repeats", int, DEFAULT_BTB.x_repeats, "X: arrivals of one prefix that mark a burst"),
        RouterParam("y_tokens", int, DEFAULT_BTB.y_tokens, "Y: burst prefix length in tokens"),
        RouterParam("z_s", float, DEFAULT_BTB.z_s, "Z: detector window in seconds"),
        RouterParam("m_replicas", int, DEFAULT_BTB.m_replicas, "M: warm copies per active prefix"),
        RouterParam("pause_compute_while_receiving", bool, False,
                    "destination pauses compute while a copy lands"),
        RouterParam("source_tiers", str, "hbm,dram,disk", "tiers in which a replica holds it"),
    ) + CacheAwareRouter.PARAMS

    def __init__(self, x_repeats: int = DEFAULT_BTB.x_repeats, y_tokens: int = DEFAULT_BTB.y_tokens,
                 z_s: float = DEFAULT_BTB.z_s, m_replicas: int = DEFAULT_BTB.m_replicas,
                 pause_compute_while_receiving: bool = False,
                 source_tiers: str = "hbm,dram,disk", **cache_aware) -> None:
        p = self.name
        #: X, Y, Z, M (validated; raises ConfigError naming the field and value)
        self.config = BTBConfig(x_repeats=x_repeats, y_tokens=y_tokens, z_s=z_s,
                                m_replicas=m_replicas)
        if not isinstance(pause_compute_while_receiving, bool):
            raise ConfigError(f"{p}: pause_compute_while_receiving="
                              f"{pause_compute_while_receiving!r} must be a bool")
        known = {q.name for q in CacheAwareRouter.PARAMS}
        unknown = sorted(set(cache_aware) - known)
        if unknown:
            raise ConfigError(f"{p}: unknown parameter(s) {unknown}; cache-aware ones are "
                              f"{sorted(known)}")
        self.pause_compute_while_receiving = pause_compute_while_receiving
        self.source_tiers = parse_tiers(source_tiers, p, "source_tiers")
        self.cache_aware = CacheAwareRouter(**cache_aware)

    # -- lifecycle -----------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: BTBConfig, **kwargs) -> "BTBRouter":
        """A router with thresholds ``config`` and the other constructor ``kwargs``."""
        return cls(**config.as_params(), **kwargs)

    def reset(self, view) -> None:
        super().reset(view)
        #: Y in whole blocks of this run's trace
        self.y_blocks = self.config.y_blocks(view.block_tokens)
        self.cache_aware.reset(view)
        # the finish hook is the cache-aware router's (on_request_finished below), called directly
        self.on_request_finished = self.cache_aware.on_request_finished
        self.detector = BurstDetector(self.config)
        # the view's piece-based queries, when it has them (the simulator's views do)
        self._request_pieces = getattr(view, "request_pieces", None)
        self._holding_all = getattr(view, "holding_all_pieces", None)
        self._started: dict = {}    # prefix key -> destinations a copy was started to
        self._landed: set = set()   # prefix keys with at least one landed copy
        self._transfer_key: dict = {}
        #: One dict per copy: key, src, dst, start_s, done_s (None until it lands).
        self.transfers: list[dict] = []
        #: Copies refused because the source no longer held the prefix (stale views only).
        self.failed_copies = 0
        #: Decision counts: "warm" (BTB branch) and "fallback" (cache-aware branch).
        self.decisions = {"warm": 0, "fallback": 0}

    @property
    def load(self):
        """The in-flight loads (shared with the contained cache-aware router)."""
        return self.cache_aware.load

    # -- the rule ------------------------------------------------------------------------------
    def _replicate(self, key, request, holders: list) -> None:
        """Start the copies the rule asks for at this arrival of active prefix ``key`` (whose
        first Y blocks are ``request.hash_ids[:Y]``; ``holders``: replicas holding all of them)."""
        started = self._started.get(key)
        if started is None:
            started = self._started[key] = set()
        budget = self.config.m_replicas - len(started)
        if budget <= 0:
            return
        v = self.view
        if not holders:
            return  # the first prefill is still running (or the prefix was evicted everywhere)
        loads = self.load.loads
        held = set(holders)
        eligible = sorted((r for r in self.candidates() if r not in held and r not in started),
                          key=lambda r: (loads[r], r))
        prefix = request.hash_ids[:self.y_blocks] if eligible else ()
        for dst in eligible[:budget]:
            src = min(holders, key=lambda r: (v.egress_backlog_s(r), r))
            try:
                tid = v.start_transfer(src, dst, prefix,
                                       pause_destination=self.pause_compute_while_receiving)
            except ValueError:
                # only behind late KV events (sim/lag.py): the source the router believes holds
                # the prefix evicted it meanwhile, and the copy fails as an RDMA read would
                self.failed_copies += 1
                continue
            started.add(dst)
            self._transfer_key[tid] = (key, len(self.transfers))
            self.transfers.append({"key": key, "src": src, "dst": dst, "num_blocks": len(prefix),
                                   "start_s": v.now_s, "done_s": None})

    def route(self, request) -> int:
        y = self.y_blocks
        replica = None
        key = pieces = None
        if request.full_blocks >= y:
            # the prefix key (the Y-th id) from the request's pieces of runs when the view gives
            # them (no id tuple built), else from its ids
            pieces = self._request_pieces(request) if self._request_pieces is not None else None
            if pieces is not None:
                pos = y - 1
                starts, lens = pieces
                for k in range(len(lens)):
                    ln = lens[k]
                    if pos < ln:
                        key = starts[k] + pos
                        break
                    pos -= ln
            else:
                key = prefix_key(request.hash_ids, y)
        if key is not None:
            active = self.detector.observe(key, self.view.now_s) and self.config.m_replicas > 0
            landed = key in self._landed
            if active or landed:
                # one walk of the holder index (replicas holding all Y blocks, ascending); copies
                # started below land later, so it holds for the warm choice too
                if pieces is not None and self._holding_all is not None:
                    holders = self._holding_all(pieces[0], pieces[1], y, self.source_tiers)
                else:
                    found = cached_blocks_all(self.view, request.hash_ids[:y], self.source_tiers)
                    holders = sorted([r for r, m in found.items() if m >= y])
                if active:
                    self._replicate(key, request, holders)
                if landed:
                    cands = self._routable(holders)
                    replica = self.load.argmin(cands) if cands else None
        if replica is None:
            replica = self.cache_aware.choose(request)
            self.decisions["fallback"] += 1
        else:
            self.decisions["warm"] += 1
        self.cache_aware.record(request, replica)
        return replica

    def _routable(self, replicas: list) -> list:
        """``replicas`` (ascending) that are in ``view.routable_replicas``."""
        cands = self.candidates()
        if len(cands) == self.view.num_replicas:
            return replicas
        allowed = set(cands)
        return [r for r in replicas if r in allowed]

    # -- hooks ---------------------------------------------------------------------------------
    def on_request_finished(self, request, replica: int) -> None:
        self.cache_aware.on_request_finished(request, replica)

    def enable_index_sync(self) -> None:
        self.cache_aware.enable_index_sync()

    def index_updates(self) -> list:
        return self.cache_aware.index_updates()

    def apply_index_updates(self, updates: list) -> None:
        self.cache_aware.apply_index_updates(updates)

    def on_replica_added(self, replica: int) -> None:
        self.cache_aware.on_replica_added(replica)

    def on_replica_removed(self, replica: int, failed: bool) -> None:
        """A failed replica loses its copies: copies to it, and copies in flight from it, no
        longer count against ``M``, so the next arrival of a still-active prefix re-warms another
        replica (a newly added one is the least loaded)."""
        self.cache_aware.on_replica_removed(replica, failed)
        if not failed:
            return
        for started in self._started.values():
            started.discard(replica)
        for tid, (key, row) in list(self._transfer_key.items()):
            t = self.transfers[row]
            if t["src"] == replica or t["dst"] == replica:
                del self._transfer_key[tid]
                self._started.get(key, set()).discard(t["dst"])

    def on_transfer_done(self, transfer_id: int, src: int, dst: int, num_blocks: int) -> None:
        entry = self._transfer_key.pop(transfer_id, None)
        if entry is None:
            return
        key, row = entry
        self._landed.add(key)
        self.transfers[row]["done_s"] = self.view.now_s


__all__ = ["BTBRouter"]
