"""The router interface every policy implements.

A router is a class with one decision method, :meth:`Router.route`, and no-op hooks
(:meth:`Router.on_prefill_done`, :meth:`Router.on_request_finished`, :meth:`Router.on_transfer_done`). The simulator calls
:meth:`Router.reset` once with a :class:`ClusterView` before the first arrival; the view is the only
window the router has onto the cluster, and it exposes just what a real gateway could know (its own
dispatch decisions, queue lengths and KV usage that engines publish, KV-cache events) plus the one
action a replicating router needs (starting an RDMA copy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from ..sim.request import Request


class ClusterView(Protocol):
    """What a router may read from, and do to, the simulated cluster.

    Replicas are numbered ``0 .. num_replicas - 1``. All times are simulated seconds.
    """

    num_replicas: int
    block_tokens: int
    chunk_tokens: int
    rng: "np.random.Generator"
    #: The replicas' cost model (:class:`btb_core.cost.CostModel`): a deployed router would use a
    #: profiled model of the same engine.
    cost: object
    #: ``"prefill_first"`` or ``"chunked"``.
    scheduler: str

    @property
    def now_s(self) -> float:
        """Current simulated time in seconds."""

    def queue_length(self, replica: int) -> int:
        """Requests waiting (not yet admitted) on ``replica``."""

    def running(self, replica: int) -> int:
        """Requests admitted and not finished on ``replica`` (prefilling or decoding)."""

    def queued_prompt_tokens(self, replica: int) -> int:
        """Prompt tokens of the requests waiting on ``replica`` (SGLang's ``get_load`` adds them to
        the KV tokens in use)."""

    def kv_usage(self, replica: int) -> float:
        """Fraction in [0, 1] of the replica's HBM KV budget held by running requests' blocks."""

    def cached_blocks(self, replica: int, hash_ids: Sequence[int],
                      tiers: tuple[str, ...] = ("hbm", "dram", "disk")) -> int:
        """Length of the longest run of leading ``hash_ids`` that are complete in ``replica``'s
        cache in any of ``tiers`` (KV-event view: only blocks whose prefill finished or whose copy
        landed)."""

    def active_blocks(self, replica: int) -> int:
        """KV blocks held by requests running on ``replica``."""

    def cached_block_count(self, replica: int) -> int:
        """Complete blocks in ``replica``'s HBM cache (the size of its tree in a KV-event indexer,
        Dynamo's ``tree_sizes``)."""

    def egress_backlog_s(self, replica: int) -> float:
        """Seconds until ``replica``'s egress NIC is free of queued/active transfers."""

    #: Replicas that accept new requests now, ascending: every replica unless cluster events
    #: (``simulate(events=...)``) have not added it yet, or it failed or is draining. A router
    #: must return one of these.
    routable_replicas: Sequence[int]

    def dispatch(self, request: "Request", replica: int) -> None:
        """Send a request the router held back (its :meth:`Router.route` returned None) to
        ``replica`` now (a router-side queue, as Dynamo's ``router_queue_threshold``)."""

    def ingress_backlog_s(self, replica: int) -> float:
        """Seconds until ``replica``'s ingress NIC is free of queued/active transfers."""

    def hbm_free_blocks(self, replica: int) -> int:
        """HBM KV blocks of ``replica`` not held by running requests, copies or pins (free slots
        plus evictable LRU blocks): room a copy can take without evicting blocks in use."""

    def pin_prefix(self, replica: int, hash_ids: Sequence[int]) -> int:
        """Pin the leading blocks of ``hash_ids`` that sit in ``replica``'s HBM (they cannot be
        evicted until :meth:`unpin_prefix`); returns how many were pinned."""

    def unpin_prefix(self, replica: int, hash_ids: Sequence[int], num_blocks: int) -> None:
        """Undo :meth:`pin_prefix` of ``num_blocks`` leading blocks."""

    def hold_prefix(self, replica: int, hash_ids: Sequence[int], until_s: float) -> None:
        """Until ``until_s`` (or :meth:`release_hold`), requests on ``replica`` that would reuse
        more of ``hash_ids`` than it holds now wait instead of recomputing (other requests are
        scheduled past them); for a copy that will start later (pipelined copies)."""

    def release_hold(self, replica: int, hash_ids: Sequence[int]) -> None:
        """End a :meth:`hold_prefix` of exactly ``hash_ids``."""

    def start_transfer(self, src: int, dst: int, hash_ids: Sequence[int],
                       pause_destination: bool = False, from_block: int = 0,
                       hold: bool = False) -> int:
        """Start an RDMA copy of the blocks ``hash_ids`` (a prefix) from ``src`` to ``dst``.

        The copy queues FIFO behind earlier transfers on ``src``'s egress and ``dst``'s ingress NIC.
        With ``pause_destination`` the destination starts no new iteration until the copy lands.
        ``from_block`` > 0 sends only blocks ``from_block ..`` (the destination received the
        earlier ones from a previous copy: a pipelined copy's next chunk); time and bytes count
        those blocks only. With ``hold`` the destination's requests that would reuse more of
        ``hash_ids`` than it holds wait for the copy instead of recomputing (as an engine waits
        for a request's remote KV; vLLM's ``WAITING_FOR_REMOTE_KVS`` state), and other requests
        are scheduled past them.

        Returns a transfer id; :meth:`Router.on_transfer_done` is called when it lands in
        ``dst``'s HBM. Raises ``ValueError`` if ``src`` does not hold all of ``hash_ids`` as complete
        blocks, or ``src == dst``.
        """


class Router:
    """Base class: subclasses implement :meth:`route`; hooks default to no-ops.

    Class attribute ``name`` is the policy name used on the CLI and in the policy table.
    """

    name: str = "base"
    #: True for a policy backed by an external process (``sglang_gateway``); default policy lists
    #: leave such policies out unless they are named.
    external: bool = False

    def reset(self, view: ClusterView) -> None:
        """Called once before the first arrival of a run; keep ``view`` and clear state."""
        self.view = view

    def route(self, request: "Request") -> int | None:  # pragma: no cover - abstract
        """Return the replica index in ``[0, view.num_replicas)`` for ``request``, or None to hold
        it in the router and send it later with :meth:`ClusterView.dispatch`."""
        raise NotImplementedError

    def on_prefill_done(self, request: "Request", replica: int) -> None:
        """Called when ``request``'s prefill completed on ``replica`` (its first token), before
        :meth:`on_request_finished` for a 1-token output (Dynamo's ``mark_prefill_completed``)."""

    def on_request_finished(self, request: "Request", replica: int) -> None:
        """Called when ``request`` produced its last token on ``replica``."""

    def on_transfer_done(self, transfer_id: int, src: int, dst: int, num_blocks: int) -> None:
        """Called when a transfer started by :meth:`ClusterView.start_transfer` landed
        (``num_blocks`` 0 if its source or destination failed while it was in flight)."""

    def on_replica_added(self, replica: int) -> None:
        """Called when a cold replica joins (cluster event ``add``); it is in
        ``view.routable_replicas`` from now on."""

    def on_replica_removed(self, replica: int, failed: bool) -> None:
        """Called when ``replica`` leaves ``view.routable_replicas``: ``failed`` (its cache and
        requests are lost; each lost request is then routed again with :meth:`route`, without an
        :meth:`on_request_finished` for the lost attempt) or drained (its requests finish there)."""

    def candidates(self) -> Sequence[int]:
        """``view.routable_replicas``, or every replica for a view without it."""
        c = getattr(self.view, "routable_replicas", None)
        return range(self.view.num_replicas) if c is None else c

    # -- prefix-index exchange between router instances (btb_core.routers.instances) -----------
    def enable_index_sync(self) -> None:
        """Start recording the prefix-index updates this router makes (for :meth:`index_updates`).
        No-op for policies without an approximate prefix index."""

    def index_updates(self) -> list:
        """The prefix-index updates recorded since the last call (then forgotten); ``[]`` if none."""
        return []

    def apply_index_updates(self, updates: list) -> None:
        """Apply another instance's :meth:`index_updates` to this router's prefix index."""

    # Optional hooks, called only when a router defines them (no cost for the others):
    # ``on_blocks_complete(request, replica, complete_blocks)`` after a prefill chunk makes more of
    # a prompt's leading blocks complete, and ``on_run_end()`` after the last event.

    def close(self) -> None:
        """Called once when a run ends, fails or is interrupted: release external resources
        (the ``sglang_gateway`` policy stops its gateway process here). A later :meth:`reset`
        may start them again."""
