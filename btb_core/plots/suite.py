"""Charts of notebook 06 (beyond the rule). Builders take plain pandas tables only.

- :func:`ratio_heatmap`: policy x shape heatmap of a ratio-to-best column
  (input: :func:`btb_core.suite.summarize`);
- :func:`ledger_timeline`: the decision ledger of ``btb_adaptive`` over time, one row per
  destination replica (input: ``BTBAdaptiveRouter.ledger_frame()`` with a ``shape`` column);
- :func:`predicted_vs_actual`: predicted against actual TTFT per request
  (input: ``BTBAdaptiveRouter.requests_frame()`` with a ``shape`` column).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from . import policy_order

EVENTS = ["warm_set", "pipe", "copy", "skip", "pin", "unpin"]
EVENT_COLORS = ["#6c757d", "#f2a541", "#2a9d8f", "#e63946", "#264653", "#a8dadc"]


def ratio_heatmap(summary: pd.DataFrame, column: str = "mean_ratio", shapes=None,
                  title: str = "Mean TTFT over the best policy of each shape") -> alt.LayerChart:
    """Policy x shape heatmap of ``column`` (1.0 = the best policy of that shape), values printed.

    Parameters
    ----------
    summary : DataFrame
        Columns ``shape, policy`` and ``column``.
    shapes : list of str, optional
        Row order (default: order of first appearance).
    """
    data = summary[["shape", "policy", column]].copy()
    data["label"] = data[column].map(lambda x: f"{x:.2f}")
    rows = list(shapes) if shapes is not None else list(dict.fromkeys(data["shape"]))
    order = policy_order(data["policy"])
    base = alt.Chart(data).encode(
        x=alt.X("policy:N", sort=order, title=None, axis=alt.Axis(labelAngle=-30, orient="top")),
        y=alt.Y("shape:N", sort=rows, title=None),
    )
    rect = base.mark_rect().encode(
        color=alt.Color(f"{column}:Q", title="ratio to best",
                        scale=alt.Scale(type="log", domain=[1.0, 4.0], clamp=True,
                                        scheme="orangered")),
        tooltip=["shape", "policy", alt.Tooltip(f"{column}:Q", format=".3f")],
    )
    text = base.mark_text(fontSize=10).encode(
        text="label:N",
        color=alt.condition(f"datum['{column}'] > 2.0", alt.value("white"), alt.value("black")),
    )
    return (rect + text).properties(width=62 * len(order), height=22 * len(rows), title=title)


def ledger_timeline(ledger: pd.DataFrame, title: str = "btb_adaptive decision ledger") -> alt.Chart:
    """Ledger events over time (x), by destination replica (y; -1 = cluster-wide warm-set
    changes), coloured by event; one panel per ``shape``.

    Parameters
    ----------
    ledger : DataFrame
        Columns ``shape, time_s, event, dst, prefix_blocks, reason, target``.
    """
    data = ledger[["shape", "time_s", "event", "dst", "prefix_blocks", "reason", "target"]].copy()
    return alt.Chart(data).mark_point(filled=True, size=50, opacity=0.8).encode(
        x=alt.X("time_s:Q", title="time (s)"),
        y=alt.Y("dst:O", title="destination replica (-1: warm set)"),
        color=alt.Color("event:N", scale=alt.Scale(domain=EVENTS, range=EVENT_COLORS)),
        shape=alt.Shape("event:N", scale=alt.Scale(domain=EVENTS)),
        tooltip=["shape", "time_s", "event", "dst", "prefix_blocks", "target", "reason"],
    ).properties(width=360, height=150).facet(
        column=alt.Column("shape:N", title=None)).resolve_scale(x="independent").properties(
        title=title)


def predicted_vs_actual(requests: pd.DataFrame,
                        title: str = "Predicted vs actual TTFT (btb_adaptive)") -> alt.LayerChart:
    """Scatter of predicted against actual TTFT per request with the y = x line, coloured by the
    router's choice (warm / landing / cold); one colour per choice, ``shape`` in the tooltip.

    Parameters
    ----------
    requests : DataFrame
        Columns ``shape, choice, predicted_ttft_s, actual_ttft_s``.
    """
    data = requests[["shape", "choice", "predicted_ttft_s", "actual_ttft_s"]].copy()
    top = float(max(data["predicted_ttft_s"].max(), data["actual_ttft_s"].max(), 0.01))
    line = alt.Chart(pd.DataFrame({"x": [0.0, top], "y": [0.0, top]})).mark_line(
        color="#999", strokeDash=[4, 3]).encode(x="x:Q", y="y:Q")
    pts = alt.Chart(data).mark_circle(size=25, opacity=0.6).encode(
        x=alt.X("predicted_ttft_s:Q", title="predicted TTFT (s)"),
        y=alt.Y("actual_ttft_s:Q", title="actual TTFT (s)"),
        color=alt.Color("choice:N", scale=alt.Scale(domain=["warm", "landing", "cold"],
                                                    range=["#2a9d8f", "#f2a541", "#264653"])),
        tooltip=["shape", "choice", alt.Tooltip("predicted_ttft_s:Q", format=".3f"),
                 alt.Tooltip("actual_ttft_s:Q", format=".3f")],
    )
    return (line + pts).properties(width=320, height=260, title=title)


__all__ = ["ledger_timeline", "predicted_vs_actual", "ratio_heatmap"]
