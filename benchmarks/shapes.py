"""Builders of benchmark traces shaped like the Bursted test split (no dataset generator needed).

``bursted_shaped_trace()`` gives 76,800 rows in 256-token blocks, like the reference Bursted-ART
test split (DESIGN.md section 2): 15 normal windows of 1,000 consecutive rows (here cut from the
shipped Mooncake conversation trace, its 512-token blocks split in two) and 15 synthetic windows of
8 jobs x 500 requests sharing a 65,536-token prefix + a 256-token suffix each (1 output token, job
starts 40 s apart from 20 s, up to 2 s jitter, spread over 60 s) plus 120 single-request decoys =
4,120 rows. Windows are laid end to end on one timeline.
"""

from __future__ import annotations

import numpy as np

from btb_core.paths import DATA_DIR
from btb_core.trace import load_mooncake, make_trace

BLOCK = 256
PREFIX_TOKENS = 65_536
SUFFIX_TOKENS = 256


def _normal_rows(base, start: int, rows: int, offset_s: float, uid: str):
    tab = base.table.iloc[start:start + rows]
    t0 = float(tab["arrival_s"].iloc[0])
    out = []
    for i, (a, n_in, n_out) in enumerate(zip(tab["arrival_s"], tab["input_length"], tab["output_length"])):
        ids512 = base.row_hash_ids(start + i)
        n_blocks = -(-int(n_in) // BLOCK)
        ids = np.stack([2 * ids512.astype(np.int64), 2 * ids512.astype(np.int64) + 1], 1).ravel()[:n_blocks]
        out.append((offset_s + float(a) - t0, int(n_in), int(n_out), ids))
    return out


_SYN = 1 << 40  # synthetic ids live far above the base trace's interned ids


def _synthetic_rows(rng, offset_s: float, w: int):
    rows = []
    base_id = _SYN + w * 10_000_000
    prefix_blocks = PREFIX_TOKENS // BLOCK
    total = PREFIX_TOKENS + SUFFIX_TOKENS
    n_blocks = -(-total // BLOCK)
    for j in range(8):
        start = 20.0 + 40.0 * j + rng.uniform(0.0, 2.0)
        times = np.sort(rng.uniform(0.0, 60.0, 500)) + start
        prefix = np.arange(prefix_blocks, dtype=np.int64) + base_id + j * 1_000_000
        for k, t in enumerate(times):
            suffix = base_id + j * 1_000_000 + 500_000 + k * 8 + np.arange(n_blocks - prefix_blocks)
            rows.append((offset_s + float(t), total, 1, np.concatenate([prefix, suffix])))
    for d in range(120):
        t = rng.uniform(0.0, 360.0)
        rows.append((offset_s + float(t), total, 1,
                     base_id + 9_000_000 + d * 1_000 + np.arange(n_blocks, dtype=np.int64)))
    return rows


def bursted_shaped_trace(seed: int = 0, windows: int = 30):
    """76,800 rows (for 30 windows) as described in the module docstring."""
    rng = np.random.default_rng(seed)
    base = load_mooncake(DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl")
    rows = []
    offset = 0.0
    for w in range(windows):
        if w % 2 == 0:
            start = (w // 2 * 1000) % (len(base) - 1000)
            part = _normal_rows(base, start, 1000, offset, f"n{w}")
        else:
            part = _synthetic_rows(rng, offset, w)
        part.sort(key=lambda r: r[0])
        rows.extend(part)
        offset = max(r[0] for r in part) + 30.0
    a, i, o, h = zip(*rows)
    return make_trace(list(a), list(i), list(o), list(h), block_tokens=BLOCK, name="bursted_shaped")
