"""The interface every replica scheduler implements.

A scheduler decides what one replica does next. The engine (:mod:`btb_core.sim.engine`) owns the
event loop, the KV cache, decode bookkeeping and the router; it calls the replica's scheduler at
two points:

- :meth:`Scheduler.plan` when the replica may start a new operation (it just became idle, a request
  arrived at an idle replica, a transfer freed blocks);
- :meth:`Scheduler.op_done` when an operation the scheduler started (any kind other than the
  engine's own ``"stretch"`` of coalesced decode steps and ``"pause"``) ends.

A scheduler acts on the replica through the engine's scheduling primitives, all of them methods of
:class:`~btb_core.sim.engine.Simulator`: ``try_admit(rep, job)`` (prefix look-up, load-vs-recompute
decision, KV reservation), ``start_op(rep, kind, duration_s, data)``, ``start_stretch(rep)``,
``idle(rep)``, ``sample_queue(rep)``, ``complete(rep, job, upto_tokens)``,
``first_token(rep, job)``, ``finish_decodes(rep)`` and ``first_unheld(rep, start)`` (the first
waiting request, from ``start``, that no router hold makes wait for a copy in flight). A new scheduler is one file in this package
plus one line in :data:`btb_core.sim.schedulers.SCHEDULERS`.
"""

from __future__ import annotations


class Scheduler:
    """Base class: subclasses implement :meth:`plan` and :meth:`op_done`.

    Parameters
    ----------
    cluster : btb_core.sim.ClusterConfig
        The run's cluster (``max_running``, ``chunk_tokens``, ``cost``); one scheduler object serves
        every replica of a run, so per-replica state lives on the
        :class:`~btb_core.sim.replica.Replica`.

    Class attribute ``name`` is the scheduler's name in :data:`SCHEDULERS`, on the CLI
    (``--scheduler``) and in result tables.
    """

    name: str = "base"
    #: True when the scheduler's own operations run decode steps (as ``chunked``'s iterations do),
    #: so paged KV admission (``ClusterConfig.kv_admission="paged"``) allocates the decode batch's
    #: next blocks, preempting if needed, before :meth:`plan`; False when decode runs only in the
    #: engine's stretches (``prefill_first``).
    decodes_in_ops: bool = False

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        # CostModel.context_s_per_token, read once (0 on the GPU presets: no per-chunk term)
        self._context_s = cluster.cost.context_s_per_token

    def plan(self, sim, rep) -> None:  # pragma: no cover - abstract
        """Start ``rep``'s next operation (``sim.start_op`` / ``sim.start_stretch``) or leave it
        idle (``sim.idle``). Called only when ``rep`` is not busy and not paused."""
        raise NotImplementedError

    def op_done(self, sim, rep, kind: str, data) -> None:  # pragma: no cover - abstract
        """Apply the effects of ``rep``'s finished operation ``kind`` (started by this scheduler
        with payload ``data``) at ``sim.now``. The engine plans the replica's next operation
        afterwards."""
        raise NotImplementedError


__all__ = ["Scheduler"]
