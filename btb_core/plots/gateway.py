"""Chart of ``btb gateway-check`` results (notebook 03): agreement of our ``cache_aware`` with the
real SGLang Model Gateway. Builders take plain pandas tables only."""

from __future__ import annotations

import altair as alt
import pandas as pd


def agreement_chart(summary: pd.DataFrame,
                    title: str = "Our cache_aware vs the real SGLang gateway") -> alt.Chart:
    """Step and replay agreement (fraction of requests) per trace and cache_aware variant.

    Parameters
    ----------
    summary : DataFrame
        Columns ``trace, variant, step_agreement, replay_agreement`` (fractions in [0, 1]), e.g.
        :attr:`btb_core.gateway_check.GatewayCheck.summary` with a ``trace`` column added.
    """
    long = summary.melt(id_vars=["trace", "variant"],
                        value_vars=["step_agreement", "replay_agreement"],
                        var_name="measure", value_name="agreement")
    long["measure"] = long["measure"].str.replace("_agreement", "", regex=False)
    base = alt.Chart(long).encode(
        y=alt.Y("variant:N", title=None),
        x=alt.X("agreement:Q", title="requests routed as the gateway did",
                scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%")),
        color=alt.Color("measure:N", title="agreement",
                        scale=alt.Scale(domain=["step", "replay"], range=["#264653", "#f2a541"])),
        yOffset=alt.YOffset("measure:N", sort=["step", "replay"]),
        tooltip=["trace", "variant", "measure", alt.Tooltip("agreement:Q", format=".1%")],
    )
    bars = base.mark_bar().properties(width=260, height=90)
    labels = base.mark_text(align="left", dx=3, fontSize=10).encode(
        text=alt.Text("agreement:Q", format=".1%"), color=alt.value("black"))
    return (bars + labels).facet(row=alt.Row("trace:N", title=None, header=alt.Header(
        labelAngle=0, labelOrient="top", labelAnchor="start", labelFontWeight="bold"))).properties(title=title)


__all__ = ["agreement_chart"]
