"""Discrete-event simulator of a routed cluster of LLM replicas with tiered prefix KV caches.

Semantics: docs/DESIGN.md section 4 and the module docstrings of ``engine``, ``replica``,
``kvcache``. Entry point: :func:`simulate`.
"""

from .cluster import KV_ADMISSIONS, SCHEDULERS, ClusterConfig
from .engine import Simulator, simulate
from .metrics import REQUEST_COLUMNS, SimResult
from .request import Request

__all__ = ["KV_ADMISSIONS", "SCHEDULERS", "ClusterConfig", "Request", "REQUEST_COLUMNS", "SimResult", "Simulator",
           "simulate"]
