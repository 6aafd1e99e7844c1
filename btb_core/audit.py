"""Trace audit: deep-prefix fan-out and arrival burstiness.

Deep-prefix fan-out (DESIGN.md section 2): for a depth of ``K`` blocks and a window of ``W``
seconds, the largest number of requests that share the same first ``K`` blocks (only requests with
at least ``K`` *full* blocks count) within any window ``[s, s + W)``. Because trace ids are chained
(:mod:`btb_core.trace`), "same first K blocks" is "same ``hash_ids[K-1]``", so the fan-out is a
per-key sliding-window maximum, computed here with sorts and binary searches (``O(n log n)``, no
Python loop over requests).

Excluding earlier turns (``exclude_sessions=True``): a request ``a`` does not count in a window if a
later request ``b`` (later row, arriving before the window ends) *extends* it: ``b`` has more full
blocks than ``a`` and its first ``F_a`` blocks are ``a``'s ``F_a`` full blocks. That is how a growing
conversation looks (turn 2's prompt is turn 1's prompt plus the answer plus a new message). Requests
with the same full blocks as a later one (a burst that shares its prefix and differs only inside the
last partial block) are *not* excluded: the extension must be strict.

The window semantics are exact: request ``a`` counts in the window starting at ``s`` iff
``s <= t_a < s + W`` and (with exclusion) its first extension arrives at or after ``s + W``; so each
request contributes the interval of window starts ``(t_a - W, min(t_a, e_a - W)]`` and the fan-out is
the largest number of same-key intervals that overlap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .errors import ConfigError
from .trace import Trace

#: Default audit grid (issue 2): depths of 1k, 4k and 8k tokens, windows of 10 s and 60 s.
DEFAULT_DEPTH_TOKENS = (1024, 4096, 8192)
DEFAULT_WINDOW_S = (10.0, 60.0)
#: Burstiness bins (issue 2): requests per second at 1 s and 10 s bins.
DEFAULT_BIN_S = (1.0, 10.0)

FANOUT_COLUMNS = ("trace", "depth_tokens", "depth_blocks", "block_tokens", "window_s",
                  "exclude_sessions", "max_fanout", "keys_at_max", "eligible_requests",
                  "distinct_keys", "window_start_s", "note")


@dataclass(frozen=True)
class FanoutResult:
    """Deep-prefix fan-out of one trace at one depth and window.

    Attributes
    ----------
    trace : str
        Trace name.
    depth_tokens : int
        Requested depth in tokens; requests must share at least this many leading tokens.
    depth_blocks : int
        ``ceil(depth_tokens / block_tokens)``: the shared leading blocks compared.
    block_tokens : int
    window_s : float
        Window length in seconds.
    exclude_sessions : bool
        Whether earlier turns of a growing conversation were excluded.
    max_fanout : int
        Largest number of requests sharing one depth-``K`` prefix within one window (0 if no
        request has ``K`` full blocks).
    keys_at_max : int
        Number of distinct prefixes that reach ``max_fanout`` (in some window).
    eligible_requests : int
        Requests with at least ``depth_blocks`` full blocks.
    distinct_keys : int
        Distinct depth-``K`` prefixes among the eligible requests.
    window_start_s : float
        Start of one window achieving the maximum (NaN if ``max_fanout == 0``).
    example_key : int
        Chained id (``hash_ids[K-1]``) of one prefix reaching the maximum (-1 if none).
    """

    trace: str
    depth_tokens: int
    depth_blocks: int
    block_tokens: int
    window_s: float
    exclude_sessions: bool
    max_fanout: int
    keys_at_max: int
    eligible_requests: int
    distinct_keys: int
    window_start_s: float
    example_key: int

    def as_dict(self) -> dict:
        """Plain JSON-friendly dict (NaN -> None)."""
        d = dict(self.__dict__)
        if isinstance(d["window_start_s"], float) and math.isnan(d["window_start_s"]):
            d["window_start_s"] = None
        return d


def _check_grid(depth_tokens: int, window_s: float) -> None:
    if isinstance(depth_tokens, bool) or not isinstance(depth_tokens, (int, np.integer)) or depth_tokens <= 0:
        raise ConfigError(f"depth_tokens = {depth_tokens!r}: must be a positive integer")
    if not isinstance(window_s, (int, float, np.integer, np.floating)) or not window_s > 0 \
            or not math.isfinite(window_s):
        raise ConfigError(f"window_s = {window_s!r}: must be a positive number of seconds")


def extension_arrival_s(trace: Trace) -> np.ndarray:
    """Arrival of the first later request that strictly extends each request's full blocks.

    Parameters
    ----------
    trace : Trace
        With prefix info and globally sorted arrivals.

    Returns
    -------
    numpy.ndarray
        float64, shape (n,): for row ``a``, the arrival (s) of the first row ``b > a`` whose prompt
        has more full blocks than ``a`` and starts with ``a``'s full blocks; ``inf`` if none (or if
        ``a`` has no full block).

    Raises
    ------
    TraceError
        No prefix info, or a grouped (multi-window) trace.
    """
    trace.require_prefix_info("excluding earlier conversation turns")
    trace._require_ungrouped("the audit")
    n = len(trace)
    off = trace.hash_offsets
    full = trace.full_blocks
    flat = trace.hash_flat.astype(np.int64)
    t = trace.arrival_s
    out = np.full(n, np.inf)
    if len(flat) == 0:
        return out
    lengths = np.diff(off)
    row_of = np.repeat(np.arange(n, dtype=np.int64), lengths)
    pos = np.arange(len(flat), dtype=np.int64) - np.repeat(off[:-1], lengths)
    # Occurrences that can extend someone: a full block that is not the row's last full block.
    occ = pos <= full[row_of] - 2
    occ_key = flat[occ] * (n + 1) + row_of[occ]
    occ_key.sort()
    has = full >= 1
    a = np.flatnonzero(has)
    h = flat[off[a] + full[a] - 1]
    q = h * (n + 1) + a + 1  # first occurrence of id h in a row after a
    j = np.searchsorted(occ_key, q, "left")
    ok = j < len(occ_key)
    jj = np.where(ok, j, 0)
    found = ok & (occ_key[jj] // (n + 1) == h) if len(occ_key) else np.zeros(len(a), bool)
    out[a[found]] = t[occ_key[jj[found]] % (n + 1)]
    return out


def _max_overlap(keys: np.ndarray, lo: np.ndarray, hi: np.ndarray
                 ) -> tuple[int, int, float, int]:
    """Largest number of same-key intervals ``(lo, hi]`` sharing a point.

    Returns (max count, number of keys reaching it, one point achieving it, one key reaching it).
    """
    live = hi > lo
    keys, lo, hi = keys[live], lo[live], hi[live]
    if len(keys) == 0:
        return 0, 0, math.nan, -1
    values, inv = np.unique(np.concatenate([lo, hi]), return_inverse=True)
    r_lo, r_hi = inv[:len(lo)].astype(np.int64), inv[len(lo):].astype(np.int64)
    base = np.int64(len(values) + 1)
    k = keys.astype(np.int64)
    lo_key = np.sort(k * base + r_lo)
    hi_key = np.sort(k * base + r_hi)
    # count at point x = hi_b (the max is attained at some interval's right end):
    # #{same key: lo < x} - #{same key: hi < x}
    x = k * base + r_hi
    count = np.searchsorted(lo_key, x, "left") - np.searchsorted(hi_key, x, "left")
    best = int(count.max())
    at_max = count == best
    keys_at_max = int(len(np.unique(k[at_max])))
    i = int(np.flatnonzero(at_max)[0])
    return best, keys_at_max, float(hi[i]), int(k[i])


def fanout(trace: Trace, depth_tokens: int, window_s: float, *, exclude_sessions: bool = False,
           _ext: np.ndarray | None = None) -> FanoutResult:
    """Deep-prefix fan-out of ``trace`` at one depth and window (see the module docstring).

    Parameters
    ----------
    trace : Trace
        Must have prefix info and one time line (split a grouped Bursted trace with ``groups()``).
    depth_tokens : int
        Shared leading tokens; compared as ``ceil(depth_tokens / block_tokens)`` whole blocks.
    window_s : float
        Window length, seconds (half-open ``[s, s + W)``).
    exclude_sessions : bool
        Exclude requests that a later request in the window strictly extends.

    Returns
    -------
    FanoutResult

    Raises
    ------
    TraceError
        If the trace has no prefix hash ids (Azure) or holds several windows.
    ConfigError
        Non-positive depth or window.
    """
    _check_grid(depth_tokens, window_s)
    trace.require_prefix_info("deep-prefix fan-out")
    trace._require_ungrouped("the audit")
    k_blocks = -(-int(depth_tokens) // trace.block_tokens)
    full = trace.full_blocks
    rows = np.flatnonzero(full >= k_blocks)
    t = trace.arrival_s[rows]
    keys = trace.hash_flat[trace.hash_offsets[rows] + k_blocks - 1].astype(np.int64)
    lo = t - float(window_s)
    hi = t.copy()
    if exclude_sessions:
        ext = extension_arrival_s(trace) if _ext is None else _ext
        hi = np.minimum(hi, ext[rows] - float(window_s))
    best, n_at_max, point, key = _max_overlap(keys, lo, hi)
    return FanoutResult(trace.name, int(depth_tokens), int(k_blocks), trace.block_tokens,
                        float(window_s), bool(exclude_sessions), best, n_at_max, int(len(rows)),
                        int(len(np.unique(keys))), point, key)


def fanout_table(traces: Trace | Iterable[Trace], depth_tokens: Sequence[int] = DEFAULT_DEPTH_TOKENS,
                 window_s: Sequence[float] = DEFAULT_WINDOW_S,
                 exclude_sessions: Sequence[bool] = (False, True)) -> pd.DataFrame:
    """Fan-out over a grid, one row per (trace, exclusion, window, depth).

    Grouped traces (a Bursted split with several windows) are audited window by window (one
    block of rows per window, named ``<trace>/<trace_id>``).
    Traces without prefix info get rows with ``max_fanout`` = ``<NA>`` and a ``note`` saying why,
    so a table of several traces shows Azure's gap instead of hiding it or reporting zeros.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`FANOUT_COLUMNS` (``max_fanout``, ``keys_at_max`` are nullable Int64).
    """
    if isinstance(traces, Trace):
        traces = [traces]
    # A Bursted split holds many windows on their own clocks: audit each window separately.
    traces = [g for tr in traces for g in (tr.groups() if tr.group_column else [tr])]
    for d in depth_tokens:
        for w in window_s:
            _check_grid(d, w)
    rows = []
    for tr in traces:
        if not tr.has_prefix_info:
            note = "needs prefix hash ids; this trace (Azure CSV) has none"
            for ex in exclude_sessions:
                for w in window_s:
                    for d in depth_tokens:
                        rows.append({"trace": tr.name, "depth_tokens": int(d),
                                     "depth_blocks": None, "block_tokens": None,
                                     "window_s": float(w), "exclude_sessions": bool(ex),
                                     "max_fanout": None, "keys_at_max": None,
                                     "eligible_requests": None, "distinct_keys": None,
                                     "window_start_s": math.nan, "note": note})
            continue
        ext = extension_arrival_s(tr) if any(exclude_sessions) else None
        for ex in exclude_sessions:
            for w in window_s:
                for d in depth_tokens:
                    r = fanout(tr, d, w, exclude_sessions=ex, _ext=ext).as_dict()
                    r.pop("example_key")
                    r["note"] = ""
                    rows.append(r)
    df = pd.DataFrame(rows, columns=list(FANOUT_COLUMNS))
    for col in ("max_fanout", "keys_at_max", "eligible_requests", "distinct_keys", "depth_blocks",
                "block_tokens"):
        df[col] = df[col].astype("Int64")
    df["window_start_s"] = df["window_start_s"].astype(float)
    return df


#: Most bins a per-bin count array may have (80 MB of int64). Burstiness over more bins (a trace
#: whose span is huge next to the bin width, e.g. one epoch-millisecond row among zero-based ones)
#: is computed from the non-empty bins alone; :func:`arrival_rate` refuses.
MAX_DENSE_BINS = 10_000_000


def burstiness(trace: Trace, bin_s: Sequence[float] = DEFAULT_BIN_S) -> pd.DataFrame:
    """Peak vs mean arrival rate at several bin widths.

    Bins are ``[k * bin_s, (k + 1) * bin_s)`` from the first arrival's bin to the last one's; empty
    bins count. Works without prefix info. For a grouped trace the windows are measured separately
    and the table has one row per (window, bin).

    Returns
    -------
    pandas.DataFrame
        Columns ``trace``, ``bin_s``, ``requests``, ``bins``, ``mean_rps``, ``peak_rps``,
        ``peak_to_mean``, ``cv`` (std / mean of per-bin counts), ``zero_bins_frac``.

    Raises
    ------
    ConfigError
        Non-positive bin width.
    """
    if trace.group_column is not None:
        return pd.concat([burstiness(g, bin_s) for g in trace.groups()], ignore_index=True)
    rows = []
    t = trace.arrival_s
    for b in bin_s:
        if not b > 0:
            raise ConfigError(f"bin_s = {b!r}: must be a positive number of seconds")
        k = np.floor(t / b).astype(np.int64)
        span_bins = int(k.max() - k.min()) + 1 if len(k) else 1
        if span_bins <= MAX_DENSE_BINS:
            counts = arrival_rate(trace, b)["requests"].to_numpy()
            if not len(counts):
                counts = np.zeros(1, np.int64)
            mean_c, peak_c = counts.mean(), counts.max()
            cv = float(counts.std() / mean_c) if mean_c > 0 else math.nan
            zero = float(np.mean(counts == 0))
        else:  # a huge span (e.g. one epoch-time row): the same figures from non-empty bins only
            _, nz = np.unique(k, return_counts=True)
            mean_c, peak_c = len(k) / span_bins, nz.max()
            var = max(float(np.sum(nz.astype(np.float64) ** 2)) / span_bins - mean_c ** 2, 0.0)
            cv = math.sqrt(var) / mean_c
            zero = 1.0 - len(nz) / span_bins
        mean = mean_c / b
        peak = peak_c / b
        rows.append({"trace": trace.name, "bin_s": float(b), "requests": int(len(t)),
                     "bins": int(span_bins), "mean_rps": float(mean), "peak_rps": float(peak),
                     "peak_to_mean": float(peak / mean) if mean > 0 else math.nan,
                     "cv": cv, "zero_bins_frac": zero})
    return pd.DataFrame(rows)


def trace_summary(trace: Trace) -> dict:
    """Headline facts about a trace (rows, span, timestamp quantisation, shared first block).

    Returns
    -------
    dict
        ``trace``, ``rows``, ``span_s``, ``distinct_arrivals``, ``max_same_arrival`` (requests
        sharing one timestamp), ``median_gap_s`` (median positive gap between distinct arrivals),
        ``block_tokens``, ``has_prefix_info``, ``mean_input_tokens``, ``first_block_shared_frac``
        (fraction of requests whose first block id is the most common first id; None without prefix
        info), ``memory_bytes_per_row``.
    """
    t = trace.arrival_s
    uniq, counts = np.unique(t, return_counts=True)
    gaps = np.diff(uniq)
    shared = None
    if trace.has_prefix_info:
        nb = trace.n_blocks
        first = trace.hash_flat[trace.hash_offsets[:-1][nb > 0]]
        if len(first):
            _, c = np.unique(first, return_counts=True)
            shared = float(c.max() / len(trace))
    return {"trace": trace.name, "rows": len(trace), "span_s": trace.duration_s,
            "distinct_arrivals": int(len(uniq)), "max_same_arrival": int(counts.max()) if len(t) else 0,
            "median_gap_s": float(np.median(gaps)) if len(gaps) else math.nan,
            "block_tokens": trace.block_tokens, "has_prefix_info": trace.has_prefix_info,
            "mean_input_tokens": float(trace.input_length.mean()) if len(t) else math.nan,
            "first_block_shared_frac": shared,
            "memory_bytes_per_row": trace.memory_bytes() / max(1, len(trace))}


__all__ = ["DEFAULT_BIN_S", "DEFAULT_DEPTH_TOKENS", "DEFAULT_WINDOW_S", "FANOUT_COLUMNS",
           "FanoutResult", "burstiness", "extension_arrival_s", "fanout", "fanout_table",
           "trace_summary"]


def arrival_rate(trace: Trace, bin_s: float = 10.0) -> pd.DataFrame:
    """Requests per second in consecutive ``bin_s`` bins (for plotting arrivals over time).

    Returns
    -------
    pandas.DataFrame
        Columns ``trace``, ``t_s`` (bin start, seconds on the trace clock), ``requests``, ``rps``.
        Empty bins between the first and last arrival are included.

    Raises
    ------
    ConfigError
        Non-positive bin width, or more than :data:`MAX_DENSE_BINS` bins.
    """
    if not bin_s > 0:
        raise ConfigError(f"bin_s = {bin_s!r}: must be a positive number of seconds")
    t = trace.arrival_s
    k = np.floor(t / bin_s).astype(np.int64)
    if len(k) and int(k.max() - k.min()) + 1 > MAX_DENSE_BINS:
        raise ConfigError(f"{trace.name}: {trace.duration_s:.6g} s of arrivals in {bin_s!r}-s bins "
                          f"would be {int(k.max() - k.min()) + 1:,} bins (at most "
                          f"{MAX_DENSE_BINS:,}); use wider bins or a window of the trace")
    counts = np.bincount(k - k.min()) if len(k) else np.zeros(0, np.int64)
    start = (k.min() if len(k) else 0) * bin_s
    return pd.DataFrame({"trace": trace.name, "t_s": start + np.arange(len(counts)) * bin_s,
                         "requests": counts, "rps": counts / bin_s})


__all__ += ["arrival_rate"]


def load_audit_traces(art_path: str | None = None, art_max_rows: int | None = None) -> list[Trace]:
    """The traces notebook 01 audits: every shipped trace, plus ART-Chat when a path/id is given.

    Parameters
    ----------
    art_path : str, optional
        Local ART-Chat parquet/JSONL file or directory, or a Hugging Face dataset id.
    art_max_rows : int, optional
        Keep only the first rows of ART-Chat (2.5 M rows in full).
    """
    from .trace import load_art, load_trace, shipped_traces

    traces = [load_trace(p) for p in shipped_traces().values()]
    if art_path:
        traces.insert(2, load_art(art_path, max_rows=art_max_rows))
    return traces


def fanout_pivot(fanout: pd.DataFrame) -> pd.DataFrame:
    """Wide view of :func:`fanout_table`: rows (trace, exclude_sessions), columns (window, depth).

    Cells hold ``max_fanout`` (``<NA>`` where the trace has no prefix info).
    """
    wide = fanout.pivot_table(index=["trace", "exclude_sessions"],
                              columns=["window_s", "depth_tokens"], values="max_fanout",
                              aggfunc="first", dropna=False, sort=False)
    wide.columns = [f"{w:g} s / {d:,} tok" for w, d in wide.columns]
    return wide.astype("Int64")


__all__ += ["fanout_pivot", "load_audit_traces"]
