"""Charts of notebook 03 (routers under bursts). Builders take plain pandas tables only.

- :func:`ttft_bars`: mean TTFT and recomputed prefill tokens per scenario x policy
  (input: :func:`btb_core.scenarios.summarize`);
- :func:`queue_timelines`: per-replica waiting-queue length over time, one panel per policy
  (input: ``SimResult.queue_length_series`` tables with a ``policy`` column);
- :func:`copy_frames_chart`: a static frame sequence of per-replica queues coloured by warm-copy
  state, the headless stand-in for the notebook's time slider (input:
  :func:`btb_core.scenarios.copy_frames`).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from . import policy_order

#: Copy states and their colours in the warm-copy frames.
COPY_STATES = ["none", "source", "in flight", "landed"]
COPY_COLORS = ["#bdbdbd", "#264653", "#f2a541", "#2a9d8f"]


def ttft_bars(summary: pd.DataFrame,
              title: str = "Routers under three traffic shapes") -> alt.Chart:
    """Two bar panels per scenario: mean TTFT (s) and recomputed prefill tokens, by policy.

    Parameters
    ----------
    summary : DataFrame
        Columns ``scenario, policy, ttft_mean_s, recomputed_prefill_tokens``.
    """
    order = policy_order(summary["policy"])
    base = alt.Chart(summary).encode(
        x=alt.X("policy:N", sort=order, title=None, axis=alt.Axis(labelAngle=-30)),
        color=alt.Color("policy:N", sort=order, legend=None),
    )
    ttft = base.mark_bar().encode(
        y=alt.Y("ttft_mean_s:Q", title="mean TTFT (s)"),
        tooltip=["scenario", "policy", alt.Tooltip("ttft_mean_s:Q", format=".2f"),
                 alt.Tooltip("ttft_p99_s:Q", format=".2f")],
    ).properties(width=150, height=140)
    recompute = base.mark_bar().encode(
        y=alt.Y("recomputed_prefill_tokens:Q", title="recomputed prefill tokens"),
        tooltip=["scenario", "policy", "recomputed_prefill_tokens"],
    ).properties(width=150, height=140)
    return alt.vconcat(
        ttft.facet(column=alt.Column("scenario:N", title=None)).resolve_scale(x="independent"),
        recompute.facet(column=alt.Column("scenario:N", title=None)).resolve_scale(
            x="independent"),
    ).properties(title=title)


def queue_timelines(series: pd.DataFrame, title: str = "Waiting queue per replica") -> alt.Chart:
    """Per-replica queue length (step lines) over time, one row of panels per policy.

    Parameters
    ----------
    series : DataFrame
        Columns ``time_s, replica, queue_length, policy`` (optionally ``scenario``, used in the
        title only when a single one is present).
    """
    order = policy_order(series["policy"])
    return alt.Chart(series).mark_line(interpolate="step-after", strokeWidth=1.5).encode(
        x=alt.X("time_s:Q", title="time (s)"),
        y=alt.Y("queue_length:Q", title="waiting requests"),
        color=alt.Color("replica:N", title="replica"),
        tooltip=["policy", "replica", "time_s", "queue_length"],
    ).properties(width=520, height=110).facet(
        row=alt.Row("policy:N", sort=order, title=None)
    ).properties(title=title)


def copy_frames_chart(frames: pd.DataFrame, title: str = "BTB warm copies landing") -> alt.Chart:
    """Small multiples, one per frame: queue length per replica (bars) and its KV-copy role
    (squares under the axis: none / source / in flight / landed).

    Parameters
    ----------
    frames : DataFrame
        Columns ``frame, time_s, replica, queue_length, copy_state``.
    """
    data = frames.assign(label=frames["time_s"].map(lambda t: f"t = {t:.2f} s"))
    labels = list(dict.fromkeys(data.sort_values("frame")["label"]))
    base = alt.Chart().encode(x=alt.X("replica:O", title="replica"))
    bars = base.mark_bar(color="#8d99ae").encode(
        y=alt.Y("queue_length:Q", title="waiting requests"),
        tooltip=["time_s", "replica", "queue_length", "copy_state"],
    )
    role = base.mark_square(size=90, yOffset=8).encode(
        y=alt.datum(0),
        color=alt.Color("copy_state:N", title="KV copy role",
                        scale=alt.Scale(domain=COPY_STATES, range=COPY_COLORS)),
    )
    return alt.layer(bars, role, data=data).properties(width=130, height=120).facet(
        facet=alt.Facet("label:N", sort=labels, title=None), columns=min(3, len(labels))
    ).properties(title=title)


__all__ = ["copy_frames_chart", "queue_timelines", "ttft_bars"]
