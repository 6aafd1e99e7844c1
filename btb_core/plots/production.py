"""Charts of notebook 03's "What production adds" section. Builders take plain pandas tables only
(the outputs of :mod:`btb_core.production`).

- :func:`variant_bars`: one row of bar panels per metric, one bar per run variant, one column of
  panels per policy (instances, lag and threshold tables alike).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from . import policy_order

#: Axis titles of the metrics the production tables carry.
METRIC_TITLES = {
    "ttft_mean_s": "mean TTFT (s)",
    "ttft_p95_s": "p95 TTFT (s)",
    "ttft_p99_s": "p99 TTFT (s)",
    "hit_fraction": "prompt tokens reused",
    "recomputed_prefill_tokens": "recomputed prefill tokens",
    "copies": "warm copies",
    "session_duration_mean_s": "mean session duration (s)",
    "e2e_mean_s": "mean end-to-end latency (s)",
}


def variant_bars(table: pd.DataFrame, variant: str, metrics=("ttft_mean_s", "ttft_p95_s"),
                 title: str = "", log_scale: bool = False) -> alt.Chart:
    """Bars of each ``metric`` per run variant, one column of panels per policy.

    Parameters
    ----------
    table : DataFrame
        Columns ``policy``, ``variant`` and every name in ``metrics``.
    variant : str
        Column naming the run variant (e.g. ``"instances"``, ``"kv_event_lag_s"``,
        ``"setting"``); its order of first appearance is kept.
    metrics : sequence of str
        Numeric columns; titles from :data:`METRIC_TITLES`.
    log_scale : bool
        Log y scale for TTFT metrics (bars start at 0.01 s), for TTFTs spanning orders of magnitude.
    """
    data = table.assign(**{variant: table[variant].astype(str)})
    order = list(dict.fromkeys(data[variant]))
    policies = policy_order(data["policy"])
    rows = []
    for m in metrics:
        scale = alt.Scale(type="log") if log_scale and m.startswith("ttft") else alt.Scale()
        mark = alt.Chart(data).mark_bar()
        if log_scale and m.startswith("ttft"):   # a log axis cannot start bars at 0
            mark = alt.Chart(data).mark_bar().encode(y2=alt.datum(0.01))
        chart = mark.encode(
            x=alt.X(f"{variant}:N", sort=order, title=None, axis=alt.Axis(labelAngle=-30)),
            y=alt.Y(f"{m}:Q", title=METRIC_TITLES.get(m, m), scale=scale),
            color=alt.Color(f"{variant}:N", sort=order, legend=None),
            tooltip=["policy", variant] + [alt.Tooltip(f"{c}:Q", format=".3~f") for c in metrics],
        ).properties(width=190, height=120).facet(
            column=alt.Column("policy:N", sort=policies, title=None)
        ).resolve_scale(x="independent", y="shared" if log_scale else "independent")
        rows.append(chart)
    return alt.vconcat(*rows).properties(title=title)


__all__ = ["METRIC_TITLES", "variant_bars"]
