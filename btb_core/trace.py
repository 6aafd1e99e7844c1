"""The normalised trace table, its loaders, validation and windows.

Every source (Mooncake JSONL, ART-Chat rows, Bursted datasets, Azure CSV) loads into one
:class:`Trace`: a pandas table with the columns of DESIGN.md section 2 plus the trace's
``block_tokens``. Prefix hash ids are *interned* (renumbered to compact ``int32`` in order of first
appearance) and *chained* (equal id means equal whole prefix), and are stored once in a flat array
(``hash_flat`` + ``hash_offsets``); the table's ``hash_ids`` column holds numpy views into it.

Chaining rule (DESIGN.md section 2): after loading, an id identifies one whole prefix of blocks, so
"the first K blocks of requests a and b are equal" is exactly ``hash_ids_a[K-1] == hash_ids_b[K-1]``
and one id never appears at two different positions. Sources whose ids are already chained (Mooncake,
ART-Chat) keep their structure; other sources are re-chained by interning the running prefix
``(id of the prefix so far, raw id of this block)``.

Timestamps
----------
* Mooncake ``timestamp`` is integer milliseconds since the trace start (Mooncake
  ``FAST25-release/README.md``); ``arrival_s = timestamp / 1000`` with no re-basing, so the first
  arrival keeps its own value (0.0 for both shipped traces).
* ART-Chat ``timestamp_ms`` is milliseconds from the trace start (first row 0 on the Hugging Face
  viewer of ``alessiotoniolo/ART-Chat-2.5M``); same rule.
* Azure 2023 ``TIMESTAMP`` is a wall-clock datetime; ``arrival_s`` is seconds since the first row.
* Bursted rows already carry ``arrival_s``; kept as written.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from .errors import TraceError
from .manifest import listed_files, read_manifest, verify_files, verify_rows

#: Tokens per hash block in the Mooncake FAST'25 traces (``FAST25-release/README.md``; verified:
#: ``len(hash_ids) == ceil(input_length / 512)`` on 100% of rows of both shipped files).
MOONCAKE_BLOCK_TOKENS = 512
#: Tokens per hash block in ART-Chat-2.5M (Hugging Face ``alessiotoniolo/ART-Chat-2.5M`` card).
ART_BLOCK_TOKENS = 256
#: Placeholder block size for traces without prefix info (Azure); no analysis uses it.
AZURE_BLOCK_TOKENS = 512

#: Required columns of a trace table, in order.
CORE_COLUMNS = ("request_id", "arrival_s", "input_length", "output_length", "hash_ids")
#: Optional columns, in canonical order after the core ones (kept as given).
OPTIONAL_COLUMNS = ("session_id", "turn", "group_id", "source", "trace_id", "split", "metadata")

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


#: Largest arrival time a trace may hold, seconds: beyond 2^32 s (136 years) the spacing of float64
#: values exceeds 1 microsecond, so simulated waits and TTFTs would round (at 1e16 s a TTFT comes out
#: exactly 0). Such traces are refused rather than silently re-based: every loader already measures
#: arrivals from the trace's own start or from a small offset.
MAX_ARRIVAL_S = float(2 ** 32)
#: Largest input/output length a row may hold (2^40 tokens: far beyond any context window, and
#: small enough that tokens x KV bytes per token stays inside int64).
MAX_TOKENS = 2 ** 40


class TraceWarning(UserWarning):
    """A recoverable trace problem (e.g. unsorted arrivals that were sorted)."""


# --------------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Trace:
    """A request trace: one row per request, arrivals sorted, prefix ids interned and chained.

    Attributes
    ----------
    table : pandas.DataFrame
        ``n`` rows; columns in order ``request_id`` (int64), ``arrival_s`` (float64, seconds from
        the trace start, ascending; for a grouped trace ascending within each group),
        ``input_length`` (int64, tokens), ``output_length`` (int64, tokens), ``hash_ids`` (object:
        each a read-only int32 numpy view into :attr:`hash_flat`), then the optional
        ``session_id``, ``turn`` (see :mod:`btb_core.sessions`), ``group_id``, ``source``,
        ``trace_id``, ``split``, ``metadata`` and any extra source columns, kept as given.
    block_tokens : int
        Tokens per hash block (Mooncake 512, ART-Chat 256).
    name : str
        Short label, e.g. the file stem.
    has_prefix_info : bool
        False for sources without hash ids (Azure): ``hash_ids`` are then empty arrays.
    hash_flat : numpy.ndarray
        int32, shape (sum of row lengths,): every row's chained ids concatenated.
    hash_offsets : numpy.ndarray
        int64, shape (n + 1,): row ``i``'s ids are ``hash_flat[hash_offsets[i]:hash_offsets[i+1]]``.
    group_column : str or None
        None for an ordinary trace (arrivals sorted globally). A Bursted split holds many windows
        whose clocks each start near 0; it is then grouped by ``trace_id`` (rows of one window are
        contiguous and sorted within it). Split it with :meth:`groups` before replaying or slicing.

    Raises
    ------
    TraceError
        If the arrays are inconsistent (lengths, dtypes, offsets).
    """

    table: pd.DataFrame
    block_tokens: int
    name: str
    has_prefix_info: bool
    hash_flat: np.ndarray
    hash_offsets: np.ndarray
    group_column: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.block_tokens, bool) or not isinstance(self.block_tokens, (int, np.integer)) \
                or self.block_tokens <= 0:
            raise TraceError(f"{self.name}: block_tokens = {self.block_tokens!r}: must be a positive int")
        if list(self.table.columns[:5]) != list(CORE_COLUMNS):
            raise TraceError(f"{self.name}: table columns {list(self.table.columns)!r} must start with "
                             f"{list(CORE_COLUMNS)!r}")
        n = len(self.table)
        if self.hash_offsets.shape != (n + 1,) or self.hash_offsets.dtype != np.int64:
            raise TraceError(f"{self.name}: hash_offsets must be int64 of shape ({n + 1},), got "
                             f"{self.hash_offsets.dtype} {self.hash_offsets.shape}")
        if self.hash_flat.dtype != np.int32 or self.hash_flat.ndim != 1:
            raise TraceError(f"{self.name}: hash_flat must be a 1-D int32 array, got "
                             f"{self.hash_flat.dtype} with shape {self.hash_flat.shape}")
        if n and (self.hash_offsets[0] != 0 or self.hash_offsets[-1] != len(self.hash_flat)):
            raise TraceError(f"{self.name}: hash_offsets must run from 0 to len(hash_flat) = "
                             f"{len(self.hash_flat)}")
        if self.group_column is not None and self.group_column not in self.table.columns:
            raise TraceError(f"{self.name}: group_column = {self.group_column!r} is not a column")

    # ---- basics ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        span = self.duration_s if len(self) else 0.0
        return (f"Trace({self.name!r}, rows={len(self)}, block_tokens={self.block_tokens}, "
                f"span_s={span:.1f}, prefix_info={self.has_prefix_info})")

    @property
    def arrival_s(self) -> np.ndarray:
        """float64 array of arrivals in seconds, shape (n,)."""
        return self.table["arrival_s"].to_numpy()

    @property
    def input_length(self) -> np.ndarray:
        """int64 array of prompt lengths in tokens, shape (n,)."""
        return self.table["input_length"].to_numpy()

    @property
    def output_length(self) -> np.ndarray:
        """int64 array of generated lengths in tokens, shape (n,)."""
        return self.table["output_length"].to_numpy()

    @property
    def n_blocks(self) -> np.ndarray:
        """int64 array, shape (n,): hash ids per row (``ceil(input_length / block_tokens)``)."""
        return np.diff(self.hash_offsets)

    @property
    def full_blocks(self) -> np.ndarray:
        """int64 array, shape (n,): complete blocks per row (``input_length // block_tokens``)."""
        return self.input_length // self.block_tokens

    @property
    def duration_s(self) -> float:
        """Last minus first arrival, seconds (0 for fewer than 2 rows)."""
        t = self.arrival_s
        return float(t.max() - t.min()) if len(t) else 0.0

    def row_hash_ids(self, i: int) -> np.ndarray:
        """Chained ids of row ``i`` (int32 view, shape (n_blocks_i,))."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"{self.name}: row {i} out of range for {n} rows")
        i %= n
        return self.hash_flat[self.hash_offsets[i]:self.hash_offsets[i + 1]]

    def memory_bytes(self) -> int:
        """Approximate resident bytes: table (deep, views counted by header) + flat id array."""
        table = int(self.table.drop(columns=["hash_ids"]).memory_usage(deep=True).sum())
        views = len(self) * (8 + _VIEW_HEADER_BYTES)  # object pointer + ndarray header per row
        return table + views + self.hash_flat.nbytes + self.hash_offsets.nbytes

    def require_prefix_info(self, what: str) -> None:
        """Raise :class:`TraceError` if this trace has no prefix hash ids.

        Parameters
        ----------
        what : str
            The analysis that needs them, e.g. ``"deep-prefix fan-out"``.
        """
        if not self.has_prefix_info:
            raise TraceError(f"{self.name}: {what} needs prefix hash ids; this trace (Azure CSV) "
                             f"has none")

    # ---- slicing --------------------------------------------------------------------------
    def _take(self, start: int, stop: int, name: str, rebase_s: float | None = None,
              group_column: str | None = None) -> Trace:
        start = max(0, min(start, len(self)))
        stop = max(start, min(stop, len(self)))
        table = self.table.iloc[start:stop].reset_index(drop=True)
        lo, hi = int(self.hash_offsets[start]), int(self.hash_offsets[stop])
        flat = self.hash_flat[lo:hi]
        offsets = self.hash_offsets[start:stop + 1] - lo
        if rebase_s is not None and rebase_s != 0.0:
            table["arrival_s"] = table["arrival_s"].to_numpy() - rebase_s
        return Trace(table, self.block_tokens, name, self.has_prefix_info, flat, offsets,
                     group_column)

    def _require_ungrouped(self, what: str) -> None:
        if self.group_column is not None:
            raise TraceError(f"{self.name}: {what} needs one time line, but this trace holds "
                             f"several windows ({self.group_column!r}); split it with .groups() first")

    def window(self, start_s: float | None = None, end_s: float | None = None, *,
               rebase: bool = False) -> Trace:
        """Rows with ``start_s <= arrival_s < end_s`` (either bound may be None = open).

        Parameters
        ----------
        start_s, end_s : float or None
            Window bounds in seconds on the trace's own clock.
        rebase : bool
            If True, subtract ``start_s`` (or the window's first arrival when ``start_s`` is None)
            from ``arrival_s``; by default arrivals keep their trace-clock values.

        Raises
        ------
        TraceError
            For a grouped trace (see :attr:`group_column`) or ``end_s < start_s``.
        """
        self._require_ungrouped("window()")
        if start_s is not None and end_s is not None and end_s < start_s:
            raise TraceError(f"{self.name}: window end_s = {end_s} is before start_s = {start_s}")
        t = self.arrival_s
        a = 0 if start_s is None else int(np.searchsorted(t, start_s, "left"))
        b = len(t) if end_s is None else int(np.searchsorted(t, end_s, "left"))
        shift = None
        if rebase:
            shift = start_s if start_s is not None else (float(t[a]) if b > a else 0.0)
        label = f"{self.name}[{_fmt(start_s)}:{_fmt(end_s)}s]"
        return self._take(a, b, label, shift)

    def rows(self, start: int, stop: int) -> Trace:
        """Rows ``start:stop`` by position (Python slice semantics for non-negative bounds)."""
        if start < 0 or stop < 0:
            raise TraceError(f"{self.name}: rows({start}, {stop}): bounds must be >= 0")
        keep_group = self.group_column
        return self._take(start, stop, f"{self.name}[rows {start}:{stop}]", None, keep_group)

    def windows(self, span_s: float | None = None, rows: int | None = None, *,
                rebase: bool = False) -> list[Trace]:
        """Cut the trace into consecutive windows by time span or row count (give exactly one).

        By time: windows ``[k * span_s, (k + 1) * span_s)`` on the trace clock, from the window
        holding the first arrival to the one holding the last; empty windows are dropped. By rows:
        consecutive blocks of ``rows`` rows (the last may be shorter).

        Raises
        ------
        TraceError
            If neither or both of ``span_s`` and ``rows`` are given, or either is not positive.
        """
        if (span_s is None) == (rows is None):
            raise TraceError(f"{self.name}: windows() needs exactly one of span_s= or rows=")
        if rows is not None:
            if int(rows) <= 0:
                raise TraceError(f"{self.name}: windows(rows={rows}): must be > 0")
            rows = int(rows)
            return [self._take(a, a + rows, f"{self.name}[{k}]", None, self.group_column)
                    for k, a in enumerate(range(0, len(self), rows))]
        self._require_ungrouped("windows(span_s=...)")
        if not span_s > 0 or not math.isfinite(span_s):
            raise TraceError(f"{self.name}: windows(span_s={span_s}): must be a positive number")
        if not len(self):
            return []
        t = self.arrival_s
        k = np.floor(t / span_s).astype(np.int64)
        cuts = np.flatnonzero(np.diff(k)) + 1
        starts = np.concatenate([[0], cuts])
        stops = np.concatenate([cuts, [len(t)]])
        out = []
        for j, (a, b) in enumerate(zip(starts, stops)):
            w0 = float(k[a] * span_s)
            out.append(self._take(int(a), int(b), f"{self.name}[{j}]", w0 if rebase else None))
        return out

    def groups(self, column: str | None = None) -> list[Trace]:
        """Split by the values of ``column`` (default :attr:`group_column`), in first-appearance order.

        Each part is an ordinary (ungrouped) trace named ``"<name>/<value>"``; rows of a value must be
        contiguous.
        """
        column = column or self.group_column
        if column is None or column not in self.table.columns:
            raise TraceError(f"{self.name}: groups() needs a column to split by, got {column!r}")
        codes, uniques = pd.factorize(self.table[column], use_na_sentinel=False)
        if len(codes) and np.any(np.diff(codes) < 0):
            i = int(np.flatnonzero(np.diff(codes) < 0)[0]) + 1
            raise TraceError(f"{self.name}: rows of {column!r} are not contiguous (row {i} returns "
                             f"to {_show(self.table[column].iloc[i])} after other values)")
        bounds = np.flatnonzero(np.diff(codes)) + 1
        starts = np.concatenate([[0], bounds]).astype(int)
        stops = np.concatenate([bounds, [len(codes)]]).astype(int)
        return [self._take(a, b, f"{self.name}/{v}") for v, a, b in zip(uniques, starts, stops)]


_VIEW_HEADER_BYTES = 112  # sys.getsizeof of a 1-D numpy view (numpy 1.26/2.x, 64-bit)


def _label(text: str) -> str:
    """A trace name from a file name: undecodable bytes (non-UTF-8 file names) escaped, so the
    name can be stored in tables and parquet (``\\xff`` for byte 0xff)."""
    return str(text).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _show(v: Any) -> str:
    """repr of a value for error messages (numpy scalars shown as plain Python numbers)."""
    return repr(v.item() if isinstance(v, np.generic) else v)


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:g}"


# --------------------------------------------------------------------------------------------
# construction: validation, interning, chaining
# --------------------------------------------------------------------------------------------


class _Where:
    """Names a row in error messages: ``file, line N`` or ``name, row N``."""

    def __init__(self, origin: str, lines: Sequence[int] | np.ndarray | None, unit: str = "line"):
        self.origin = origin
        self.lines = lines
        self.unit = unit

    def __call__(self, i: int) -> str:
        if self.lines is None:
            return f"{self.origin}, row {int(i)}"
        return f"{self.origin}, {self.unit} {int(self.lines[i])}"


def _numeric(values: Any, field: str, where: _Where, rule: str) -> np.ndarray:
    """Numeric array from ``values``; non-numbers (strings, bools, None, lists) raise TraceError."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        return values
    if isinstance(values, pd.Series) and values.dtype.kind in "iuf":
        return values.to_numpy()
    items = list(values)
    for i, v in enumerate(items):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TraceError(f"{where(i)}: field {field!r} = {_show(v)}: {rule}")
    as_float = any(isinstance(v, (float, np.floating)) for v in items)
    try:
        return np.asarray(items, dtype=np.float64 if as_float else np.int64)
    except OverflowError:  # an int beyond 64 bits (or beyond float64 when mixed with floats)
        for i, v in enumerate(items):
            if isinstance(v, int) and not -2 ** 63 <= v < 2 ** 63:
                raise TraceError(f"{where(i)}: field {field!r} = {v}: beyond the 64-bit integer "
                                 f"range") from None
        raise TraceError(f"{where.origin}: field {field!r}: a value is out of range") from None


def _int_column(values: Any, field: str, where: _Where) -> np.ndarray:
    """Validate non-negative integer lengths (at most :data:`MAX_TOKENS`); returns int64 array."""
    arr = _numeric(values, field, where, "must be a non-negative integer")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr < 0) | (arr != np.floor(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TraceError(f"{where(i)}: field {field!r} = {_show(arr[i])}: must be a non-negative integer")
    if arr.dtype.kind in "iuf":
        if (arr < 0).any():
            i = int(np.flatnonzero(arr < 0)[0])
            raise TraceError(f"{where(i)}: field {field!r} = {_show(arr[i])}: must be a non-negative integer")
        if (arr > MAX_TOKENS).any():
            i = int(np.flatnonzero(arr > MAX_TOKENS)[0])
            raise TraceError(f"{where(i)}: field {field!r} = {_show(arr[i])}: more than 2^40 tokens "
                             f"(not a request length)")
        return arr.astype(np.int64)
    raise TraceError(f"{where.origin}: field {field!r} has dtype {arr.dtype}: must be integers")


def _time_column(values: Any, field: str, where: _Where, max_s: float | None = None) -> np.ndarray:
    arr = _numeric(values, field, where, "must be a number").astype(np.float64)
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"{where(i)}: field {field!r} = {_show(arr[i])}: must be finite and >= 0")
    if max_s is not None and len(arr) and arr.max() >= max_s:
        i = int(np.flatnonzero(arr >= max_s)[0])
        raise TraceError(f"{where(i)}: arrival {_show(arr[i])} s is 2^32 s (136 years) or more from "
                         f"the clock's zero, where float64 seconds lose microsecond precision "
                         f"(times would round and waits come out 0); re-base the trace's clock "
                         f"(e.g. subtract its first timestamp) or check the time unit")
    return arr


def _intern_chained(raw_flat: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, bool]:
    """Intern raw block ids into compact chained int32 ids, first-appearance order.

    Parameters
    ----------
    raw_flat : numpy.ndarray
        Shape (m,), any hashable dtype: every row's raw ids concatenated.
    offsets : numpy.ndarray
        int64, shape (n + 1,).

    Returns
    -------
    ids : numpy.ndarray
        int32, shape (m,): equal id <=> equal whole prefix up to and including that block.
    rechained : bool
        True if the raw ids were not chained (an id followed different prefixes) and were re-chained.
    """
    m = len(raw_flat)
    if m == 0:
        return np.zeros(0, np.int32), False
    if m >= np.iinfo(np.int32).max:
        raise TraceError(f"{m} block ids do not fit int32 interning")
    codes, uniques = pd.factorize(raw_flat)
    codes = codes.astype(np.int64)
    n_codes = len(uniques)
    lengths = np.diff(offsets)
    starts = np.zeros(m, bool)
    starts[offsets[:-1][lengths > 0]] = True
    parent = np.empty(m, np.int64)
    parent[0] = -1
    parent[1:] = codes[:-1]
    parent[starts] = -1
    pair = (parent + 1) * (n_codes + 1) + codes
    if len(pd.unique(pair)) == n_codes:  # every raw id has exactly one parent: already chained
        return codes.astype(np.int32), False
    # Re-chain level by level: node = intern(parent node, raw code).
    pos = np.arange(m, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    order = np.argsort(pos, kind="stable")
    level_bounds = np.searchsorted(pos[order], np.arange(int(pos.max()) + 2), "left")
    node = np.empty(m, np.int64)
    next_node = 0
    for p in range(len(level_bounds) - 1):
        idx = order[level_bounds[p]:level_bounds[p + 1]]
        par = np.where(pos[idx] == 0, -1, node[np.maximum(idx - 1, 0)])
        key = (par + 1) * (n_codes + 1) + codes[idx]
        local, _ = pd.factorize(key)
        node[idx] = local + next_node
        next_node += int(local.max()) + 1
    ids, _ = pd.factorize(node)
    return ids.astype(np.int32), True


def _flatten_hash_ids(hash_ids: Any, n: int, where: _Where) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate per-row id lists; returns (raw_flat, offsets int64 (n+1,))."""
    if hash_ids is None:
        return np.zeros(0, np.int64), np.zeros(n + 1, np.int64)
    if len(hash_ids) != n:
        raise TraceError(f"{where.origin}: hash_ids has {len(hash_ids)} rows, expected {n}")
    lengths = np.empty(n, np.int64)
    parts = []
    for i, h in enumerate(hash_ids):
        if h is None or isinstance(h, (str, bytes, dict)) or not hasattr(h, "__len__"):
            raise TraceError(f"{where(i)}: field 'hash_ids' = {h!r}: must be a list of ids")
        lengths[i] = len(h)
        if len(h):
            kind = np.asarray(h).dtype.kind
            if kind in "iu" and isinstance(h, list) and any(x.__class__ is bool for x in h):
                x = next(x for x in h if x.__class__ is bool)  # [1, true] reads as ints [1, 1]
                raise TraceError(f"{where(i)}: field 'hash_ids' has element {_show(x)}: ids must be "
                                 f"ints or strings")
            # ints pass as they are; anything else is checked element by element, so a float or
            # null hidden among strings (which numpy would turn into text) is caught on its own row
            if kind not in "iu" and not (kind in "US" and not isinstance(h, list)):
                for x in h:
                    if (isinstance(x, (bool, np.bool_, float, np.floating)) or x is None
                            or isinstance(x, (list, dict))):
                        raise TraceError(f"{where(i)}: field 'hash_ids' has element {_show(x)}: ids "
                                         f"must be ints or strings")
        parts.append(h)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] == 0:
        return np.zeros(0, np.int64), offsets
    try:
        flat = np.concatenate([np.asarray(p) for p in parts if len(p)])
    except ValueError:
        flat = np.asarray([x for p in parts for x in p], dtype=object)
    if flat.dtype.kind == "f" or flat.dtype == object:
        for j, x in enumerate(flat):
            if isinstance(x, (bool, np.bool_, float, np.floating)) or x is None or isinstance(x, (list, dict)):
                i = int(np.searchsorted(offsets, j, "right") - 1)
                raise TraceError(f"{where(i)}: field 'hash_ids' has element {_show(x)}: ids must be ints "
                                 f"or strings")
    return flat, offsets


def make_trace(arrival_s: Any, input_length: Any, output_length: Any, hash_ids: Any, *,
               block_tokens: int, name: str = "trace", request_id: Any = None,
               strict: bool = False, has_prefix_info: bool | None = None,
               origin: str | None = None, line_numbers: Sequence[int] | None = None,
               check_block_count: bool = True, group_column: str | None = None,
               **optional_columns: Any) -> Trace:
    """Build a validated :class:`Trace` from per-row sequences.

    Parameters
    ----------
    arrival_s : sequence of float, shape (n,)
        Seconds from the trace start; finite and >= 0.
    input_length, output_length : sequence of int, shape (n,)
        Tokens; non-negative integers (integral floats accepted).
    hash_ids : sequence of sequences, or None
        Per row, one id per ``block_tokens`` block of the prompt (ints or strings, any
        numbering). None = no prefix info (every row gets an empty id array).
    block_tokens : int
        Tokens per block; ``len(hash_ids[i]) == ceil(input_length[i] / block_tokens)`` is checked.
    name : str
        Trace label.
    request_id : sequence of int, optional
        Defaults to ``0..n-1`` in the given (pre-sort) order.
    strict : bool
        Unsorted arrivals raise :class:`TraceError` instead of being stably sorted with a
        :class:`TraceWarning`.
    has_prefix_info : bool, optional
        Defaults to ``hash_ids is not None``.
    origin, line_numbers : optional
        File name and per-row line numbers used in error messages (default ``name`` and row index).
    check_block_count : bool
        Check ``len(hash_ids)`` against ``ceil(input_length / block_tokens)``.
    group_column : str, optional
        Sort check within contiguous groups of this column instead of globally (Bursted splits).
    **optional_columns : sequence, shape (n,)
        ``session_id``, ``group_id``, ``source``, ``trace_id``, ``split``, ``metadata`` (or any
        extra column), kept as given.

    Returns
    -------
    Trace

    Raises
    ------
    TraceError
        Empty input; mismatched column lengths; negative, NaN or non-integer length; NaN or negative
        arrival; non-list hash ids; ``len(hash_ids)`` inconsistent with the block size; unsorted
        arrivals with ``strict=True``. Messages name the file/row (or line), field and value.
    """
    where = _Where(origin or name, line_numbers)
    n = len(arrival_s)
    if n == 0:
        raise TraceError(f"{origin or name}: empty trace (no requests)")
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, (int, np.integer)) or block_tokens <= 0:
        raise TraceError(f"{origin or name}: block_tokens = {block_tokens!r}: must be a positive int")
    for fname, col in (("input_length", input_length), ("output_length", output_length)):
        if len(col) != n:
            raise TraceError(f"{origin or name}: field {fname!r} has {len(col)} rows, arrival_s has {n}")
    t = _time_column(arrival_s, "arrival_s", where, max_s=MAX_ARRIVAL_S)
    inp = _int_column(input_length, "input_length", where)
    out = _int_column(output_length, "output_length", where)
    raw_flat, offsets = _flatten_hash_ids(hash_ids, n, where)
    if has_prefix_info is None:
        has_prefix_info = hash_ids is not None
    if has_prefix_info and check_block_count:
        expected = -(-inp // block_tokens)
        got = np.diff(offsets)
        bad = got != expected
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TraceError(f"{where(i)}: field 'hash_ids' has {int(got[i])} ids but input_length = "
                             f"{int(inp[i])} needs ceil({int(inp[i])} / {block_tokens}) = "
                             f"{int(expected[i])} blocks")
    if request_id is None:
        rid = np.arange(n, dtype=np.int64)
    else:
        if len(request_id) != n:
            raise TraceError(f"{origin or name}: request_id has {len(request_id)} rows, expected {n}")
        rid = _int_column(request_id, "request_id", where)
    extras = {}
    for col, vals in optional_columns.items():
        if vals is None:
            continue
        if len(vals) != n:
            raise TraceError(f"{origin or name}: column {col!r} has {len(vals)} rows, expected {n}")
        extras[col] = vals

    # Sortedness (globally, or within contiguous groups).
    if group_column is not None:
        if group_column not in extras:
            raise TraceError(f"{origin or name}: group_column {group_column!r} not given")
        gcodes, _ = pd.factorize(pd.Series(extras[group_column]), use_na_sentinel=False)
        same_group = np.diff(gcodes) == 0
        unsorted = np.flatnonzero(same_group & (np.diff(t) < 0))
        order_key = (gcodes, t)
    else:
        unsorted = np.flatnonzero(np.diff(t) < 0)
        order_key = (t,)
    order = None
    if len(unsorted):
        i = int(unsorted[0]) + 1
        msg = (f"{where(i)}: field 'arrival_s' = {_show(t[i])} is earlier than the previous row's "
               f"{_show(t[i - 1])}: arrivals are not sorted")
        if strict:
            raise TraceError(msg)
        warnings.warn(msg + f"; sorted {n} rows by arrival (stable)", TraceWarning, stacklevel=2)
        order = np.lexsort(order_key[::-1]) if len(order_key) > 1 else np.argsort(t, kind="stable")

    if order is not None:
        t, inp, out, rid = t[order], inp[order], out[order], rid[order]
        lengths = np.diff(offsets)[order]
        if len(raw_flat):
            src = np.concatenate([np.arange(offsets[j], offsets[j + 1]) for j in order])
            raw_flat = raw_flat[src]
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        extras = {k: _take_seq(v, order) for k, v in extras.items()}

    ids, _ = _intern_chained(raw_flat, offsets)
    ids.flags.writeable = False
    views = np.empty(n, dtype=object)
    for i in range(n):
        views[i] = ids[offsets[i]:offsets[i + 1]]
    data: dict[str, Any] = {"request_id": rid, "arrival_s": t, "input_length": inp,
                            "output_length": out, "hash_ids": views}
    for col in OPTIONAL_COLUMNS:
        if col in extras:
            data[col] = _as_column(extras.pop(col))
    for col, vals in extras.items():
        data[col] = _as_column(vals)
    table = pd.DataFrame(data)
    return Trace(table, int(block_tokens), name, bool(has_prefix_info), ids, offsets, group_column)


def _take_seq(vals: Any, order: np.ndarray) -> Any:
    if isinstance(vals, pd.Series):
        return vals.iloc[order].reset_index(drop=True)
    arr = np.empty(len(vals), dtype=object) if not isinstance(vals, np.ndarray) else vals
    if not isinstance(vals, np.ndarray):
        arr[:] = list(vals)
    return arr[order]


def _as_column(vals: Any) -> Any:
    if isinstance(vals, pd.Series):
        return vals.reset_index(drop=True).to_numpy()
    if isinstance(vals, np.ndarray):
        return vals
    arr = np.empty(len(vals), dtype=object)
    arr[:] = list(vals)
    try:  # plain scalars -> a typed column
        typed = pd.array(list(vals))
        if typed.dtype != object and not isinstance(typed.dtype, pd.StringDtype):
            return typed
    except (TypeError, ValueError):
        pass
    return arr


def from_table(table: pd.DataFrame, *, block_tokens: int, name: str = "trace", strict: bool = False,
               origin: str | None = None, group_column: str | None = None,
               has_prefix_info: bool | None = None) -> Trace:
    """Build a :class:`Trace` from a DataFrame holding the trace-table columns.

    ``hash_ids`` may be missing (no prefix info); any other columns are kept as extra columns.
    Error messages name ``origin`` and the 0-based row.
    """
    missing = [c for c in ("arrival_s", "input_length", "output_length") if c not in table.columns]
    if missing:
        raise TraceError(f"{origin or name}: missing field {missing[0]!r} (columns: "
                         f"{list(table.columns)})")
    extra = {c: table[c].to_numpy() for c in table.columns if c not in CORE_COLUMNS}
    rid = table["request_id"].to_numpy() if "request_id" in table.columns else None
    hids = table["hash_ids"].to_numpy() if "hash_ids" in table.columns else None
    return make_trace(table["arrival_s"].to_numpy(), table["input_length"].to_numpy(),
                      table["output_length"].to_numpy(), hids, block_tokens=block_tokens, name=name,
                      request_id=rid, strict=strict, origin=origin, group_column=group_column,
                      has_prefix_info=has_prefix_info, **extra)


# --------------------------------------------------------------------------------------------
# loaders
# --------------------------------------------------------------------------------------------


def _decode_line(raw: bytes, path: Path, lineno: int) -> str:
    """One line of a text trace as str; TraceError naming file, line and byte if it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}, line {lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                         f"column {exc.start + 1}); is this a JSONL trace?") from None


def _read_jsonl(path: Path, required: Iterable[str]) -> tuple[list[dict], list[int]]:
    """Parse a JSONL file; returns (records, 1-based line numbers). Blank lines are skipped."""
    required = tuple(required)
    records, lines = [], []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = _decode_line(raw, path, lineno)
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                snippet = line.strip()[:60]
                raise TraceError(f"{path}, line {lineno}: malformed JSON ({exc.msg} at column "
                                 f"{exc.colno}): {snippet!r}") from None
            if not isinstance(rec, dict):
                raise TraceError(f"{path}, line {lineno}: expected a JSON object, got {type(rec).__name__}")
            for field in required:
                if field not in rec:
                    raise TraceError(f"{path}, line {lineno}: missing field {field!r} (has "
                                     f"{sorted(rec)})")
            records.append(rec)
            lines.append(lineno)
    if not records:
        raise TraceError(f"{path}: empty file (no JSON lines)")
    return records, lines


def load_mooncake(path: str | Path, *, block_tokens: int | None = None, strict: bool = False,
                  name: str | None = None) -> Trace:
    """Load a Mooncake FAST'25 JSONL trace.

    Format (``kvcache-ai/Mooncake`` ``FAST25-release/README.md``): one JSON object per line with
    ``timestamp`` (int ms since the trace start), ``input_length``, ``output_length`` (tokens) and
    ``hash_ids`` (chained ids of 512-token blocks). ``arrival_s = timestamp / 1000``, not re-based.

    Parameters
    ----------
    path : path-like
    block_tokens : int, optional
        Default :data:`MOONCAKE_BLOCK_TOKENS` (512).
    strict : bool
        Unsorted timestamps raise instead of being sorted with a warning.
    name : str, optional
        Default: the file stem.

    Raises
    ------
    TraceError
        Malformed JSON line, missing field, bad value (names file, line, field and value); empty file.
    FileNotFoundError
        If ``path`` does not exist.
    """
    path = Path(path)
    records, lines = _read_jsonl(path, ("timestamp", "input_length", "output_length", "hash_ids"))
    ts = [r["timestamp"] for r in records]
    where = _Where(str(path), lines)
    ts_arr = _time_column(ts, "timestamp", where) / 1000.0
    extras = {k: [r.get(k) for r in records] for k in OPTIONAL_COLUMNS
              if any(k in r for r in records[:1])}
    return make_trace(ts_arr, [r["input_length"] for r in records],
                      [r["output_length"] for r in records], [r["hash_ids"] for r in records],
                      block_tokens=block_tokens or MOONCAKE_BLOCK_TOKENS, name=name or _label(path.stem),
                      strict=strict, origin=str(path), line_numbers=lines, **extras)


_ART_FIELDS = ("timestamp_ms", "input_length", "output_length", "hash_ids")
_ART_DROP = ("messages",)  # filler text: large and not needed for routing


def _art_from_frame(df: pd.DataFrame, *, origin: str, name: str, block_tokens: int, strict: bool,
                    line_numbers: Sequence[int] | None, unit: str = "row") -> Trace:
    for field in _ART_FIELDS:
        if field not in df.columns:
            raise TraceError(f"{origin}: missing field {field!r} (columns: {list(df.columns)})")
    where = _Where(origin, line_numbers, unit)
    t = _time_column(df["timestamp_ms"].to_numpy(), "timestamp_ms", where) / 1000.0
    extras: dict[str, Any] = {}
    for col in df.columns:
        if col in _ART_FIELDS or col in _ART_DROP:
            continue
        if col == "request_id":
            extras["source_request_id"] = df[col].to_numpy()
        else:
            extras[col] = df[col].to_numpy()
    return make_trace(t, df["input_length"].to_numpy(), df["output_length"].to_numpy(),
                      list(df["hash_ids"]), block_tokens=block_tokens, name=name, strict=strict,
                      origin=origin, line_numbers=line_numbers, **extras)


def load_art(path_or_id: str | Path, *, block_tokens: int | None = None, strict: bool = False,
             name: str | None = None, split: str = "train", max_rows: int | None = None) -> Trace:
    """Load ART-Chat-2.5M rows: a parquet or JSONL file, a directory of them, or a Hub dataset id.

    Row format (Hugging Face ``alessiotoniolo/ART-Chat-2.5M``): ``request_id`` (string, kept as
    ``source_request_id``; ``request_id`` becomes the 0-based file row), ``timestamp_ms`` (ms from
    the trace start; ``arrival_s = timestamp_ms / 1000``), ``input_length``, ``output_length``,
    ``hash_ids`` (chained 24-hex-digit ids of 256-token blocks), ``token_hash`` (user),
    ``system_prompt_hash`` (both kept), ``messages`` (filler text, dropped).

    Parameters
    ----------
    path_or_id : path-like or str
        Local ``.parquet`` / ``.jsonl`` file or directory of such files (read in name order), or a
        Hub dataset id (``owner/name``), loaded with ``datasets`` (needs the network or a cache).
    block_tokens : int, optional
        Default :data:`ART_BLOCK_TOKENS` (256).
    split : str
        Hub split to load.
    max_rows : int, optional
        Keep only the first ``max_rows`` rows (before the sort check).

    Raises
    ------
    TraceError
        Bad rows (file, line/row, field, value); an id that is neither a local path nor loadable.
    """
    bt = block_tokens or ART_BLOCK_TOKENS
    p = Path(path_or_id)
    if p.is_dir():
        files = sorted([*p.glob("*.parquet"), *p.glob("*.jsonl")])
        if not files:
            raise TraceError(f"{p}: no .parquet or .jsonl files in this directory")
        frames = [_read_art_file(f, max_rows) for f in files]
        df = pd.concat([f for f, _ in frames], ignore_index=True)
        lines = None
        origin = str(p)
    elif p.exists():
        df, lines = _read_art_file(p, max_rows)
        origin = str(p)
    else:
        df = _load_art_hub(str(path_or_id), split, max_rows)
        lines, origin = None, f"hf://{path_or_id}[{split}]"
    if max_rows is not None:
        df = df.iloc[:max_rows]
        lines = None if lines is None else lines[:max_rows]
    unit = "line" if lines is not None and p.suffix == ".jsonl" else "row"
    return _art_from_frame(df, origin=origin, name=name or _label(p.stem or str(path_or_id)), block_tokens=bt,
                           strict=strict, line_numbers=lines, unit=unit)


def _read_art_file(path: Path, max_rows: int | None) -> tuple[pd.DataFrame, list[int] | None]:
    if path.suffix == ".parquet":
        df = _read_parquet(path)
        if df.empty:
            raise TraceError(f"{path}: empty file (no rows)")
        return df, None
    if path.suffix in (".jsonl", ".json"):
        records, lines = _read_jsonl(path, _ART_FIELDS)
        return pd.DataFrame.from_records(records), lines
    raise TraceError(f"{path}: unsupported ART file type {path.suffix!r} (want .parquet or .jsonl)")


def _load_art_hub(dataset_id: str, split: str, max_rows: int | None) -> pd.DataFrame:
    if not looks_like_hub_id(dataset_id):
        raise FileNotFoundError(f"{dataset_id}: no such file, and not a Hugging Face dataset id "
                                f"(owner/name)")
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise TraceError(f"{dataset_id}: loading from the Hub needs `datasets` ({exc})") from None
    import logging

    quiet = [logging.getLogger(n) for n in ("huggingface_hub", "datasets", "fsspec")]
    levels = [q.level for q in quiet]
    for q in quiet:  # retries are reported once, in the error below, not line by line
        q.setLevel(logging.ERROR + 10)
    try:
        if max_rows is not None:  # stream: read only the first rows
            ds = datasets.load_dataset(dataset_id, split=split, streaming=True)
            df = pd.DataFrame.from_records(list(ds.take(max_rows)))
            return df.drop(columns=[c for c in _ART_DROP if c in df.columns])
        ds = datasets.load_dataset(dataset_id, split=split)
        drop = [c for c in _ART_DROP if c in ds.column_names]
        return ds.remove_columns(drop).to_pandas()
    except Exception as exc:  # network, auth, missing dataset
        raise TraceError(f"hf://{dataset_id}: could not load split {split!r} from the Hugging Face "
                         f"Hub ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                         f"pass a local parquet/JSONL path instead (no such local file: "
                         f"{dataset_id})") from None
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)


def _read_parquet(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, columns=columns).to_pandas()
    except Exception as exc:
        raise TraceError(f"{path}: cannot read parquet ({type(exc).__name__}: {exc})") from None


def load_bursted(path: str | Path, split: str | None = None, *, block_tokens: int | None = None,
                 strict: bool = False, name: str | None = None) -> Trace:
    """Load Bursted rows written by the dataset generator (``btb synth``).

    Parameters
    ----------
    path : path-like
        The dataset directory (``manifest.json`` with ``"block_tokens"`` plus one parquet per split,
        e.g. ``train.parquet`` / ``test.parquet`` or ``data/<split>-*.parquet``) or one parquet file
        (block size from its ``block_tokens`` column or the ``manifest.json`` next to it or its parent).
    split : str, optional
        Load only this split from a directory (default: every split, in name order).
    block_tokens : int, optional
        Overrides the manifest.

    Returns
    -------
    Trace
        Columns as written (the trace-table columns plus ``trace_id``, ``source``, ``split``,
        ``metadata``...). When the rows hold several windows (``trace_id``), the trace is grouped by
        ``trace_id`` (see :attr:`Trace.group_column`): arrivals are checked/sorted within each
        window, and :meth:`Trace.groups` yields one trace per window.

    Raises
    ------
    TraceError
        No manifest / block size, unknown split, bad rows (file, row, field, value); in a
        directory ``btb synth`` wrote (``manifest.json`` of format ``btb-bursted``): a parquet file
        the manifest does not list, a split file whose SHA-256 or row count differs from the
        manifest, or rows whose ``split`` is not the file's split.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    if path.is_dir():
        files = sorted(path.rglob("*.parquet"))
        if split is not None:
            files = [f for f in files if f.stem == split or f.stem.startswith(f"{split}-")
                     or f.parent.name == split]
        if not files:
            raise TraceError(f"{path}: no parquet files" + (f" for split {split!r}" if split else ""))
        manifest_dir = path
    else:
        files = [path]
        manifest_dir = path.parent
    root = path if path.is_dir() else path.parent
    manifest = read_manifest(root)
    if manifest is not None:  # a directory `btb synth` wrote: its files must be the ones it wrote
        verify_files(root, manifest, files)
    frames = [_read_parquet(f) for f in files]
    if manifest is not None:
        split_of = {f["path"]: s for s, f in listed_files(manifest).items()}
        for f, frame in zip(files, frames):
            s = split_of.get(f.relative_to(root).as_posix())
            if s is not None:
                verify_rows(root, manifest, f, s, len(frame),
                            pd.unique(frame["split"]) if "split" in frame.columns else None)
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if df.empty:
        raise TraceError(f"{path}: empty file (no rows)")
    if split is not None and "split" in df.columns and path.is_file():
        df = df[df["split"] == split].reset_index(drop=True)
        if df.empty:
            raise TraceError(f"{path}: no rows with split = {split!r}")
    bt = block_tokens or _bursted_block_tokens(df, manifest_dir, path)
    df = df.drop(columns=[c for c in ("block_tokens",) if c in df.columns])
    group = None
    if "trace_id" in df.columns and df["trace_id"].nunique(dropna=False) > 1:
        group = "trace_id"
    label = name or _label(f"{path.name}/{split}" if split and path.is_dir() else path.stem)
    return from_table(df, block_tokens=bt, name=label, strict=strict, origin=str(path),
                      group_column=group)


def _bursted_block_tokens(df: pd.DataFrame, manifest_dir: Path, path: Path) -> int:
    if "block_tokens" in df.columns:
        vals = pd.unique(df["block_tokens"])
        if len(vals) != 1:
            raise TraceError(f"{path}: column 'block_tokens' has several values {list(vals)[:5]}")
        return int(vals[0])
    for d in (manifest_dir, manifest_dir.parent):
        manifest = d / "manifest.json"
        if manifest.exists():
            try:
                data = json.loads(manifest.read_text())
            except json.JSONDecodeError as exc:
                raise TraceError(f"{manifest}: malformed JSON ({exc.msg})") from None
            bt = data.get("block_tokens") if isinstance(data, dict) else None
            if bt is None and isinstance(data, dict):
                bt = (data.get("params") or data.get("parameters") or {}).get("block_tokens")
            if not isinstance(bt, int) or bt <= 0:
                raise TraceError(f"{manifest}: field 'block_tokens' = {bt!r}: must be a positive int")
            return bt
    raise TraceError(f"{path}: no 'block_tokens' column and no manifest.json next to it; pass "
                     f"block_tokens=")


def load_azure(path: str | Path, *, strict: bool = False, name: str | None = None,
               block_tokens: int | None = None) -> Trace:
    """Load an Azure LLM inference trace CSV (2023, Splitwise): no prefix info.

    Columns (``Azure/AzurePublicDataset`` ``AzureLLMInferenceTrace.md``): ``TIMESTAMP`` (wall-clock
    datetime), ``ContextTokens``, ``GeneratedTokens``. ``arrival_s`` = seconds since the first row.
    ``hash_ids`` are empty and ``has_prefix_info`` is False, so prefix analyses raise a clear
    :class:`TraceError` instead of reporting zeros.

    Raises
    ------
    TraceError
        Empty file, missing column, unparsable timestamp or bad length (names file, line, field,
        value); unsorted timestamps with ``strict=True``.
    """
    path = Path(path)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: empty file (no header)") from None
    except pd.errors.ParserError as exc:
        raise TraceError(f"{path}: malformed CSV ({str(exc).strip()})") from None
    for col in _AZURE_COLUMNS:
        if col not in df.columns:
            raise TraceError(f"{path}: missing field {col!r} (header: {list(df.columns)})")
    if df.empty:
        raise TraceError(f"{path}: empty file (header only)")
    lines = np.arange(2, len(df) + 2)  # line 1 is the header
    where = _Where(str(path), lines)
    raw_ts = df["TIMESTAMP"]
    aware = raw_ts.str.strip().str.contains(r"(?:Z|[+-]\d\d:?\d\d)$", regex=True).to_numpy()
    if aware.any() and not aware.all():  # pandas refuses the mix; say which row breaks it
        i = int(np.flatnonzero(aware != aware[0])[0])
        raise TraceError(f"{where(i)}: field 'TIMESTAMP' = {raw_ts.iloc[i]!r}: "
                         f"{'has a' if aware[i] else 'has no'} time-zone offset, unlike line "
                         f"{int(lines[0])} ({raw_ts.iloc[0]!r}); use one convention for every row")
    try:  # offsets (all rows have one) are converted to UTC
        ts = pd.to_datetime(raw_ts, errors="coerce", format="ISO8601", utc=bool(aware.all()))
    except (ValueError, OverflowError) as exc:
        raise TraceError(f"{path}: field 'TIMESTAMP': cannot parse the datetimes "
                         f"({str(exc).splitlines()[0]})") from None
    if ts.isna().any():
        i = int(np.flatnonzero(ts.isna().to_numpy())[0])
        raise TraceError(f"{where(i)}: field 'TIMESTAMP' = {df['TIMESTAMP'].iloc[i]!r}: not a datetime")
    ns = ts.to_numpy().astype("datetime64[ns]").astype(np.int64)
    t = (ns - ns.min()) / 1e9
    inp, out = (_csv_int_column(df[c], c, where) for c in ("ContextTokens", "GeneratedTokens"))
    return make_trace(t, inp, out, None, block_tokens=block_tokens or AZURE_BLOCK_TOKENS,
                      name=name or _label(path.stem), strict=strict, origin=str(path), line_numbers=lines,
                      has_prefix_info=False)


def _csv_int_column(raw: pd.Series, field: str, where: _Where) -> np.ndarray:
    num = pd.to_numeric(raw, errors="coerce")
    bad = num.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"{where(i)}: field {field!r} = {raw.iloc[i]!r}: must be a non-negative integer")
    return _int_column(num.to_numpy(), field, where)


FORMATS = ("mooncake", "art", "bursted", "azure")


_TRACE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".gz", ".zst", ".txt", ".arrow")


def looks_like_hub_id(path: str | Path) -> bool:
    """True if a path that does not exist could be a Hugging Face dataset id ``owner/name``.

    A file name (a trace suffix such as ``.jsonl``), an absolute or ``./`` path, more than two
    components, or an ``owner`` that is an existing local directory mean a missing local file,
    reported as "no such file" and never tried on the Hub.
    """
    text = str(path)
    parts = Path(text).parts
    return (not text.startswith((".", "/", "~")) and len(parts) == 2
            and not Path(parts[0]).exists()
            and not text.lower().endswith(_TRACE_SUFFIXES)
            and all(part and part.replace("-", "").replace("_", "").replace(".", "").isalnum()
                    for part in parts))


def detect_format(path: str | Path) -> str:
    """Guess the format of ``path``: ``"mooncake"``, ``"art"``, ``"bursted"`` or ``"azure"``.

    Directories with a ``manifest.json`` or parquet files holding ``arrival_s`` are Bursted; CSV is
    Azure; JSONL by its first record's time field (``timestamp`` Mooncake, ``timestamp_ms`` ART,
    ``arrival_s`` Bursted); parquet by its columns; a non-existent ``owner/name`` is an ART Hub id.

    Raises
    ------
    TraceError
        If the format cannot be recognised.
    """
    p = Path(path)
    if not p.exists():
        if looks_like_hub_id(path):
            return "art"
        raise FileNotFoundError(f"{path}: no such file or directory")
    if p.is_dir():
        if (p / "manifest.json").exists():
            return "bursted"
        files = sorted(p.rglob("*.parquet")) or sorted(p.glob("*.jsonl"))
        if not files:
            raise TraceError(f"{p}: directory holds no manifest.json, .parquet or .jsonl files")
        return detect_format(files[0])
    suffix = p.suffix.lower()
    if suffix == ".csv":
        return "azure"
    if suffix in (".jsonl", ".json"):
        with open(p, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                line = _decode_line(raw, p, lineno)
                if line.strip():
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise TraceError(f"{p}, line {lineno}: malformed JSON ({exc.msg})") from None
                    break
            else:
                raise TraceError(f"{p}: empty file (no JSON lines)")
        keys = set(rec) if isinstance(rec, dict) else set()
        if "timestamp_ms" in keys:
            return "art"
        if "arrival_s" in keys:
            return "bursted"
        if "timestamp" in keys:
            return "mooncake"
        raise TraceError(f"{p}, line {lineno}: cannot tell the trace format from fields {sorted(keys)}")
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            cols = set(pq.read_schema(p).names)
        except Exception as exc:
            raise TraceError(f"{p}: cannot read parquet ({type(exc).__name__}: {exc})") from None
        if "arrival_s" in cols:
            return "bursted"
        if "timestamp_ms" in cols:
            return "art"
        raise TraceError(f"{p}: parquet columns {sorted(cols)} match no known trace format")
    raise TraceError(f"{p}: unknown trace file type {suffix!r} (want .jsonl, .parquet, .csv or a "
                     f"Bursted directory)")


def load_trace(path: str | Path, *, fmt: str | None = None, block_tokens: int | None = None,
               strict: bool = False, name: str | None = None, **kwargs: Any) -> Trace:
    """Load any supported trace; ``fmt`` is auto-detected (see :func:`detect_format`).

    Parameters
    ----------
    path : path-like or str
        File, Bursted directory, or (ART) Hugging Face dataset id.
    fmt : {"mooncake", "art", "bursted", "azure"}, optional
    block_tokens : int, optional
        Override the format's block size.
    strict : bool
        Unsorted arrivals raise instead of being sorted with a warning.
    name : str, optional
    **kwargs
        Passed to the format's loader (e.g. ``split=`` for Bursted/ART, ``max_rows=`` for ART).

    Raises
    ------
    TraceError
        Unknown format or any validation failure (see the loaders).
    """
    fmt = fmt or detect_format(path)
    if fmt == "mooncake":
        return load_mooncake(path, block_tokens=block_tokens, strict=strict, name=name)
    if fmt == "art":
        return load_art(path, block_tokens=block_tokens, strict=strict, name=name, **kwargs)
    if fmt == "bursted":
        return load_bursted(path, block_tokens=block_tokens, strict=strict, name=name, **kwargs)
    if fmt == "azure":
        return load_azure(path, strict=strict, name=name, block_tokens=block_tokens)
    raise TraceError(f"{path}: unknown trace format {fmt!r} (choose from {', '.join(FORMATS)})")


def shipped_traces() -> dict[str, Path]:
    """The traces shipped in ``data/traces`` (name -> path), Mooncake first, then Azure."""
    from .paths import DATA_DIR

    base = DATA_DIR / "traces"
    return {
        "mooncake_conversation": base / "mooncake" / "conversation_trace.jsonl",
        "mooncake_synthetic": base / "mooncake" / "synthetic_trace.jsonl",
        "azure_code_2023": base / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv",
        "azure_conv_2023": base / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv",
    }


__all__ = [
    "ART_BLOCK_TOKENS", "AZURE_BLOCK_TOKENS", "CORE_COLUMNS", "FORMATS", "MOONCAKE_BLOCK_TOKENS",
    "OPTIONAL_COLUMNS", "Trace", "TraceWarning", "detect_format", "from_table", "load_art",
    "load_azure", "load_bursted", "load_mooncake", "load_trace", "make_trace", "shipped_traces",
]
