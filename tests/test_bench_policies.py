"""``benchmarks/bench_policies.py`` on a tiny cut (no timing asserted: the figures it derives from
its own replay times, and that interleaved replays stay bit-identical)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    sys.path.insert(0, str(BENCH))
    try:
        import bench_policies
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path_factory.mktemp("bench") / "policies.json"
    assert bench_policies.main(["--windows", "1", "--replicas", "2", "3", "--policies", "round_robin",
                                "random", "--traces", "bursted_shaped", "--repeats", "3",
                                "--fleet-rows", "0", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_case_replayed_once_per_round(result):
    cases = result["cases"]
    assert result["complete"] and len(cases) == 4
    assert [(c["replicas"], c["policy"]) for c in cases] == [
        (2, "round_robin"), (2, "random"), (3, "round_robin"), (3, "random")]
    for c in cases:
        assert c["repeats"] == 3 and len(c["cpu_s_all"]) == 3 and len(c["wall_s_all"]) == 3
        assert c["cpu_s_min"] == min(c["cpu_s_all"])
        assert c["requests_per_s_cpu"] == pytest.approx(c["rows"] / c["cpu_s_min"], rel=5e-3)


def test_rounds_take_turns_in_a_rotated_order(result):
    """Round k replays every case once, starting from case k (then k + 1, ...), and a round ends
    before the next begins."""
    cases = result["cases"]
    k = len(cases)
    for rnd in range(3):
        started = [c["started_s_all"][rnd] for c in cases]
        order = sorted(range(k), key=started.__getitem__)
        assert order == [(i + rnd) % k for i in range(k)]
        if rnd:
            assert min(started) > max(c["started_s_all"][rnd - 1] for c in cases)


def test_ratios_compare_each_cases_least_time(result):
    by = {(c["replicas"], c["policy"]): c for c in result["cases"]}
    for (n, policy), c in by.items():
        rr = by[(n, "round_robin")]
        assert c["ratio_to_round_robin"] == round(rr["cpu_s_min"] / c["cpu_s_min"], 3)
        lo, med, hi = c["ratio_to_round_robin_rounds"]
        same_round = sorted(x / y for x, y in zip(rr["cpu_s_all"], c["cpu_s_all"]))
        assert (lo, med, hi) == tuple(round(v, 3) for v in same_round)
        small = by[(2, policy)]
        assert c["cost_ratio_vs_2_replicas"] == round(c["cpu_us_per_request"]
                                                      / small["cpu_us_per_request"], 3)
    assert by[(3, "round_robin")]["ratio_to_round_robin_rounds"] == [1.0, 1.0, 1.0]
