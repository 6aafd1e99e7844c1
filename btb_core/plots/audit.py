"""Altair charts for the trace audit (notebook 01): fan-out vs depth, arrivals over time.

Builders take the tables of :mod:`btb_core.audit` and return charts; save them with
:func:`btb_core.plots.save_chart`.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

#: Text shown in the facet of a trace without prefix hash ids.
NO_PREFIX_LABEL = "no prefix hash ids:\nfan-out cannot be measured"


def _ticks(top: float) -> list[int]:
    """1-2-5 ticks from 0 up to the first one at or above ``top`` (for a symlog axis)."""
    ticks = [0]
    for decade in (1, 10, 100, 1000, 10000, 100000):
        for m in (1, 2, 5):
            ticks.append(m * decade)
            if ticks[-1] >= top:
                return ticks
    return ticks


def fanout_chart(fanout: pd.DataFrame, *, exclude_sessions: bool = False, width: int = 220,
                 height: int = 200) -> alt.Chart:
    """Max fan-out vs depth, one line per window, one panel per trace.

    Parameters
    ----------
    fanout : pandas.DataFrame
        Output of :func:`btb_core.audit.fanout_table`. Traces whose ``max_fanout`` is missing (no
        prefix info) get a panel with :data:`NO_PREFIX_LABEL` instead of a line, so the gap shows.
        The y axis is logarithmic; cells with fan-out 0 (no request that deep) are left out.
    exclude_sessions : bool
        Plot the rows computed with (True) or without (False) excluding earlier conversation turns.
    """
    df = fanout[fanout["exclude_sessions"] == exclude_sessions].copy()
    df["window"] = df["window_s"].map(lambda w: f"{w:g} s")
    df["turns"] = df["exclude_sessions"].map({False: "all requests", True: "earlier turns excluded"})
    has = df["max_fanout"].notna()
    data = df[has & (df["max_fanout"].fillna(0) > 0)].assign(
        max_fanout=lambda d: d["max_fanout"].astype(float), kind="line", label="")
    depths = sorted(df["depth_tokens"].unique().tolist())
    mid = (min(depths) * max(depths)) ** 0.5 if depths else 4096.0  # centre of the log axis
    missing = (df[~has].drop_duplicates("trace")
               .assign(depth_tokens=mid, max_fanout=max(1.0, float(data["max_fanout"].max())) ** 0.5
                       if len(data) else 1.0, kind="missing",
                       label=NO_PREFIX_LABEL))
    both = pd.concat([data, missing], ignore_index=True)[
        ["trace", "depth_tokens", "window", "turns", "max_fanout", "keys_at_max",
         "eligible_requests", "kind", "label"]]
    both["keys_at_max"] = both["keys_at_max"].astype(float)
    both["eligible_requests"] = both["eligible_requests"].astype(float)
    order = list(dict.fromkeys(df["trace"]))
    x = alt.X("depth_tokens:Q", scale=alt.Scale(type="log", base=2, nice=False,
                                               domain=[min(depths) / 1.3, max(depths) * 1.3]),
              title="shared prefix depth (tokens; k = 1,024)",
              axis=alt.Axis(values=depths, labelExpr="datum.value >= 1024 ? "
                            "format(datum.value / 1024, '~g') + 'k' : datum.value"))
    # log: the one-block depth of a trace whose prompts all share their first block reaches
    # thousands while deep prefixes stay in single digits (cells with fan-out 0 are not drawn).
    y = alt.Y("max_fanout:Q", title="max requests sharing it in one window",
              scale=alt.Scale(type="log", domainMin=1),
              axis=alt.Axis(values=_ticks(float(data["max_fanout"].max()) if len(data) else 1.0)[1:],
                            labelOverlap=False, format="~s"))
    windows = sorted(df["window"].unique(), key=lambda s: float(s[:-2]))
    lines = alt.Chart().transform_filter(alt.datum.kind == "line").mark_line(point=True).encode(
        x=x, y=y,
        color=alt.Color("window:N", title="window", sort=windows),
        tooltip=["trace", "depth_tokens", "window", "turns", "max_fanout", "keys_at_max",
                 "eligible_requests"])
    text = alt.Chart().transform_filter(alt.datum.kind == "missing").mark_text(
        fontSize=12, color="#a33", lineBreak="\n").encode(x=x, y=alt.Y("max_fanout:Q"), text="label:N")
    layered = alt.layer(lines, text).properties(width=width, height=height)
    return layered.facet(column=alt.Column("trace:N", sort=order, title=None), data=both
                         ).properties(
        title=alt.TitleParams("Deep-prefix fan-out in public traces",
                              subtitle="max requests sharing the first N tokens within any window"
                              + ("; earlier conversation turns excluded" if exclude_sessions
                                 else "; all requests")))


def arrival_rate_chart(rates: pd.DataFrame, *, width: int = 640, height: int = 90) -> alt.Chart:
    """Requests per second over time, one row per trace (x independent: traces differ in span).

    Parameters
    ----------
    rates : pandas.DataFrame
        Concatenated :func:`btb_core.audit.arrival_rate` tables.
    """
    order = list(dict.fromkeys(rates["trace"]))
    return alt.Chart(rates).mark_line(interpolate="step-after", strokeWidth=1).encode(
        x=alt.X("t_s:Q", title="time since trace start (s)", scale=alt.Scale(nice=False)),
        y=alt.Y("rps:Q", title="req/s"),
        tooltip=["trace", "t_s", "requests", "rps"],
    ).properties(width=width, height=height).facet(
        row=alt.Row("trace:N", sort=order, title=None, header=alt.Header(labelAngle=0,
                                                                         labelAlign="left")),
    ).resolve_scale(x="independent", y="independent").properties(title="Arrival rate")


__all__ = ["NO_PREFIX_LABEL", "arrival_rate_chart", "fanout_chart"]
