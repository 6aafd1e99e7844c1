"""`btb cost`: the published linear table, the JSON shape, options and errors."""

import json

import pytest

from btb_core.cli import main


def run(capsys, *argv):
    code = main(["cost", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_linear_reproduces_reference_table(capsys):
    code, out, _ = run(capsys, "--linear")
    assert code == 0
    assert "71.4 us/token" in out
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["8,000"])
    # tokens, prefill, HBM, DRAM, RDMA, NVMe (ms): the published 571 / 0.196 / 11.9 / 13.1 / 374,
    # each column at one precision (3 significant figures of its smallest value, 500 tokens)
    assert row[:6] == ["8,000", "571.1", "0.1956", "11.916", "13.107", "374.5"]
    assert row[6:] == ["2,919x", "47.9x", "43.6x", "1.52x"]


def test_json_shape_and_numbers(capsys):
    code, out, _ = run(capsys, "--linear", "--json", "--tokens", "8000", "64000")
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"setup", "rows", "ratios"}
    assert [r["tokens"] for r in data["rows"]] == [8000, 64000]
    assert set(data["rows"][0]) == {"tokens", "prefill_ms", "hbm_ms", "dram_ms", "rdma_ms",
                                    "nvme_ms"}
    r = data["rows"][0]
    assert round(r["prefill_ms"]) == 571 and round(r["rdma_ms"], 1) == 13.1
    assert data["setup"]["attention"] is False and data["setup"]["num_gpus"] == 4
    assert data["ratios"]["prefill_over_rdma"][0] == pytest.approx(r["prefill_ms"] / r["rdma_ms"])


def test_default_rows_and_attention_on(capsys):
    code, out, _ = run(capsys, "--json")
    data = json.loads(out)
    assert [r["tokens"] for r in data["rows"]] == [500, 1000, 2000, 8000, 16000, 32000, 64000,
                                                   128000]
    assert data["setup"]["attention"] is True
    # with the attention term and the embedding-free count, 8,000 tokens take ~596 ms
    assert round(data["rows"][3]["prefill_ms"]) == 596


def test_options_change_the_setup(capsys):
    _, out, _ = run(capsys, "--model", "qwen3-8b", "--gpu", "h200", "--gpus", "2", "--mfu",
                    "0.25", "--json", "--tokens", "1000")
    s = json.loads(out)["setup"]
    assert (s["model"], s["gpu"], s["num_gpus"], s["mfu"]) == ("Qwen3-8B", "H200-SXM", 2, 0.25)
    assert s["node_bytes_per_s"]["rdma"] == pytest.approx(100e9)


@pytest.mark.parametrize("argv,needle", [(["--mfu", "0"], "--mfu"), (["--gpus", "0"], "--gpus"),
                                         (["--tokens", "0"], "--tokens")])
def test_bad_values_exit_2_with_one_line(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert needle in err and len(err.strip().splitlines()) == 1
