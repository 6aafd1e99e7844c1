"""`--linear` is the reference study's linear cost model, with its published constants.

The study's p95 TTFT, 4.697 s, is one uncontended cold prefill of a 65,792-token prompt (a 65,536-token
job prefix plus a 256-token suffix) at 70.6e9 parameters x 2 FLOP / token on 4 x 989e12 FLOP/s at
MFU 0.5: 65,792 x 2 x 70.6e9 / (4 x 989e12 x 0.5) = 4.6970 s.
"""

from __future__ import annotations

import json

import pytest

from btb_core.cli import main
from btb_core.cost import linear_cost_model, reference_cost_model
from btb_core.sim import ClusterConfig

PROMPT = 65_792
CLOSED_FORM_S = PROMPT * 2 * 70.6e9 / (4 * 989e12 * 0.5)


def test_closed_form_is_the_published_p95():
    assert round(CLOSED_FORM_S, 3) == 4.697


@pytest.fixture
def one_request(tmp_path):
    path = tmp_path / "one.jsonl"
    blocks = -(-PROMPT // 512)
    path.write_text(json.dumps({"timestamp": 0, "input_length": PROMPT, "output_length": 1,
                                "hash_ids": list(range(blocks))}) + "\n")
    return path


@pytest.mark.parametrize("scheduler", ["prefill_first", "chunked"])
def test_single_request_linear_replay_is_4_697_s(one_request, scheduler, capsys):
    assert main(["replay", "--trace", str(one_request), "--policy", "cache_aware", "--linear",
                 "--replicas", "1", "--scheduler", scheduler, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 1
    assert out["ttft_mean_s"] == pytest.approx(CLOSED_FORM_S, rel=1e-9)
    assert round(out["ttft_mean_s"], 3) == 4.697


def test_linear_matches_btb_cost_linear():
    # replay --linear and `btb cost --linear` use one model: the published table's
    cl = ClusterConfig.from_setup("70b_h100x4", attention=False)
    assert cl.cost.prefill_s(PROMPT) == reference_cost_model().prefill_s(PROMPT)
    assert 1e6 * cl.cost.prefill_s(1) == pytest.approx(71.4, abs=0.05)
    # with attention the default preset is unchanged (68.45e9 non-embedding parameters, 989.4e12)
    assert ClusterConfig.from_setup("70b_h100x4").cost.attention


def test_linear_other_setups_count_every_parameter():
    cm = linear_cost_model("qwen3_8b_h100x4")
    assert not cm.attention and cm.model.embedding_params == 0
    assert cm.prefill_flops(1000) == pytest.approx(2 * cm.model.params_active * 1000)


def test_reference_setup_accepted_by_replay(one_request, capsys):
    assert main(["replay", "--trace", str(one_request), "--policy", "cache_aware",
                 "--setup", "70b_h100x4_reference", "--replicas", "1", "--json"]) == 0
    assert round(json.loads(capsys.readouterr().out)["ttft_mean_s"], 3) == 4.697
