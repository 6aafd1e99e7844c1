"""The simulator's request record."""

from __future__ import annotations

from ..trace.runs import tuple_of_pieces


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
        The simulator builds it on first access from the row's pieces of runs (``hash_ids`` given
        as None with ``source=(run starts, lengths)``, :mod:`btb_core.sim.blocks`; or
        ``source=(flat, lo, hi)``, a slice of a flat id array) and may drop the cached tuple after
        the router's hooks ran, so a run holds only the ids routers are looking at.
    block_tokens : int
        Tokens per KV block of the trace.
    """

    __slots__ = ("index", "request_id", "arrival_s", "input_length", "output_length",
                 "block_tokens", "_hash_ids", "_source")

    def __init__(self, index, request_id, arrival_s, input_length, output_length, hash_ids,
                 block_tokens, source=None):
        self.index = index
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.input_length = input_length
        self.output_length = output_length
        self.block_tokens = block_tokens
        self._hash_ids = hash_ids
        self._source = source

    @property
    def hash_ids(self) -> tuple:
        h = self._hash_ids
        if h is None:
            src = self._source
            if len(src) == 2:
                h = self._hash_ids = tuple_of_pieces(src[0], src[1])
            else:
                flat, lo, hi = src
                h = self._hash_ids = tuple(flat[lo:hi].tolist())
        return h

    def drop_hash_ids(self) -> None:
        """Forget the cached ``hash_ids`` tuple (rebuilt on next access) to save memory."""
        if self._source is not None:
            self._hash_ids = None

    @property
    def full_blocks(self) -> int:
        """Number of complete ``block_tokens`` blocks in the prompt."""
        return self.input_length // self.block_tokens

    def __repr__(self) -> str:
        return (f"Request(index={self.index}, request_id={self.request_id!r}, "
                f"arrival_s={self.arrival_s}, input_length={self.input_length}, "
                f"output_length={self.output_length})")
