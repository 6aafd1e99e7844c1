"""Prompts for a real engine from a trace's block ids: one word per token, shared ids share words.

Each chained block id maps to a fixed sequence of ``block_tokens`` words drawn from the tiny
model's word-level vocabulary (``w3`` .. ``w8191``; ids 0-2 are special tokens), so two requests
whose first ``k`` ids are equal have the same first ``k x block_tokens`` words, hence the same first
tokens, and the engine's prefix cache sees exactly the sharing the trace describes. The words of a
block depend only on ``(salt, id, position in the block)`` (BLAKE2b), so the text is the same in
every run; a new ``salt`` gives text that shares nothing with an earlier run's (a cold cache
without restarting the engine).
"""

from __future__ import annotations

import hashlib

import numpy as np

#: Word ids of the tiny model's vocabulary that are plain words (see ``_remote.SPECIAL_TOKENS``).
FIRST_WORD_ID = 3
VOCAB_SIZE = 8192


def block_words(block_id: int, block_tokens: int, salt: int = 0) -> list[str]:
    """The ``block_tokens`` words standing for one block id (deterministic in ``salt``, ``block_id``)."""
    out: list[str] = []
    counter = 0
    span = VOCAB_SIZE - FIRST_WORD_ID
    while len(out) < block_tokens:
        digest = hashlib.blake2b(f"{salt}:{int(block_id)}:{counter}".encode(), digest_size=64).digest()
        vals = np.frombuffer(digest, dtype="<u2")
        out.extend(f"w{FIRST_WORD_ID + int(v) % span}" for v in vals)
        counter += 1
    return out[:block_tokens]


class PromptBuilder:
    """Builds and memoises prompt text for chained block ids.

    Parameters
    ----------
    block_tokens : int
        Tokens per block id of the trace.
    salt : int
        Separates runs: the same ids under another salt share no text.
    """

    def __init__(self, block_tokens: int, salt: int = 0) -> None:
        self.block_tokens = int(block_tokens)
        self.salt = int(salt)
        self._memo: dict[int, list[str]] = {}

    def words(self, hash_ids, input_length: int) -> list[str]:
        """The prompt's ``input_length`` words; raises ValueError if ids cover fewer tokens."""
        bt = self.block_tokens
        need = -(-int(input_length) // bt)
        if len(hash_ids) < need:
            raise ValueError(f"{len(hash_ids)} block ids cover {len(hash_ids) * bt} tokens, "
                             f"fewer than input_length={input_length}")
        out: list[str] = []
        for b in list(hash_ids)[:need]:
            w = self._memo.get(int(b))
            if w is None:
                w = self._memo[int(b)] = block_words(int(b), bt, self.salt)
            out.extend(w)
        return out[:int(input_length)]

    def text(self, hash_ids, input_length: int) -> str:
        """The prompt as text: words joined by single spaces (one word = one token)."""
        return " ".join(self.words(hash_ids, input_length))
