"""Prompt text for the real gateway: one fixed-length pseudo-random text chunk per block id.

The SGLang Model Gateway's ``cache_aware`` policy matches raw request *text* in a character radix
tree (``sgl-model-gateway/src/policies/tree.rs``, sgl-project/sglang @ 03744dbe: ``insert`` and
``prefix_match_with_counts`` walk ``char`` by ``char``; the match rate is matched chars / input
chars). A trace gives block ids, not text, so :class:`BlockText` writes each prompt as the
concatenation of one chunk per block id:

* the same id always gives the same chunk, so prompts that share their first K blocks share their
  first ``K * chars_per_block`` characters;
* a chunk's **first character** is an ordinal of the block among the children of its parent
  block (ids are chained: the parent of ``hash_ids[i]`` is ``hash_ids[i - 1]``), in order of first
  appearance. Two different blocks at the same position therefore never share even one character,
  so the tree walk stops exactly at a block boundary and the text match is the block match times
  ``chars_per_block`` (no accidental one-character matches into a sibling's node);
* the other characters are pseudo-random CJK ideographs (U+4E00..U+9FFF), drawn from a generator
  seeded by the block's intern number, so a run is reproducible;
* the last block, when partial (``input_length - (n - 1) * block_tokens`` tokens), is the first
  ``round(chars_per_block * tokens / block_tokens)`` (at least 1) characters of its chunk, so the
  text length stays proportional to the prompt's tokens.

Every character is a 3-byte UTF-8 code point, so a character count and a byte count give the same
ratio (older gateway releases divided ``str::len()`` bytes, ``cache_aware.rs`` @ 053b63ff).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...errors import ConfigError

_RANDOM_LO, _RANDOM_N = 0x4E00, 0x9FFF - 0x4E00 + 1      # CJK Unified Ideographs
# First characters (sibling ordinals): 3-byte code points outside the surrogates.
_FIRST_RANGES = ((0x4E00, 0xD7FF), (0xE000, 0xFFFD))
_FIRST_MAX = sum(hi - lo + 1 for lo, hi in _FIRST_RANGES)


def _ordinal_char(k: int) -> str:
    for lo, hi in _FIRST_RANGES:
        if k <= hi - lo:
            return chr(lo + k)
        k -= hi - lo + 1
    raise ConfigError(f"sglang_gateway: more than {_FIRST_MAX} distinct blocks follow one parent "
                      "block; the text encoding cannot keep their first characters distinct")


class BlockText:
    """Encode chained block ids as gateway prompt text (see the module docstring).

    Parameters
    ----------
    chars_per_block : int >= 2
        Characters per full block (default 64: a 65,536-token prefix of 512-token blocks is 8,192
        characters, 24 KiB of UTF-8).
    seed : int
        Seeds the per-block character draws.

    Raises
    ------
    ConfigError
        If ``chars_per_block < 2``.
    """

    def __init__(self, chars_per_block: int = 64, seed: int = 0) -> None:
        if isinstance(chars_per_block, bool) or not isinstance(chars_per_block, int) \
                or chars_per_block < 2:
            raise ConfigError(f"sglang_gateway: chars_per_block={chars_per_block!r} must be an "
                              "integer >= 2")
        self.chars_per_block = chars_per_block
        self.seed = int(seed)
        self._chunk: dict = {}       # block id -> full chunk text
        self._children: dict = {}    # parent id (None = root) -> number of distinct children

    def _chunk_of(self, parent, block) -> str:
        text = self._chunk.get(block)
        if text is None:
            k = self._children.get(parent, 0)
            self._children[parent] = k + 1
            rng = np.random.default_rng([self.seed, len(self._chunk)])
            rest = rng.integers(0, _RANDOM_N, self.chars_per_block - 1) + _RANDOM_LO
            text = _ordinal_char(k) + "".join(map(chr, rest.tolist()))
            self._chunk[block] = text
        return text

    def encode(self, hash_ids: Sequence, input_length: int, block_tokens: int) -> str:
        """The prompt text of a request.

        Parameters
        ----------
        hash_ids : sequence of hashable
            Chained block ids, one per ``block_tokens`` tokens (the last may be partial).
        input_length : int
            Prompt tokens.
        block_tokens : int
            Tokens per block.

        Returns
        -------
        str
            ``len(hash_ids) - 1`` full chunks then the last block's (possibly partial) chunk;
            ``""`` for a request without block ids.
        """
        n = len(hash_ids)
        if n == 0:
            return ""
        c = self.chars_per_block
        parts = []
        parent = None
        for h in hash_ids:
            parts.append(self._chunk_of(parent, h))
            parent = h
        last_tokens = min(max(int(input_length) - (n - 1) * int(block_tokens), 1), int(block_tokens))
        keep = max(1, int(round(c * last_tokens / block_tokens)))
        if keep < c:
            parts[-1] = parts[-1][:keep]
        return "".join(parts)


__all__ = ["BlockText"]
