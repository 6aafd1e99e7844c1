"""The simulator's request record."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Request:
    """One request of a trace as the router and replicas see it.

    Attributes
    ----------
    index : int
        Row position in the trace (0-based); unique within a run.
    request_id : int | str
        The trace's request id.
    arrival_s : float
        Arrival time, seconds from the trace start.
    input_length, output_length : int
        Prompt tokens and generated tokens (``output_length >= 1``; 0 is treated as 1 since the
        first token is produced by prefill).
    hash_ids : tuple[int, ...]
        Chained block ids, one per ``block_tokens`` block of the prompt (the last may be partial).
    block_tokens : int
        Tokens per KV block of the trace.
    """

    index: int
    request_id: object
    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: tuple
    block_tokens: int

    @property
    def full_blocks(self) -> int:
        """Number of complete ``block_tokens`` blocks in the prompt."""
        return self.input_length // self.block_tokens
