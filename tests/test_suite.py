"""The burst-shape suite (issue 10, item 3): shapes build as described; `btb suite` prints its table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from btb_core.cli import main
from btb_core.errors import ConfigError
from btb_core.suite import SHAPES, BurstJob, Shape, run_suite, shapes, summarize


def test_suite_covers_the_issue_axes():
    prefixes = {j.prefix_tokens for s in SHAPES for j in s.jobs}
    rates = {j.rate_per_s for s in SHAPES for j in s.jobs}
    assert min(prefixes) == 4096 and max(prefixes) == 131_072
    assert min(rates) == 1.0 and max(rates) == 20.0
    assert {s.replicas for s in SHAPES} >= {4, 8, 16}
    assert any(s.background_rate_per_s > 0 for s in SHAPES)
    assert max(len(s.jobs) for s in SHAPES) == 3
    assert any(s.decoys for s in SHAPES) and any(s.sessions for s in SHAPES)
    assert any(j.output_tokens >= 256 for s in SHAPES for j in s.jobs)
    assert "trickle" in {s.name for s in SHAPES}
    assert len({s.name for s in SHAPES}) == len(SHAPES)


def test_shape_build_is_seeded_and_shares_prefixes_as_described():
    s = Shape("t", "test", (BurstJob(4096, 10.0, 2.0), BurstJob(8192, 5.0, 2.0, start_s=1.0)),
              background_rate_per_s=5.0, decoys=2, decoy_repeats=3, sessions=2, session_turns=3,
              span_s=4.0)
    a, b = s.build(1), s.build(1)
    assert a.table["arrival_s"].tolist() == b.table["arrival_s"].tolist()
    assert s.build(2).table["arrival_s"].tolist() != a.table["arrival_s"].tolist()
    tab = a.table
    src = tab["source"]
    assert np.all(np.diff(tab["arrival_s"]) >= 0)
    job0 = tab[src == "job0"]
    first8 = {tuple(h[:8]) for h in job0["hash_ids"]}
    assert len(first8) == 1                                     # one 4096-token prefix
    assert len({h[8] for h in job0["hash_ids"]}) == len(job0)   # own suffix each
    assert (src == "decoy").sum() == 6
    sess = tab[src == "session"]
    assert len(sess) == 6 and sorted(set(sess["input_length"])) == [6144, 8192, 10240]
    bg = tab[src == "background"]
    assert bg["input_length"].between(1024, 8192).all()


def test_shape_validation_and_unknown_names():
    with pytest.raises(ConfigError, match="prefix_tokens=1000"):
        Shape("bad", "x", (BurstJob(1000, 1.0, 1.0),))
    with pytest.raises(ConfigError, match="sends no request"):
        Shape("empty", "x")
    with pytest.raises(ConfigError, match="unknown shape"):
        shapes(["nope"])
    assert shapes(["p32k"], scale=0.5)[0].jobs[0].duration_s == 10.0
    for bad in (0, -1.0, float("inf"), float("nan"), True, "2"):
        with pytest.raises(ConfigError, match="--scale"):
            shapes(["p32k"], scale=bad)


def test_summarize_ratios_to_best():
    import pandas as pd

    rows = pd.DataFrame({"shape": ["a", "a", "b", "b"], "policy": ["x", "y", "x", "y"],
                         "requests": 1, "ttft_mean_s": [1.0, 2.0, 3.0, 1.5],
                         "ttft_p95_s": [2.0, 2.0, 4.0, 8.0], "copies": [0, 4, 0, 0],
                         "copies_unused": [0, 1, 0, 0]})
    s = summarize(rows).set_index(["shape", "policy"])
    assert s.loc[("a", "y"), "mean_ratio"] == 2.0 and s.loc[("b", "x"), "mean_ratio"] == 2.0
    assert s.loc[("a", "x"), "mean_vs_best_other"] == 0.5
    assert s.loc[("b", "y"), "p95_ratio"] == 2.0
    assert s.loc[("a", "y"), "unused_share"] == 0.25


def test_run_suite_small_and_cli(capsys):
    small = shapes(["p32k", "trickle"], scale=0.25)
    out = run_suite(["least_load", "btb"], small, progress=False)
    assert set(out["shape"]) == {"p32k", "trickle"} and len(out) == 4
    assert (out.groupby("shape")["mean_ratio"].min() == 1.0).all()
    assert main(["suite", "--policies", "least_load", "cache_aware", "--shapes", "p16k",
                 "--scale", "0.2", "--json"]) == 0
    got = capsys.readouterr()
    rows = json.loads(got.out)
    assert {r["policy"] for r in rows} == {"least_load", "cache_aware"}
    assert got.out.startswith('[\n  {\n    "')       # indented by 2, as btb replay --json
    assert "fewer than" not in got.err                 # 34 requests per policy: no note
    # p128k at --scale 0.1 has 2 requests (fewer than FEW_REQUESTS): a note says so, on stderr
    assert main(["suite", "--policies", "least_load", "--shapes", "p128k", "trickle",
                 "--scale", "0.1", "--json"]) == 0
    got = capsys.readouterr()
    n = {r["shape"]: r["requests"] for r in json.loads(got.out)}
    assert n["p128k"] < 10 and n["trickle"] < 10
    assert (f"2 shapes with fewer than 10 requests at --scale 0.1: p128k ({n['p128k']}), "
            f"trickle ({n['trickle']})") in got.err
    assert main(["suite", "--policies", "least_load", "--shapes", "p16k", "--scale", "0.2",
                 "--wide"]) == 0
    head, row = capsys.readouterr().out.splitlines()[:2]
    # one policy: every ratio is exactly 1 and no copy moved a byte; measured figures print as
    # 1.000 and 0.000, not "1" and "0" (the columns before the empty "vs best other" ones)
    cells = dict(zip(head.split(), row.split()))
    assert cells["mean_ratio"] == cells["p95_ratio"] == "1.000" and cells["rdma_gb"] == "0.000"
    assert cells["requests"].isdigit()
    assert main(["suite", "--policies", "least_load", "--shapes", "p128k", "--scale", "0.1"]) == 0
    assert "1 shape with fewer than 10 requests" in capsys.readouterr().err   # the table too
    assert main(["suite", "--policies", "nope"]) == 2
    assert "unknown policy" in capsys.readouterr().err


def test_goal_and_literal_rule_tables():
    import pandas as pd

    from btb_core.suite import goal_table, literal_rule_table

    rows = pd.DataFrame({"shape": ["a"] * 3 + ["b"] * 3,
                         "policy": ["cache_aware", "btb", "btb_adaptive"] * 2, "requests": 1,
                         "ttft_mean_s": [1.0, 1.0, 1.04, 2.0, 1.5, 1.7],
                         "ttft_p95_s": [2.0, 2.0, 2.1, 4.0, 3.0, 3.0],
                         "copies": [0, 0, 10, 0, 4, 10], "copies_unused": [0, 0, 0, 0, 4, 1]})
    g = goal_table(summarize(rows)).set_index("shape")
    assert bool(g.loc["a", "meets_goal"]) is True                 # 1.04x mean, 1.05x p95, 0 unused
    assert bool(g.loc["b", "meets_goal"]) is False                # 1.13x mean, 10 % unused
    assert g.loc["b", "best_other"] == "btb"
    lit = literal_rule_table(summarize(rows)).set_index("shape")
    assert bool(lit.loc["a", "btb_equals_cache_aware"]) and not bool(lit.loc["b", "btb_equals_cache_aware"])
    assert lit.loc["b", "btb_unused"] == 4
