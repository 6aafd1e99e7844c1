"""Cost model: the published linear table, the attention share, closed forms and invariants."""

import dataclasses

import pandas as pd

import pytest
from hypothesis import given, settings, strategies as st

from btb_core.cost import (DEFAULT_SETUP_LATENCY_S, REFERENCE_SETUP, TIERS, CostModel,
                           cost_model_for_setup, ratios, reference_cost_model)
from btb_core.errors import ConfigError
from btb_core.specs import GPUS, MODELS, SETUPS, NodeSpec


@pytest.fixture(scope="module")
def ref():
    return reference_cost_model()


@pytest.fixture(scope="module")
def std():
    return cost_model_for_setup("70b_h100x4")


def test_reference_table_reproduces_published_numbers(ref):
    # Published linear table (issue 3): 71.4 us/token; at 8,000 tokens prefill 571 ms,
    # RDMA 13.1 ms, DRAM 11.9 ms, NVMe 374 ms, HBM 0.196 ms.
    assert round(ref.prefill_s(1) * 1e6, 1) == 71.4
    assert round(ref.prefill_s(8000) * 1e3) == 571
    assert round(ref.load_s("rdma", 8000) * 1e3, 1) == 13.1
    assert round(ref.load_s("dram", 8000) * 1e3, 1) == 11.9
    assert round(ref.load_s("nvme", 8000) * 1e3) == 374
    assert round(ref.load_s("hbm", 8000) * 1e3, 3) == 0.196
    # exact closed forms behind them
    assert ref.prefill_s(8000) == pytest.approx(2 * 70.6e9 * 8000 / (4 * 989e12 * 0.5))
    assert ref.load_s("rdma", 8000) == pytest.approx(8000 * 327_680 / 200e9)


def test_reference_is_reachable_by_name(ref):
    assert cost_model_for_setup(REFERENCE_SETUP).prefill_s(8000) == ref.prefill_s(8000)


def test_attention_share_llama70b(std):
    # DESIGN.md section 3: 7% of prefill FLOPs at 8k tokens, 24% at 32k, 39% at 64k.
    assert round(100 * std.attention_share(8192)) == 7
    assert round(100 * std.attention_share(32768)) == 24
    assert round(100 * std.attention_share(65536)) == 39
    assert std.replace(attention=False).attention_share(65536) == 0.0


def test_prefill_flops_closed_form(std):
    m = std.model
    s, c = 1000, 3000
    lin = 2 * m.matmul_params_active * s
    attn = 4 * m.num_layers * m.num_q_heads * m.head_dim * (s * c + s * s / 2)
    assert std.prefill_flops(s, c) == pytest.approx(lin + attn)
    assert std.prefill_s(s, c) == pytest.approx((lin + attn) / (4 * 989.4e12 * 0.5))
    assert std.compute_s(1.9788e15) == pytest.approx(1.0)
    assert std.prefill_flops(0, 5000) == 0


def test_decode_step_memory_and_compute_bound(std):
    bw = 4 * 3.35e12 * 0.8
    weights = 2 * 70_553_706_496
    assert std.decode_step_s(1, 0) == pytest.approx(weights / bw)
    assert std.decode_step_s(8, 10_000) == pytest.approx((weights + 10_000 * 327_680) / bw)
    big = 100_000  # 2 x P x b / (peak x mfu) beats the memory time
    assert std.decode_step_s(big, 0) == pytest.approx(2 * 70_553_706_496 * big / (4 * 989.4e12 * 0.5))


def test_load_latency_and_unknown_tier(std):
    for tier in TIERS:
        assert std.load_s(tier, 0) == DEFAULT_SETUP_LATENCY_S[tier]
    with pytest.raises(ValueError, match="ssd"):
        std.load_s("ssd", 10)


def test_kv_budget_standard_setup(std):
    # 320 GB HBM - 141.1 GB weights - 32 GB reserve
    assert std.kv_budget_bytes() == int(320e9 - 2 * 70_553_706_496 - 32e9)
    assert std.kv_capacity_tokens() == std.kv_budget_bytes() // 327_680


def test_model_that_does_not_fit_names_model_node_and_bytes():
    cm = cost_model_for_setup("kimi_k2_h100x8")
    with pytest.raises(ConfigError, match=r"Kimi-K2.*8x H100-SXM.*1,026,408,232,448 B.*640,000,000,000 B"):
        cm.check_fits()
    cost_model_for_setup("kimi_k2_b200x8").check_fits()


@pytest.mark.parametrize("field,value", [("mfu", 0.0), ("mfu", 1.5), ("mbu", -0.1), ("mbu", 2)])
def test_invalid_efficiency_raises(field, value):
    with pytest.raises(ConfigError, match=field):
        cost_model_for_setup("70b_h100x4", **{field: value})


@pytest.mark.parametrize("field", ["step_overhead_s", "context_s_per_token", "arrival_overhead_s"])
@pytest.mark.parametrize("value, match", [(-1e-3, ">= 0 seconds"), (float("nan"), ">= 0 seconds"),
                                          (float("inf"), "finite"), (True, "a number"),
                                          ("5", "a number"), (None, "a number")])
def test_invalid_engine_terms_raise(field, value, match):
    with pytest.raises(ConfigError, match=f"field {field} must be .*{match}"):
        cost_model_for_setup("70b_h100x4", **{field: value})


def test_numpy_scalars_are_accepted_and_stored_as_float():
    # np.float32 / np.int64 (what a fit or a parquet column hands over) are numbers like any other
    import numpy as np

    cm = cost_model_for_setup("70b_h100x4", mfu=np.float32(0.5), step_overhead_s=np.int64(0),
                              arrival_overhead_s=np.float64(0.004))
    assert type(cm.mfu) is float and cm.mfu == 0.5 and cm.step_overhead_s == 0.0
    assert cm.prefill_s(1000) == cost_model_for_setup("70b_h100x4", mfu=0.5).prefill_s(1000)
    with pytest.raises(ConfigError, match="mfu must be a number"):
        cost_model_for_setup("70b_h100x4", mfu=np.bool_(True))


def test_invalid_latency_raises():
    with pytest.raises(ConfigError, match="nvme"):
        cost_model_for_setup("70b_h100x4", setup_latency_s={"nvme": -1})
    with pytest.raises(ConfigError, match="ssd"):
        cost_model_for_setup("70b_h100x4", setup_latency_s={"ssd": 0})


def test_unknown_setup_lists_valid_names():
    with pytest.raises(KeyError, match="70b_h100x4"):
        cost_model_for_setup("nope")


def test_every_setup_builds():
    for name in SETUPS:
        cm = cost_model_for_setup(name)
        assert cm.prefill_s(1000) > cm.load_s("rdma", 1000) > cm.load_s("hbm", 1000)


def test_table_rows_and_ratios(ref):
    rows = ref.table_rows([8000])
    assert set(rows[0]) == {"tokens", "prefill_ms", "hbm_ms", "dram_ms", "rdma_ms", "nvme_ms"}
    r = ratios(rows)
    assert r["prefill_over_rdma"][0] == pytest.approx(571.08 / 13.1072, rel=1e-4)


@settings(max_examples=200, deadline=None)
@given(s=st.integers(1, 200_000), c=st.integers(0, 200_000), extra=st.integers(1, 10_000))
def test_prefill_monotone_and_attention_adds(s, c, extra):
    cm = cost_model_for_setup("70b_h100x4")
    lin = cm.replace(attention=False)
    assert cm.prefill_s(s + extra, c) > cm.prefill_s(s, c)
    assert cm.prefill_s(s, c + extra) > cm.prefill_s(s, c)
    assert cm.prefill_s(s, c) >= lin.prefill_s(s, c)
    assert lin.prefill_s(s, c) == pytest.approx(lin.prefill_s(s, 0))
    # splitting a prefill into two chunks costs the same FLOPs (the S x C term accounts for it)
    assert cm.prefill_flops(s, c) + cm.prefill_flops(extra, c + s) == pytest.approx(
        cm.prefill_flops(s + extra, c), rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(tokens=st.integers(0, 10**6), n=st.integers(1, 16))
def test_load_scales_with_gpus_except_shared_disk(tokens, n):
    one = CostModel(MODELS["llama-3.3-70b"], NodeSpec(GPUS["h100"], 1))
    many = CostModel(MODELS["llama-3.3-70b"], NodeSpec(GPUS["h100"], n))
    lat = DEFAULT_SETUP_LATENCY_S
    assert many.load_s("rdma", tokens) - lat["rdma"] == pytest.approx(
        (one.load_s("rdma", tokens) - lat["rdma"]) / n)
    assert many.load_s("nvme", tokens) == pytest.approx(one.load_s("nvme", tokens))


def test_frozen():
    cm = cost_model_for_setup("70b_h100x4")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cm.mfu = 0.3


# --- measured anchors (btb_core.anchors) --------------------------------------------------------

from btb_core import anchors  # noqa: E402
from btb_core.errors import TraceError  # noqa: E402


@pytest.fixture(scope="module")
def splitwise():
    return anchors.load_splitwise()


def test_splitwise_tp4_8k_is_954_ms_and_mfu_032(splitwise):
    # data/profiles/splitwise-sim/SOURCE.md: TP4 8k prefill 954 ms -> effective MFU ~0.32
    pt = anchors.effective_mfu(splitwise).query("tensor_parallel == 4 and prompt_tokens == 8192")
    assert round(float(pt["prefill_ms"].iloc[0])) == 954
    assert round(float(pt["mfu_eff"].iloc[0]), 3) == 0.320
    assert set(splitwise["tensor_parallel"]) == {2, 4, 8}
    assert (splitwise["repeats"] >= 3).all()


def test_splitwise_fitted_mfu_per_tp_pinned(splitwise):
    fits = anchors.fit_mfu_per_tp(splitwise).set_index("tensor_parallel")["mfu_fit"].round(3)
    assert fits.to_dict() == {2: 0.458, 4: 0.334, 8: 0.213}
    assert round(anchors.fit_mfu(splitwise), 2) == 0.32


def test_fit_recovers_the_mfu_of_synthetic_points():
    cm = anchors.cost_model_for_anchor("h100", 4, mfu=0.4)
    fake = pd.DataFrame({"tensor_parallel": [4, 4, 4], "prompt_tokens": [1024, 4096, 8192]})
    fake["prefill_ms"] = [1e3 * cm.prefill_s(s) for s in fake["prompt_tokens"]]
    assert anchors.fit_mfu(fake) == pytest.approx(0.4)
    cmp = anchors.compare_prefill(fake, 0.4)
    assert cmp["error_pct"].abs().max() < 1e-9


def test_vidur_gemm_mfu_is_070_to_075_above_2k():
    summary = anchors.gemm_mfu_summary(anchors.load_vidur_gemm())
    assert summary["gemm_mfu_median"].between(0.68, 0.75).all()
    assert round(float(summary.set_index("tensor_parallel").loc[4, "gemm_mfu_median"]), 2) == 0.72


def test_send_recv_64mib_across_nodes_is_36_gb_s():
    sr = anchors.load_send_recv()
    last = sr.iloc[-1]
    assert last["size_bytes"] == 64 * 2**20
    assert round(last["bytes_per_s"] / 1e9) == 36


def test_bad_profile_names_file_line_field_value(tmp_path):
    path = tmp_path / "perf.csv"
    path.write_text("model,hardware,prompt_size,batch_size,prompt_time,tensor_parallel\n"
                    "llama2-70b,h100-80gb,1024,1,100.0,4\n"
                    "llama2-70b,h100-80gb,2048,1,-5,4\n")
    with pytest.raises(TraceError, match=r"perf.csv: line 3, field prompt_time.*-5"):
        anchors.load_splitwise(path)
    path.write_text("model,hardware,prompt_size\nx,y,1\n")
    with pytest.raises(TraceError, match="missing column"):
        anchors.load_splitwise(path)
    with pytest.raises(FileNotFoundError):
        anchors.load_splitwise(tmp_path / "nope.csv")


def test_cost_table_with_and_without_attention(std):
    from btb_core.cost import cost_table

    df = cost_table(std, [8192, 65536])
    assert (df["prefill_ms"] > df["prefill_linear_ms"]).all()
    assert df["attention_share"].round(2).tolist() == [0.07, 0.39]
    assert df["prefill_ms"].iloc[0] == pytest.approx(1e3 * std.prefill_s(8192))
