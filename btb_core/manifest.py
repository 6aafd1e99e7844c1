"""The Bursted dataset manifest: the marker of a directory ``btb synth`` wrote, and its checks.

``manifest.json`` (written by :func:`btb_core.synth.write`) records ``"format": "btb-bursted"``,
the block size, per-split row counts and, per split file, its name, rows and SHA-256. It serves
three purposes:

* **marker**: a directory is replaced (``btb synth --overwrite``) only if it holds nothing but
  the manifest, the card ``README.md`` and the files the manifest lists (:func:`foreign_reason`);
* **guard**: no output may be written inside a dataset directory (:func:`enclosing_dataset`);
* **integrity**: loading verifies every split file's hash and row count, the ``split`` column
  against the file's split name, and refuses parquet files the manifest does not list
  (:func:`verify_files`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import TraceError
from .fileio import shown_path

#: ``format`` field of a Bursted manifest.
FORMAT = "btb-bursted"
#: Files a dataset directory holds besides the split files the manifest lists.
FIXED_FILES = ("manifest.json", "README.md")


def read_manifest(directory: str | Path) -> dict | None:
    """The manifest of a Bursted dataset directory, or None if ``directory`` is not one.

    Raises
    ------
    TraceError
        ``manifest.json`` exists but is not valid JSON.
    """
    m = Path(directory) / "manifest.json"
    try:
        if not m.is_file():
            return None
        data = json.loads(m.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{shown_path(m)}: malformed JSON ({exc.msg})") from None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def enclosing_dataset(path: str | Path, *, include_self: bool = False) -> Path | None:
    """The nearest Bursted dataset directory strictly above ``path`` (or ``path`` itself with
    ``include_self``), or None."""
    p = Path(path).absolute()
    candidates = ([p] if include_self else []) + list(p.parents)
    for d in candidates:
        try:
            if read_manifest(d) is not None:
                return d
        except TraceError:
            return d
    return None


def listed_files(manifest: dict) -> dict[str, dict]:
    """``{split: {"path", "rows", "sha256"}}`` from a manifest (empty for an old manifest)."""
    files = manifest.get("files") or {}
    return {s: f for s, f in files.items() if isinstance(f, dict) and isinstance(f.get("path"), str)}


def foreign_reason(directory: Path) -> str | None:
    """None if ``directory`` holds only what ``btb synth`` wrote there, else why not."""
    try:
        manifest = read_manifest(directory)
    except TraceError as exc:
        return str(exc)
    entries = sorted(p.name for p in directory.iterdir())
    if manifest is None:
        return f"holds {entries[0]!r} and no Bursted manifest.json"
    ours = set(FIXED_FILES) | {f["path"] for f in listed_files(manifest).values()}
    foreign = [e for e in entries if e not in ours]
    if foreign:
        return f"holds {foreign[0]!r}, which is not part of the dataset"
    return None


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_files(directory: Path, manifest: dict, files: list[Path]) -> None:
    """Check the split files about to be loaded from a dataset directory against its manifest.

    Every parquet file under ``directory`` must be listed; every listed file must exist with the
    recorded SHA-256. (Row counts and split names are checked on the loaded rows by
    :func:`verify_rows`.)

    Raises
    ------
    TraceError
        A stray or missing file, or one whose bytes changed (names the file).
    """
    listed = listed_files(manifest)
    if not listed:
        return  # a manifest without file hashes (hand-made): nothing to verify against
    by_path = {f["path"]: (s, f) for s, f in listed.items()}
    for p in sorted(directory.rglob("*.parquet")):
        rel = p.relative_to(directory).as_posix()
        if rel not in by_path:
            raise TraceError(f"{shown_path(p)}: not listed in {shown_path(directory / 'manifest.json')} "
                             f"(a stray file would add rows to a split); remove it or regenerate "
                             f"the dataset")
    for p in files:
        rel = p.relative_to(directory).as_posix()
        split, f = by_path[rel]
        want = f.get("sha256")
        if isinstance(want, str) and file_sha256(p) != want:
            raise TraceError(f"{shown_path(p)}: contents differ from the manifest (sha256 mismatch "
                             f"for split {split!r}); the file was changed or replaced after "
                             f"`btb synth` wrote it")


def verify_rows(path: Path, manifest: dict, file: Path, split: str, rows: int,
                split_values) -> None:
    """Row count and ``split`` column of one loaded split file against the manifest."""
    f = listed_files(manifest).get(split)
    if f is not None and isinstance(f.get("rows"), int) and f["rows"] != rows:
        raise TraceError(f"{shown_path(file)}: {rows:,} rows, the manifest says {f['rows']:,}")
    if split_values is not None:
        bad = [v for v in split_values if v != split]
        if bad:
            raise TraceError(f"{shown_path(file)}: holds rows of split {bad[0]!r}, but is the "
                             f"{split!r} file of {shown_path(path)}")


__all__ = ["FIXED_FILES", "FORMAT", "enclosing_dataset", "file_sha256", "foreign_reason",
           "listed_files", "read_manifest", "verify_files", "verify_rows"]
