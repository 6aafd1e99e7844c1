"""Discrete-event simulator of a routed cluster of LLM replicas with tiered prefix KV caches.

Semantics: docs/DESIGN.md section 4 and the module docstrings of ``engine``, ``replica``,
``kvcache``. Entry point: :func:`simulate`.
"""

from .cluster import (EVENT_ACTIONS, KV_ADMISSIONS, SCHEDULERS, ClusterConfig, ClusterEvent,
                      check_events, load_events)
from .engine import Simulator, simulate
from .metrics import REQUEST_COLUMNS, SimResult
from .request import Request

__all__ = ["EVENT_ACTIONS", "KV_ADMISSIONS", "SCHEDULERS", "ClusterEvent", "check_events", "load_events", "ClusterConfig", "Request", "REQUEST_COLUMNS", "SimResult", "Simulator",
           "simulate"]
