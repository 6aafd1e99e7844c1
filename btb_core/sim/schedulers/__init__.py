"""Replica schedulers behind one interface (:class:`Scheduler`), and the name -> class table.

Adding a scheduler is one new file in this package (a :class:`Scheduler` subclass with a ``name``)
plus one line in :data:`SCHEDULERS`; ``ClusterConfig.scheduler`` validation, the ``--scheduler``
choices of ``btb replay`` and the experiment's scheduler list are read from the table.
"""

from __future__ import annotations

from .base import Scheduler
from .chunked import Chunked
from .prefill_first import PrefillFirst

#: Scheduler name -> class, in the order tables and the CLI list them.
SCHEDULERS: dict[str, type[Scheduler]] = {
    PrefillFirst.name: PrefillFirst,
    Chunked.name: Chunked,
}

__all__ = ["SCHEDULERS", "Chunked", "PrefillFirst", "Scheduler"]
