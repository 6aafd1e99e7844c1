"""The real SGLang Model Gateway in the loop (issue 13): text encoding, lifecycle, agreement.

Tests that start the gateway need the ``gateway`` extra (``make install`` includes it); they are
skipped, with the reason, where ``sglang-router`` is not installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest

from btb_core.cli import main
from btb_core.errors import ConfigError
from btb_core.routers import make_router, parse_router_params, policy_class
from btb_core.routers.gateway import BlockText, GatewayError, SGLangGateway, gateway_available
from btb_core.routers.gateway import process as gw_process
from btb_core.routers.prefix_tree import ApproxPrefixIndex
from btb_core.scenarios import ScenarioSpec, build
from btb_core.sim import ClusterConfig, simulate

needs_gateway = pytest.mark.skipif(not gateway_available(),
                                   reason="sglang-router not installed (pip install -e '.[gateway]')")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is gone for our purpose once reaped or a zombie
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


# -- text encoding (no gateway needed) --------------------------------------------------------------
def test_block_text_shares_prefixes_and_never_a_sibling_character():
    enc = BlockText(chars_per_block=8)
    a = enc.encode([1, 2, 3], 3 * 16, 16)
    b = enc.encode([1, 2, 4], 3 * 16, 16)
    c = enc.encode([5, 6], 2 * 16, 16)
    assert len(a) == len(b) == 24 and len(c) == 16
    assert a[:16] == b[:16] and a[16] != b[16]          # siblings differ at their first character
    assert a[0] != c[0]                                  # distinct first blocks too
    assert enc.encode([1, 2, 3], 48, 16) == a            # same ids, same text
    assert all(0x0800 <= ord(ch) <= 0xFFFF for ch in a + b + c)   # 3-byte UTF-8 only


def test_block_text_partial_last_block_scales_with_its_tokens():
    enc = BlockText(chars_per_block=64)
    full = enc.encode([7, 8], 1024, 512)
    half = enc.encode([7, 8], 512 + 256, 512)
    one = enc.encode([7, 8], 513, 512)
    assert len(full) == 128 and len(half) == 96 and len(one) == 65
    assert full.startswith(half) and full.startswith(one)
    assert enc.encode([], 0, 512) == ""
    with pytest.raises(ConfigError, match="chars_per_block"):
        BlockText(chars_per_block=1)


def test_first_holder_is_the_first_replica_to_insert_a_block():
    idx = ApproxPrefixIndex(3)
    idx.insert(2, [1, 2], 1024, 512, 0.0)
    idx.insert(0, [1, 2, 3], 1536, 512, 1.0)
    idx.insert(1, [1, 4], 1024, 512, 2.0)
    assert [idx.first_holder(h) for h in (1, 2, 3, 4, 9)] == [2, 2, 0, 1, None]


def test_cache_aware_tie_break_first_holder_vs_least_load():
    """Replicas 0 and 1 both hold the prefix; 0 got it first but is busier."""
    from test_routers_unit import req, setup  # the unit tests' fake view and request

    for tie_break, want in (("first_holder", 0), ("least_load", 1)):
        r = make_router("cache_aware", tie_break=tie_break, balance_abs_threshold=1000)
        setup(r, n=3)
        r.record(req(0, [1, 2, 3]), 0)
        r.record(req(1, [1, 2, 3]), 0)
        r.record(req(2, [1, 2, 3]), 1)
        assert r.route(req(3, [1, 2, 3, 4])) == want, tie_break
    with pytest.raises(ConfigError, match="tie_break"):
        make_router("cache_aware", tie_break="random")


# -- lifecycle ------------------------------------------------------------------------------------
def test_missing_package_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(gw_process, "gateway_available", lambda: False)
    with pytest.raises(GatewayError, match=r"needs the sglang-router package: pip install"):
        SGLangGateway(2).start()


def test_replay_cli_reports_the_missing_package_as_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gw_process, "gateway_available", lambda: False)
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 2,
                                 "hash_ids": [1, 2]}) + "\n")
    assert main(["replay", "--trace", str(trace), "--policy", "sglang_gateway"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs the sglang-router package" in err[0]


def test_gateway_params_are_checked():
    with pytest.raises(ConfigError, match="gateway_policy"):
        parse_router_params(policy_class("sglang_gateway"), ["gateway_policy=manual"])
    with pytest.raises(ConfigError, match="cache_threshold"):
        make_router("sglang_gateway", cache_threshold=1.5)


@needs_gateway
def test_startup_timeout_is_one_line_and_leaves_nothing_running():
    gw = SGLangGateway(2, startup_timeout_s=0.05)
    with pytest.raises(GatewayError, match=r"did not report 2 healthy workers within 0.05 s"):
        gw.start()
    assert gw.proc is None and gw._thread is None


@needs_gateway
def test_context_manager_routes_holds_and_stops_its_children():
    with SGLangGateway(3) as gw:
        pid = gw.pids[0]
        assert _alive(pid)
        rids = [gw.dispatch(f"distinct prompt {i} " * 8) for i in range(3)]
        # all held: the gateway counts one in flight on each replica (least-load spreads them)
        assert sorted(r for _, r in rids) == [0, 1, 2]
        gw.settle()
        assert gw.loads() == [1, 1, 1]
        gw.release(rids[0][0])
        gw.settle()
        assert gw.loads() == [1 if r != rids[0][1] else 0 for r in range(3)]
    assert not _alive(pid) and gw.proc is None


@needs_gateway
def test_error_inside_the_context_stops_the_gateway():
    with pytest.raises(RuntimeError, match="boom"):
        with SGLangGateway(2) as gw:
            pid = gw.pids[0]
            gw.dispatch("held open when the error comes")
            raise RuntimeError("boom")
    assert not _alive(pid)


@needs_gateway
def test_ctrl_c_during_a_replay_leaves_no_child_process(tmp_path):
    """SIGINT a `btb replay --policy sglang_gateway` mid-run: exit 130 and the gateway is gone."""
    rows = [{"timestamp": 200 * i, "input_length": 4096, "output_length": 64,
             "hash_ids": [0, 1, 2, 3, 4, 5, 6, 100 + i]} for i in range(4000)]
    trace = tmp_path / "long.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    script = textwrap.dedent(f"""
        import os, sys, threading, time
        from btb_core.routers.gateway import process
        orig = process.SGLangGateway._start
        def start(self):
            orig(self)
            print("PID", self.proc.pid, flush=True)
        process.SGLangGateway._start = start
        from btb_core.cli import main
        sys.exit(main(["replay", "--trace", {str(trace)!r}, "--policy", "sglang_gateway", "--json"]))
    """)
    # SIGINT back to its default in the child: a test run started in the background by a
    # non-interactive shell (`bash .ci/run &`, nohup) inherits SIGINT ignored, and Python then never
    # turns it into KeyboardInterrupt (the replay ran to its end, exit 0, once in such a run)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    line = proc.stdout.readline()
    assert line.startswith("PID"), proc.stderr.read()
    pid = int(line.split()[1])
    time.sleep(1.0)                      # inside the replay, requests in flight
    assert _alive(pid)
    proc.send_signal(signal.SIGINT)
    sent_s = time.monotonic()
    out, err = proc.communicate(timeout=60)
    # the message keeps what the replay printed and how long it ran on after the signal
    assert proc.returncode == 130, (proc.returncode, err[-400:], out[-400:],
                                    round(time.monotonic() - sent_s, 2))
    assert "interrupted" in err
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


# -- agreement on small traces --------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_burst():
    return build(ScenarioSpec("burst", 120, 15.0, 65_536, 256))


@needs_gateway
def test_gateway_check_on_a_burst_agrees_with_first_holder_cache_aware(small_burst):
    from btb_core.gateway_check import gateway_check

    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=4)
    res = gateway_check(small_burst, cluster)
    s = res.summary.set_index("variant")
    fh = s.loc["cache_aware[tie_break=first_holder]"]
    assert fh["step_agreement"] == 1.0 and fh["replay_agreement"] == 1.0
    # the product default breaks longest-match ties by load: the imbalance rule spreads 3
    # requests, then the gateway returns to the prefix's first holder and the default does not
    dflt = s.loc["cache_aware"]
    assert dflt["step_agreement"] < 1.0 and dflt["step_disagree_hit"] > 0
    assert dflt["step_disagree_imbalanced"] == 0 and dflt["step_disagree_miss"] == 0
    reps = res.replicas.set_index("replica")
    assert reps["gateway"].sum() == 120
    assert (reps["gateway"] == reps["cache_aware[tie_break=first_holder]"]).all()
    assert set(res.ttft["run"]) == {"gateway", "cache_aware", "cache_aware[tie_break=first_holder]"}


@needs_gateway
def test_replay_cli_json_and_out_record_each_requests_replica(tmp_path, capsys):
    rows = []
    for i in range(40):
        shared = [0, 1, 2, 3] if i % 2 == 0 else [10, 11]
        rows.append({"timestamp": 50 * i, "input_length": 512 * (len(shared) + 1),
                     "output_length": 8, "hash_ids": shared + [1000 + i]})
    trace = tmp_path / "mix.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "req.parquet"
    assert main(["replay", "--trace", str(trace), "--policy", "sglang_gateway", "--json",
                 "--out", str(out)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["policy"] == "sglang_gateway" and metrics["requests"] == 40
    gw = pd.read_parquet(out)
    assert len(gw) == 40 and gw["replica"].between(0, 3).all()
    # the same trace through our cache_aware with the gateway's tie-break and no eviction
    assert main(["replay", "--trace", str(trace), "--policy", "cache_aware", "--json",
                 "--router-param", "tie_break=first_holder", "--router-param",
                 "eviction_interval_s=0", "--out", str(tmp_path / "ca.parquet")]) == 0
    ca = pd.read_parquet(tmp_path / "ca.parquet")
    np.testing.assert_array_equal(gw["replica"].to_numpy(), ca["replica"].to_numpy())


@needs_gateway
def test_gateway_check_cli_json(tmp_path, capsys):
    rows = [{"timestamp": 100 * i, "input_length": 2048, "output_length": 4,
             "hash_ids": [0, 1, 2, 500 + i]} for i in range(30)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["gateway-check", "--trace", str(trace), "--replicas", "3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {r["variant"] for r in d["summary"]} == {"cache_aware",
                                                   "cache_aware[tie_break=first_holder]"}
    assert all(0.0 <= r["step_agreement"] <= 1.0 for r in d["summary"])
    assert [r["replica"] for r in d["replicas_per_run"]] == [0, 1, 2]
    assert {r["run"] for r in d["ttft"]} >= {"gateway"}
    assert main(["gateway-check", "--trace", str(trace), "--router-param",
                 "gateway_policy=round_robin"]) == 2


@needs_gateway
def test_settle_waits_until_the_gateways_loads_match_the_simulation():
    with SGLangGateway(2, request_timeout_s=1.0) as gw:
        rid, r = gw.dispatch("one request in flight")
        gw.settle()
        assert gw.loads()[r] == 1
        gw.expected_load[r] += 1          # the simulation claims one more than the gateway holds
        gw._dirty = True
        with pytest.raises(GatewayError, match="did not settle"):
            gw.settle()
