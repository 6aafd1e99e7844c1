"""Charts of replay experiments and sweeps (notebooks 04 and 05). Inputs are plain tables."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from . import policy_order, setup_label

#: Panels per row in faceted charts (setup x scheduler pairs read left to right).
PANELS_PER_ROW = 2


def _panels(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``df`` with a ``panel`` column "model on node, scheduler", and the panels in setup order."""
    df = df.copy()
    df["panel"] = [f"{setup_label(s)}, {sch}" for s, sch in zip(df["setup"], df["scheduler"])]
    return df, list(dict.fromkeys(df["panel"]))


def ttft_by_policy(results: pd.DataFrame, dataset: str = "bursted") -> alt.Chart:
    """Mean and p95 TTFT per policy, one panel per setup and scheduler (two panels per row)."""
    df = results[results["dataset"] == dataset]
    long = df.melt(id_vars=["setup", "scheduler", "policy"], value_vars=["ttft_mean_s", "ttft_p95_s"],
                   var_name="statistic", value_name="ttft_s")
    long["statistic"] = long["statistic"].map({"ttft_mean_s": "mean", "ttft_p95_s": "p95"})
    long, order = _panels(long)
    return alt.Chart(long).mark_bar().encode(
        x=alt.X("policy:N", sort=policy_order(long["policy"]), title=None, axis=alt.Axis(labelAngle=-40)),
        xOffset="statistic:N",
        y=alt.Y("ttft_s:Q", title="TTFT (s)"),
        color=alt.Color("statistic:N", title="TTFT"),
        tooltip=["setup", "scheduler", "policy", "statistic", alt.Tooltip("ttft_s:Q", format=".3f")],
    ).properties(width=260, height=150).facet(
        facet=alt.Facet("panel:N", sort=order, title=None, header=alt.Header(labelFontSize=12)),
        columns=PANELS_PER_ROW,
    ).resolve_scale(y="independent").properties(
        title=f"Mean and p95 TTFT (s) by routing policy, {dataset} windows of the Bursted test split")


def speedup_bars(results: pd.DataFrame) -> alt.Chart:
    """Mean-TTFT speedup of each policy over cache_aware (1 = same), bursted vs normal windows.

    Drawn as lollipops from 1 (dashed rule) on a log axis, so slow-downs and speed-ups are symmetric.
    """
    df, order = _panels(results[results["policy"] != "cache_aware"])
    df["one"] = 1.0
    enc = dict(
        y=alt.Y("policy:N", sort=policy_order(df["policy"]), title=None),
        yOffset=alt.YOffset("dataset:N"),
        color=alt.Color("dataset:N", title="windows"),
        tooltip=["setup", "scheduler", "policy", "dataset",
                 alt.Tooltip("speedup_vs_cache_aware:Q", format=".2f"),
                 alt.Tooltip("ttft_mean_s:Q", format=".3f")],
    )
    x = alt.X("speedup_vs_cache_aware:Q", title="speedup of mean TTFT vs cache_aware (x, log)",
              scale=alt.Scale(type="log", domain=[0.25, 4]),
              axis=alt.Axis(values=[0.25, 0.5, 1, 2, 4], format="~g"))
    stem = alt.Chart().mark_rule(strokeWidth=3).encode(x=x, x2="one:Q", **enc)
    dot = alt.Chart().mark_point(filled=True, size=70).encode(x=x, **enc)
    one = alt.Chart().mark_rule(color="black", strokeDash=[4, 3]).encode(x="one:Q")
    return alt.layer(stem, dot, one, data=df).properties(width=260, height=150).facet(
        facet=alt.Facet("panel:N", sort=order, title=None, header=alt.Header(labelFontSize=12)),
        columns=PANELS_PER_ROW,
    ).properties(title="Speedup of mean TTFT vs SGLang cache_aware (x, log scale; right of 1 = faster)")


def ttft_cdf(requests: pd.DataFrame, title: str = "TTFT CDF") -> alt.Chart:
    """Empirical CDF of TTFT per policy (log x)."""
    frames = []
    for pol, g in requests.groupby("policy", sort=False, observed=True):
        t = np.sort(g["ttft_s"].to_numpy())
        frac = np.arange(1, len(t) + 1) / len(t)
        step = max(1, len(t) // 500)  # keep the spec small: ~500 points per policy
        keep = np.unique(np.r_[np.arange(0, len(t), step), len(t) - 1])
        frames.append(pd.DataFrame({"policy": pol, "ttft_s": np.maximum(t[keep], 1e-3),
                                    "fraction": frac[keep]}))
    df = pd.concat(frames, ignore_index=True)
    return alt.Chart(df).mark_line(interpolate="step-after").encode(
        x=alt.X("ttft_s:Q", scale=alt.Scale(type="log"), title="TTFT (s, log)"),
        y=alt.Y("fraction:Q", title="fraction of requests"),
        color=alt.Color("policy:N", sort=policy_order(df["policy"])),
    ).properties(width=420, height=260, title=title)


def control_chart(results: pd.DataFrame) -> alt.Chart:
    """Mean-TTFT change vs cache_aware on normal windows only (the control): ~0 means inert."""
    df, order = _panels(results[(results["dataset"] == "normal") & (results["policy"] != "cache_aware")])
    df["change_pct"] = 100 * df["ttft_mean_change_vs_cache_aware"]
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("policy:N", sort=policy_order(df["policy"]), title=None),
        x=alt.X("change_pct:Q", title="TTFT change (%)"),
        color=alt.condition("datum.change_pct > 0", alt.value("#c44e52"), alt.value("#4c72b0")),
        tooltip=["setup", "scheduler", "policy", alt.Tooltip("change_pct:Q", format=".2f")],
    ).properties(width=260, height=130).facet(
        facet=alt.Facet("panel:N", sort=order, title=None, header=alt.Header(labelFontSize=12)),
        columns=PANELS_PER_ROW,
    ).properties(title="Control: mean TTFT change (%) vs cache_aware on normal windows only (BTB must show 0)")


#: Axis titles for sweep parameters (BTB's X, Y, Z, M) and other columns.
PARAM_TITLES = {"x_repeats": "X: arrivals to detect a burst", "y_tokens": "Y: prefix tokens",
                "z_s": "Z: detection window (s)", "m_replicas": "M: copies per active prefix",
                "replicas": "replicas"}


def sweep_heatmap(summary: pd.DataFrame, x: str, y: str | None, value: str, title: str,
                  fmt: str = ".2f", scheme: str = "viridis", zero_based: bool = False) -> alt.Chart:
    """Heatmap of ``value`` over parameters ``x`` and ``y`` (btb rows of a sweep summary).

    ``y=None``: one row of cells over ``x`` (a one-parameter sweep), with no y axis.
    ``zero_based``: the colour scale starts at 0 (counts), so all-zero cells are the lightest colour.
    """
    df = summary[summary["policy"] == "btb"].copy()
    enc = {"x": alt.X(f"{x}:O", title=PARAM_TITLES.get(x, x), axis=alt.Axis(labelAngle=0))}
    if y is not None:
        enc["y"] = alt.Y(f"{y}:O", title=PARAM_TITLES.get(y, y))
    base = alt.Chart(df).encode(**enc)
    scale = alt.Scale(scheme=scheme)
    if zero_based:
        scale = alt.Scale(scheme=scheme, domain=[0, max(1.0, float(df[value].max()) if len(df) else 1.0)])
    cells = base.mark_rect().encode(color=alt.Color(f"{value}:Q", scale=scale, title=None))
    text = base.mark_text(fontSize=11).encode(text=alt.Text(f"{value}:Q", format=fmt),
                                             color=alt.value("black" if zero_based else "white"))
    return (cells + text).properties(width=200, height=160 if y is not None else 50, title=title)


def explorer_chart(queue: pd.DataFrame, transfers: pd.DataFrame, cdf_requests: pd.DataFrame,
                   title: str) -> alt.VConcatChart:
    """Threshold explorer: BTB per-replica queue length with copy landings, and TTFT CDFs."""
    q = alt.Chart(queue).mark_line(interpolate="step-after").encode(
        x=alt.X("time_s:Q", title="time in window (s)",
                axis=alt.Axis(tickCount=8, labelOverlap="greedy", labelSeparation=8)),
        y=alt.Y("queue_length:Q", title="waiting requests"),
        color=alt.Color("replica:N"),
    ).properties(width=520, height=170, title="BTB: waiting requests per replica; black ticks = copies landing")
    layers = [q]
    if len(transfers):
        ticks = alt.Chart(transfers).mark_tick(thickness=2, size=14, color="black").encode(
            x="end_s:Q", y=alt.value(165), tooltip=["src", "dst", "end_s", "served_requests"])
        layers.append(ticks)
    return alt.vconcat(alt.layer(*layers), ttft_cdf(cdf_requests, "TTFT CDF: cache_aware vs btb")
                       ).resolve_scale(color="independent").properties(title=title)


def sweep_pair(summary: pd.DataFrame, x: str, y: str | None = None) -> alt.HConcatChart:
    """Side-by-side heatmaps of speedup vs cache_aware and of unused copies over ``x`` x ``y``
    (``y=None``: over ``x`` alone, one row)."""
    return alt.hconcat(
        sweep_heatmap(summary, x, y, "speedup_vs_cache_aware", "speedup of mean TTFT vs cache_aware (x)"),
        sweep_heatmap(summary, x, y, "copies_unused", "copies that served no request", fmt=".0f",
                      scheme="reds", zero_based=True),
    ).resolve_scale(color="independent")
