"""Chart builders: at most three panels per row, no empty panels, human names, table formats."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from btb_core import audit
from btb_core.plots import (column_decimals, setup_label, tidy, trace_label, with_subtitle)
from btb_core.plots import audit as audit_plots
from btb_core.plots.cluster_conditions import admission_bars, loop_bars
from btb_core.plots.experiment import sweep_pair
from btb_core.plots.routers import copy_frames_chart
from btb_core.trace import load_trace, shipped_traces


def _fanout_rows(trace, has_ids):
    rows = []
    for w in (10.0, 60.0):
        for d in (1024, 4096, 8192):
            rows.append({"trace": trace, "exclude_sessions": False, "window_s": w, "depth_tokens": d,
                         "max_fanout": (3 if w == 10 else 5) if has_ids else pd.NA,
                         "keys_at_max": 1 if has_ids else pd.NA,
                         "eligible_requests": 100 if has_ids else pd.NA})
    return rows


def _panels(spec):
    """Panel names of a faceted chart spec (the facet field's distinct values)."""
    field = spec["facet"]["field"]
    values = spec["datasets"][next(iter(spec["datasets"]))] if "datasets" in spec else spec["data"]["values"]
    return list(dict.fromkeys(v[field] for v in values))


def test_fanout_chart_no_empty_panels_three_per_row():
    names = ["conversation_trace", "synthetic_trace", "art_chat", "more",
             "AzureLLMInferenceTrace_code", "AzureLLMInferenceTrace_conv"]
    rows = sum((_fanout_rows(n, not n.startswith("Azure")) for n in names), [])
    fan = pd.DataFrame(rows)
    spec = audit_plots.fanout_chart(fan).to_dict()
    assert spec["columns"] == 3
    panels = _panels(spec)
    assert panels == ["Mooncake conversation", "Mooncake synthetic", "art_chat", "more"]
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "Azure LLM 2023 code" in subtitle and "Azure LLM 2023 conversation" in subtitle
    two = pd.DataFrame(sum((_fanout_rows(n, not n.startswith("Azure"))
                            for n in names[:2] + names[4:]), []))
    assert audit_plots.fanout_chart(two).to_dict()["columns"] == 2
    with pytest.raises(ValueError, match="1-3"):
        audit_plots.fanout_chart(fan, columns=4)
    with pytest.raises(ValueError, match="prefix hash ids"):
        audit_plots.fanout_chart(pd.DataFrame(_fanout_rows("AzureLLMInferenceTrace_code", False)))


def test_fanout_chart_on_the_shipped_traces():
    """The figure of notebook 01: the two Mooncake traces as panels, Azure named in the subtitle."""
    traces = [load_trace(p) for p in shipped_traces().values()]
    fan = audit.fanout_table(traces, (1024, 8192), (60.0,), (False,))
    spec = audit_plots.fanout_chart(fan).to_dict()
    assert _panels(spec) == ["Mooncake conversation", "Mooncake synthetic"]
    assert spec["columns"] == 2
    rates = pd.concat([audit.arrival_rate(t, 10.0) for t in traces], ignore_index=True)
    title = audit_plots.arrival_rate_chart(rates).to_dict()["title"]
    assert title == "Arrival rate of the public traces (requests/s, 10 s bins)"


def test_labels():
    assert trace_label("AzureLLMInferenceTrace_conv") == "Azure LLM 2023 conversation"
    assert trace_label("mine.jsonl") == "mine.jsonl"
    assert setup_label("70b_h100x4") == "Llama-3.3-70B on 4x H100-SXM"


def test_copy_frames_three_per_row():
    frames = pd.DataFrame([{"frame": f, "time_s": f * 1.5, "replica": r, "queue_length": r,
                            "copy_state": "none"} for f in range(7) for r in range(4)])
    assert copy_frames_chart(frames).to_dict()["columns"] == 3


def test_issue12_charts_name_metrics_with_units():
    loops = pd.DataFrame({"policy": ["btb", "btb"], "loop": ["open", "closed"],
                          "ttft_mean_s": [1.0, 2.0], "session_duration_mean_s": [3.0, 4.0],
                          "hit_fraction": [0.3, 0.4]})
    text = loop_bars(loops).to_json()
    assert "mean session duration (s)" in text and "session_duration_mean_s\"" not in text.replace(
        '"field": "session_duration_mean_s"', "")
    adm = pd.DataFrame({"policy": ["btb"] * 2, "kv_admission": ["reserve", "paged"], "preemptions": [0, 3],
                        "ttft_mean_s": [1.0, 2.0], "e2e_mean_s": [3.0, 4.0]})
    text = admission_bars(adm).to_json()
    assert "mean end-to-end latency (s)" in text and "mean TTFT (s)" in text


def test_one_parameter_sweep_has_no_y_axis():
    s = pd.DataFrame({"policy": ["btb"] * 3, "m_replicas": [1, 2, 3],
                      "speedup_vs_cache_aware": [1.4, 1.4, 1.5], "copies_unused": [0, 0, 0]})
    spec = sweep_pair(s, "m_replicas").to_dict()
    for panel in spec["hconcat"]:
        assert "y" not in panel["layer"][0]["encoding"]


def test_with_subtitle_keeps_title_and_subtitle():
    import altair as alt

    c = alt.Chart(pd.DataFrame({"a": [1]})).mark_point().properties(
        title=alt.TitleParams("T", subtitle="first"))
    t = with_subtitle(c, "Llama-3.3-70B on 4x H100-SXM").to_dict()["title"]
    assert t["text"] == "T" and t["subtitle"] == ["first", "Llama-3.3-70B on 4x H100-SXM"]
    assert with_subtitle(c.properties(title="plain"), "x").to_dict()["title"]["subtitle"] == ["x"]
    untitled = alt.hconcat(alt.Chart(pd.DataFrame({"a": [1]})).mark_point())
    assert with_subtitle(untitled, "x").to_dict()["title"]["text"] == "x"  # never an empty title


def test_tidy_one_precision_per_column_integers_as_integers():
    df = pd.DataFrame({"hbm_ms": [0.01223, 3.13], "prefill_ms": [34.76, 19710.4],
                       "requests": [1.0, 500.0], "gaps": [2.0, np.nan], "name": ["a", "b"]})
    html = tidy(df, "auto").to_html()
    assert "0.0122" in html and "3.1300" in html            # one precision: 4 decimals
    assert "19,710.4" in html and "34.8" in html             # 1 decimal, thousands separator
    assert ">500<" in html and ">1<" in html and "500.0" not in html   # counts stored as float
    assert ">2<" in html and "2.0" not in html and "e+" not in html
    plain = tidy(df, 2).to_html()
    assert "0.01" in plain and "19,710.40" in plain
    idx = tidy(pd.DataFrame({"n": [1, 2]}, index=pd.Index([1.0, 0.5], name="window_s"))).to_html()
    assert ">1<" in idx and ">0.5<" in idx and "1.000000" not in idx
    ratios = tidy(pd.DataFrame({"best": [1.0, 1.0], "other": [1.13, 4.05]}), 2, whole_as_int=False)
    assert ratios.to_html().count(">1.00<") == 2
    assert column_decimals([0.0, 0.0]) == 0 and column_decimals([1e-9]) == 6
    assert list(tidy(df, None)["requests"]) == [1, 500]


def test_engine_policy_chart_draws_each_real_run_as_a_dot():
    import pandas as pd

    from btb_core.plots.engine import policy_chart

    summary = pd.DataFrame({"num_replicas": [2], "policy": ["round_robin"],
                            "ttft_mean_real_s": [1.5], "ttft_mean_sim_s": [1.4]})
    reqs = pd.DataFrame({"num_replicas": 2, "policy": "round_robin", "repeat": [0, 0, 1, 1],
                         "ttft_s": [1.0, 1.2, 1.8, 2.0]})
    spec = policy_chart(summary, reqs).to_dict()
    rows = next(iter(spec["datasets"].values()))
    runs = sorted((r["run"], round(r["ttft_mean_s"], 6)) for r in rows if r["run"] != "pooled")
    assert runs == [("run 1", 1.1), ("run 2", 1.9)]
    marks = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
             for layer in spec["spec"]["layer"]]
    assert marks == ["bar", "point"]
    # one repeat: no dots
    one = policy_chart(summary, reqs[reqs["repeat"] == 0]).to_dict()
    assert all(r["run"] == "pooled" for r in next(iter(one["datasets"].values())))
