"""Traces shaped like the Bursted test split, built without the dataset generator (benchmarks and
the simulator's golden tests).

``bursted_shaped_trace()`` gives 76,800 rows in 256-token blocks, like the reference Bursted-ART
test split (DESIGN.md section 2): 15 normal windows of 1,000 consecutive rows (here cut from the
shipped Mooncake conversation trace, its 512-token blocks split in two) and 15 synthetic windows of
8 jobs x 500 requests sharing a 65,536-token prefix + a 256-token suffix each (1 output token, job
starts 40 s apart from 20 s, up to 2 s jitter, spread over 60 s) plus 120 single-request decoys =
4,120 rows. Windows are laid end to end on one timeline.

Two builders give the identical :class:`~btb_core.trace.Trace` (same rows, same interned ids):

- :func:`bursted_shaped_trace` writes the interned, chained ids directly with numpy (the 76,800
  rows hold 19.7 M block ids; the synthetic rows' ids are known in closed form), by default as
  runs of consecutive ids (a compact trace, :class:`~btb_core.trace.BlockRuns`: ~2 MB), or
  (``compact=False``) as the flat int32 array (in about 0.2 s and 100 MB);
- :func:`bursted_shaped_trace_via_make_trace` builds per-row raw id lists and passes them through
  :func:`btb_core.trace.make_trace` (validation + interning); slow (seconds, ~1 GB at full size),
  kept as the reference the fast builder is tested against.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .paths import DATA_DIR
from .trace import BlockRuns, Trace, load_mooncake, make_trace

BLOCK = 256
PREFIX_TOKENS = 65_536
SUFFIX_TOKENS = 256
JOBS = 8
JOB_REQUESTS = 500
DECOYS = 120
NORMAL_ROWS = 1000

_SYN = 1 << 40  # synthetic ids live far above the base trace's interned ids


def _base():
    return load_mooncake(DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl")


def _synthetic_times(rng, offset_s: float):
    """Arrival times (unsorted, job rows then decoys) and row kinds: job j (0..7) or -1 = decoy."""
    times, kind = [], []
    for j in range(JOBS):
        start = 20.0 + 40.0 * j + rng.uniform(0.0, 2.0)
        times.append(offset_s + (np.sort(rng.uniform(0.0, 60.0, JOB_REQUESTS)) + start))
        kind.append(np.full(JOB_REQUESTS, j))
    decoy_t = [offset_s + float(rng.uniform(0.0, 360.0)) for _ in range(DECOYS)]
    times.append(np.array(decoy_t, dtype=np.float64))
    kind.append(np.full(DECOYS, -1))
    return np.concatenate(times), np.concatenate(kind)


# ------------------------------------------------------------------------ reference builder
def _normal_rows(base, start: int, rows: int, offset_s: float):
    tab = base.table.iloc[start:start + rows]
    t0 = float(tab["arrival_s"].iloc[0])
    out = []
    for i, (a, n_in, n_out) in enumerate(zip(tab["arrival_s"], tab["input_length"], tab["output_length"])):
        ids512 = base.row_hash_ids(start + i)
        n_blocks = -(-int(n_in) // BLOCK)
        ids = np.stack([2 * ids512.astype(np.int64), 2 * ids512.astype(np.int64) + 1], 1).ravel()[:n_blocks]
        out.append((offset_s + float(a) - t0, int(n_in), int(n_out), ids))
    return out


def _synthetic_rows(rng, offset_s: float, w: int):
    rows = []
    base_id = _SYN + w * 10_000_000
    prefix_blocks = PREFIX_TOKENS // BLOCK
    total = PREFIX_TOKENS + SUFFIX_TOKENS
    n_blocks = -(-total // BLOCK)
    times, kind = _synthetic_times(rng, offset_s)
    k_in_job = [0] * JOBS
    for d_or_j, t in zip(kind.tolist(), times.tolist()):
        if d_or_j >= 0:
            j = d_or_j
            k = k_in_job[j]
            k_in_job[j] += 1
            prefix = np.arange(prefix_blocks, dtype=np.int64) + base_id + j * 1_000_000
            suffix = base_id + j * 1_000_000 + 500_000 + k * 8 + np.arange(n_blocks - prefix_blocks)
            rows.append((t, total, 1, np.concatenate([prefix, suffix])))
        else:
            d = len(rows) - JOBS * JOB_REQUESTS
            rows.append((t, total, 1, base_id + 9_000_000 + d * 1_000 + np.arange(n_blocks, dtype=np.int64)))
    return rows


def bursted_shaped_trace_via_make_trace(seed: int = 0, windows: int = 30) -> Trace:
    """Reference builder (per-row id lists through ``make_trace``); same result, slow."""
    rng = np.random.default_rng(seed)
    base = _base()
    rows = []
    offset = 0.0
    for w in range(windows):
        if w % 2 == 0:
            start = (w // 2 * NORMAL_ROWS) % (len(base) - NORMAL_ROWS)
            part = _normal_rows(base, start, NORMAL_ROWS, offset)
        else:
            part = _synthetic_rows(rng, offset, w)
        part.sort(key=lambda r: r[0])
        rows.extend(part)
        offset = max(r[0] for r in part) + 30.0
    a, i, o, h = zip(*rows)
    return make_trace(list(a), list(i), list(o), list(h), block_tokens=BLOCK, name="bursted_shaped")


# ------------------------------------------------------------------------ fast builder
class _Interner:
    """First-appearance interning of the normal windows' raw ids (2 x base id + half)."""

    def __init__(self, num_raw: int) -> None:
        self.code = np.full(num_raw, -1, np.int64)

    def __call__(self, raw: np.ndarray, next_code: int) -> tuple[np.ndarray, int]:
        uniq, first = np.unique(raw, return_index=True)
        new = uniq[self.code[uniq] < 0]
        if len(new):
            order = np.argsort(first[self.code[uniq] < 0], kind="stable")
            self.code[new[order]] = next_code + np.arange(len(new))
            next_code += len(new)
        return self.code[raw], next_code


def bursted_shaped_trace(seed: int = 0, windows: int = 30, compact: bool = True) -> Trace:
    """76,800 rows (for 30 windows) as described in the module docstring.

    Equal (rows, request ids, interned ``hash_flat`` / ``hash_offsets``) to
    :func:`bursted_shaped_trace_via_make_trace` with the same arguments. Ids are numbered in order
    of first appearance, as ``make_trace`` interns them: the normal windows through a lookup table
    over the base trace's ids, the synthetic windows in closed form (a job's first row brings its
    256 prefix ids and its own suffix id, every later row one new suffix id, a decoy 257 new ids).

    With ``compact`` (the default) the ids are written as runs of consecutive ids
    (:class:`~btb_core.trace.BlockRuns`: a synthetic row is one run, or the job's prefix run plus
    its own suffix id), and the trace keeps only those (``Trace.hash_runs``; the flat ids and the
    ``hash_ids`` column are expanded if a caller reads them): 1,000,000 rows take ~25 MB of ids
    instead of 827 MB. With ``compact=False`` the int32 id array is allocated once and filled
    window by window, and the table gets its ``hash_ids`` column of views at once.
    """
    rng = np.random.default_rng(seed)
    base = _base()
    b_arr = base.table["arrival_s"].to_numpy()
    b_in = base.table["input_length"].to_numpy()
    b_out = base.table["output_length"].to_numpy()
    b_flat, b_off = base.hash_flat.astype(np.int64), base.hash_offsets
    intern = _Interner(2 * (int(b_flat.max()) + 1) if len(b_flat) else 0)
    prefix_blocks = PREFIX_TOKENS // BLOCK
    total = PREFIX_TOKENS + SUFFIX_TOKENS
    n_syn = -(-total // BLOCK)
    arr, inp, out, lens, fills = [], [], [], [], []
    next_code = 0
    offset = 0.0
    for w in range(windows):
        if w % 2 == 0:
            start = (w // 2 * NORMAL_ROWS) % (len(base) - NORMAL_ROWS)
            sl = slice(start, start + NORMAL_ROWS)
            t = offset + b_arr[sl] - float(b_arr[start])
            n_in = b_in[sl]
            n_blocks = -(-n_in // BLOCK)
            order = np.argsort(t, kind="stable")
            raw = []
            for i in order.tolist():
                row = b_flat[b_off[start + i]:b_off[start + i + 1]]
                raw.append(np.stack([2 * row, 2 * row + 1], 1).ravel()[:n_blocks[i]])
            codes, next_code = intern(np.concatenate(raw), next_code)
            arr.append(t[order])
            inp.append(n_in[order])
            out.append(b_out[sl][order])
            lens.append(n_blocks[order])
            fills.append(("normal", codes.astype(np.int32)))
        else:
            t, kind = _synthetic_times(rng, offset)
            order = np.argsort(t, kind="stable")
            t, kind = t[order], kind[order]
            m = len(t)
            first = np.ones(m, bool)                        # the row introduces new prefix ids
            for j in range(JOBS):
                first[np.flatnonzero(kind == j)[1:]] = False
            new_count = np.where(first, n_syn, 1)
            code0 = next_code + np.cumsum(new_count) - new_count
            prefix_start = np.array([code0[np.flatnonzero(kind == j)[0]] for j in range(JOBS)])
            base_code = np.where(first, code0, prefix_start[np.maximum(kind, 0)])
            next_code += int(new_count.sum())
            arr.append(t)
            inp.append(np.full(m, total, np.int64))
            out.append(np.ones(m, np.int64))
            lens.append(np.full(m, n_syn, np.int64))
            fills.append(("synthetic", (base_code, first, code0)))
        offset = float(arr[-1].max()) + 30.0
    if next_code > np.iinfo(np.int32).max:
        raise ValueError(f"bursted_shaped_trace: {next_code} ids do not fit int32")
    lengths = np.concatenate(lens).astype(np.int64)
    n = len(lengths)
    columns = {"request_id": np.arange(n, dtype=np.int64),
               "arrival_s": np.concatenate(arr).astype(np.float64),
               "input_length": np.concatenate(inp).astype(np.int64),
               "output_length": np.concatenate(out).astype(np.int64)}
    if compact:
        runs = _runs(fills, lengths, prefix_blocks, n_syn)
        return Trace(pd.DataFrame(columns), BLOCK, "bursted_shaped", True, None, None, None,
                     hash_runs=runs)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.empty(int(offsets[-1]), np.int32)
    row = 0
    steps = np.arange(n_syn, dtype=np.int32)
    for kind_w, data in fills:
        m = NORMAL_ROWS if kind_w == "normal" else len(data[0])
        lo, hi = int(offsets[row]), int(offsets[row + m])
        if kind_w == "normal":
            flat[lo:hi] = data
        else:
            base_code, first, code0 = data
            grid = flat[lo:hi].reshape(m, n_syn)
            np.add(base_code.astype(np.int32)[:, None], steps[None, :], out=grid)
            grid[~first, prefix_blocks:] = (code0[~first].astype(np.int32)[:, None]
                                            + steps[None, :n_syn - prefix_blocks])
        row += m
    flat.flags.writeable = False
    views = np.empty(n, dtype=object)
    for i, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        views[i] = flat[a:b]
    columns["hash_ids"] = views
    return Trace(pd.DataFrame(columns), BLOCK, "bursted_shaped", True, flat, offsets, None)


def _runs(fills, lengths, prefix_blocks: int, n_syn: int) -> BlockRuns:
    """The ids of :func:`bursted_shaped_trace` as runs, window by window, without the flat array:
    a normal window's runs from its (small) id array, a synthetic row's in closed form (a row that
    introduces its ids is one run of ``n_syn``; a later row of a job is the job's prefix run, then
    its own suffix id)."""
    starts, run_lens, per_row = [], [], []
    row = 0
    for kind_w, data in fills:
        if kind_w == "normal":
            m = NORMAL_ROWS
            off = np.zeros(m + 1, np.int64)
            np.cumsum(lengths[row:row + m], out=off[1:])
            part = BlockRuns.from_flat(data, off)
            starts.append(part.start)
            run_lens.append(part.length)
            per_row.append(np.diff(part.row_runs))
        else:
            base_code, first, code0 = data
            m = len(base_code)
            k = np.where(first, 1, 2)                       # runs per row
            at = np.zeros(m, np.int64)
            np.cumsum(k[:-1], out=at[1:])
            s = np.empty(int(k.sum()), np.int64)
            ln = np.empty(len(s), np.int64)
            s[at] = base_code
            ln[at] = np.where(first, n_syn, prefix_blocks)
            later = at[~first] + 1
            s[later] = code0[~first]
            ln[later] = n_syn - prefix_blocks
            starts.append(s)
            run_lens.append(ln)
            per_row.append(k)
        row += m
    row_runs = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(np.concatenate(per_row), out=row_runs[1:])
    runs = BlockRuns(np.concatenate(starts), np.concatenate(run_lens), row_runs)
    if not np.array_equal(runs.offsets[1:] - runs.offsets[:-1], lengths):
        raise RuntimeError("bursted_shaped_trace: runs disagree with the row lengths")
    return runs


__all__ = ["bursted_shaped_trace", "bursted_shaped_trace_via_make_trace"]
