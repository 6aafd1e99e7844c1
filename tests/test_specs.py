"""Specs: presets match their published configs; invalid specs raise ConfigError."""

import dataclasses

import pytest

from btb_core.errors import ConfigError
from btb_core.specs import (GPUS, MODELS, SETUPS, GPUSpec, ModelSpec, NodeSpec, dense_params,
                            model_for, node_for)


def test_llama70b_kv_bytes_per_token_is_320_kib():
    # 2 x 80 layers x 8 KV heads x 128 head-dim x 2 B (DESIGN.md section 1)
    assert MODELS["llama-3.3-70b"].kv_bytes_per_token == 327_680


def test_llama70b_param_count_from_hf_config():
    # HF model page rounds this count to "70.6B params".
    m = MODELS["llama-3.3-70b"]
    assert m.params_total == 70_553_706_496
    assert m.embedding_params == 2 * 128256 * 8192
    assert m.weight_bytes == 2 * 70_553_706_496
    assert round(m.params_total / 1e9, 1) == 70.6


def test_qwen3_8b_counts_match_model_card():
    # Model card: 8.2B parameters, 6.95B non-embedding.
    m = MODELS["qwen3-8b"]
    assert round(m.params_total / 1e9, 1) == 8.2
    assert round(m.matmul_params_active / 1e9, 2) == 6.95
    assert m.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2


def test_moe_presets_totals_and_active():
    glm, kimi = MODELS["glm-4.5"], MODELS["kimi-k2"]
    assert glm.is_moe and kimi.is_moe
    assert 350e9 < glm.params_total < 356e9 and 32e9 <= glm.params_active < 34e9
    assert 1.0e12 < kimi.params_total < 1.04e12 and 32e9 <= kimi.params_active < 33e9
    assert glm.weight_bytes == glm.params_total  # FP8 weights


def test_kimi_k2_mla_kv_is_the_latent():
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 B
    assert MODELS["kimi-k2"].kv_bytes_per_token == 61 * 576 * 2 == 70_272


def test_dense_params_closed_form_small_model():
    # 1 layer, hidden 4, 2 q heads x 2, 1 kv head x 2, ffn 8, vocab 10, untied
    total, emb = dense_params(1, 4, 2, 1, 2, 8, 10)
    layer = 4 * 4 + 2 * 4 * 2 + 4 * 4 + 3 * 4 * 8 + 2 * 4
    assert emb == 2 * 10 * 4
    assert total == layer + 4 + emb


def test_node_aggregates_and_shared_disk():
    node = NodeSpec(GPUS["h100"], 4, disk_shared=True)
    assert node.peak_flops == pytest.approx(4 * 989.4e12)
    assert node.hbm_bytes_per_s == pytest.approx(13.4e12)
    assert node.dram_bytes_per_s == pytest.approx(220e9)
    assert node.rdma_bytes_per_s == pytest.approx(200e9)
    assert node.nvme_bytes_per_s == pytest.approx(7e9)
    assert node.hbm_capacity_bytes == pytest.approx(320e9)
    assert NodeSpec(GPUS["h100"], 4, disk_shared=False).nvme_bytes_per_s == pytest.approx(28e9)


@pytest.mark.parametrize("field,value", [("peak_flops", 0), ("hbm_bytes_per_s", -1.0),
                                         ("hbm_capacity_bytes", 0.0), ("nic_bytes_per_s", 0),
                                         ("pcie_bytes_per_s", float("nan")),
                                         ("nvme_bytes_per_s", -7e9)])
def test_invalid_gpu_spec_names_field_and_value(field, value):
    with pytest.raises(ConfigError, match=field):
        dataclasses.replace(GPUS["h100"], **{field: value})


@pytest.mark.parametrize("num_gpus", [0, -1, 2.5])
def test_invalid_num_gpus(num_gpus):
    with pytest.raises(ConfigError, match="num_gpus"):
        NodeSpec(GPUS["h100"], num_gpus)


def test_invalid_model_spec():
    with pytest.raises(ConfigError, match="num_layers"):
        dataclasses.replace(MODELS["llama-3.3-70b"], num_layers=0)
    with pytest.raises(ConfigError, match="params_active"):
        dataclasses.replace(MODELS["qwen3-8b"], params_active=MODELS["qwen3-8b"].params_total + 1)


def test_setups_refer_to_presets_and_unknown_keys_list_valid_names():
    for model, gpu, n in SETUPS.values():
        assert model in MODELS and gpu in GPUS and n >= 1
    with pytest.raises(KeyError, match="llama-3.3-70b"):
        model_for("gpt-5")
    with pytest.raises(KeyError, match="h100"):
        node_for("tpu", 4)


def test_every_preset_cites_a_source():
    for spec in [*MODELS.values(), *GPUS.values()]:
        assert spec.source, spec.name
    assert isinstance(GPUS["h100"], GPUSpec) and isinstance(MODELS["kimi-k2"], ModelSpec)
