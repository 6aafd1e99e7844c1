"""``process_group_cpu_s``: CPU seconds of a process group by role (no engine needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from btb_core.engine.server import process_group_cpu_s


def _proc(root: Path, pid: int, pgid: int, comm: str, thread_ns: list[int]) -> None:
    d = root / str(pid)
    (d / "task").mkdir(parents=True)
    # comm may hold spaces and ")": the fields are read after the last ")"
    (d / "stat").write_text(f"{pid} ({comm}) S 1 {pgid} {pgid} 0 -1 4194560 0 0\n")
    (d / "comm").write_text(comm + "\n")
    for k, ns in enumerate(thread_ns):
        (d / "task" / str(pid + k)).mkdir()
        (d / "task" / str(pid + k) / "schedstat").write_text(f"{ns} 12345 67\n")


def test_roles_and_thread_sums_from_a_proc_tree(tmp_path):
    _proc(tmp_path, 100, 100, "python", [1_000_000_000, 500_000_000])     # the leader: api
    _proc(tmp_path, 101, 100, "VLLM::EngineCor", [250_000_000])
    _proc(tmp_path, 102, 100, "VLLM::Worker", [2_000_000_000, 1])
    _proc(tmp_path, 103, 100, "odd) name (x", [7_000_000])                 # other
    _proc(tmp_path, 200, 200, "VLLM::Worker", [9_000_000_000])            # another group
    (tmp_path / "self").mkdir()                                          # not a pid: skipped
    (tmp_path / "104").mkdir()                                           # vanished: skipped
    got = process_group_cpu_s(100, proc_root=str(tmp_path))
    assert got == {"api": 1.5, "engine_core": 0.25, "worker": 2.000000001, "other": 0.007}
    assert process_group_cpu_s(200, proc_root=str(tmp_path)) == {"api": 9.0}  # the leader, by pid
    assert process_group_cpu_s(999, proc_root=str(tmp_path)) == {}
    assert process_group_cpu_s(100, proc_root=str(tmp_path / "missing")) == {}
    # a thread that ended while being read is skipped, not its whole process
    (tmp_path / "102" / "task" / "103" / "schedstat").unlink()
    assert process_group_cpu_s(100, proc_root=str(tmp_path))["worker"] == 2.0
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="pgid"):
            process_group_cpu_s(bad, proc_root=str(tmp_path))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_real_group_leader_that_burns_cpu_is_counted_as_api():
    code = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
            "time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        got = {}
        while time.monotonic() < deadline:
            got = process_group_cpu_s(proc.pid)
            if got.get("api", 0.0) >= 0.3:
                break
            time.sleep(0.05)
        assert 0.3 <= got["api"] < 5.0
        assert set(got) == {"api"}
        assert os.getpgid(proc.pid) == proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("args", [["--lone", "0"], ["--replays", "0"], ["--idle-s", "0"],
                                  ["--idle-s", "nan"], ["--idle-s", "inf"],
                                  ["--out", "/nonexistent-btb-folder/x.json"]])
def test_the_benchmark_refuses_bad_arguments_before_starting_a_server(args):
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "engine_process_cpu.py"
    res = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                         cwd=script.parent, timeout=120)
    assert res.returncode == 2
    assert f"error: {args[0]} {args[1]}:" in res.stderr     # names the argument and its value
    assert "calibrating" not in res.stdout      # refused before a server was started
