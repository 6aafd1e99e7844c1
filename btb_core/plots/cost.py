"""Charts for the cost model (notebook 00). Each builder takes a plain table and returns altair.

Tables come from :mod:`btb_core.cost` (``time_vs_tokens``, ``attention_share_table``) and
:mod:`btb_core.anchors` (``compare_prefill``, ``load_vidur_gemm``).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

_LOG = alt.Scale(type="log")
_TP_COLORS = alt.Scale(scheme="category10")


def _log_x(series: pd.Series, field: str, title: str) -> alt.X:
    """A log x axis fitted to the data, with round ticks that do not collide."""
    lo, hi = float(series.min()), float(series.max())
    ticks = [v for v in (1, 10, 100, 500, 1_000, 2_000, 8_000, 32_000, 128_000, 512_000)
             if lo <= v <= hi]
    return alt.X(f"{field}:Q", title=title,
                 scale=alt.Scale(type="log", domain=[lo, hi], nice=False),
                 axis=alt.Axis(values=ticks, format="~s"))


def time_vs_prefix_chart(long: pd.DataFrame, title: str = "") -> alt.Chart:
    """Log-log lines of time (ms) vs prefix length, one per source.

    Parameters
    ----------
    long : DataFrame
        Columns ``tokens``, ``source``, ``ms`` (:func:`btb_core.cost.time_vs_tokens`).
    """
    sources = list(dict.fromkeys(long["source"]))
    return (alt.Chart(long, title=title or "Time to make a prefix's KV usable")
            .mark_line(strokeWidth=2.5)
            .encode(x=_log_x(long["tokens"], "tokens", "prefix length (tokens)"),
                    y=alt.Y("ms:Q", scale=_LOG, title="time (ms)"),
                    color=alt.Color("source:N", sort=sources, title=None),
                    tooltip=["source", "tokens", alt.Tooltip("ms:Q", format=",.3g")])
            .properties(width=520, height=340))


def attention_share_chart(shares: pd.DataFrame) -> alt.Chart:
    """Attention share of prefill FLOPs vs prefix length, one line per model.

    Parameters
    ----------
    shares : DataFrame
        Columns ``model``, ``tokens``, ``attention_share``
        (:func:`btb_core.cost.attention_share_table`).
    """
    base = alt.Chart(shares, title="Attention share of prefill FLOPs (cold prefix)")
    line = base.mark_line(point=True).encode(
        x=_log_x(shares["tokens"], "tokens", "prefix length (tokens)"),
        y=alt.Y("attention_share:Q", axis=alt.Axis(format="%"), title="share of FLOPs"),
        color=alt.Color("model:N", title=None),
        tooltip=["model", "tokens", alt.Tooltip("attention_share:Q", format=".1%")])
    return line.properties(width=520, height=300)


def prefill_anchor_chart(compared: pd.DataFrame, title: str = "") -> alt.Chart:
    """Measured prefill (points) vs the model (lines), log-log, coloured by TP degree.

    Parameters
    ----------
    compared : DataFrame
        Columns ``tensor_parallel``, ``prompt_tokens``, ``prefill_ms`` (measured), ``model_ms``
        and ``label`` (which model line, e.g. ``"model, MFU 0.32"``); rows with the same measured
        point may repeat once per label.
    """
    tp = alt.Color("tensor_parallel:N", title="TP", scale=_TP_COLORS)
    lengths = sorted(int(v) for v in compared["prompt_tokens"].unique())
    # ticks at the measured prompt lengths (powers of two: 1k = 1,024), padded so no point sits on
    # the frame
    x = alt.X("prompt_tokens:Q", title="prompt tokens (k = 1,024)",
              scale=alt.Scale(type="log", domain=[lengths[0] / 1.2, lengths[-1] * 1.2], nice=False),
              axis=alt.Axis(values=lengths, labelExpr="datum.value >= 1024 ? "
                            "format(datum.value / 1024, '~g') + 'k' : datum.value"))
    measured = (alt.Chart(compared.drop_duplicates(["tensor_parallel", "prompt_tokens"]))
                .mark_point(size=70, filled=True)
                .encode(x=x, y=alt.Y("prefill_ms:Q", scale=_LOG, title="prefill time (ms)"),
                        color=tp, tooltip=["tensor_parallel", "prompt_tokens",
                                           alt.Tooltip("prefill_ms:Q", format=",.0f")]))
    model = (alt.Chart(compared).mark_line()
             .encode(x=x, y="model_ms:Q", color=tp,
                     strokeDash=alt.StrokeDash("label:N", title="model line")))
    return (measured + model).properties(
        width=520, height=340,
        title=title or "Llama-2-70B prefill on DGX-H100: Splitwise measured (points) vs cost model "
                       "(lines)")


def gemm_mfu_chart(gemm: pd.DataFrame, rules: dict[str, float] | None = None) -> alt.Chart:
    """Achieved GEMM MFU per layer vs tokens in the batch (Vidur kernels), by TP degree.

    Parameters
    ----------
    gemm : DataFrame
        Columns ``tensor_parallel``, ``tokens``, ``gemm_mfu``
        (:func:`btb_core.anchors.load_vidur_gemm`).
    rules : dict, optional
        Label -> MFU drawn as horizontal reference lines (e.g. the table's 0.5).
    """
    chart = (alt.Chart(gemm, title="Vidur: achieved GEMM MFU, Llama-2-70B layer on H100")
             .mark_line()
             .encode(x=_log_x(gemm["tokens"], "tokens", "tokens in the batch"),
                     y=alt.Y("gemm_mfu:Q", title="GEMM FLOPs / dense peak",
                             scale=alt.Scale(domain=[0, 1])),
                     color=alt.Color("tensor_parallel:N", title="TP", scale=_TP_COLORS)))
    if rules:
        df = pd.DataFrame({"label": list(rules), "mfu": list(rules.values())})
        rule = alt.Chart(df).mark_rule(strokeDash=[4, 3], color="gray").encode(y="mfu:Q")
        text = alt.Chart(df).mark_text(align="left", dx=4, dy=-6, color="gray").encode(
            y="mfu:Q", x=alt.value(4), text="label:N")
        chart = chart + rule + text
    return chart.properties(width=520, height=300)


__all__ = ["time_vs_prefix_chart", "attention_share_chart", "prefill_anchor_chart",
           "gemm_mfu_chart"]
