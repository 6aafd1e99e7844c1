"""Extension points: the scheduler and policy registries, the routers' ClusterView, BTBConfig.

Adding a scheduler or a policy is one file plus one registry line; these tests prove it by
registering a toy of each, and check that every list of names (CLI choices, config validation,
chart order) is read from the registries.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import btb_core.routers as routers_pkg
from btb_core.btb_config import DEFAULT_BTB, BTBConfig
from btb_core.cli import build_parser
from btb_core.cost import cost_model_for_setup
from btb_core.errors import ConfigError
from btb_core.plots import policy_order
from btb_core.routers import POLICIES, Router, make_router
from btb_core.routers.btb import BTBRouter
from btb_core.sim import ClusterConfig, simulate
from btb_core.sim.schedulers import SCHEDULERS, Scheduler
from btb_core.sim.view import ClusterView
from btb_core.trace import make_trace

BT = 512
COST = cost_model_for_setup("70b_h100x4")


def trace_of(rows, block_tokens=BT):
    """rows: (arrival_s, input_length, output_length, hash_ids)."""
    a, i, o, h = zip(*rows)
    return make_trace(list(a), list(i), list(o), [list(x) for x in h], block_tokens=block_tokens)


class ToReplica0(Router):
    name = "to_replica_0"

    def route(self, request):
        return 0


# ------------------------------------------------------------------ schedulers
class OneAtATime(Scheduler):
    """A toy scheduler: one request at a time, prefill then its decode, no batching."""

    name = "one_at_a_time"

    def plan(self, sim, rep) -> None:
        if rep.running == 0 and rep.waiting and sim.try_admit(rep, rep.waiting[0]):
            job = rep.waiting.popleft()
            sim.sample_queue(rep)
            rep.in_op += 1
            compute = sim.cost.prefill_s(job.req.input_length - job.done_tokens, job.done_tokens)
            sim.start_op(rep, "prefill", job.load_s + compute, job)
        elif rep.n_decode:
            sim.start_stretch(rep)
        else:
            sim.idle(rep)

    def op_done(self, sim, rep, kind, data) -> None:
        rep.in_op -= 1
        data.done_tokens = data.req.input_length
        sim.complete(rep, data, data.done_tokens)
        sim.first_token(rep, data)


def test_a_new_scheduler_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(SCHEDULERS, OneAtATime.name, OneAtATime)   # the one registry line
    cluster = ClusterConfig(cost=COST, num_replicas=1, scheduler="one_at_a_time")
    rows = [(0.0, 2048, 8, [1, 2, 3, 4]), (0.001, 2048, 8, [10, 11, 12, 13]),
            (0.002, 2048, 8, [20, 21, 22, 23])]
    res = simulate(trace_of(rows), ToReplica0(), cluster, progress=False)
    req = res.requests
    # no batching: each request is admitted when the previous one finished, prefill alone
    admit_s = (req["arrival_s"] + req["queue_wait_s"]).to_numpy()
    assert admit_s[1:] == pytest.approx(req["finish_s"].to_numpy()[:-1], rel=1e-12)
    assert req["prefill_s"].tolist() == pytest.approx([COST.prefill_s(2048, 0)] * 3, rel=1e-12)
    batched = simulate(trace_of(rows), ToReplica0(),
                       ClusterConfig(cost=COST, num_replicas=1, scheduler="prefill_first"),
                       progress=False).requests
    assert batched["finish_s"].iloc[-1] < req["finish_s"].iloc[-1]
    # the CLI choices and the experiment's name check read the registry too
    action = next(a for a in _replay_parser()._actions if a.dest == "scheduler")
    assert set(action.choices) == {*SCHEDULERS, "both"}


def test_unknown_scheduler_lists_the_registry():
    with pytest.raises(ConfigError, match=r"scheduler='fifo'.*prefill_first.*chunked"):
        ClusterConfig(cost=COST, scheduler="fifo")


def test_builtin_schedulers_are_registered_under_their_names():
    assert list(SCHEDULERS) == ["prefill_first", "chunked"]
    for name, cls in SCHEDULERS.items():
        assert cls.name == name and issubclass(cls, Scheduler)


def _replay_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["replay"]


# ------------------------------------------------------------------ policies
def _router_classes_in_package():
    found = {}
    for info in pkgutil.walk_packages(routers_pkg.__path__, prefix="btb_core.routers."):
        mod = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            # a policy declares its own ``name`` (wrappers such as RouterInstances do not)
            if (issubclass(cls, Router) and cls is not Router and "name" in vars(cls)
                    and cls.__module__ == mod.__name__):
                found[cls.name] = cls
    return found


def test_every_policy_class_in_the_package_is_registered_under_its_name():
    assert _router_classes_in_package() == POLICIES


def test_policy_lists_come_from_the_registry(monkeypatch):
    action = next(a for a in _replay_parser()._actions if a.dest == "policy")
    assert all(name in action.help for name in POLICIES)
    assert policy_order(["btb", "zeta", *reversed(list(POLICIES))]) == [*POLICIES, "zeta"]
    monkeypatch.setitem(POLICIES, ToReplica0.name, ToReplica0)       # the one registry line
    assert policy_order(["to_replica_0", "btb"]) == ["btb", "to_replica_0"]
    assert isinstance(make_router("to_replica_0"), ToReplica0)


def test_routers_import_nothing_from_the_simulator():
    code = ("import sys, btb_core.routers; "
            "print(sorted(m for m in sys.modules if m.startswith('btb_core.sim')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ ClusterView
class Spy(Router):
    """Keeps the view; asks it about each request's ids as a fresh tuple every time."""

    name = "spy"

    def reset(self, view):
        super().reset(view)
        self.seen = []

    def route(self, request):
        v = self.view
        ids = request.hash_ids
        fresh = tuple(list(ids))
        self.seen.append((v.now_s, v.cached_blocks(0, ids), v.cached_blocks(0, fresh),
                          v.cached_blocks(0, ids, ("dram",)), v.queue_length(0), v.kv_usage(0),
                          v.active_blocks(0), v.egress_backlog_s(0)))
        return 0


def test_router_receives_a_cluster_view_not_the_simulator():
    rows = [(0.0, 2048, 1, [1, 2, 3, 4]), (5.0, 2560, 1, [1, 2, 3, 4, 5])]
    spy = Spy()
    simulate(trace_of(rows), spy, ClusterConfig(cost=COST, num_replicas=2, scheduler="chunked"),
             progress=False)
    assert type(spy.view) is ClusterView
    assert not hasattr(spy.view, "replicas") and not hasattr(spy.view, "run")
    assert spy.view.num_replicas == 2 and spy.view.block_tokens == BT
    first, second = spy.seen
    assert first == (0.0, 0, 0, 0, 0, 0.0, 0, 0.0)
    # 4 complete blocks of request 0 are cached in HBM; the value cache gives the same answer
    # for the request's own tuple and for a fresh equal tuple
    assert second[:4] == (5.0, 4, 4, 0)


def test_view_caches_pieces_by_value():
    rows = [(0.0, 2048, 1, [1, 2, 3, 4])]
    spy = Spy()
    simulate(trace_of(rows), spy, ClusterConfig(cost=COST, num_replicas=1), progress=False)
    v = spy.view
    a = v.pieces((0, 1, 2))
    assert a is not None and v.pieces(tuple([0, 1, 2])) is a
    assert v.pieces((0, 2)) is None             # not a root path of the trace's ids


# ------------------------------------------------------------------ BTBConfig
def test_btb_config_defaults_are_the_reference_study_and_shared():
    assert DEFAULT_BTB == BTBConfig(x_repeats=2, y_tokens=65_536, z_s=1.0, m_replicas=4)
    r = BTBRouter()
    assert r.config == DEFAULT_BTB
    assert {p.name: p.default for p in BTBRouter.PARAMS if p.name in DEFAULT_BTB.as_params()} \
        == DEFAULT_BTB.as_params()
    cfg = BTBConfig(x_repeats=3, y_tokens=4096, z_s=2, m_replicas=1)
    assert cfg.z_s == 2.0 and isinstance(cfg.z_s, float)
    assert BTBRouter.from_config(cfg).config == cfg
    assert cfg.y_blocks(512) == 8 and cfg.y_blocks(1000) == 4
    with pytest.raises(ConfigError, match="y_tokens=4096 is shorter than one block"):
        cfg.y_blocks(8192)
    with pytest.raises(Exception):
        cfg.x_repeats = 4                        # frozen


@pytest.mark.parametrize("kwargs, field", [
    ({"x_repeats": 0}, "x_repeats=0"), ({"y_tokens": 0}, "y_tokens=0"),
    ({"y_tokens": 1.5}, "y_tokens=1.5"), ({"z_s": float("nan")}, "z_s=nan"),
    ({"m_replicas": True}, "m_replicas=True"),
])
def test_btb_router_validates_through_btb_config(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        BTBRouter(**kwargs)
