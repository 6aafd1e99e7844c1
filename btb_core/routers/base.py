"""The router interface every policy implements.

A router is a class with one decision method, :meth:`Router.route`, and no-op hooks
(:meth:`Router.on_prefill_done`, :meth:`Router.on_request_finished`,
:meth:`Router.on_transfer_done`). The simulator calls :meth:`Router.reset` once with a
:class:`~btb_core.sim.view.ClusterView` before the first arrival; the view is the only window the
router has onto the cluster, and it exposes just what a real gateway could know (its own dispatch
decisions, queue lengths and KV usage that engines publish, KV-cache events) plus the one action a
replicating router needs (starting an RDMA copy). Routers import nothing from the simulator at run
time (the names below are for type hints only).

A new policy is one file in this package (a :class:`Router` subclass with a ``name``) plus one line
in :data:`btb_core.routers.POLICIES`; the CLI help, chart order and tests read that table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..sim.request import Request
    from ..sim.view import ClusterView


def cached_blocks_all(view, hash_ids, tiers=("hbm", "dram", "disk")) -> dict[int, int]:
    """``{replica: view.cached_blocks(replica, hash_ids, tiers)}`` for the replicas where it is
    >= 1 (every omitted replica holds 0): the view's one-walk
    :meth:`~btb_core.sim.view.ClusterView.cached_blocks_all` when it has one, else one
    ``cached_blocks`` call per replica (views of real engines, test doubles)."""
    f = getattr(view, "cached_blocks_all", None)
    if f is not None:
        return f(hash_ids, tiers)
    from ..sim.view import scan_cached_blocks

    return scan_cached_blocks(view, hash_ids, tiers)


def queue_length_all(view) -> list[int]:
    """``[view.queue_length(r) for r in range(view.num_replicas)]``, in one call when the view
    has ``queue_length_all``."""
    f = getattr(view, "queue_length_all", None)
    if f is not None:
        return f()
    return [view.queue_length(r) for r in range(view.num_replicas)]


def cached_block_count_all(view) -> list[int]:
    """``[view.cached_block_count(r) for r in range(view.num_replicas)]``, in one call when the
    view has ``cached_block_count_all``."""
    f = getattr(view, "cached_block_count_all", None)
    if f is not None:
        return f()
    return [view.cached_block_count(r) for r in range(view.num_replicas)]


def kv_usage_all(view) -> list[float]:
    """``[view.kv_usage(r) for r in range(view.num_replicas)]``, in one call when the view has
    ``kv_usage_all``."""
    f = getattr(view, "kv_usage_all", None)
    if f is not None:
        return f()
    return [view.kv_usage(r) for r in range(view.num_replicas)]


def kv_usage_max(view) -> float:
    """``max(kv_usage_all(view))``, in one call when the view has ``kv_usage_max``."""
    f = getattr(view, "kv_usage_max", None)
    if f is not None:
        return f()
    return max(kv_usage_all(view))


class IndexSyncLog:
    """:meth:`Router.enable_index_sync` and :meth:`Router.index_updates` for a router that appends
    each prefix-index update it makes to ``self._sync_log`` while syncing is on (None while it is
    off: its ``reset`` sets that). Put it before ``Router`` among the bases."""

    def enable_index_sync(self) -> None:
        self._sync_log = []

    def index_updates(self) -> list:
        ops, self._sync_log = self._sync_log or [], ([] if self._sync_log is not None else None)
        return ops


class Router:
    """Base class: subclasses implement :meth:`route`; hooks default to no-ops.

    Class attribute ``name`` is the policy name used on the CLI and in the policy table.
    """

    name: str = "base"
    #: True for a policy backed by an external process (``sglang_gateway``); default policy lists
    #: leave such policies out unless they are named.
    external: bool = False

    def reset(self, view: "ClusterView") -> None:
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
