"""Windows of a Bursted dataset split read in one streamed pass, handed out one window at a time.

:func:`~btb_core.trace.load_bursted` reads a whole split into one :class:`~btb_core.trace.Trace`
(a pandas table with one numpy array per row, then one interning pass over every id): on the
default test split (70,800 rows, 8.2 M block ids) ``btb replay --dataset`` peaked at ~650 MB. A
dataset-mode replay needs one window at a time, so :class:`SplitWindows`:

- reads the split once in record batches of :data:`_BATCH_ROWS` rows (pyarrow), validating every
  row as :func:`~btb_core.trace.from_table` does and interning the raw ids in order of first
  appearance over the whole split, exactly as ``load_bursted`` numbers them (so every window's
  ``hash_flat`` equals the corresponding slice of the loaded split);
- keeps at rest the interned ids as runs of consecutive ids (int32 start + length; a row's ids are
  a shared prefix and its own blocks, a few runs: the 8.2 M ids of the default test split are
  0.14 M runs, 2.3 MB with the int64 row offsets), and the other columns as one Arrow table
  (~19 MB: no Python object per row);
- builds a window's :class:`~btb_core.trace.Trace` on demand (:meth:`SplitWindows.window`: its
  int32 ids expanded from the runs), equal to the window ``load_bursted(...).groups("trace_id")``
  gives (same rows, columns, dtypes, ids, name), arrivals re-based to its first one as
  :func:`btb_core.experiment.load_windows` always did.

Splits this path does not cover are loaded whole by ``load_bursted`` (same result, the old
memory): split files with different columns, a file without ``trace_id`` / ``request_id`` or with
nulls in ``trace_id``, a ``block_tokens`` column, ids that are not integers or strings or are null,
rows unsorted within a window, windows that are not contiguous, ids that are not already chained
(they are re-chained over the whole split), or any row that fails validation (so that the error
raised is exactly ``load_bursted``'s).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import TraceError
from .table import CORE_COLUMNS, MAX_ARRIVAL_S, Trace, _label
from .validate import _int_column, _time_column, _Where, from_table


def _release_arrow_memory() -> None:
    """Hand the pages Arrow's allocator (mimalloc by default) keeps after frees back to the OS:
    without it, reading the default test split once left ~55 MB of them resident."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


class _Fallback(Exception):
    """The split needs the whole-split loader (see the module docstring)."""


#: Rows per record batch of the pass over a split (bounds the decoded ids held at once).
_BATCH_ROWS = 4096


def _read_column(path: Path, column: str) -> np.ndarray:
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=[column]).column(column).to_numpy(zero_copy_only=False)


class SplitWindows:
    """The windows of one split of a Bursted dataset directory, read one at a time.

    Parameters
    ----------
    path : path-like
        A Bursted dataset directory (``btb synth`` output: ``manifest.json`` + split parquet).
    split : str or None
        The split (``"test"``, ``"train"``); None = every split file in name order.

    Attributes
    ----------
    ids : list[str]
        Window ids (``trace_id``) in dataset order.
    kinds : list[str]
        ``"synthetic"`` or ``"normal"`` per window (:func:`btb_core.experiment.window_kind`).
    rows : list[int]
        Rows per window.
    streamed : bool
        False when the split was loaded whole (see the module docstring for when).

    Raises
    ------
    FileNotFoundError, TraceError
        As :func:`btb_core.trace.load_bursted` raises them (missing files, manifest checks,
        bad rows: the message names file, row and field).
    """

    def __init__(self, path, split: str | None = "test"):
        import pyarrow.parquet as pq

        from .loaders import _bursted_files, _bursted_block_tokens, verify_rows
        from ..manifest import listed_files

        self.path = path = Path(path)
        self.split = split
        files, root, manifest_dir, manifest = _bursted_files(path, split)
        self._files = files
        columns, num_rows = [], []
        for f in files:
            try:
                pf = pq.ParquetFile(f)
            except Exception as exc:
                raise TraceError(f"{f}: cannot read parquet ({type(exc).__name__}: {exc})") from None
            columns.append(list(pf.schema_arrow.names))
            num_rows.append(pf.metadata.num_rows)
        if manifest is not None:
            split_of = {f["path"]: s for s, f in listed_files(manifest).items()}
            for f, cols, n in zip(files, columns, num_rows):
                s = split_of.get(f.relative_to(root).as_posix())
                if s is not None:
                    verify_rows(root, manifest, f, s, n,
                                pd.unique(_read_column(f, "split")) if "split" in cols else None)
        self.name = _label(f"{path.name}/{split}" if split and path.is_dir() else path.stem)
        self.origin = str(path)
        self._legacy = None
        try:
            if sum(num_rows) == 0 or path.is_file() or any(c != columns[0] for c in columns):
                raise _Fallback
            if any(c not in columns[0] for c in ("trace_id", "hash_ids", "request_id", "arrival_s",
                                                  "input_length", "output_length")) \
                    or "block_tokens" in columns[0]:
                raise _Fallback
            self.block_tokens = _bursted_block_tokens(pd.DataFrame(), manifest_dir, path)
            self._scan(columns[0])
        except _Fallback:
            self._load_whole()

    # ------------------------------------------------------------------ the pass over the split
    def _scan(self, columns: list[str]) -> None:
        """One pass over the split in record batches: validate, intern, find the windows; keep the
        interned ids (int32) and the other columns (Arrow) at rest."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from ..experiment import window_kind

        known = None                    # sorted distinct raw ids seen so far, and their codes
        known_code = np.zeros(0, np.int64)
        parent = np.zeros(0, np.int64)  # parent code of every code (-1: a first block)
        next_code = 0
        len_parts, run_start_parts, run_len_parts, row_runs_parts = [], [], [], []
        win_ids, win_start = [], []     # windows in order; first global row of each
        seen = set()
        last_tid, last_t = None, None
        row0 = 0
        for f in self._files:
            core = ["request_id", "arrival_s", "input_length", "output_length", "hash_ids", "trace_id"]
            for batch in pq.ParquetFile(f).iter_batches(batch_size=_BATCH_ROWS, columns=core,
                                                        use_threads=False):
                n = batch.num_rows
                if not n:
                    continue
                tid = batch.column("trace_id")
                if tid.null_count:
                    raise _Fallback
                tid = pd.Series(tid.to_numpy(zero_copy_only=False), dtype=object)
                h = batch.column("hash_ids")
                if h.null_count or not (pa.types.is_list(h.type) or pa.types.is_large_list(h.type)):
                    raise _Fallback
                vt = h.type.value_type
                if not (pa.types.is_integer(vt) or pa.types.is_string(vt) or pa.types.is_large_string(vt)):
                    raise _Fallback
                lengths = pc.list_value_length(h).to_numpy().astype(np.int64)
                raw = h.flatten()
                if raw.null_count:
                    raise _Fallback
                raw = raw.to_numpy(zero_copy_only=False)
                offsets = np.zeros(n + 1, np.int64)
                np.cumsum(lengths, out=offsets[1:])
                # validation, as from_table / make_trace do it (on any failure the whole-split
                # loader runs and raises its own message)
                try:
                    where = _Where(self.origin, np.arange(row0, row0 + n), "row")
                    t = _time_column(batch.column("arrival_s").to_numpy(zero_copy_only=False),
                                     "arrival_s", where, max_s=MAX_ARRIVAL_S)
                    inp = _int_column(batch.column("input_length").to_numpy(zero_copy_only=False),
                                      "input_length", where)
                    _int_column(batch.column("output_length").to_numpy(zero_copy_only=False),
                                "output_length", where)
                    _int_column(batch.column("request_id").to_numpy(zero_copy_only=False),
                                "request_id", where)
                except TraceError:
                    raise _Fallback from None
                if np.any(lengths != -(-inp // self.block_tokens)):
                    raise _Fallback
                # windows: contiguous runs of trace_id, sorted arrivals within each
                change = np.concatenate([[tid.iloc[0] != last_tid], tid.to_numpy()[1:] != tid.to_numpy()[:-1]])
                same = ~change
                dt = np.diff(np.concatenate([[last_t if last_t is not None else -np.inf], t]))
                if np.any(same & (dt < 0)):
                    raise _Fallback
                for i in np.flatnonzero(change).tolist():
                    w = tid.iloc[i]
                    if w in seen:       # not contiguous: load_bursted's groups() raises
                        raise _Fallback
                    seen.add(w)
                    win_ids.append(w)
                    win_start.append(row0 + i)
                last_tid, last_t = tid.iloc[-1], float(t[-1])
                # intern: first appearance over the whole split, as make_trace's factorize
                local, uniq = pd.factorize(raw)
                uniq = np.asarray(uniq)
                code = np.empty(len(uniq), np.int64)
                hit = np.zeros(len(uniq), bool)
                if known is not None and len(uniq):
                    pos = np.searchsorted(known, uniq)
                    ok = pos < len(known)
                    hit[ok] = known[pos[ok]] == uniq[ok]
                    code[hit] = known_code[pos[hit]]
                new = np.flatnonzero(~hit)
                code[new] = next_code + np.arange(len(new))
                next_code += len(new)
                g = code[local]
                # chained: one parent per code over the split (else re-chaining: whole split)
                par = np.empty(len(g), np.int64)
                if len(g):
                    par[1:] = g[:-1]
                    par[offsets[:-1][lengths > 0]] = -1
                if len(parent) < next_code:
                    parent = np.concatenate([parent, np.full(next_code - len(parent), -2, np.int64)])
                fresh = parent[g] == -2
                parent[g[fresh]] = par[fresh]
                if np.any(parent[g] != par):
                    raise _Fallback
                if next_code >= np.iinfo(np.int32).max:
                    raise _Fallback
                add = uniq[new]
                order = np.argsort(add, kind="stable")
                add, add_code = add[order], code[new][order]
                if known is None:
                    known, known_code = add, add_code
                else:
                    at = np.searchsorted(known, add)
                    known = np.insert(known, at, add)
                    known_code = np.insert(known_code, at, add_code)
                # at rest as runs of consecutive ids (a row's ids are a few such runs: a shared
                # prefix, then the row's own blocks), split at row starts
                brk = np.zeros(len(g), bool)
                brk[offsets[:-1][lengths > 0]] = True
                if len(g) > 1:
                    brk[1:] |= np.diff(g) != 1
                at = np.flatnonzero(brk)
                run_start_parts.append(g[at].astype(np.int32))
                run_len_parts.append(np.diff(np.append(at, len(g))).astype(np.int32))
                row_runs_parts.append(np.diff(np.searchsorted(at, offsets)))
                len_parts.append(lengths)
                del batch, h, raw, local, uniq, code, g, par, fresh, brk, at
                _release_arrow_memory()     # ~2 ms per batch
                row0 += n
        del known, known_code, parent
        self._offsets = np.zeros(row0 + 1, np.int64)
        np.cumsum(np.concatenate(len_parts), out=self._offsets[1:])
        self._run_start = np.concatenate(run_start_parts)
        self._run_len = np.concatenate(run_len_parts)
        self._row_runs = np.zeros(row0 + 1, np.int64)       # row i's runs: [_row_runs[i], [i+1])
        np.cumsum(np.concatenate(row_runs_parts), out=self._row_runs[1:])
        del run_start_parts, run_len_parts, row_runs_parts, len_parts
        # the other columns, read in one go now that the pass's buffers are freed
        rest = [c for c in columns if c != "hash_ids"]
        self._rest = pa.concat_tables([pq.read_table(f, columns=rest, use_threads=False)
                                       for f in self._files])
        _release_arrow_memory()
        self._bounds = win_start + [row0]
        self.ids = [str(w) for w in win_ids]
        self.rows = np.diff(self._bounds).tolist()
        kind_cols = [c for c in ("window_kind", "metadata", "source") if c in columns]
        self.kinds = []
        for k in range(len(win_ids)):
            a, b = self._bounds[k], self._bounds[k + 1]
            self.kinds.append(window_kind(_TableOnly(self._rest.select(kind_cols).slice(a, b - a).to_pandas())))
        self._dtypes = self._split_dtypes()
        self._tids = win_ids

    def _split_dtypes(self) -> dict:
        """dtype of every extra column as the whole-split table has it (a window alone may infer
        another: e.g. ``object`` where the split's ``str`` column holds only nulls in it)."""
        from .validate import _as_column

        import pyarrow.compute as pc

        out = {}
        for c in self._rest.column_names:
            if c in CORE_COLUMNS:
                continue
            # pandas infers a column's dtype from its kinds of values (Arrow keeps one type per
            # column): the first non-null value and the first null stand for the whole column
            col = self._rest.column(c)
            valid = pc.is_valid(col)
            pick = [i for i in (pc.index(valid, True).as_py(), pc.index(valid, False).as_py()) if i >= 0]
            sample = self._rest.select([c]).take(sorted(pick)).to_pandas()[c]
            out[c] = pd.DataFrame({c: _as_column(sample.to_numpy())})[c].dtype
        return out

    def _load_whole(self) -> None:
        from .loaders import load_bursted
        from ..experiment import window_kind

        self._legacy = []
        for w in load_bursted(self.path, split=self.split).groups("trace_id"):
            first = float(w.table["arrival_s"].iloc[0])
            if first != 0.0:
                w = w.window(first, None, rebase=True)
            self._legacy.append(w)
        self.ids = [str(w.table["trace_id"].iloc[0]) for w in self._legacy]
        self.kinds = [window_kind(w) for w in self._legacy]
        self.rows = [len(w) for w in self._legacy]
        self.block_tokens = self._legacy[0].block_tokens if self._legacy else None

    # ------------------------------------------------------------------ one window
    @property
    def streamed(self) -> bool:
        return self._legacy is None

    def __len__(self) -> int:
        return len(self.ids)

    def nbytes(self) -> int:
        """Bytes held at rest (interned ids, offsets, the other columns in Arrow)."""
        if self._legacy is not None:
            return sum(w.memory_bytes() for w in self._legacy)
        return (self._run_start.nbytes + self._run_len.nbytes + self._row_runs.nbytes
                + self._offsets.nbytes + self._rest.nbytes)

    def window(self, k: int) -> Trace:
        """Window ``k`` (0-based, dataset order) as an ordinary trace, arrivals re-based to its
        first arrival; equal to ``load_bursted(...).groups("trace_id")[k]`` so re-based."""
        if self._legacy is not None:
            return self._legacy[k]
        a, b = self._bounds[k], self._bounds[k + 1]
        lo, hi = int(self._offsets[a]), int(self._offsets[b])
        df = self._rest.slice(a, b - a).to_pandas()
        _release_arrow_memory()
        r0, r1 = int(self._row_runs[a]), int(self._row_runs[b])
        starts, lens = self._run_start[r0:r1], self._run_len[r0:r1].astype(np.int64)
        first = np.zeros(len(lens), np.int64)              # position of each run in the window
        np.cumsum(lens[:-1], out=first[1:])
        flat = (np.arange(hi - lo, dtype=np.int64) - np.repeat(first - starts, lens)).astype(np.int32)
        w = from_table(df, block_tokens=self.block_tokens, name=self.name, origin=self.origin,
                       group_column=None, interned=(flat, self._offsets[a:b + 1] - lo),
                       row_numbers=np.arange(a, b))
        for c, dt in self._dtypes.items():
            if c in w.table.columns and w.table[c].dtype != dt:
                w.table[c] = w.table[c].astype(dt)
        # the names and re-basing of load_bursted(...).groups("trace_id") + load_windows
        w = w._take(0, len(w), f"{self.name}/{self._tids[k]}")
        first = float(w.table["arrival_s"].iloc[0])
        if first != 0.0:
            w = w.window(first, None, rebase=True)
        return w


class _TableOnly:
    """A stand-in with only ``.table`` (for :func:`btb_core.experiment.window_kind`)."""

    def __init__(self, table: pd.DataFrame):
        self.table = table


__all__ = ["SplitWindows"]
