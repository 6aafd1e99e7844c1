"""Charts of issue 12's runs: closed-loop sessions, paged admission, cluster-event timelines."""

from __future__ import annotations

import altair as alt
import pandas as pd

from . import policy_order
from .production import METRIC_TITLES

#: Row headers: horizontal, left of the panels (metric names read as words, not rotated ids).
_ROW_HEADER = alt.Header(labelAngle=0, labelAlign="left", labelFontSize=12, labelLimit=200)


def _labelled(long: pd.DataFrame, metrics) -> tuple[pd.DataFrame, list[str]]:
    """``long`` with its ``metric`` column as axis-style titles (units included), and their order."""
    labels = [METRIC_TITLES.get(m, m) for m in metrics]
    return long.assign(metric=long["metric"].map(lambda m: METRIC_TITLES.get(m, m))), labels


def loop_bars(table: pd.DataFrame, metrics=("ttft_mean_s", "session_duration_mean_s", "hit_fraction"),
              title: str = "Open vs closed loop") -> alt.Chart:
    """Grouped bars per policy, open vs closed loop, one panel per metric.

    Parameters
    ----------
    table : DataFrame
        :func:`btb_core.production.session_comparison` output.
    """
    long, labels = _labelled(table.melt(id_vars=["policy", "loop"], value_vars=list(metrics),
                                        var_name="metric"), metrics)
    return alt.Chart(long).mark_bar().encode(
        x=alt.X("loop:N", title=None, sort=["open", "closed"], axis=alt.Axis(labelAngle=0)),
        y=alt.Y("value:Q", title=None),
        color=alt.Color("loop:N", sort=["open", "closed"], title="loop"),
        column=alt.Column("policy:N", sort=policy_order(table["policy"]), title=None),
        row=alt.Row("metric:N", title=None, sort=labels, header=_ROW_HEADER),
        tooltip=["policy", "loop", "metric", alt.Tooltip("value:Q", format=".4g")],
    ).resolve_scale(y="independent").properties(width=90, height=110, title=title)


def admission_bars(table: pd.DataFrame, title: str = "Reserved vs paged KV admission") -> alt.Chart:
    """Mean TTFT and end-to-end latency per policy under each admission rule, with the
    preemption count as text.

    Parameters
    ----------
    table : DataFrame
        :func:`btb_core.production.admission_comparison` output.
    """
    metrics = ["ttft_mean_s", "e2e_mean_s"]
    long, labels = _labelled(table.melt(id_vars=["policy", "kv_admission", "preemptions"],
                                        value_vars=metrics, var_name="metric"), metrics)
    base = alt.Chart(long).encode(
        x=alt.X("kv_admission:N", title=None, sort=["reserve", "paged"], axis=alt.Axis(labelAngle=0)),
        y=alt.Y("value:Q", title=None),
    )
    bars = base.mark_bar().encode(
        color=alt.Color("kv_admission:N", sort=["reserve", "paged"], title="admission"),
        tooltip=["policy", "kv_admission", "metric", alt.Tooltip("value:Q", format=".4g"),
                 "preemptions"])
    text = base.mark_text(dy=-6, fontSize=9).encode(text=alt.Text("preemptions:Q"))
    return alt.layer(bars, text, data=long).properties(width=90, height=130).facet(
        column=alt.Column("policy:N", sort=policy_order(table["policy"]), title=None),
        row=alt.Row("metric:N", title=None, sort=labels, header=_ROW_HEADER),
    ).resolve_scale(y="independent").properties(
        title=alt.TitleParams(title, subtitle="numbers on bars: preemptions"))


def event_timeline_chart(series: pd.DataFrame, copies: pd.DataFrame, events,
                         title: str = "Scale-out and failure") -> alt.Chart:
    """Per-replica waiting queue over time, one panel per policy, with the cluster events as
    vertical rules and landed copies as triangles at the top of the panel (coloured by their
    destination replica).

    Parameters
    ----------
    series, copies : DataFrame
        :func:`btb_core.production.event_timeline` output.
    events : sequence of ClusterEvent
    """
    order = policy_order(series["policy"])
    ymax = float(max(1, series["queue_length"].max()))
    xmax = float(max(series["time_s"].max(), copies["end_s"].max() if len(copies) else 0.0))
    ev = pd.DataFrame([{"time_s": e.t_s, "event": f"{e.action} {e.replica}"} for e in events])
    rows = []
    for policy in order:
        sub = series[series["policy"] == policy]
        lines = alt.Chart(sub).mark_line(interpolate="step-after", strokeWidth=1.5).encode(
            x=alt.X("time_s:Q", title="time (s)", scale=alt.Scale(domain=[0, xmax])),
            y=alt.Y("queue_length:Q", title="waiting requests", scale=alt.Scale(domain=[0, ymax * 1.15])),
            color=alt.Color("replica:N", title="replica"),
            tooltip=["replica", "time_s", "queue_length"])
        rules = alt.Chart(ev).mark_rule(strokeDash=[4, 3], color="black").encode(
            x="time_s:Q", tooltip=["event", "time_s"])
        labels = alt.Chart(ev).mark_text(align="left", dx=3, dy=-4, fontSize=9, color="black").encode(
            x="time_s:Q", y=alt.value(8), text="event:N")
        layers = [lines, rules, labels]
        cp = copies[copies["policy"] == policy].assign(y=ymax * 1.08)
        if len(cp):
            layers.append(alt.Chart(cp).mark_point(shape="triangle-down", filled=True, size=60).encode(
                x=alt.X("end_s:Q"), y=alt.Y("y:Q"), color=alt.Color("dst:N", title="replica"),
                tooltip=[alt.Tooltip("dst:N", title="copy to replica"), "end_s", "blocks"]))
        rows.append(alt.layer(*layers).properties(width=520, height=130, title=policy))
    return alt.vconcat(*rows).resolve_scale(color="shared").properties(
        title=alt.TitleParams(title, subtitle="dashed: cluster events; triangles: a warm copy landed "
                                              "(colour = destination replica)"))


__all__ = ["admission_bars", "event_timeline_chart", "loop_bars"]
