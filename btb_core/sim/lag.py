"""Stale views: what a router sees when KV events and load figures reach it late.

In a real deployment the engines publish KV-cache events (blocks stored, blocks removed) and load
figures (queue length, running requests, KV usage) over the network, and a router acts on what has
arrived: NVIDIA Dynamo's indexer consumes KV events from an event plane, SGLang's gateway polls
each engine's load every ``load_monitor_interval`` seconds, llm-d's endpoint picker scrapes engine
metrics periodically. Two knobs model that (``DESIGN.md`` section 8, "Lag"):

- ``kv_event_lag_s = L``: every change to a replica's cache contents (blocks whose prefill
  completed, copies that landed, evictions and spills to lower tiers) reaches the router ``L``
  seconds after it happened. The router's cache queries (``cached_blocks``,
  ``cached_block_count``) answer from a **mirror** of each replica's cache that replays the real
  cache's operations ``L`` seconds late: every mutating call on the real cache is logged with its
  time and replayed into the mirror once ``now - L`` has passed it, so at time ``t`` the mirror
  holds exactly the real cache's state at ``t - L`` (evictions and tier moves included), and a
  block completed at ``t0`` is never visible before ``t0 + L``.
- ``load_lag_s = L``: the load figures (``queue_length``, ``kv_usage``,
  ``active_blocks``, ``queued_prompt_tokens``) are a snapshot of every replica refreshed every ``L``
  seconds (at ``L, 2L, ...``, after all events at that instant; the first snapshot is the idle
  cluster at time 0), as a poller would see them.

Everything else a router reads (the clock, its rng, NIC backlogs of its own copies) is live, and
its actions (copies, dispatches) act on the real cluster. With both lags 0 the simulator hands
routers itself and nothing here runs, so results are bit-identical to a run without this module.
"""

from __future__ import annotations

from ..trace.runs import tuple_of_pieces
from .holders import HolderIndex
from .kvcache import DiskTier, KVCache
from .view import ClusterView

#: The cache operations that change its contents (the ones the mirror replays).
MUTATORS = ("pin_prefix", "reserve_private", "complete_blocks", "release", "pin_existing",
            "unpin", "land", "clear")


class LoggedKVCache(KVCache):
    """A :class:`KVCache` that appends each content-changing call to a shared log (only the
    outermost call: one that another logged operation makes is part of it).

    Parameters
    ----------
    replica : int
        Index written into each log entry.
    log : list
        Shared by all replicas of a run: entries ``(time_s, replica, method, args)`` in call order.
    clock : callable
        Returns the current simulated time in seconds.
    *args, **kwargs
        Passed to :class:`KVCache`.
    """

    __slots__ = ("replica", "log", "clock", "depth")

    def __init__(self, replica: int, log: list, clock, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.replica = replica
        self.log = log
        self.clock = clock
        self.depth = 0


def _logged(name):
    base = getattr(KVCache, name)

    def method(self, *args):
        if self.depth:             # called from another logged operation (release -> unpin)
            return base(self, *args)
        self.log.append((self.clock(), self.replica, name, args))
        self.depth = 1
        try:
            return base(self, *args)
        finally:
            self.depth = 0

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


for _name in MUTATORS:
    setattr(LoggedKVCache, _name, _logged(_name))


class LaggedView(ClusterView):
    """The :class:`~btb_core.sim.view.ClusterView` of a router behind stale KV events and
    snapshot loads (see the module docstring); the clock, NIC backlogs and actions stay live.

    Parameters
    ----------
    sim : Simulator
        The live cluster; its caches must be :class:`LoggedKVCache` when ``kv_event_lag_s > 0``.
    kv_event_lag_s, load_lag_s : float >= 0
        The two lags in seconds.

    Raises
    ------
    ValueError
        On a negative or non-finite lag.
    """

    def __init__(self, sim, kv_event_lag_s: float = 0.0, load_lag_s: float = 0.0) -> None:
        for field, value in (("kv_event_lag_s", kv_event_lag_s), ("load_lag_s", load_lag_s)):
            if not (isinstance(value, (int, float)) and 0.0 <= value < float("inf")):
                raise ValueError(f"{field}={value!r} must be a finite number >= 0")
        super().__init__(sim)
        self.sim = sim
        self.kv_event_lag_s = float(kv_event_lag_s)
        self.load_lag_s = float(load_lag_s)
        self._log_pos = 0
        self.mirrors = None
        self.mirror_index = None
        if self.kv_event_lag_s > 0:
            self.mirrors = self._make_mirrors(sim)
            self.mirror_index = HolderIndex()
            for r, mirror in enumerate(self.mirrors):
                mirror.attach_index(self.mirror_index, r)
        self._snap = None
        if self.load_lag_s > 0:
            self.snapshot()

    @staticmethod
    def _make_mirrors(sim) -> list[KVCache]:
        caches = [rep.cache for rep in sim.replicas]
        if not all(isinstance(c, LoggedKVCache) for c in caches):
            raise ValueError("kv_event_lag_s > 0 needs the simulator's caches to be LoggedKVCache")
        disks = {}
        mirrors = []
        for c in caches:
            disk = None
            if c.disk is not None:   # a shared disk tier stays shared in the mirror
                disk = disks.setdefault(id(c.disk), DiskTier(c.disk.capacity_blocks))
            mirrors.append(KVCache(c.capacity_blocks, c.dram_capacity_blocks, disk))
        return mirrors

    # -- KV events -----------------------------------------------------------------------------
    def _catch_up(self) -> None:
        """Replay logged cache operations that happened at or before ``now - kv_event_lag_s``."""
        log = self.sim.kv_log
        horizon = self.sim.now - self.kv_event_lag_s
        pos, mirrors = self._log_pos, self.mirrors
        end = len(log)
        while pos < end and log[pos][0] <= horizon:
            _, r, name, args = log[pos]
            getattr(mirrors[r], name)(*args)
            pos += 1
        if pos > 4096 and pos * 2 > end:   # drop the replayed head now and then
            del log[:pos]
            pos = 0
        self._log_pos = pos

    def cached_blocks(self, replica, hash_ids, tiers=("hbm", "dram", "disk")) -> int:
        if self.mirrors is None:
            return super().cached_blocks(replica, hash_ids, tiers)
        self._catch_up()
        return self.cached_in(self.mirrors[replica], hash_ids, tiers)

    def cached_block_count(self, replica: int) -> int:
        if self.mirrors is None:
            return super().cached_block_count(replica)
        self._catch_up()
        return self.mirrors[replica].hbm_blocks

    def cached_block_count_all(self) -> list[int]:
        if self.mirrors is None:
            return super().cached_block_count_all()
        self._catch_up()
        return [m.hbm_blocks for m in self.mirrors]

    def cached_blocks_all(self, hash_ids, tiers=("hbm", "dram", "disk")) -> dict:
        """:meth:`ClusterView.cached_blocks_all` against the stale mirrors (they keep a holder
        index of their own, so the answer is the one the mirrors give replica by replica)."""
        if self.mirrors is None:
            return super().cached_blocks_all(hash_ids, tiers)
        self._catch_up()
        pieces = self.pieces(hash_ids)
        if pieces is None or ("disk" in tiers and self.sim.has_disk):
            return self._scan_all(hash_ids, tiers)
        caches = self.mirrors if "dram" in tiers else None
        return self.mirror_index.matched(caches, pieces[0], pieces[1], len(hash_ids),
                                         "hbm" in tiers, "dram" in tiers)

    def cached_blocks_all_pieces(self, starts, lens, n, tiers=("hbm", "dram", "disk")) -> dict:
        """:meth:`ClusterView.cached_blocks_all_pieces` against the stale mirrors."""
        if self.mirrors is None:
            return super().cached_blocks_all_pieces(starts, lens, n, tiers)
        self._catch_up()
        if "disk" in tiers and self.sim.has_disk:
            return self._scan_all(tuple_of_pieces(starts, lens)[:n], tiers)
        caches = self.mirrors if "dram" in tiers else None
        return self.mirror_index.matched(caches, starts, lens, n, "hbm" in tiers, "dram" in tiers)

    def holding_all_pieces(self, starts, lens, n, tiers=("hbm", "dram", "disk")) -> list[int]:
        """:meth:`ClusterView.holding_all_pieces` against the stale mirrors."""
        if self.mirrors is None:
            return super().holding_all_pieces(starts, lens, n, tiers)
        self._catch_up()
        if "hbm" not in tiers or ("disk" in tiers and self.sim.has_disk):
            return sorted([r for r, m in self.cached_blocks_all_pieces(starts, lens, n,
                                                                       tiers).items() if m >= n])
        use_dram = "dram" in tiers
        return self.mirror_index.holding_all(self.mirrors if use_dram else None, starts, lens, n,
                                             use_dram)

    def cached_blocks_hbm_dram(self, hash_ids) -> tuple[dict, dict]:
        if self.mirrors is None:
            return super().cached_blocks_hbm_dram(hash_ids)
        return (self.cached_blocks_all(hash_ids, ("hbm",)),
                self.cached_blocks_all(hash_ids, ("hbm", "dram")))

    def cached_blocks_hbm_dram_pieces(self, starts, lens, n) -> tuple[dict, dict]:
        if self.mirrors is None:
            return super().cached_blocks_hbm_dram_pieces(starts, lens, n)
        return (self.cached_blocks_all_pieces(starts, lens, n, ("hbm",)),
                self.cached_blocks_all_pieces(starts, lens, n, ("hbm", "dram")))

    # -- load figures --------------------------------------------------------------------------
    def snapshot(self) -> None:
        """Take the load figures of every replica now (called every ``load_lag_s`` seconds)."""
        live = ClusterView
        r = range(self.num_replicas)
        self._snap = ([live.queue_length(self, i) for i in r], [live.kv_usage(self, i) for i in r],
                      [live.active_blocks(self, i) for i in r],
                      [live.queued_prompt_tokens(self, i) for i in r])

    def queue_length(self, replica: int) -> int:
        return self._snap[0][replica] if self._snap else super().queue_length(replica)

    def kv_usage(self, replica: int) -> float:
        return self._snap[1][replica] if self._snap else super().kv_usage(replica)

    def queue_length_all(self) -> list[int]:
        return list(self._snap[0]) if self._snap else super().queue_length_all()

    def kv_usage_all(self) -> list[float]:
        return list(self._snap[1]) if self._snap else super().kv_usage_all()

    def kv_usage_max(self) -> float:
        return max(self._snap[1]) if self._snap else super().kv_usage_max()

    def active_blocks(self, replica: int) -> int:
        return self._snap[2][replica] if self._snap else super().active_blocks(replica)

    def queued_prompt_tokens(self, replica: int) -> int:
        return self._snap[3][replica] if self._snap else super().queued_prompt_tokens(replica)

    # live, inherited from ClusterView: the clock, NIC backlogs, free HBM, copies, pins, holds and
    # dispatches


__all__ = ["LaggedView", "LoggedKVCache", "MUTATORS"]
