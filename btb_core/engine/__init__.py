"""Validation of the simulator against a real engine: vLLM (CPU build) serving a tiny model.

Public entry points: :class:`EngineCluster` (start/stop 1-2 servers), :func:`validate` (calibrate,
replay per policy, simulate, compare), :func:`calibrate.measure` / :func:`calibrate.fit_cost`,
:func:`replay.replay`. The engine runs in its own environment (``make engine``); without it the
functions raise :class:`EngineNotInstalled` whose message says how to install it.
"""

from .server import (ENGINE_BLOCK_TOKENS, ENGINE_CHUNK_TOKENS, INSTALL_HINT, EngineCluster,
                     EngineError, EngineNotInstalled, engine_available, tiny_model_spec)
from .validation import DEFAULT_POLICIES, DEFAULT_TRACE, GOALS, ValidationResult, validate

__all__ = ["DEFAULT_POLICIES", "DEFAULT_TRACE", "ENGINE_BLOCK_TOKENS", "ENGINE_CHUNK_TOKENS", "GOALS",
           "INSTALL_HINT", "EngineCluster", "EngineError", "EngineNotInstalled", "ValidationResult",
           "engine_available", "tiny_model_spec", "validate"]
