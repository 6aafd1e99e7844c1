"""Charts of the real-engine validation (notebook 07). Builders take plain tables.

Tables come from :mod:`btb_core.engine.validation` (``ValidationResult.requests`` / ``.summary``) and
:func:`btb_core.engine.calibrate.fit_table`.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from . import policy_order


def calibration_chart(fit: pd.DataFrame, curve: pd.DataFrame) -> alt.HConcatChart:
    """Measured TTFT (points) and the fitted model (lines): cold vs prompt length, and warm vs
    cached context at a fixed number of new tokens.

    Parameters
    ----------
    fit : DataFrame
        :func:`~btb_core.engine.calibrate.fit_table`: ``kind``, ``input_length``,
        ``cached_tokens``, ``new_tokens``, ``ttft_s``, ``fitted_ttft_s``.
    curve : DataFrame
        Fitted curves: ``kind``, ``new_tokens``, ``cached_tokens``, ``input_length``,
        ``fitted_ttft_s`` (dense grid).
    """
    cold = fit[fit["kind"] == "cold"]
    warm = fit[fit["kind"] == "cached"].assign(series=lambda d: d["new_tokens"].map("{} new tokens".format))
    cold_curve = curve[curve["kind"] == "cold"]
    warm_curve = curve[curve["kind"] == "cached"].assign(
        series=lambda d: d["new_tokens"].map("{} new tokens".format))
    left = (alt.Chart(cold_curve).mark_line(color="#4c78a8")
            .encode(x=alt.X("input_length:Q", title="prompt length (tokens), cold"),
                    y=alt.Y("fitted_ttft_s:Q", title="TTFT (s)"))
            + alt.Chart(cold).mark_point(filled=True, size=60, color="#e45756")
            .encode(x="input_length:Q", y="ttft_s:Q",
                    tooltip=["input_length", alt.Tooltip("ttft_s:Q", format=".3f"),
                             alt.Tooltip("fitted_ttft_s:Q", format=".3f")])
            ).properties(width=300, height=260, title="Cold prompt: measured (points), fitted (line)")
    # legend in numeric order (256, 1024, 2048 new tokens), not as text
    order = [f"{n} new tokens" for n in sorted(set(warm_curve["new_tokens"]) | set(warm["new_tokens"]))]
    right = (alt.Chart(warm_curve).mark_line()
             .encode(x=alt.X("cached_tokens:Q", title="cached context (tokens)"),
                     y=alt.Y("fitted_ttft_s:Q", title="TTFT (s)"),
                     color=alt.Color("series:N", title=None, sort=order))
             + alt.Chart(warm).mark_point(filled=True, size=60)
             .encode(x="cached_tokens:Q", y="ttft_s:Q", color=alt.Color("series:N", sort=order),
                     tooltip=["cached_tokens", "new_tokens", alt.Tooltip("ttft_s:Q", format=".3f"),
                              alt.Tooltip("fitted_ttft_s:Q", format=".3f")])
             ).properties(width=300, height=260, title="New tokens after a cached prefix")
    return alt.hconcat(left, right).resolve_scale(color="independent")


def scatter_chart(requests: pd.DataFrame) -> alt.FacetChart:
    """Simulated vs real TTFT per request, one panel per server count, colour = policy, with the
    y = x line. ``requests``: ``policy``, ``num_replicas``, ``ttft_s``, ``sim_ttft_s``."""
    df = requests.copy()
    df["servers"] = df["num_replicas"].map(lambda n: f"{n} server{'s' if n > 1 else ''}")
    lim = float(max(df["ttft_s"].max(), df["sim_ttft_s"].max())) * 1.05
    diag = pd.DataFrame({"x": [0.0, lim], "y": [0.0, lim]})
    order = policy_order(df["policy"])
    base = alt.Chart().mark_circle(size=28, opacity=0.65).encode(
        x=alt.X("ttft_s:Q", title="real TTFT (s)", scale=alt.Scale(domain=[0, lim])),
        y=alt.Y("sim_ttft_s:Q", title="simulated TTFT (s)", scale=alt.Scale(domain=[0, lim])),
        color=alt.Color("policy:N", sort=order, title="policy"),
        tooltip=["policy", "request_id", "replica", "input_length", "cached_tokens",
                 alt.Tooltip("ttft_s:Q", format=".3f"), alt.Tooltip("sim_ttft_s:Q", format=".3f")])
    line = alt.Chart(diag).mark_line(color="grey", strokeDash=[4, 4]).encode(x="x:Q", y="y:Q")
    return (alt.layer(line, base, data=df).properties(width=280, height=280)
            .facet(column=alt.Column("servers:N", title=None))
            .properties(title="Per request: simulated vs real TTFT (dashed: equal)"))


def policy_chart(summary: pd.DataFrame, requests: pd.DataFrame | None = None) -> alt.FacetChart:
    """Mean TTFT per policy, real vs simulated, one panel per server count.

    With ``requests`` (per-request rows with a ``repeat`` column, :func:`validate`'s
    ``requests``) and more than one repeat, each real run's mean TTFT is drawn as a black dot on
    the real bar: the spread of the dots is the engine's own run-to-run noise.
    """
    long = summary.melt(id_vars=["num_replicas", "policy"],
                        value_vars=["ttft_mean_real_s", "ttft_mean_sim_s"],
                        var_name="source", value_name="ttft_mean_s")
    long["source"] = long["source"].map({"ttft_mean_real_s": "real (vLLM)",
                                         "ttft_mean_sim_s": "simulated"})
    long["run"] = "pooled"
    if requests is not None and "repeat" in requests and requests["repeat"].nunique() > 1:
        runs = (requests.groupby(["num_replicas", "policy", "repeat"], sort=False)["ttft_s"].mean()
                .rename("ttft_mean_s").reset_index())
        runs["source"] = "real (vLLM)"
        runs["run"] = runs["repeat"].map(lambda k: f"run {int(k) + 1}")
        long = pd.concat([long, runs.drop(columns=["repeat"])], ignore_index=True)
    long["servers"] = long["num_replicas"].map(lambda n: f"{n} server{'s' if n > 1 else ''}")
    order = policy_order(long["policy"])
    base = alt.Chart().encode(x=alt.X("policy:N", sort=order, title=None),
                              xOffset=alt.XOffset("source:N"),
                              y=alt.Y("ttft_mean_s:Q", title="mean TTFT (s)"))
    bars = (base.mark_bar().transform_filter(alt.datum.run == "pooled")
            .encode(color=alt.Color("source:N", title=None,
                                    scale=alt.Scale(range=["#4c78a8", "#f58518"])),
                    tooltip=["policy", "source", alt.Tooltip("ttft_mean_s:Q", format=".3f")]))
    dots = (base.mark_point(filled=True, color="black", size=30)
            .transform_filter(alt.datum.run != "pooled")
            .encode(tooltip=["policy", "run", alt.Tooltip("ttft_mean_s:Q", format=".3f")]))
    return (alt.layer(bars, dots, data=long).properties(width=260, height=240)
            .facet(column=alt.Column("servers:N", title=None))
            .properties(title="Mean TTFT per policy: real vs simulated (dots: each real run)"))


__all__ = ["calibration_chart", "policy_chart", "scatter_chart"]
