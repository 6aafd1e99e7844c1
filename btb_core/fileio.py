"""Small I/O helpers shared by the commands, sweeps and chart saving."""

from __future__ import annotations

import errno
import fcntl
import glob
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import BTBError


def atomic_write_bytes(path: str | Path, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename, so
    a reader never sees a half-written file and an interrupted write leaves ``path`` as it was.

    The parent directory is created if missing; the file gets ``mode`` (default 0644).

    Raises
    ------
    OutputError
        An operating-system error (one line naming the path); no temporary file is left.
    """
    path = Path(path)
    ensure_dir(path.parent)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise output_error(exc, path, "nothing was written" if tmp else "") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
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


# --------------------------------------------------------------------------------------------
# operating-system errors as one line
# --------------------------------------------------------------------------------------------

_ERRNO_TEXT = {
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.ENOTDIR: "a component of the path is a file, not a directory",
    errno.ENAMETOOLONG: "file name too long",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EEXIST: "already exists",
    errno.ENOENT: "no such file or directory",
    errno.EISDIR: "is a directory",
}


def os_error_text(exc: OSError, path: str | Path | None = None) -> str:
    """One line for an operating-system error: ``<path>: <what went wrong>``.

    The path is the one the error names (``exc.filename``) or, failing that, ``path``; the text is
    a plain description of the ``errno`` (pyarrow and fsspec often raise ``OSError`` without a
    filename, with the errno only in the message).
    """
    where = exc.filename if exc.filename is not None else path
    if isinstance(where, bytes):
        where = os.fsdecode(where)
    where = shown_path(where) if where is not None else None
    what = errno_text(exc)
    return f"{where}: {what}" if where is not None else what


def errno_text(exc: OSError) -> str:
    """What an ``OSError`` means, in words (no path)."""
    code = exc.errno
    if code is None:  # e.g. pyarrow: "[Errno 28] Error writing bytes ... [errno 28] No space ..."
        import re

        m = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)
        code = int(m.group(1)) if m else None
    return _ERRNO_TEXT.get(code) or (exc.strerror or str(exc).splitlines()[0] if str(exc) else
                                     type(exc).__name__)


def shown_path(path: str | Path) -> str:
    """``path`` as text safe to print on one line (undecodable bytes escaped, no newlines)."""
    text = os.fsdecode(path) if isinstance(path, bytes) else str(path)
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.replace("\n", "\\n").replace("\r", "\\r")


def ensure_dir(directory: str | Path) -> Path:
    """Create ``directory`` (and parents) if missing; :class:`OutputError` naming the path if that
    fails, e.g. because a component of the path is a regular file."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        for p in [directory, *directory.parents]:
            if p.exists() and not p.is_dir():
                raise OutputError(f"{shown_path(p)}: is a file, so no directory can be made "
                                  f"under it") from None
        raise output_error(exc, directory) from None
    return directory


class OutputError(BTBError):
    """Writing an output failed (disk full, read-only file system, bad path); nothing partial left."""


def output_error(exc: OSError, path: str | Path, cleanup: str = "") -> OutputError:
    """An :class:`OutputError` naming ``path`` (the output asked for, not a temporary name)
    with :func:`errno_text` (``cleanup`` says what was left)."""
    return OutputError(f"{shown_path(path)}: {errno_text(exc)}" + (f" ({cleanup})" if cleanup else ""))


# --------------------------------------------------------------------------------------------
# output directories: lock, write-then-swap, recovery
# --------------------------------------------------------------------------------------------


@contextmanager
def dir_lock(directory: str | Path, *, blocking: bool = True, what: str = "output"):
    """Hold an exclusive ``flock`` on ``directory`` itself (no lock file is left behind).

    Every writer of an output directory holds the lock on its *parent* from before it creates its
    temporary sibling until the swap is done, so temporary siblings seen under the lock belong to
    dead runs. With ``blocking=False`` a held lock raises :class:`OutputError` at once.
    """
    directory = Path(directory)
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise output_error(exc, directory) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            raise OutputError(f"{shown_path(directory)}: another btb process is writing this "
                              f"{what}; wait for it to finish or choose another --out") from None
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _tmp_siblings(out: Path, kind: str) -> list[Path]:
    return sorted(out.parent.glob(f".{glob.escape(out.name)}.{kind}-*"))


def recover_swap(out: Path) -> list[str]:
    """Finish or undo an interrupted :func:`replace_dir` of ``out``; call with the parent locked.

    * ``.<name>.old-*/old`` with ``out`` missing: the run died between its two renames, so the old
      directory is moved back to ``out`` (nothing is lost);
    * any other ``.<name>.old-*`` or ``.<name>.tmp-*`` sibling: left by a killed run, removed.

    Returns one line per action (for a warning).
    """
    notes = []
    for trash in _tmp_siblings(out, "old"):
        old = trash / "old"
        if old.is_dir() and not out.exists():
            os.replace(old, out)
            notes.append(f"{shown_path(out)}: restored from an interrupted replace")
        shutil.rmtree(trash, ignore_errors=True)
    for tmp in _tmp_siblings(out, "tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
        notes.append(f"{shown_path(tmp)}: removed the temporary folder of a killed run")
    return notes


def replace_dir(out: str | Path, fill: Callable[[Path], Any], *, overwrite: bool,
                owned: Callable[[Path], str | None], what: str = "--out") -> Path:
    """Write a directory atomically: ``fill(tmp)`` writes into a fresh temporary sibling, which
    then takes the place of ``out`` by rename (``out``, if present, is moved aside first and
    deleted last). The parent directory is locked throughout (see :func:`dir_lock`), and earlier
    interrupted swaps of ``out`` are recovered first (:func:`recover_swap`).

    Parameters
    ----------
    out : path-like
    fill : callable
        Writes the new content into the directory it is given.
    overwrite : bool
        Allow replacing an existing non-empty ``out``.
    owned : callable
        ``owned(out)`` returns None if ``out`` holds only what this tool wrote, else a reason
        (e.g. the first foreign file); a non-empty ``out`` that is not owned is never replaced.

    Raises
    ------
    ConfigError
        ``out`` is a file, non-empty without ``overwrite``, or holds files this tool did not write.
    OutputError
        An operating-system error (read-only, disk full, path through a file, name too long); the
        temporary folder is removed and ``out`` is as it was.
    """
    import warnings

    out = Path(out)
    ensure_dir(out.parent)
    with dir_lock(out.parent, what=what):
        for note in recover_swap(out):
            warnings.warn(note, OutputWarning, stacklevel=2)
        check_replaceable(out, overwrite=overwrite, owned=owned, what=what)
        tmp = trash = None
        try:
            tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
            fill(tmp)
            os.chmod(tmp, 0o755)
            if out.exists():
                trash = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
                os.replace(out, trash / "old")
            os.replace(tmp, out)
            tmp = None
        except OSError as exc:
            raise output_error(exc, out, "nothing was written") from None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if trash is not None:
                if (trash / "old").is_dir() and not out.exists():  # failed between the renames
                    os.replace(trash / "old", out)
                shutil.rmtree(trash, ignore_errors=True)
    return out


def check_replaceable(out: Path, *, overwrite: bool, owned: Callable[[Path], str | None],
                      what: str = "--out") -> None:
    """Raise ``ConfigError`` unless ``out`` is missing, an empty directory, or (with
    ``overwrite``) a directory ``owned`` accepts; cheap, so callers also run it before long work."""
    from .errors import ConfigError

    shown = shown_path(out)
    try:
        exists = out.exists()
        if exists and not out.is_dir():
            raise ConfigError(f"{what} {shown}: exists and is not a directory")
        cwd = Path.cwd().resolve()
        if exists and (out.resolve() == cwd or out.resolve() in cwd.parents):
            raise ConfigError(f"{what} {shown}: is the current directory (or contains it) and "
                              f"cannot be replaced; write to a subdirectory such as "
                              f"{shown_path(out / 'bursted')}")
        if not exists or not any(out.iterdir()):
            return
    except OSError as exc:
        raise output_error(exc, out) from None
    reason = owned(out)
    if reason is not None:
        raise ConfigError(f"{what} {shown}: {reason}; refusing to replace a directory btb did not "
                          f"write (choose another --out)")
    if not overwrite:
        raise ConfigError(f"{what} {shown}: directory exists and is not empty; pass --overwrite "
                          f"(API: overwrite=True) to replace it")


class OutputWarning(UserWarning):
    """Something about an output location worth a line (e.g. a recovered interrupted replace)."""
