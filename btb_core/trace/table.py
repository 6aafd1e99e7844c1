"""The trace table: :class:`Trace` (a pandas table + interned, chained block ids), the column and
block-size constants every loader shares, and :class:`TraceWarning`.

See :mod:`btb_core.trace` for the chaining rule and the time conventions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from ..errors import TraceError
from .runs import BlockRuns

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
    hash_runs : BlockRuns
        The same ids as runs of consecutive ids (:mod:`btb_core.trace.runs`).

    Notes
    -----
    A *compact* trace (built with ``hash_runs=`` and ``hash_flat=None``, its table without the
    ``hash_ids`` column) keeps its ids only as runs: a 1,000,000-row Bursted-shaped trace holds
    ~25 MB of runs instead of 827 MB of flat ids plus 120 MB of per-row views. Reading
    :attr:`hash_flat` or :attr:`table` expands them once (then kept); the simulator, slicing
    (:meth:`rows`, :meth:`window`, :meth:`groups`), the column properties and
    :meth:`row_hash_ids` work on the runs and never expand them. Both forms give equal values.
    A trace is immutable (assigning an attribute raises ``dataclasses.FrozenInstanceError``).

    Raises
    ------
    TraceError
        If the arrays are inconsistent (lengths, dtypes, offsets).
    """

    def __init__(self, table: pd.DataFrame, block_tokens: int, name: str, has_prefix_info: bool,
                 hash_flat: np.ndarray | None, hash_offsets: np.ndarray | None,
                 group_column: str | None = None, *, hash_runs: BlockRuns | None = None) -> None:
        put = object.__setattr__
        put(self, "block_tokens", block_tokens)
        put(self, "name", name)
        put(self, "has_prefix_info", has_prefix_info)
        put(self, "group_column", group_column)
        put(self, "_runs", hash_runs)
        put(self, "_full", None)          # a compact trace's table with hash_ids, once expanded
        if hash_flat is None:
            if hash_runs is None:
                raise TraceError(f"{name}: a trace needs hash_flat or hash_runs")
            if hash_offsets is not None and not np.array_equal(hash_offsets, hash_runs.offsets):
                raise TraceError(f"{name}: hash_offsets disagree with hash_runs")
            hash_offsets = hash_runs.offsets
        put(self, "_base", table)
        put(self, "_flat", hash_flat)
        put(self, "_runs_only", hash_flat is None)   # built compact: the table has no hash_ids
        put(self, "hash_offsets", hash_offsets)
        self._check()

    def _check(self) -> None:
        if isinstance(self.block_tokens, bool) or not isinstance(self.block_tokens, (int, np.integer)) \
                or self.block_tokens <= 0:
            raise TraceError(f"{self.name}: block_tokens = {self.block_tokens!r}: must be a positive int")
        base = self._base
        compact = self._runs_only
        core = list(CORE_COLUMNS[:4]) if compact else list(CORE_COLUMNS)
        if list(base.columns[:len(core)]) != core or (compact and "hash_ids" in base.columns):
            want = core if not compact else core + ["(no hash_ids: the ids are hash_runs)"]
            raise TraceError(f"{self.name}: table columns {list(base.columns)!r} must start with "
                             f"{want!r}")
        n = len(base)
        if self.hash_offsets.shape != (n + 1,) or self.hash_offsets.dtype != np.int64:
            raise TraceError(f"{self.name}: hash_offsets must be int64 of shape ({n + 1},), got "
                             f"{self.hash_offsets.dtype} {self.hash_offsets.shape}")
        if not compact:
            if self._flat.dtype != np.int32 or self._flat.ndim != 1:
                raise TraceError(f"{self.name}: hash_flat must be a 1-D int32 array, got "
                                 f"{self._flat.dtype} with shape {self._flat.shape}")
            if n and (self.hash_offsets[0] != 0 or self.hash_offsets[-1] != len(self._flat)):
                raise TraceError(f"{self.name}: hash_offsets must run from 0 to len(hash_flat) = "
                                 f"{len(self._flat)}")
        if self.group_column is not None and self.group_column not in base.columns:
            raise TraceError(f"{self.name}: group_column = {self.group_column!r} is not a column")

    def __setattr__(self, key, value):
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {key!r}")

    def __delattr__(self, key):
        raise dataclasses.FrozenInstanceError(f"cannot delete field {key!r}")

    # ---- the ids, flat or as runs ---------------------------------------------------------------
    @property
    def compact(self) -> bool:
        """True while the ids are held only as runs (:attr:`hash_runs`), not yet expanded."""
        return self._flat is None

    @property
    def hash_flat(self) -> np.ndarray:
        """int32, every row's ids concatenated (expanded from the runs on first use, then kept)."""
        flat = self._flat
        if flat is None:
            flat = self._runs.to_flat()
            flat.flags.writeable = False
            object.__setattr__(self, "_flat", flat)
        return flat

    @property
    def hash_runs(self) -> BlockRuns:
        """The ids as runs of consecutive ids (:class:`~btb_core.trace.runs.BlockRuns`; found from
        the flat ids on first use, then kept)."""
        runs = self._runs
        if runs is None:
            runs = BlockRuns.from_flat(self._flat, self.hash_offsets)
            object.__setattr__(self, "_runs", runs)
        return runs

    @property
    def table(self) -> pd.DataFrame:
        """The table (see the class docstring); a compact trace builds its ``hash_ids`` column of
        views into :attr:`hash_flat` on first use."""
        if not self._runs_only:
            return self._base
        full = self._full
        if full is None:
            flat = self.hash_flat
            views = np.empty(len(self._base), dtype=object)
            for i, (a, b) in enumerate(zip(self.hash_offsets[:-1].tolist(),
                                           self.hash_offsets[1:].tolist())):
                views[i] = flat[a:b]
            full = self._base.copy(deep=False)
            full.insert(4, "hash_ids", views)
            object.__setattr__(self, "_full", full)
        return full

    def column(self, name: str) -> pd.Series:
        """One column of the table other than ``hash_ids``, without expanding a compact trace's ids."""
        return self._base[name]

    @property
    def columns(self) -> list[str]:
        """Column names of :attr:`table`, in order."""
        cols = list(self._base.columns)
        if "hash_ids" not in cols:
            cols.insert(4, "hash_ids")
        return cols

    # ---- basics ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._base)

    def __repr__(self) -> str:
        span = self.duration_s if len(self) else 0.0
        return (f"Trace({self.name!r}, rows={len(self)}, block_tokens={self.block_tokens}, "
                f"span_s={span:.1f}, prefix_info={self.has_prefix_info})")

    @property
    def arrival_s(self) -> np.ndarray:
        """float64 array of arrivals in seconds, shape (n,)."""
        return self._base["arrival_s"].to_numpy()

    @property
    def input_length(self) -> np.ndarray:
        """int64 array of prompt lengths in tokens, shape (n,)."""
        return self._base["input_length"].to_numpy()

    @property
    def output_length(self) -> np.ndarray:
        """int64 array of generated lengths in tokens, shape (n,)."""
        return self._base["output_length"].to_numpy()

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
        """Chained ids of row ``i`` (int32, shape (n_blocks_i,); a read-only view of
        :attr:`hash_flat`, or a new array for a compact trace)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"{self.name}: row {i} out of range for {n} rows")
        i %= n
        if self._flat is None:
            ids = self._runs.row(i)
            ids.flags.writeable = False
            return ids
        return self._flat[self.hash_offsets[i]:self.hash_offsets[i + 1]]

    def memory_bytes(self) -> int:
        """Approximate resident bytes: table (deep, views counted by header) + ids (flat array and
        per-row views once expanded; runs while compact)."""
        base = self._base.drop(columns=["hash_ids"]) if "hash_ids" in self._base.columns else self._base
        total = int(base.memory_usage(deep=True).sum()) + self.hash_offsets.nbytes
        if self._flat is not None:
            total += self._flat.nbytes
            if self._full is not None or "hash_ids" in self._base.columns:
                total += len(self) * (8 + _VIEW_HEADER_BYTES)  # pointer + ndarray header per row
        if self._runs is not None:
            total += self._runs.nbytes - self._runs.offsets.nbytes
        return total

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
        if self._runs_only:   # built compact: slice the runs, never expand them
            table = self._base.iloc[start:stop].reset_index(drop=True)
            if rebase_s is not None and rebase_s != 0.0:
                table["arrival_s"] = table["arrival_s"].to_numpy() - rebase_s
            return Trace(table, self.block_tokens, name, self.has_prefix_info, None, None,
                         group_column, hash_runs=self._runs.take(start, stop))
        table = self.table.iloc[start:stop].reset_index(drop=True)
        lo, hi = int(self.hash_offsets[start]), int(self.hash_offsets[stop])
        flat = self._flat[lo:hi]
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
        if column is None or column not in self._base.columns:
            raise TraceError(f"{self.name}: groups() needs a column to split by, got {column!r}")
        codes, uniques = pd.factorize(self._base[column], use_na_sentinel=False)
        if len(codes) and np.any(np.diff(codes) < 0):
            i = int(np.flatnonzero(np.diff(codes) < 0)[0]) + 1
            raise TraceError(f"{self.name}: rows of {column!r} are not contiguous (row {i} returns "
                             f"to {_show(self._base[column].iloc[i])} after other values)")
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
