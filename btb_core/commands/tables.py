"""Terminal tables of the ``btb`` subcommands: at most 120 characters wide unless ``--wide``.

A table that would be wider drops its least important columns (each command lists them, least
important first) and says which ones are hidden; ``--wide`` prints every column and ``--json`` every
field. Columns with one value across the table (the setup or scheduler of a single-setup run) move
into a heading line above it instead of repeating on every row.
"""

from __future__ import annotations

import argparse
import textwrap

#: Default width of a printed table (characters): a terminal split in two, a code review, a paper.
TABLE_WIDTH = 120


def add_wide_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--wide`` (print every column, however wide) to a subcommand's parser."""
    parser.add_argument("--wide", action="store_true",
                        help=f"print every column of the tables, however wide (default: each "
                             f"command's main columns, fitted to {TABLE_WIDTH} characters; --json "
                             f"has every field)")


def width(text: str) -> int:
    """Longest line of ``text`` (characters)."""
    return max((len(line) for line in text.splitlines()), default=0)


def _integers(df, floats=()):
    """Float columns holding only whole numbers (counts, parameters stored as float because some
    rows lack them) as integers, so they print as ``2``, not ``2.000``; missing values print empty.
    The columns named in ``floats`` stay floats (a ratio of exactly 1 prints as ``1.000``)."""
    import pandas as pd

    out = df.copy()
    for col in out.columns:
        s = out[col]
        if pd.api.types.is_float_dtype(s) and col not in floats:
            finite = s.dropna()
            if len(finite) and (finite == finite.round()).all() and finite.abs().max() < 2**53:
                out[col] = s.astype("Int64")
        if isinstance(out[col].dtype, pd.Int64Dtype) and out[col].isna().any():
            out[col] = out[col].map(lambda v: "" if pd.isna(v) else f"{v}")  # not "<NA>"
    return out


def render(df, *, wide: bool = False, drop: tuple[str, ...] = (), constant: tuple[str, ...] = (),
           group: tuple[str, ...] = (), float_format=None, max_width: int = TABLE_WIDTH,
           index: bool = False, floats: tuple[str, ...] = ()) -> str:
    """``df`` as text, fitted to ``max_width`` characters unless ``wide``.

    Parameters
    ----------
    df : pandas.DataFrame
        The table, columns in display order.
    wide : bool
        Every column, no fitting (``--wide``).
    drop : tuple of str
        Columns that may be hidden to fit, least important first; they are hidden one at a time
        until the table fits, and a note at the end names them (wrapped to ``max_width``).
    constant : tuple of str
        Columns that, when they hold a single value, are printed once as ``name: value`` above the
        table instead of on every row (not with ``wide``).
    group : tuple of str
        Columns that, when they hold several values, split the table into one block per value
        combination under a ``name: value`` heading (not with ``wide``); single-valued ones are
        treated as ``constant``.
    float_format : callable or str, optional
        As for :meth:`pandas.DataFrame.to_string`.
    max_width : int
        Characters per line (default :data:`TABLE_WIDTH`).
    index : bool
        Print the index.
    floats : tuple of str
        Float columns printed as floats even when every value is whole (measured quantities and
        ratios, where ``1`` beside another run's ``1.000`` would read as a different precision).

    Returns
    -------
    str
        The table; without ``wide`` no line is longer than ``max_width`` unless the columns that
        may not be hidden are wider by themselves.
    """
    df = _integers(df, floats)
    if wide:
        return df.to_string(index=index, float_format=float_format, na_rep="")
    head = []
    for col in (*constant, *group):
        if col in df.columns and len(df) and df[col].nunique(dropna=False) == 1:
            head.append(f"{col}: {df[col].iloc[0]}")
            df = df.drop(columns=col)
    by = [c for c in group if c in df.columns]
    blocks = [(None, df)] if not by else [
        ("; ".join(f"{c}: {v}" for c, v in zip(by, key if isinstance(key, tuple) else (key,))),
         part.drop(columns=by)) for key, part in df.groupby(by, sort=False)]

    def text_of(cols):
        out = []
        for title, part in blocks:
            out += ([""] if out else []) + ([title] if title else [])
            out.append(part[cols].to_string(index=index, float_format=float_format, na_rep=""))
        return "\n".join(out)

    cols = [c for c in df.columns if c not in by]
    text = text_of(cols)
    hidden = []
    for col in drop:
        if width(text) <= max_width:
            break
        if col in cols:
            cols.remove(col)
            hidden.append(col)
            text = text_of(cols)
    lines = (["; ".join(head)] if head else []) + [text]
    if hidden:   # every hidden column named, over several lines when they do not fit one
        note = (f"(hidden to fit {max_width} columns: {', '.join(hidden)}; --wide shows "
                f"{'it' if len(hidden) == 1 else 'them'})")
        lines.append(textwrap.fill(note, max_width, break_long_words=False, break_on_hyphens=False))
    return "\n".join(lines)


#: Parts of a column name that mark a count (printed as an integer when every value is whole).
COUNT_WORDS = ("tokens", "bytes", "copies", "requests", "events", "windows", "replicas", "rows")


def measured_floats(df) -> tuple[str, ...]:
    """The float columns of ``df`` that hold measured quantities or ratios (seconds, fractions,
    speedups), not counts: for :func:`render`'s ``floats``, so that a whole value prints as
    ``1.000`` there as beside other rows, not as ``1``."""
    return tuple(c for c in df.columns if df[c].dtype.kind == "f"
                 and not any(w in str(c) for w in COUNT_WORDS))


def more_columns_note(all_columns, shown, max_width: int = TABLE_WIDTH) -> str:
    """A note naming the fields of a result that its table does not show (a command's main
    columns), wrapped to ``max_width``; ``""`` when it shows them all. It does not count the
    columns the table has but hid to fit or moved to a heading: :func:`render` names those."""
    shown = set(shown)
    more = [c for c in all_columns if c not in shown]
    if not more:
        return ""
    one = len(more) == 1
    note = (f"({len(more)} more result field{'' if one else 's'}, --wide shows "
            f"{'it' if one else 'them'}: {', '.join(more)})")
    return textwrap.fill(note, max_width, break_long_words=False, break_on_hyphens=False)


__all__ = ["COUNT_WORDS", "TABLE_WIDTH", "add_wide_option", "measured_floats", "more_columns_note",
           "render", "width"]
