"""Progress bars for long work (replayed windows, sweep cells), on or off by where the code runs."""

from __future__ import annotations

import os
import sys


def progress_bar(total: int, desc: str, unit: str, progress: bool | None = None):
    """A ``tqdm`` bar over ``total`` items, or ``None`` when progress is off.

    Parameters
    ----------
    total : int
        Number of items (windows, sweep cells).
    desc, unit : str
        The bar's label and unit.
    progress : bool, optional
        ``True`` / ``False`` force the bar on / off. ``None`` (default) decides from the
        environment: ``$BTB_PROGRESS=text`` (set by ``make reproduce`` for its kernels, whose
        stderr it passes through to the terminal) gives a plain-text bar redrawn at most every
        5 s; ``$BTB_PROGRESS=0`` turns bars off (``make test``); otherwise a bar shows on a
        terminal and, inside a Jupyter kernel (JupyterLab), as a widget.
    """
    mode = os.environ.get("BTB_PROGRESS", "")
    if progress is None:
        if mode in ("0", "off"):
            return None
        progress = bool(mode) or sys.stderr.isatty() or "ipykernel" in sys.modules
    if not progress:
        return None
    if mode == "text":
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, mininterval=5.0, file=sys.stderr)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit)
