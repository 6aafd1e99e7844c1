"""Building a :class:`~btb_core.trace.table.Trace` from columns: validation of every field at the
boundary (one error naming the row, field and value), interning and chaining of block ids.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import TraceError

from .table import (CORE_COLUMNS, MAX_ARRIVAL_S, MAX_TOKENS, OPTIONAL_COLUMNS, Trace, TraceWarning,
                    _show)


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
               interned: tuple[np.ndarray, np.ndarray] | None = None, row_unit: str = "line",
               time_field: tuple[str, float] = ("arrival_s", 1.0),
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
    interned : (numpy.ndarray, numpy.ndarray), optional
        Ids already interned and chained (``hash_flat`` int32 of shape (m,), ``hash_offsets``
        int64 of shape (n + 1,)), used as they are instead of ``hash_ids`` (which must be None);
        the rows must then be sorted (a dataset window streamed by :mod:`btb_core.trace.stream`).
    row_unit : str
        Word for ``line_numbers`` in messages (``"line"``; ``"row"`` for 0-based table rows).
    time_field : (str, float)
        How the source names the arrival time and its units per second, for messages (default
        ``("arrival_s", 1.0)``; the Mooncake JSONL loader: ``("timestamp", 1000.0)``, ms).
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
    where = _Where(origin or name, line_numbers, row_unit)
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
    if interned is not None:
        if hash_ids is not None:
            raise TypeError("make_trace: give hash_ids or interned=, not both")
        raw_flat, offsets = interned
        if offsets.shape != (n + 1,):
            raise TraceError(f"{origin or name}: interned offsets have shape {offsets.shape}, "
                             f"expected ({n + 1},)")
        if has_prefix_info is None:
            has_prefix_info = True
    else:
        raw_flat, offsets = _flatten_hash_ids(hash_ids, n, where)
    if has_prefix_info is None:
        has_prefix_info = hash_ids is not None
    if has_prefix_info and check_block_count:
        expected = -(-inp // block_tokens)
        got = np.diff(offsets)
        bad = got != expected
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            # a trace of another block size: say which one fits every row
            fits = [b for b in (2 ** k for k in range(4, 17))
                    if b != block_tokens and np.array_equal(-(-inp // b), got)]
            hint = (f" (every row fits {fits[0]}-token blocks: give block_tokens={fits[0]}, "
                    f"`btb replay --block-tokens {fits[0]}`)" if fits else "")
            raise TraceError(f"{where(i)}: field 'hash_ids' has {int(got[i])} ids but input_length = "
                             f"{int(inp[i])} needs ceil({int(inp[i])} / {block_tokens}) = "
                             f"{int(expected[i])} blocks{hint}")
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
        field, per_s = time_field     # as the source file has it (name, its units per second)
        msg = (f"{where(i)}: field {field!r} = {_show(t[i] * per_s)} is earlier than the previous "
               f"row's {_show(t[i - 1] * per_s)}: arrivals are not sorted")
        if strict:
            raise TraceError(msg)
        warnings.warn(msg + f"; sorted {n} rows by arrival (stable)", TraceWarning, stacklevel=2)
        order = np.lexsort(order_key[::-1]) if len(order_key) > 1 else np.argsort(t, kind="stable")

    if order is not None and interned is not None:
        raise TraceError(msg + " (interned rows must come sorted)")
    if order is not None:
        t, inp, out, rid = t[order], inp[order], out[order], rid[order]
        lengths = np.diff(offsets)[order]
        if len(raw_flat):
            src = np.concatenate([np.arange(offsets[j], offsets[j + 1]) for j in order])
            raw_flat = raw_flat[src]
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        extras = {k: _take_seq(v, order) for k, v in extras.items()}

    if interned is not None:
        ids = np.ascontiguousarray(raw_flat, dtype=np.int32)
    else:
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
               has_prefix_info: bool | None = None,
               interned: tuple[np.ndarray, np.ndarray] | None = None,
               row_numbers: np.ndarray | None = None) -> Trace:
    """Build a :class:`Trace` from a DataFrame holding the trace-table columns.

    ``hash_ids`` may be missing (no prefix info); any other columns are kept as extra columns.
    Error messages name ``origin`` and the 0-based row (``row_numbers[i]`` for row ``i`` when
    given: a slice of a larger table). ``interned``: see :func:`make_trace` (``hash_ids`` is then
    not read).
    """
    missing = [c for c in ("arrival_s", "input_length", "output_length") if c not in table.columns]
    if missing:
        raise TraceError(f"{origin or name}: missing field {missing[0]!r} (columns: "
                         f"{list(table.columns)})")
    extra = {c: table[c].to_numpy() for c in table.columns if c not in CORE_COLUMNS}
    rid = table["request_id"].to_numpy() if "request_id" in table.columns else None
    hids = table["hash_ids"].to_numpy() if "hash_ids" in table.columns and interned is None else None
    return make_trace(table["arrival_s"].to_numpy(), table["input_length"].to_numpy(),
                      table["output_length"].to_numpy(), hids, block_tokens=block_tokens, name=name,
                      request_id=rid, strict=strict, origin=origin, group_column=group_column,
                      has_prefix_info=has_prefix_info, interned=interned,
                      line_numbers=row_numbers, row_unit="row", **extra)
