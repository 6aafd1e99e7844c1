"""The default validation trace: small bursts of same-prefix requests, sized for one CPU core.

:func:`make_validation_trace` builds it from a seed; ``data/traces/engine_validation/`` ships the
output of ``write_validation_trace(seed=0)`` (Mooncake JSONL: ``timestamp`` in ms,
``input_length``, ``output_length``, chained ``hash_ids`` of 32-token blocks).

Shape (defaults): six bursts, each twelve requests over two seconds that share a prefix of 1,024
to 3,072 tokens (one prefix ends inside a block, so that block is not shared) plus a suffix of
their own of 32-320 tokens; bursts start 1.5 s apart. Eight one-off requests of 256-2,048 cold
tokens at random times, and four exact repeats of earlier requests (a full hit, where the engine
recomputes the last block). Outputs are 1 token (three in four requests) or 2-8 tokens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..paths import DATA_DIR
from ..trace import make_trace

BLOCK_TOKENS = 32
PREFIX_TOKENS = (1024, 2048, 1536, 3072, 2560, 1040)


def _rows(seed: int):
    rng = np.random.default_rng(seed)
    next_id = [0]

    def fresh(n):
        out = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return out

    rows = []
    for b, prefix in enumerate(PREFIX_TOKENS):
        shared_blocks = prefix // BLOCK_TOKENS          # full blocks of the shared prefix
        shared = fresh(shared_blocks)
        start = 1.5 * b
        for t in np.sort(rng.uniform(0.0, 2.0, 12)):
            suffix = int(rng.integers(32, 321))
            n = prefix + suffix
            ids = shared + fresh(-(-n // BLOCK_TOKENS) - shared_blocks)
            out = 1 if rng.random() < 0.75 else int(rng.integers(2, 9))
            rows.append((start + float(t), n, out, ids))
    end = max(r[0] for r in rows)
    for t in rng.uniform(0.0, end, 8):
        n = int(rng.integers(256, 2049))
        rows.append((float(t), n, 1, fresh(-(-n // BLOCK_TOKENS))))
    rows.sort(key=lambda r: r[0])
    picks = rng.choice(len(rows) // 2, 4, replace=False)
    for k in sorted(picks):
        t0, n, out, ids = rows[k]
        rows.append((t0 + float(rng.uniform(3.0, 6.0)), n, 1, list(ids)))
    rows.sort(key=lambda r: r[0])
    return [(int(round(1000 * t)), n, out, ids) for t, n, out, ids in rows]


def make_validation_trace(seed: int = 0):
    """The validation trace as a :class:`btb_core.trace.Trace` (32-token blocks)."""
    rows = _rows(seed)
    return make_trace([r[0] / 1000 for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                      [r[3] for r in rows], block_tokens=BLOCK_TOKENS, name=f"engine_validation-seed{seed}")


def write_validation_trace(path: str | Path | None = None, seed: int = 0) -> Path:
    """Write the trace as Mooncake JSONL (temp file + rename); returns the path."""
    path = Path(path) if path else DATA_DIR / "traces" / "engine_validation" / "engine_validation.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        for ts, n, out, ids in _rows(seed):
            fh.write(json.dumps({"timestamp": ts, "input_length": n, "output_length": out,
                                 "hash_ids": ids}) + "\n")
    os.replace(tmp, path)
    return path


__all__ = ["BLOCK_TOKENS", "PREFIX_TOKENS", "make_validation_trace", "write_validation_trace"]
