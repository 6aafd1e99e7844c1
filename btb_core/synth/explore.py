"""Helpers for looking at a Bursted dataset (notebook 02): row kinds, arrivals per second, one row
per job or decoy, fan-out per window.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..trace import Trace


# --------------------------------------------------------------------------------------------
# helpers for notebook 02
# --------------------------------------------------------------------------------------------


def row_kinds(table: pd.DataFrame) -> pd.Series:
    """``metadata.row_kind`` of every row (base, background, job, decoy; ``"unknown"`` where a row
    has none). ``metadata`` may hold JSON strings or dicts."""
    def kind(m):
        if isinstance(m, str):
            m = json.loads(m)
        return m.get("row_kind", "unknown") if isinstance(m, dict) else "unknown"

    return table["metadata"].map(kind)


def arrivals_per_second(table: pd.DataFrame, trace_ids: list[str], bin_s: float = 1.0) -> pd.DataFrame:
    """Requests per ``bin_s`` bin for some windows, by row kind (input of the arrivals chart).

    Returns
    -------
    pandas.DataFrame
        Columns ``trace_id``, ``second`` (bin start, s), ``row_kind``, ``requests``; empty bins
        are omitted.
    """
    if not bin_s > 0:
        raise ConfigError(f"bin_s = {bin_s!r}: must be > 0")
    sub = table[table["trace_id"].isin(trace_ids)]
    missing = sorted(set(trace_ids) - set(sub["trace_id"]))
    if missing:
        raise ConfigError(f"trace_id {missing[0]!r} is not in the table")
    df = pd.DataFrame({"trace_id": sub["trace_id"].to_numpy(),
                       "second": np.floor(sub["arrival_s"].to_numpy() / bin_s) * bin_s,
                       "row_kind": row_kinds(sub).to_numpy()})
    return df.groupby(["trace_id", "second", "row_kind"], as_index=False, sort=True).size() \
        .rename(columns={"size": "requests"})


def group_summary(table: pd.DataFrame, block_tokens: int) -> pd.DataFrame:
    """One row per job or decoy (``group_id``): size, timing and the prefix its requests share.

    Parameters
    ----------
    table : pandas.DataFrame
        Rows of a split (:attr:`BurstedDataset.splits` or a loaded trace's ``table``).
    block_tokens : int

    Returns
    -------
    pandas.DataFrame
        Columns ``trace_id``, ``group_id``, ``row_kind``, ``job_kind``, ``requests``, ``first_s``,
        ``span_s`` (last minus first arrival), ``shared_prefix_tokens`` (leading blocks common to
        all its requests x block_tokens), ``input_length`` (of the first request).
    """
    sub = table[table["group_id"].notna()]
    rows = []
    for gid, g in sub.groupby("group_id", sort=False):
        ids = g["hash_ids"].to_list()
        n = min(len(h) for h in ids)
        first = np.asarray(ids[0][:n])
        same = np.ones(n, bool)
        for h in ids[1:]:
            same &= np.asarray(h[:n]) == first
        shared = int(np.argmin(same)) if not same.all() else n
        m = json.loads(g["metadata"].iloc[0])
        t = g["arrival_s"].to_numpy()
        rows.append({"trace_id": g["trace_id"].iloc[0], "group_id": gid, "row_kind": m["row_kind"],
                     "job_kind": m.get("job_kind"), "requests": len(g), "first_s": float(t.min()),
                     "span_s": float(t.max() - t.min()),
                     "shared_prefix_tokens": shared * block_tokens if len(g) > 1 else None,
                     "input_length": int(g["input_length"].iloc[0])})
    out = pd.DataFrame(rows)
    if len(out):
        out["shared_prefix_tokens"] = out["shared_prefix_tokens"].astype("Int64")
    return out


def window_fanout(trace: Trace, depth_tokens: tuple[int, ...] = (1024, 8192, 65_536),
                  window_s: float = 60.0) -> pd.DataFrame:
    """Deep-prefix fan-out of every window of a Bursted split, with the window kind.

    Returns
    -------
    pandas.DataFrame
        One row per (window, depth): ``trace_id``, ``kind``, ``depth_tokens``, ``window_s``,
        ``max_fanout``, ``eligible_requests``.
    """
    from ..audit import fanout_table

    fan = fanout_table(trace, depth_tokens, (window_s,), (False,))
    fan["trace_id"] = fan["trace"].str.split("/").str[-1]
    fan["kind"] = fan["trace_id"].str.split("-").str[-1]
    return fan[["trace_id", "kind", "depth_tokens", "window_s", "max_fanout", "eligible_requests"]]
