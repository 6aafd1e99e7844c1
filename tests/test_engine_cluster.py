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
