"""Loaders: Mooncake JSONL, ART-Chat (parquet, JSONL, Hub), Bursted datasets, Azure CSV; format
detection and :func:`load_trace`.

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
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from ..errors import TraceError
from ..manifest import listed_files, read_manifest, verify_files, verify_rows

from .table import (ART_BLOCK_TOKENS, AZURE_BLOCK_TOKENS, MOONCAKE_BLOCK_TOKENS, OPTIONAL_COLUMNS,
                    Trace, _label)
from .validate import _int_column, _time_column, _Where, from_table, make_trace

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

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
                      strict=strict, origin=str(path), line_numbers=lines,
                      time_field=("timestamp", 1000.0), **extras)


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
                      origin=origin, line_numbers=line_numbers,
                      time_field=("timestamp_ms", 1000.0), **extras)


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


def _bursted_files(path: Path, split: str | None):
    """``(files, root, manifest_dir, manifest)`` of a Bursted file or directory (split filter and
    manifest checks of :func:`load_bursted`, shared with :mod:`btb_core.trace.stream`)."""
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
    return files, root, manifest_dir, manifest


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
    files, root, manifest_dir, manifest = _bursted_files(path, split)
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
    from ..paths import DATA_DIR

    base = DATA_DIR / "traces"
    return {
        "mooncake_conversation": base / "mooncake" / "conversation_trace.jsonl",
        "mooncake_synthetic": base / "mooncake" / "synthetic_trace.jsonl",
        "azure_code_2023": base / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv",
        "azure_conv_2023": base / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv",
    }
