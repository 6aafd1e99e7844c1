"""Small I/O helpers shared by the commands, sweeps and chart saving."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def atomic_write_bytes(path: str | Path, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename, so
    a reader never sees a half-written file and an interrupted write leaves ``path`` as it was.

    The parent directory is created if missing; the file gets ``mode`` (default 0644).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def jsonable(obj: Any) -> Any:
    """``obj`` with numpy scalars as Python numbers and NaN / inf / ``pd.NA`` / ``None`` as
    ``None``, recursively through dicts, lists and tuples (strict JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is not None and type(obj).__name__ == "NAType":  # pandas.NA without importing pandas
        return None
    return obj
