"""Altair charts for the trace audit (notebook 01): fan-out vs depth, arrivals over time.

Builders take the tables of :mod:`btb_core.audit` and return charts; save them with
:func:`btb_core.plots.save_chart`.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

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
                 height: int = 200, columns: int = 3) -> alt.Chart:
    """Max fan-out vs depth, one line per window, one panel per trace that has prefix hash ids.

    Parameters
    ----------
    fanout : pandas.DataFrame
        Output of :func:`btb_core.audit.fanout_table`. Traces whose ``max_fanout`` is missing (no
        prefix info, e.g. the Azure traces) get no panel: the subtitle names them instead, so no
        panel is empty. The y axis is logarithmic; cells with fan-out 0 (no request that deep) are
        left out.
    exclude_sessions : bool
        Plot the rows computed with (True) or without (False) excluding earlier conversation turns.
    width, height : int
        Size of one panel (pixels).
    columns : int
        Panels per row (at most three, so the chart fits a page).

    Raises
    ------
    ValueError
        ``columns`` is not 1-3, or no trace has prefix hash ids (nothing to draw).
    """
    from . import trace_label

    if not 1 <= columns <= 3:
        raise ValueError(f"columns = {columns}: a row holds 1-3 panels")
    df = fanout[fanout["exclude_sessions"] == exclude_sessions].copy()
    df["window"] = df["window_s"].map(lambda w: f"{w:g} s")
    df["turns"] = df["exclude_sessions"].map({False: "all requests", True: "earlier turns excluded"})
    df["trace_name"] = df["trace"].map(trace_label)
    has = df["max_fanout"].notna()
    missing = list(dict.fromkeys(df.loc[~has, "trace_name"]))
    data = df[has & (df["max_fanout"].fillna(0) > 0)].assign(
        max_fanout=lambda d: d["max_fanout"].astype(float))[
        ["trace", "trace_name", "depth_tokens", "window", "turns", "max_fanout", "keys_at_max",
         "eligible_requests"]]
    if data.empty:
        raise ValueError("no trace in the table has prefix hash ids: no fan-out to plot")
    data["keys_at_max"] = data["keys_at_max"].astype(float)
    data["eligible_requests"] = data["eligible_requests"].astype(float)
    depths = sorted(df["depth_tokens"].unique().tolist())
    order = list(dict.fromkeys(data["trace_name"]))
    x = alt.X("depth_tokens:Q", scale=alt.Scale(type="log", base=2, nice=False,
                                               domain=[min(depths) / 1.3, max(depths) * 1.3]),
              title="shared prefix depth (tokens; k = 1,024)",
              axis=alt.Axis(values=depths, labelExpr="datum.value >= 1024 ? "
                            "format(datum.value / 1024, '~g') + 'k' : datum.value"))
    # log: the one-block depth of a trace whose prompts all share their first block reaches
    # thousands while deep prefixes stay in single digits (cells with fan-out 0 are not drawn).
    y = alt.Y("max_fanout:Q", title="max requests sharing it in one window",
              scale=alt.Scale(type="log", domainMin=1),
              axis=alt.Axis(values=_ticks(float(data["max_fanout"].max()))[1:],
                            labelOverlap=False, format="~s"))
    windows = sorted(df["window"].unique(), key=lambda s: float(s[:-2]))
    subtitle = ["max requests sharing the first N tokens within any window"
                + ("; earlier conversation turns excluded" if exclude_sessions else "; all requests")]
    if missing:
        subtitle.append("not shown (no prefix hash ids, fan-out cannot be measured): "
                        + ", ".join(missing))
    return alt.Chart(data).mark_line(point=True).encode(
        x=x, y=y,
        color=alt.Color("window:N", title="window", sort=windows),
        tooltip=[alt.Tooltip("trace_name:N", title="trace"), "depth_tokens", "window", "turns",
                 "max_fanout", "keys_at_max", "eligible_requests"],
    ).properties(width=width, height=height).facet(
        facet=alt.Facet("trace_name:N", sort=order, title=None, header=alt.Header(labelFontSize=12)),
        columns=min(columns, len(order)),
    ).properties(title=alt.TitleParams("Deep-prefix fan-out in public traces", subtitle=subtitle))


def arrival_rate_chart(rates: pd.DataFrame, *, width: int = 640, height: int = 90) -> alt.Chart:
    """Requests per second over time, one row per trace (x independent: traces differ in span).

    Parameters
    ----------
    rates : pandas.DataFrame
        Concatenated :func:`btb_core.audit.arrival_rate` tables.
    """
    from . import trace_label

    rates = rates.assign(trace_name=rates["trace"].map(trace_label))
    order = list(dict.fromkeys(rates["trace_name"]))
    steps = rates.groupby("trace", sort=False)["t_s"].diff().dropna().round(9).unique()
    bin_s = float(steps[0]) if len(steps) == 1 else None  # the bin width, when every trace shares it
    title = "Arrival rate of the public traces (requests/s" + (
        f", {bin_s:g} s bins)" if bin_s is not None else ")")
    return alt.Chart(rates).mark_line(interpolate="step-after", strokeWidth=1).encode(
        x=alt.X("t_s:Q", title="time since trace start (s)", scale=alt.Scale(nice=False)),
        y=alt.Y("rps:Q", title="requests/s"),
        tooltip=[alt.Tooltip("trace_name:N", title="trace"), "t_s", "requests", "rps"],
    ).properties(width=width, height=height).facet(
        row=alt.Row("trace_name:N", sort=order, title=None, header=alt.Header(
            labelAngle=0, labelAlign="left", labelFontSize=12, labelLimit=180)),
    ).resolve_scale(x="independent", y="independent").properties(title=title)


__all__ = ["arrival_rate_chart", "fanout_chart"]
