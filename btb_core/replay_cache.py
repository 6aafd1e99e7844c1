"""A content-addressed cache of window replays, so one run never replays the same cell twice.

``make reproduce`` replays some cells more than once: notebook 06 replays five of notebook 04's
policies on the same windows, setup, schedulers and seed (300 of its 360 cells). With the cache on,
:func:`btb_core.experiment.run_experiment` looks every cell up before replaying it and stores what
it replays, so the second notebook reads the first one's results instead of computing them again.

The cache is **off** unless ``$BTB_REPLAY_CACHE`` names a directory. ``python -m btb_core.notebooks``
(``make reproduce``) sets it to a fresh folder under ``build/replay-cache/`` for the run and removes
that folder when the run ends: results are computed within the run, never shipped or kept.

A cell's key is the SHA-256 of everything that decides its result:

- the cell (:class:`btb_core.experiment.Cell`: setup, scheduler, policy and its parameters, window
  id, replica count, seed, cost model with or without the attention term) and the split;
- the bytes of every file of the dataset (its parquet splits and ``manifest.json``);
- the bytes of every source file of the ``btb_core`` package (the simulator, routers, cost model,
  trace readers), and the Python, numpy, pandas and pyarrow versions.

A hit returns the pickled output of :func:`btb_core.experiment.run_cell` exactly as it was stored
(floats round-trip bit for bit). Entries are written to a temporary file and renamed, so a reader
never sees half an entry; a missing, unreadable or corrupt entry is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import platform
from functools import lru_cache
from pathlib import Path

#: The environment variable naming the cache directory (unset or empty: no cache).
ENV = "BTB_REPLAY_CACHE"

#: Bumped when the stored value's layout changes.
FORMAT = 1

#: The environment variable naming the notebook a process runs for (set by the notebook runner
#: for each notebook's process; the kernel inherits it): :func:`note_experiment_done` counts the
#: experiments that notebook has finished, so the runner can start a notebook that reuses them.
NOTEBOOK_ENV = "BTB_NOTEBOOK"


def cache_dir() -> Path | None:
    """The cache directory from ``$BTB_REPLAY_CACHE``, or None when the cache is off."""
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


def _sha256_files(paths) -> str:
    h = hashlib.sha256()
    for rel, path in paths:
        h.update(rel.encode() + b"\0")
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 of every source file of the ``btb_core`` package (sorted by relative path) and the
    versions of Python, numpy, pandas and pyarrow: a change to any of them changes every key."""
    import numpy
    import pandas
    import pyarrow

    root = Path(__file__).resolve().parent
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    versions = f"{platform.python_version()}|{numpy.__version__}|{pandas.__version__}|{pyarrow.__version__}"
    return hashlib.sha256((_sha256_files(files) + versions).encode()).hexdigest()


def dataset_digest(dataset) -> str:
    """SHA-256 of every file of a Bursted dataset directory (or of the one file), by relative path.

    Hidden files are skipped. Raises ``FileNotFoundError`` if ``dataset`` does not exist.
    """
    path = Path(dataset)
    if path.is_file():
        return _sha256_files([(path.name, path)])
    if not path.is_dir():
        raise FileNotFoundError(f"{dataset}: no such Bursted dataset directory")
    files = sorted((p.relative_to(path).as_posix(), p) for p in path.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
    return _sha256_files(files)


def cell_key(cell, split, dataset_sha256: str, with_requests: bool = True) -> str:
    """The cache key of one cell (hex SHA-256; see the module docstring for what goes in)."""
    fields = {"format": FORMAT, "setup": cell.setup, "scheduler": cell.scheduler,
              "policy": cell.policy, "params": [[k, repr(v)] for k, v in cell.params],
              "window": cell.window, "replicas": cell.replicas, "seed": cell.seed,
              "attention": cell.attention, "split": split, "dataset": dataset_sha256,
              "with_requests": with_requests, "code": code_digest()}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _entry(directory: Path, key: str) -> Path:
    return directory / key[:2] / f"{key}.pkl"


def load(directory: Path, key: str):
    """The stored output for ``key``, or None (missing, unreadable or corrupt: a miss)."""
    try:
        data = _entry(directory, key).read_bytes()
        return pickle.loads(data)
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
        return None


def store(directory: Path, key: str, value) -> None:
    """Store ``value`` under ``key`` (temporary file + rename; see :func:`btb_core.fileio.atomic_write_bytes`)."""
    from .fileio import atomic_write_bytes

    atomic_write_bytes(_entry(directory, key), pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _progress_file(directory: Path, notebook: str) -> Path:
    return Path(directory) / "progress" / notebook


def note_experiment_done(directory: Path | None = None, notebook: str | None = None) -> None:
    """Record that this process's notebook (``$BTB_NOTEBOOK``) finished one more experiment whose
    cells are now all in the cache (called at the end of
    :func:`btb_core.experiment.run_experiment`). Does nothing when the cache is off or no notebook
    is named. One line per experiment is appended to ``<cache>/progress/<notebook>``."""
    directory = directory if directory is not None else cache_dir()
    notebook = notebook if notebook is not None else os.environ.get(NOTEBOOK_ENV, "").strip()
    if directory is None or not notebook:
        return
    path = _progress_file(directory, notebook)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:          # one short line per append: never torn
        fh.write("experiment done\n")


def experiments_done(directory: Path, notebook: str) -> int:
    """How many experiments ``notebook`` has finished in the run whose cache is ``directory``
    (:func:`note_experiment_done`); 0 when it has not written any."""
    try:
        return _progress_file(directory, notebook).read_text().count("\n")
    except OSError:
        return 0
