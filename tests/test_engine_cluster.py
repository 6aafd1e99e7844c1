"""``EngineCluster`` says what it is doing when it is interrupted (no engine needed)."""

from __future__ import annotations

import pytest

import subprocess
import time

from btb_core.engine import server as engine_server
from btb_core.engine.server import EngineCluster


class _Proc:
    def __init__(self, running: bool) -> None:
        self.running = running

    def poll(self):
        return None if self.running else 0


class _Server:
    def __init__(self, running: bool = True) -> None:
        self.proc = _Proc(running)
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True
        self.proc.running = False


@pytest.fixture(autouse=True)
def _no_signals(monkeypatch):
    """The fake servers have no process groups: record what the cluster would signal."""
    calls = []
    monkeypatch.setattr(engine_server, "_kill_groups", lambda procs, grace_s=10.0: calls.append(procs))
    return calls


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(143)])
def test_an_interrupt_says_the_servers_are_being_stopped(exc, capsys, _no_signals):
    cluster = EngineCluster(2)
    cluster.servers = [_Server(), _Server()]
    cluster.__exit__(type(exc), exc, None)
    assert all(s.stopped for s in cluster.servers)
    assert _no_signals == [[s.proc for s in cluster.servers]]     # both at once
    assert "interrupted; stopping 2 vLLM server(s) (up to 15 s)" in capsys.readouterr().err


@pytest.mark.parametrize("exc, servers", [(None, [_Server()]), (RuntimeError("x"), [_Server()]),
                                          (KeyboardInterrupt(), [_Server(running=False)])])
def test_no_message_on_a_normal_exit_an_error_or_when_nothing_runs(exc, servers, capsys):
    cluster = EngineCluster(1)
    cluster.servers = servers
    cluster.__exit__(type(exc) if exc else None, exc, None)
    assert all(s.stopped for s in cluster.servers)
    assert capsys.readouterr().err == ""


def test_kill_groups_stops_several_stubborn_groups_in_one_grace_period(monkeypatch):
    """Two process groups that ignore SIGTERM (as a server whose front end waits for an open
    stream): both are SIGKILLed after one grace period in all, not one each."""
    monkeypatch.undo()          # the real _kill_groups
    procs = [subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 30"], start_new_session=True)
             for _ in range(2)]
    time.sleep(0.2)             # the traps are set
    t0 = time.monotonic()
    engine_server._kill_groups(procs, grace_s=1.0)
    took = time.monotonic() - t0
    assert all(p.poll() is not None for p in procs)
    assert 1.0 <= took < 1.9, took     # one at a time would take >= 2 s


# -- where the API servers run (api_cores) -------------------------------------------------------

def test_resolve_api_cores_stays_moves_to_spare_cores_or_takes_a_list(monkeypatch):
    import numpy as np

    monkeypatch.setattr(engine_server.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    resolve = EngineCluster.resolve_api_cores
    assert resolve(None, [0, 1]) == [None, None]
    assert resolve("spare", [0]) == [1]                 # one server on a 2+-core machine
    assert resolve("spare", [0, 1]) == [2, 3]
    assert resolve("spare", [0, 1, 2]) == [3, 3, 3]     # one spare core, shared
    assert resolve("spare", [0, 1, 2, 3]) == [None] * 4  # no spare core: they stay
    assert resolve([3, 2], [0, 1]) == [3, 2]
    assert resolve((np.int64(3), 1), [0, 1]) == [3, None]   # its own engine's core: it stays
    for bad, says in (("other", "must be None, 'spare' or a list"), (b"s", "must be None"),
                      (1, "must be None"), (True, "must be None"), ([1], "1 core\\(s\\) for 2"),
                      ([1, -1], "integer >= 0"), ([1, True], "not a bool"), ([1, 1.0], "integer >= 0"),
                      ([1, "2"], "integer >= 0"), ([1, 9], "api_cores\\[1\\]=9: not a core this "
                                                          "process may use")):
        with pytest.raises(engine_server.BTBError, match=says):
            resolve(bad, [0, 1])
    with pytest.raises(engine_server.BTBError, match="must be 1..4"):
        EngineCluster(True)


def test_spare_that_moves_nothing_says_why(monkeypatch):
    monkeypatch.setattr(engine_server.os, "sched_getaffinity", lambda pid: {0, 1})
    assert EngineCluster(2, api_cores="spare").api_note == (
        "no spare core (2 server(s) on cores [0, 1]): the API servers stay on their engines' cores")
    assert EngineCluster(1, api_cores="spare").api_note == ""
    assert EngineCluster(2).api_note == ""


def test_spare_cores_are_the_allowed_ones_no_engine_uses(monkeypatch):
    monkeypatch.setattr(engine_server.os, "sched_getaffinity", lambda pid: {1, 3, 5})
    assert engine_server.spare_cores([3]) == [1, 5]
    assert engine_server.spare_cores([0], ncpu=2) == [1]
    assert engine_server.spare_cores([0, 1], ncpu=2) == []
    with pytest.raises(ValueError, match="engine core='0'"):
        engine_server.spare_cores(["0"])


def test_move_threads_pins_every_thread_of_a_process():
    """A real process with three threads: every one of them ends up on the new core, and a
    thread it starts afterwards inherits it."""
    import os
    import shutil
    import sys

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2 or not shutil.which("taskset"):
        pytest.skip("needs two cores and taskset")
    src = ("import threading, time, os, sys\n"
           "ev = threading.Event()\n"
           "ts = [threading.Thread(target=ev.wait) for _ in range(2)]\n"
           "[t.start() for t in ts]\n"
           "print('ready', flush=True)\n"
           "sys.stdin.readline()\n"
           "t = threading.Thread(target=ev.wait); t.start()\n"
           "print(sorted(os.sched_getaffinity(t.native_id)), flush=True)\n"
           "ev.set()\n")
    first, target = allowed[0], allowed[1]
    proc = subprocess.Popen(["taskset", "-c", str(first), sys.executable, "-c", src],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        assert len(tids) == 3
        assert all(os.sched_getaffinity(t) == {first} for t in tids)
        assert engine_server.move_threads(proc.pid, [target]) == 3
        assert all(os.sched_getaffinity(t) == {target} for t in tids)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == f"[{target}]"
    finally:
        proc.kill()
        proc.wait()
    mt = engine_server.move_threads
    for pid, cores, says in ((proc.pid, [], "cores is empty"), (proc.pid, 0, "a sequence"),
                             (proc.pid, "01", "a sequence"), (proc.pid, [True], "not a bool"),
                             (proc.pid, [0.7], "integer >= 0"), (proc.pid, [-1], "integer >= 0"),
                             (proc.pid, [max(allowed) + 1000], "not available to this process"),
                             ("abc", [target], "pid='abc': a process id"),
                             (True, [target], "pid=True: a process id"),
                             (0, [target], "pid=0: a process id")):
        with pytest.raises(ValueError, match=says):
            mt(pid, cores)
    with pytest.raises(ProcessLookupError, match=f"no process {proc.pid}"):
        mt(proc.pid, [target])     # the process has ended


def test_a_server_whose_api_server_cannot_move_says_so(tmp_path):
    """``EngineServer.move_api_server`` to a core that does not exist: one EngineError naming
    the server's port and the core (no engine needed: a sleeping process stands in)."""
    import os

    srv = engine_server.EngineServer(tmp_path, 0, tmp_path / "log", port=12345)
    srv.proc = subprocess.Popen(["sleep", "30"])
    try:
        bad = max(os.sched_getaffinity(0)) + 1000
        with pytest.raises(engine_server.EngineError, match=f"port 12345: could not move its API "
                                                            f"server .* to core {bad}"):
            srv.move_api_server(bad)
    finally:
        srv.proc.kill()
        srv.proc.wait()


def test_wait_ready_moves_the_api_server_once_it_answers(tmp_path, monkeypatch):
    """``EngineServer(api_core=...)``: when ``/health`` first answers, the group leader's threads
    move to ``api_core`` (a sleeping process stands in for the server)."""
    import os
    import shutil

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2 or not shutil.which("taskset"):
        pytest.skip("needs two cores and taskset")
    srv = engine_server.EngineServer(tmp_path, allowed[0], tmp_path / "log", port=12345,
                                     api_core=allowed[1])
    srv.proc = subprocess.Popen(["taskset", "-c", str(allowed[0]), "sleep", "30"])
    try:
        time.sleep(0.2)                     # taskset has exec'd sleep
        monkeypatch.setattr(srv, "healthy", lambda: True)
        srv.wait_ready(5.0)
        assert os.sched_getaffinity(srv.proc.pid) == {allowed[1]}
    finally:
        srv.proc.kill()
        srv.proc.wait()
