"""The router's window onto a simulated cluster: :class:`ClusterView`.

A router (:mod:`btb_core.routers`) receives one ``ClusterView`` per run in
:meth:`~btb_core.routers.Router.reset` and sees the cluster only through it: what a real gateway
could know (its own clock, the queue lengths and KV usage engines publish, KV-cache events) plus
the one action a replicating router needs (starting an RDMA copy). The view never exposes the
engine, replicas or caches themselves, so routers import nothing from engine internals.

The view owns the look-up cache that turns a block-id sequence into the run-compressed pieces the
KV cache works on (:meth:`btb_core.sim.blocks.BlockIndex.path_pieces`): a router may pass any
sequence, as a fresh tuple or the same object every time, at the same cost.
"""

from __future__ import annotations

from typing import Sequence

from ..trace.runs import tuple_of_pieces

#: Tiers a block may sit in, fastest first (``ClusterView.cached_blocks``' ``tiers`` argument).
ALL_TIERS = ("hbm", "dram", "disk")

#: Entries of the id-sequence -> pieces cache before it is cleared (bounds memory; a run asks
#: about a few distinct prefixes at a time).
_PIECES_CACHE_MAX = 1024


def scan_cached_blocks(view, hash_ids, tiers=ALL_TIERS) -> dict[int, int]:
    """``{replica: view.cached_blocks(replica, hash_ids, tiers)}`` for the replicas where it is
    >= 1, one ``cached_blocks`` call per replica (the reference for the one-walk
    :meth:`ClusterView.cached_blocks_all`; views without it, such as real engines', use this)."""
    out = {}
    for r in range(view.num_replicas):
        m = view.cached_blocks(r, hash_ids, tiers)
        if m:
            out[r] = m
    return out


class ClusterView:
    """What a router may read from, and do to, the simulated cluster.

    Built by the engine (:class:`btb_core.sim.engine.Simulator`); routers get it in ``reset``.
    Replicas are numbered ``0 .. num_replicas - 1``. All times are simulated seconds from the trace
    start. Block-id sequences (``hash_ids``) are a request's chained ids or a leading part of them
    (:attr:`btb_core.sim.request.Request.hash_ids`).

    Attributes
    ----------
    num_replicas : int
        Replicas behind the router.
    block_tokens : int
        Tokens per KV block of the trace (the unit of every ``*_blocks`` value).
    chunk_tokens : int
        The replicas' per-iteration token budget (``ClusterConfig.chunk_tokens``; engines publish
        it as their chunked-prefill size).
    rng : btb_core.sim.rng.RouterRng
        The run's random generator (seeded by ``simulate(..., seed=)``): a PCG64
        ``numpy.random.Generator`` whose scalar ``integers(n)`` and ``random()`` are computed in
        Python, the same numbers at about half the cost (:mod:`btb_core.sim.rng`); routers draw
        from it only.
    cost : btb_core.cost.CostModel
        The replicas' cost model (a deployed router would use a profiled model of the same engine).
    scheduler : str
        The replicas' scheduler, a name of :data:`btb_core.sim.schedulers.SCHEDULERS`.
    """

    __slots__ = ("_sim", "num_replicas", "block_tokens", "chunk_tokens", "rng", "cost", "scheduler",
                 "_replicas", "_caches", "_queue_lengths", "_capacity_blocks",
                 "_last_ids", "_last_pieces", "_pieces_cache")

    def __init__(self, sim) -> None:
        self._sim = sim
        self.num_replicas = sim.num_replicas
        self.block_tokens = sim.block_tokens
        self.chunk_tokens = sim.chunk_tokens
        self.rng = sim.rng
        self.cost = sim.cost
        self.scheduler = sim.cluster.scheduler
        self._replicas = sim.replicas
        # the replicas' caches indexed by replica (every replica, added ones included, exists
        # from the start and keeps its cache object)
        self._caches = [rep.cache for rep in sim.replicas]
        self._queue_lengths = sim.queue_lengths                  # kept by the simulator
        self._capacity_blocks = sim.capacity_blocks
        self._last_ids = None         # identity fast path: the last sequence looked up ...
        self._last_pieces = None      # ... and its pieces
        self._pieces_cache: dict = {}

    # -- reading ----------------------------------------------------------------------------------
    @property
    def now_s(self) -> float:
        """Current simulated time, seconds from the trace start (float)."""
        return self._sim.now

    @property
    def routable_replicas(self):
        """Replicas that accept new requests now, ascending (a ``range`` or tuple of ints): every
        replica unless cluster events (``simulate(events=...)``) have not added it yet, or it
        failed or is draining. A router must return one of these. Membership is never lagged: a
        gateway learns it from health checks."""
        return self._sim.routable_replicas

    def queue_length(self, replica: int) -> int:
        """Requests routed to ``replica`` and waiting to be admitted (not yet prefilling), >= 0."""
        return len(self._replicas[replica].waiting)

    def queue_length_all(self) -> list[int]:
        """:meth:`queue_length` of every replica, a new list indexed by replica (one call; a copy
        of the lengths the simulator keeps with the queues)."""
        return self._queue_lengths[:]

    def queued_prompt_tokens(self, replica: int) -> int:
        """Prompt tokens (sum of ``input_length``) of the requests waiting on ``replica``, >= 0
        (SGLang's ``get_load`` adds them to the KV tokens in use)."""
        return self._replicas[replica].queued_tokens   # kept with the queue (Replica.queued_tokens)

    def kv_usage(self, replica: int) -> float:
        """Fraction in [0, 1] of ``replica``'s HBM KV budget (blocks) held by running requests'
        blocks (reference-counted: a shared prefix block counts once)."""
        return self._replicas[replica].cache.used_slots / self._capacity_blocks

    def kv_usage_all(self) -> list[float]:
        """:meth:`kv_usage` of every replica, a list indexed by replica (one call, not one per
        replica)."""
        cap = self._capacity_blocks
        return [c.used_slots / cap for c in self._caches]

    def kv_usage_max(self) -> float:
        """``max(kv_usage_all())`` without building the list of fractions (the largest count of
        blocks in use over the budget: the same float, division being monotone)."""
        return max([c.used_slots for c in self._caches]) / self._capacity_blocks

    def active_blocks(self, replica: int) -> int:
        """KV blocks (of ``block_tokens`` tokens) held in HBM by requests running on ``replica``;
        the numerator of :meth:`kv_usage`."""
        return self._replicas[replica].cache.used_slots

    def cached_block_count(self, replica: int) -> int:
        """Complete blocks (of ``block_tokens`` tokens) in ``replica``'s HBM cache, pinned or
        not: the size of its tree in a KV-event indexer (Dynamo's ``tree_sizes``)."""
        return self._replicas[replica].cache.hbm_blocks

    def cached_block_count_all(self) -> list[int]:
        """:meth:`cached_block_count` of every replica, a list indexed by replica (one call;
        the holder index keeps the totals)."""
        return self._sim.holder_index.hbm_totals(self.num_replicas)

    def egress_backlog_s(self, replica: int) -> float:
        """Seconds, >= 0, until ``replica``'s egress NIC has finished every transfer already
        queued or running on it (0 when idle)."""
        return max(0.0, self._replicas[replica].egress_free_s - self._sim.now)

    def ingress_backlog_s(self, replica: int) -> float:
        """Seconds, >= 0, until ``replica``'s ingress NIC has finished every transfer already
        queued or running into it (0 when idle)."""
        return max(0.0, self._replicas[replica].ingress_free_s - self._sim.now)

    def hbm_free_blocks(self, replica: int) -> int:
        """HBM KV blocks of ``replica`` not held by running requests, copies or pins: free slots
        plus evictable LRU blocks, i.e. room a copy can take without evicting blocks in use."""
        cache = self._replicas[replica].cache
        return cache.capacity_blocks - cache.used_slots

    def cached_blocks(self, replica: int, hash_ids: Sequence[int],
                      tiers: tuple[str, ...] = ALL_TIERS) -> int:
        """Length (blocks) of the longest run of leading ``hash_ids`` that are complete in
        ``replica``'s cache in any of ``tiers`` (a subset of ``("hbm", "dram", "disk")``).

        KV-event view: only blocks whose prefill finished or whose copy landed count; blocks of a
        prefill still running do not. Returns an int in ``[0, len(hash_ids)]``.
        """
        return self.cached_in(self._replicas[replica].cache, hash_ids, tiers)

    def cached_blocks_all(self, hash_ids: Sequence[int],
                          tiers: tuple[str, ...] = ALL_TIERS) -> dict[int, int]:
        """:meth:`cached_blocks` of every replica at once, for the replicas where it is >= 1.

        Returns
        -------
        dict[int, int]
            ``{replica: cached_blocks(replica, hash_ids, tiers)}`` for every replica holding at
            least the first block (in no particular order); every replica it omits holds 0.

        Notes
        -----
        Answered by one walk over ``hash_ids``' pieces in the holder index the caches keep
        (:mod:`btb_core.sim.holders`), so the cost follows the replicas that match, not the
        fleet. Counting the disk tier on a cluster that has one, or an id sequence that is not a
        root path of the trace, asks every replica instead (same answer).
        """
        pieces = self.pieces(hash_ids)
        sim = self._sim
        if pieces is None or ("disk" in tiers and sim.has_disk):
            return self._scan_all(hash_ids, tiers)
        caches = self._caches if "dram" in tiers else None
        return sim.holder_index.matched(caches, pieces[0], pieces[1], len(hash_ids),
                                        "hbm" in tiers, "dram" in tiers)

    def request_pieces(self, request) -> tuple[list[int], list[int]]:
        """``(run starts, lengths)`` of ``request.hash_ids`` (:meth:`pieces`), from the pieces
        the simulator built the request from, without building or checking its id tuple.

        The returned lists are shared: do not modify them.
        """
        src = getattr(request, "_source", None)
        if src is not None and len(src) == 2:
            return src
        return self.pieces(request.hash_ids)

    def cached_blocks_all_pieces(self, starts, lens, n: int,
                                 tiers: tuple[str, ...] = ALL_TIERS) -> dict[int, int]:
        """:meth:`cached_blocks_all` of the path's first ``n`` blocks given by its pieces
        (:meth:`pieces`, :meth:`request_pieces`; ``n`` at most their total length)."""
        sim = self._sim
        if "disk" in tiers and sim.has_disk:
            return self._scan_all(tuple_of_pieces(starts, lens)[:n], tiers)
        caches = self._caches if "dram" in tiers else None
        return sim.holder_index.matched(caches, starts, lens, n, "hbm" in tiers, "dram" in tiers)

    def holding_all_pieces(self, starts, lens, n: int,
                           tiers: tuple[str, ...] = ALL_TIERS) -> list[int]:
        """Replicas, ascending, where :meth:`cached_blocks_all_pieces` is ``n``: those holding
        all of the path's first ``n`` (>= 1) blocks in ``tiers`` (one pass over the first run's
        holders when the ``n`` blocks lie in it: :meth:`HolderIndex.holding_all`)."""
        sim = self._sim
        if "hbm" not in tiers or ("disk" in tiers and sim.has_disk):
            return sorted([r for r, m in self.cached_blocks_all_pieces(starts, lens, n,
                                                                       tiers).items() if m >= n])
        use_dram = "dram" in tiers
        return sim.holder_index.holding_all(self._caches if use_dram else None, starts, lens, n,
                                            use_dram)

    def cached_blocks_hbm_dram(self, hash_ids: Sequence[int]) -> tuple[dict, dict]:
        """``(cached_blocks_all(hash_ids, ("hbm",)), cached_blocks_all(hash_ids, ("hbm",
        "dram")))`` from one walk."""
        pieces = self.pieces(hash_ids)
        if pieces is None:
            return (self._scan_all(hash_ids, ("hbm",)), self._scan_all(hash_ids, ("hbm", "dram")))
        return self._sim.holder_index.matched(self._caches, pieces[0],
                                              pieces[1], len(hash_ids), True, True, True)

    def cached_blocks_hbm_dram_pieces(self, starts, lens, n: int) -> tuple[dict, dict]:
        """:meth:`cached_blocks_hbm_dram` of the path's first ``n`` blocks given by its pieces
        (:meth:`pieces`, :meth:`request_pieces`; ``n`` at most their total length), from one
        walk, without building or looking up its id tuple."""
        return self._sim.holder_index.matched(self._caches, starts, lens, n, True, True, True)

    def _scan_all(self, hash_ids, tiers) -> dict[int, int]:
        """:meth:`cached_blocks_all` by asking every replica (the reference answer)."""
        return scan_cached_blocks(self, hash_ids, tiers)

    # -- acting -----------------------------------------------------------------------------------
    def start_transfer(self, src: int, dst: int, hash_ids: Sequence[int],
                       pause_destination: bool = False, from_block: int = 0,
                       hold: bool = False) -> int:
        """Start an RDMA copy of the blocks ``hash_ids`` (a leading part of a request's ids) from
        ``src``'s cache to ``dst``'s HBM.

        The copy queues FIFO behind earlier transfers on ``src``'s egress and ``dst``'s ingress NIC
        and then takes ``cost.load_s("rdma", (len(hash_ids) - from_block) x block_tokens)``
        seconds. The blocks in ``src``'s HBM stay pinned until it lands. With
        ``pause_destination`` the destination starts no new operation until the copy lands.
        ``from_block`` > 0 sends only blocks ``from_block ..`` (the destination received the
        earlier ones from a previous copy: a pipelined copy's next chunk). With ``hold`` the
        destination's requests that would reuse more of ``hash_ids`` than it holds wait for the copy
        instead of recomputing (as an engine waits for a request's remote KV; vLLM's
        ``WAITING_FOR_REMOTE_KVS`` state), and other requests are scheduled past them.

        Returns
        -------
        int
            The transfer id (0, 1, ... in start order); :meth:`Router.on_transfer_done` is called
            with it when the copy lands.

        Raises
        ------
        ValueError
            If ``src`` or ``dst`` is not a replica, ``src == dst``, ``hash_ids`` is empty or not a
            chained prefix from a request's first block, ``from_block`` is not in
            ``[0, len(hash_ids))``, or ``src`` does not hold all of ``hash_ids`` as complete
            blocks (any tier).
        """
        n = self.num_replicas
        if not (0 <= src < n and 0 <= dst < n):
            raise ValueError(f"start_transfer: replicas must be in [0, {n}), got src={src} dst={dst}")
        if src == dst:
            raise ValueError(f"start_transfer: src and dst are both replica {src}")
        sim = self._sim
        if sim.cluster_events and (sim.replica_state[src] in ("absent", "failed")
                                   or sim.replica_state[dst] != "up"):
            raise ValueError(f"start_transfer: replica {src} ({sim.replica_state[src]}) -> "
                             f"{dst} ({sim.replica_state[dst]}): copies go from a live replica "
                             "to one that accepts requests")
        hash_ids = tuple(hash_ids)
        if not hash_ids:
            raise ValueError("start_transfer: no blocks to copy")
        cache = self._replicas[src].cache
        pieces = self.pieces(hash_ids)
        if pieces is None:
            have = self._matched_any(cache, hash_ids, ALL_TIERS)
            if have == len(hash_ids):
                raise ValueError("start_transfer: hash_ids must be a leading part of a request's "
                                 "hash_ids (a chained prefix from the first block)")
        else:
            have = cache.matched_blocks(pieces[0], pieces[1], len(hash_ids))
        if have < len(hash_ids):
            raise ValueError(f"start_transfer: replica {src} holds only {have} of the "
                             f"{len(hash_ids)} complete blocks requested")
        if not (isinstance(from_block, int) and 0 <= from_block < len(hash_ids)):
            raise ValueError(f"start_transfer: from_block={from_block!r} must be in [0, {len(hash_ids)})")
        return self._sim.start_transfer(src, dst, hash_ids, pieces, pause_destination, from_block,
                                        hold)

    def pin_prefix(self, replica: int, hash_ids: Sequence[int]) -> int:
        """Pin the leading blocks of ``hash_ids`` that sit in ``replica``'s HBM (they cannot be
        evicted until :meth:`unpin_prefix`); returns how many were pinned, in
        ``[0, len(hash_ids)]``. Raises ``ValueError`` unless ``hash_ids`` is a leading part of a
        request's ids."""
        hash_ids = tuple(hash_ids)
        pieces = self.pieces(hash_ids)
        if pieces is None:
            raise ValueError("pin_prefix: hash_ids must be a leading part of a request's hash_ids")
        return self._sim.pin_prefix(replica, pieces, len(hash_ids))

    def unpin_prefix(self, replica: int, hash_ids: Sequence[int], num_blocks: int) -> None:
        """Undo :meth:`pin_prefix` of ``num_blocks`` leading blocks of ``hash_ids`` (the value it
        returned). Raises ``ValueError`` as :meth:`pin_prefix`."""
        hash_ids = tuple(hash_ids)
        pieces = self.pieces(hash_ids)
        if pieces is None:
            raise ValueError("unpin_prefix: hash_ids must be a leading part of a request's hash_ids")
        self._sim.unpin_prefix(replica, pieces, num_blocks)

    def hold_prefix(self, replica: int, hash_ids: Sequence[int], until_s: float) -> None:
        """Until ``until_s`` (simulated seconds) or :meth:`release_hold`, requests on ``replica``
        that would reuse more of ``hash_ids`` than it holds now wait instead of recomputing (other
        requests are scheduled past them): for a copy that will start later (pipelined copies).
        No-op when ``until_s`` is not in the future; ``ValueError`` on empty ``hash_ids``."""
        hash_ids = tuple(hash_ids)
        if not hash_ids:
            raise ValueError("hold_prefix: no blocks")
        self._sim.hold_prefix(replica, hash_ids, until_s)

    def release_hold(self, replica: int, hash_ids: Sequence[int]) -> None:
        """End the :meth:`hold_prefix` holds of exactly ``hash_ids`` on ``replica``."""
        self._sim.release_hold(replica, tuple(hash_ids))

    def dispatch(self, request, replica: int) -> None:
        """Send ``request``, which the router held back (its ``route`` returned None), to
        ``replica`` now: a router-side queue, as Dynamo's ``router_queue_threshold``.

        Raises
        ------
        ValueError
            If ``replica`` is not a replica or ``request`` was not held back.
        """
        self._sim.dispatch(request, replica)

    # -- look-up cache (engine side; not for routers) ---------------------------------------------
    def cached_in(self, cache, hash_ids: Sequence[int], tiers: tuple[str, ...] = ALL_TIERS) -> int:
        """:meth:`cached_blocks` against any cache of this run's block index (a replica's, or a
        stale mirror of it, :mod:`btb_core.sim.lag`)."""
        pieces = self.pieces(hash_ids)
        if pieces is None:
            return self._matched_any(cache, hash_ids, tiers)
        return cache.matched_blocks(pieces[0], pieces[1], len(hash_ids), tiers)

    def pieces(self, hash_ids):
        """``(run starts, lengths)`` of ``hash_ids`` if it is a root path of the trace's ids, else
        None; cached on the sequence's identity and on its value."""
        if hash_ids is self._last_ids:
            return self._last_pieces
        cache = self._pieces_cache
        key = hash_ids if type(hash_ids) is tuple else tuple(hash_ids)
        try:
            val = cache[key]
        except KeyError:
            if len(cache) >= _PIECES_CACHE_MAX:
                cache.clear()
            val = cache[key] = self._sim.blocks.path_pieces(key)
        except TypeError:             # unhashable elements: not ids of this trace
            val = None
        self._last_ids = hash_ids
        self._last_pieces = val
        return val

    def _matched_any(self, cache, hash_ids, tiers) -> int:
        """Block-by-block leading-run count for an id sequence that is not a root path."""
        use = ("hbm" in tiers, "dram" in tiers, "disk" in tiers)
        index = self._sim.blocks
        n = 0
        for b in hash_ids:
            where = index.run_of(b)
            if where is None:
                break
            t = cache.block_tiers(*where)
            if not ((use[0] and t[0]) or (use[1] and t[1]) or (use[2] and t[2])):
                break
            n += 1
        return n


__all__ = ["ALL_TIERS", "ClusterView"]
