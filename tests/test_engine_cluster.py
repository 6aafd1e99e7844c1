"""``EngineCluster`` says what it is doing when it is interrupted (no engine needed)."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(143)])
def test_an_interrupt_says_the_servers_are_being_stopped(exc, capsys):
    cluster = EngineCluster(2)
    cluster.servers = [_Server(), _Server()]
    cluster.__exit__(type(exc), exc, None)
    assert all(s.stopped for s in cluster.servers)
    assert "interrupted; stopping 2 vLLM server(s) (up to 20 s)" in capsys.readouterr().err


@pytest.mark.parametrize("exc, servers", [(None, [_Server()]), (RuntimeError("x"), [_Server()]),
                                          (KeyboardInterrupt(), [_Server(running=False)])])
def test_no_message_on_a_normal_exit_an_error_or_when_nothing_runs(exc, servers, capsys):
    cluster = EngineCluster(1)
    cluster.servers = servers
    cluster.__exit__(type(exc) if exc else None, exc, None)
    assert all(s.stopped for s in cluster.servers)
    assert capsys.readouterr().err == ""
