"""Tests for ``btb audit`` (through btb_core.cli.main, as the console script runs it)."""

from __future__ import annotations

import json
from pathlib import Path

from btb_core.cli import main
from btb_core.trace import shipped_traces

FIXTURES = Path(__file__).parent / "fixtures"
SHIPPED = shipped_traces()


def test_json_rows(capsys):
    rc = main(["audit", str(FIXTURES / "art_small.jsonl"), "--depth-tokens", "1024", "2048",
               "--window-s", "10", "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["trace"], r["depth_tokens"], r["window_s"], r["max_fanout"], r["keys_at_max"])
            for r in rows] == [("art_small", 1024, 10.0, 4, 1), ("art_small", 2048, 10.0, 1, 1)]
    assert rows[0]["exclude_sessions"] is False and rows[0]["block_tokens"] == 256
    assert rows[1]["eligible_requests"] == 1  # only row 9 has 8 full 256-token blocks


def test_exclude_sessions_and_table(capsys):
    rc = main(["audit", str(SHIPPED["mooncake_conversation"]), "--depth-tokens", "1024",
               "--window-s", "60", "--exclude-sessions"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "excluding earlier turns" in out and "conversation_trace" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("conversation_trace"))
    assert line.split()[1:5] == ["1024", "60", "5", "1"]  # whole seconds print as integers
    assert "Burstiness" in out


def test_azure_says_prefix_info_is_missing(capsys):
    rc = main(["audit", str(SHIPPED["azure_code_2023"]), "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(rows) == 6
    assert all(r["max_fanout"] is None for r in rows)
    assert rows[0]["note"] == "needs prefix hash ids; this trace (Azure CSV) has none"
    rc = main(["audit", str(SHIPPED["azure_code_2023"]), "--json", "--burstiness"])
    b = json.loads(capsys.readouterr().out)
    assert rc == 0 and b[0]["requests"] == 8819 and b[0]["peak_rps"] == 67.0
    main(["audit", str(SHIPPED["azure_code_2023"])])
    out = capsys.readouterr().out
    assert "n/a" in out and "deep-prefix fan-out needs prefix hash ids" in out


def test_bad_trace_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
                   '{"timestamp": 1, "input_length": -4, "output_length": 1, "hash_ids": []}\n')
    rc = main(["audit", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("btb audit: error: ") and "bad.jsonl, line 2: field 'input_length' = -4" in err


def test_unsorted_warns_or_fails_with_strict(tmp_path, capsys):
    p = tmp_path / "u.jsonl"
    p.write_text('{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
                 '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n')
    assert main(["audit", str(p), "--json"]) == 0
    assert "warning: " in capsys.readouterr().err
    assert main(["audit", str(p), "--strict"]) == 2
    assert "arrivals are not sorted" in capsys.readouterr().err


def test_bad_options_exit_2(capsys):
    assert main(["audit", str(FIXTURES / "art_small.jsonl"), "--window-s", "0"]) == 2
    assert "--window-s must be a positive" in capsys.readouterr().err
    assert main(["audit", "does/not/exist.jsonl"]) == 2
