"""Several router instances: one policy run by N independent gateway replicas.

Production runs more than one router: SGLang Model Gateway replicas behind a load balancer, Dynamo
frontends with several router replicas, llm-d endpoint pickers scaled out. Each instance sees only
the requests it routed: its own prefix index, its own in-flight counts and load book, its own burst
detector and copy bookkeeping (``btb``, ``btb_adaptive``), so a shared-prompt burst split across
instances can pile onto different replicas per instance and warm copies can be started twice.
What instances do share is what the cluster publishes: KV events, engine load figures (both
possibly late, :mod:`btb_core.sim.lag`) and the copies that landed.

:class:`RouterInstances` wraps any :class:`~btb_core.routers.base.Router` class (it only uses the
interface: ``reset``, ``route``, the hooks, and the optional index-sync methods), so a new policy
works behind it without edits.

- Assignment (``assign``): ``"round_robin"`` by arrival (a load balancer in front of the
  gateways), or ``"session"``: a stable hash (CRC-32) of the request's session id, as a sticky
  load balancer would: from ``session_ids`` (one per trace row, e.g. the trace's ``session_id``
  column or :func:`btb_core.sessions.infer_sessions`), else the request's own ``session_id``
  attribute, else its first block id (requests of one job share it; note that in traces where
  every prompt starts with one system prompt this sends everything to one instance).
- Sync (``sync_s``): every ``sync_s`` seconds of simulated time the instances exchange the prefix
  index updates they made since the last exchange (SGLang's mesh tree sync; Dynamo's
  ``router_replica_sync`` shares its active-sequence book instead, which is not modelled). ``0``:
  never. An exchange inserts the other instances' routed prompts into each instance's index,
  stamped with the exchange time; loads are never shared. Policies without an approximate index
  (``kv_aware``, ``least_load``, ...) have nothing to exchange.

One instance, or N instances that are the same object, route exactly like the bare policy.
"""

from __future__ import annotations

import zlib

from ..errors import ConfigError
from .base import Router

ASSIGN_MODES = ("round_robin", "session")


class _InstanceView:
    """One instance's window on the cluster: the shared view, with its copies and dispatches
    recorded so that hooks reach the instance that started them."""

    def __init__(self, owner: "RouterInstances", k: int, base) -> None:
        self._owner = owner
        self._k = k
        self._base = base

    def __getattr__(self, name):
        return getattr(self._base, name)

    def start_transfer(self, src, dst, hash_ids, pause_destination=False, **kw) -> int:
        tid = self._base.start_transfer(src, dst, hash_ids, pause_destination, **kw)
        self._owner._transfer_owner[tid] = self._k
        return tid


class RouterInstances(Router):
    """``num_instances`` independent instances of one policy (see the module docstring).

    Parameters
    ----------
    factory : callable
        ``factory(k)`` returns the router of instance ``k`` (``0 .. num_instances - 1``); returning
        the same object for several ``k`` makes them share one state.
    num_instances : int >= 1
    assign : {"round_robin", "session"}
        How arrivals are split across instances.
    sync_s : float >= 0
        Seconds between prefix-index exchanges; 0 = never.
    session_ids : sequence, optional
        Session id of each trace row (by request index), for ``assign="session"``.

    Raises
    ------
    ConfigError
        On a value outside the ranges above.
    """

    def __init__(self, factory, num_instances: int, assign: str = "round_robin",
                 sync_s: float = 0.0, session_ids=None) -> None:
        if isinstance(num_instances, bool) or not isinstance(num_instances, int) or num_instances < 1:
            raise ConfigError(f"--routers={num_instances!r} must be an integer >= 1")
        if assign not in ASSIGN_MODES:
            raise ConfigError(f"--router-assign={assign!r} must be one of {list(ASSIGN_MODES)}")
        if isinstance(sync_s, bool) or not isinstance(sync_s, (int, float)) \
                or not 0.0 <= sync_s < float("inf"):
            raise ConfigError(f"--router-sync-s={sync_s!r} must be a finite number >= 0")
        self.instances = [factory(k) for k in range(num_instances)]
        self.num_instances = num_instances
        self.assign = assign
        self.sync_s = float(sync_s)
        self.session_ids = None if session_ids is None else list(session_ids)
        self.name = getattr(self.instances[0], "name", "instances")

    @classmethod
    def of_policy(cls, policy_cls, params: dict, num_instances: int, assign: str = "round_robin",
                  sync_s: float = 0.0, session_ids=None) -> "RouterInstances":
        """``num_instances`` fresh ``policy_cls(**params)`` routers."""
        return cls(lambda k: policy_cls(**params), num_instances, assign, sync_s, session_ids)

    # -- lifecycle -----------------------------------------------------------------------------
    def reset(self, view) -> None:
        super().reset(view)
        self._unique = []         # distinct router objects, in instance order
        seen = {}
        for k, router in enumerate(self.instances):
            if id(router) not in seen:
                seen[id(router)] = k
                self._unique.append(router)
                router.reset(_InstanceView(self, k, view))
        self._first_of = [seen[id(r)] for r in self.instances]   # instance -> its state's owner
        self._owner: dict[int, int] = {}           # request index -> instance
        self._transfer_owner: dict[int, int] = {}  # transfer id -> instance (its state's owner)
        self._next = 0
        self._next_sync_s = self.sync_s if self.sync_s > 0 else float("inf")
        if self.sync_s > 0 and len(self._unique) > 1:
            for router in self._unique:
                router.enable_index_sync()
        self._block_hooks = [r.on_blocks_complete for r in self._unique
                             if hasattr(r, "on_blocks_complete")]
        #: Requests routed by each instance.
        self.routed = [0] * self.num_instances
        self.syncs = 0

    def close(self) -> None:
        """Close every distinct instance (each ``sglang_gateway`` instance stops its gateway)."""
        seen = set()
        for router in self.instances:
            if id(router) not in seen:
                seen.add(id(router))
                router.close()

    # -- assignment and sync -------------------------------------------------------------------
    def instance_of(self, request) -> int:
        """The instance that routes ``request`` (advances the round-robin pointer)."""
        n = self.num_instances
        if n == 1:
            return 0
        if self.assign == "round_robin":
            k = self._next
            self._next = (k + 1) % n
            return k
        key = None
        if self.session_ids is not None:
            key = self.session_ids[request.index]
        if key is None:
            key = getattr(request, "session_id", None)
        if key is None:
            ids = request.hash_ids
            key = ids[0] if len(ids) else request.index
        return zlib.crc32(str(key).encode()) % n

    def _sync(self) -> None:
        now = self.view.now_s
        if now < self._next_sync_s:
            return
        updates = [router.index_updates() for router in self._unique]
        for i, router in enumerate(self._unique):
            for j, ops in enumerate(updates):
                if i != j and ops:
                    router.apply_index_updates(ops)
        self.syncs += 1
        while self._next_sync_s <= now:
            self._next_sync_s += self.sync_s

    # -- Router interface ----------------------------------------------------------------------
    def route(self, request):
        if len(self._unique) > 1:
            self._sync()
        k = self.instance_of(request)
        self.routed[k] += 1
        self._owner[request.index] = k
        return self.instances[k].route(request)

    def _router_of(self, request):
        k = self._owner.get(request.index)
        return None if k is None else self.instances[k]

    def on_prefill_done(self, request, replica: int) -> None:
        router = self._router_of(request)
        if router is not None:
            router.on_prefill_done(request, replica)

    def on_request_finished(self, request, replica: int) -> None:
        router = self._router_of(request)
        self._owner.pop(request.index, None)
        if router is not None:
            router.on_request_finished(request, replica)

    def on_transfer_done(self, transfer_id: int, src: int, dst: int, num_blocks: int) -> None:
        k = self._transfer_owner.pop(transfer_id, None)
        if k is not None:
            self.instances[k].on_transfer_done(transfer_id, src, dst, num_blocks)

    def on_replica_added(self, replica: int) -> None:
        for router in self.instances:
            router.on_replica_added(replica)

    def on_replica_removed(self, replica: int, failed: bool) -> None:
        for router in self.instances:
            router.on_replica_removed(replica, failed)


    def on_blocks_complete(self, request, replica: int, complete_blocks: int) -> None:
        """Chunk completions are cluster events: every instance that listens hears them."""
        for hook in self._block_hooks:
            hook(request, replica, complete_blocks)

    def on_run_end(self) -> None:
        for router in self._unique:
            hook = getattr(router, "on_run_end", None)
            if hook is not None:
                hook()


def trace_session_ids(trace):
    """Session id per row of ``trace``: its ``session_id`` column, else sessions inferred from
    chained prefixes (:func:`btb_core.sessions.infer_sessions`), else None (no prefix info)."""
    table = trace.table
    if "session_id" in table.columns:
        return table["session_id"].tolist()
    try:
        from ..sessions import infer_sessions

        return infer_sessions(trace).table["session_id"].tolist()
    except Exception:   # noqa: BLE001 - no prefix info or a grouped trace: fall back per request
        return None


__all__ = ["ASSIGN_MODES", "RouterInstances", "trace_session_ids"]
