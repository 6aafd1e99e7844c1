"""Number formats shared by the printed tables (``btb`` commands) and the notebooks' tables."""

from __future__ import annotations

import math

import numpy as np


def column_decimals(values, significant: int = 3, most: int = 6) -> int:
    """Decimals that show the column's smallest non-zero magnitude to ``significant`` figures.

    One precision per column: ``[0.0122, 3.13]`` -> 4 (``0.0122``, ``3.1300``); ``[34.8, 19710]``
    -> 1; all-zero or empty -> 0. At most ``most`` decimals.
    """
    v = np.abs(np.asarray(values, dtype=float))
    v = v[np.isfinite(v) & (v > 0)]
    if not len(v):
        return 0
    return int(min(most, max(0, significant - 1 - math.floor(math.log10(v.min())))))


def format_column(values, significant: int = 3, suffix: str = "") -> list[str]:
    """``values`` as strings with one number of decimals (:func:`column_decimals`), thousands
    separators and ``suffix``: ``[0.0122, 3.13]`` -> ``["0.0122", "3.1300"]``."""
    d = column_decimals(values, significant)
    return [f"{v:,.{d}f}{suffix}" if math.isfinite(v) else f"{v}" for v in map(float, values)]


__all__ = ["column_decimals", "format_column"]
