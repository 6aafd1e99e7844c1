"""Charts for the Bursted dataset (notebook 02). Builders take plain tables and return altair.

Tables come from :func:`btb_core.synth.arrivals_per_second` and :func:`btb_core.synth.window_fanout`.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

#: Row kinds in stacking order, with fixed colours so every figure reads the same.
_KINDS = ["base", "background", "job", "decoy"]
_KIND_COLORS = alt.Scale(domain=_KINDS, range=["#4c78a8", "#9ecae9", "#e45756", "#f2a541"])


def arrivals_chart(per_second: pd.DataFrame, bin_s: float = 1.0, title: str = "") -> alt.FacetChart:
    """Requests per second, stacked by row kind, one panel per window.

    Parameters
    ----------
    per_second : DataFrame
        Columns ``trace_id``, ``second``, ``row_kind``, ``requests``
        (:func:`btb_core.synth.arrivals_per_second`).
    title : str
    """
    order = list(dict.fromkeys(per_second["trace_id"]))
    df = per_second.copy()
    df["second_end"] = df["second"] + bin_s
    end_s = float(df["second_end"].max()) if len(df) else 60.0
    step_s = next(v for v in (10, 20, 30, 60, 120, 300, 600, 1800, 3600, 1e9) if end_s / v <= 20)
    ticks = [k * step_s for k in range(int(end_s // step_s) + 1)]
    bars = (alt.Chart(df)
            .mark_bar(binSpacing=0)
            .encode(x=alt.X("second:Q", bin=alt.Bin(binned=True, step=bin_s),
                            title="seconds from the window's start",
                            axis=alt.Axis(values=ticks)),
                    x2="second_end:Q",
                    y=alt.Y("requests:Q", stack="zero", title=f"requests / {bin_s:g} s"),
                    color=alt.Color("row_kind:N", scale=_KIND_COLORS, sort=_KINDS, title="row"),
                    order=alt.Order("row_kind:N"),
                    tooltip=["trace_id", "second", "row_kind", "requests"])
            .properties(width=620, height=150))
    return bars.facet(row=alt.Row("trace_id:N", sort=order, title=None),
                      title=title or "Arrivals per second").resolve_scale(y="independent")


def fanout_chart(fan: pd.DataFrame, title: str = "") -> alt.Chart:
    """Deep-prefix fan-out per window vs depth, coloured by window kind (log y).

    Parameters
    ----------
    fan : DataFrame
        Columns ``trace_id``, ``kind``, ``depth_tokens``, ``window_s``, ``max_fanout``
        (:func:`btb_core.synth.window_fanout`); windows with no eligible request (fan-out 0) are
        drawn at 0.5 so they stay visible on the log axis.
    """
    df = fan.copy()
    df["max_fanout"] = df["max_fanout"].astype(float)
    df["shown"] = df["max_fanout"].where(df["max_fanout"] > 0, 0.5)
    df["depth"] = df["depth_tokens"].map(lambda d: f"{d:,}")
    depths = [f"{d:,}" for d in sorted(df["depth_tokens"].unique())]
    w = df["window_s"].iloc[0] if len(df) else 60.0
    top = float(df["shown"].max()) if len(df) else 1.0
    ticks = [v * 10**e for e in range(0, 7) for v in (1, 2, 5) if v * 10**e <= 2 * top]
    return (alt.Chart(df, title=title or f"Deep-prefix fan-out per window ({w:g} s window)")
            .mark_point(filled=True, size=70, opacity=0.7)
            .encode(x=alt.X("depth:N", sort=depths, title="shared prefix depth (tokens)",
                          axis=alt.Axis(labelAngle=0)),
                    xOffset=alt.XOffset("kind:N"),
                    y=alt.Y("shown:Q", scale=alt.Scale(type="log"),
                            title="max requests sharing the prefix",
                            axis=alt.Axis(values=ticks, grid=True)),
                    color=alt.Color("kind:N", title="window",
                                    scale=alt.Scale(domain=["normal", "synthetic"],
                                                    range=["#4c78a8", "#e45756"])),
                    tooltip=["trace_id", "kind", "depth_tokens", "max_fanout"])
            .properties(width=420, height=280))


__all__ = ["arrivals_chart", "fanout_chart"]
