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

    def dispatch(self, request: "Request", replica: int) -> None:
        """Send a request the router held back (its :meth:`Router.route` returned None) to
        ``replica`` now (a router-side queue, as Dynamo's ``router_queue_threshold``)."""

    def start_transfer(self, src: int, dst: int, hash_ids: Sequence[int],
                       pause_destination: bool = False) -> int:
        """Start an RDMA copy of the blocks ``hash_ids`` (a prefix) from ``src`` to ``dst``.

        The copy queues FIFO behind earlier transfers on ``src``'s egress and ``dst``'s ingress NIC.
        With ``pause_destination`` the destination starts no new iteration until the copy lands.

        Returns a transfer id; :meth:`Router.on_transfer_done` is called when it lands in
        ``dst``'s HBM. Raises ``ValueError`` if ``src`` does not hold all of ``hash_ids`` as complete
        blocks, or ``src == dst``.
        """


class Router:
    """Base class: subclasses implement :meth:`route`; hooks default to no-ops.

    Class attribute ``name`` is the policy name used on the CLI and in the policy table.
    """

    name: str = "base"

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
        """Called when a transfer started by :meth:`ClusterView.start_transfer` landed."""

    # -- prefix-index exchange between router instances (btb_core.routers.instances) -----------
    def enable_index_sync(self) -> None:
        """Start recording the prefix-index updates this router makes (for :meth:`index_updates`).
        No-op for policies without an approximate prefix index."""

    def index_updates(self) -> list:
        """The prefix-index updates recorded since the last call (then forgotten); ``[]`` if none."""
        return []

    def apply_index_updates(self, updates: list) -> None:
        """Apply another instance's :meth:`index_updates` to this router's prefix index."""
