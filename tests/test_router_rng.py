"""``btb_core.sim.rng.RouterRng`` gives numpy's own sequence: any mix of its fast scalar draws
(``integers(n)``, ``random()``) and of calls handed to the wrapped generator returns what the plain
``numpy.random.Generator`` returns, and leaves the generator in the same state; replays through it
route exactly as through a plain generator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import btb_core.sim.engine as engine_module
from btb_core.routers import policy_class
from btb_core.sim import ClusterConfig, simulate
from btb_core.sim.rng import RouterRng, router_rng
from btb_core.trace import load_trace, shipped_traces

# bounds around the edges of the fast path: 1 (no draw), small, large, 2**32 - 1, 2**32 (one
# plain 32-bit draw), 2**32 + 1 and 2**40 (numpy's own 64-bit path)
_BOUNDS = st.one_of(st.sampled_from([1, 2, 3, 5, 7, 64, 255, 2 ** 31 + 5, 2 ** 32 - 1, 2 ** 32,
                                     2 ** 32 + 1, 2 ** 40]),
                    st.integers(1, 2 ** 32))
_CALLS = st.one_of(
    st.tuples(st.just("integers"), _BOUNDS),
    st.tuples(st.just("random"), st.none()),
    st.tuples(st.just("integers_size"), st.integers(1, 5)),      # handed to numpy
    st.tuples(st.just("integers_range"), st.integers(1, 50)),    # integers(low, high): numpy
    st.tuples(st.just("normal"), st.none()),                     # an attribute of the generator
    st.tuples(st.just("choice"), st.integers(1, 9)),
    st.tuples(st.just("many"), st.integers(1, 3000)),            # crosses a block of raw outputs
)


def _call(g, kind, arg):
    if kind == "integers":
        return int(g.integers(arg))
    if kind == "random":
        return g.random()
    if kind == "integers_size":
        return g.integers(10, size=arg).tolist()
    if kind == "integers_range":
        return int(g.integers(arg, arg + 7))
    if kind == "normal":
        return float(g.standard_normal())
    if kind == "choice":
        return int(g.choice(arg))
    return [int(g.integers(7)) if i % 2 else g.random() for i in range(arg)]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2 ** 63 - 1), calls=st.lists(_CALLS, max_size=40))
def test_any_mix_of_draws_is_numpys_sequence(seed, calls):
    plain = np.random.default_rng(seed)
    fast = RouterRng(np.random.default_rng(seed))
    for kind, arg in calls:
        assert _call(fast, kind, arg) == _call(plain, kind, arg), (kind, arg)
    assert fast.generator.bit_generator.state == plain.bit_generator.state
    # and the next draws after handing the state back still agree
    assert fast.integers(5) == int(plain.integers(5))
    assert fast.random() == plain.random()


def test_scalar_draws_are_python_numbers_and_edge_bounds():
    seed = 20261201
    plain, fast = np.random.default_rng(seed), RouterRng(np.random.default_rng(seed))
    assert type(fast.integers(6)) is int and type(fast.random()) is float
    plain.integers(6)
    plain.random()
    assert fast.integers(1) == 0 == int(plain.integers(1))          # no draw for one value
    with pytest.raises(ValueError):
        fast.integers(0)                                           # numpy's own error
    with pytest.raises(ValueError):
        plain.integers(0)
    # array and numpy-integer bounds are numpy's own calls
    assert fast.integers(np.array([3, 5])).tolist() == plain.integers(np.array([3, 5])).tolist()
    assert fast.integers(np.int64(9)) == plain.integers(np.int64(9))
    # 2**32 takes one 32-bit draw, the pending high half first
    for _ in range(3):
        assert fast.integers(2 ** 32) == int(plain.integers(2 ** 32))
    assert fast.generator.bit_generator.state == plain.bit_generator.state


def test_lemire_rejections_follow_numpy():
    """Bounds just above 2**31 reject about half their first draws (Lemire's threshold is
    ``2**32 mod n``), so this run takes the rejection loop hundreds of times."""
    plain, fast = np.random.default_rng(7), RouterRng(np.random.default_rng(7))
    bounds = [2 ** 31 + 5, 3 * 2 ** 30 + 1, 2 ** 32 - 1, 6, 2 ** 31, 1000003]
    got = [fast.integers(bounds[i % 6]) for i in range(3000)]
    assert got == [int(plain.integers(bounds[i % 6])) for i in range(3000)]
    assert fast.generator.bit_generator.state == plain.bit_generator.state


def test_only_pcg64_is_wrapped():
    other = np.random.Generator(np.random.MT19937(1))
    with pytest.raises(TypeError, match="PCG64"):
        RouterRng(other)
    assert router_rng(other) is other
    assert isinstance(router_rng(np.random.default_rng(1)), RouterRng)


@pytest.mark.parametrize("policy", ["power_of_two", "random", "least_load", "kv_aware",
                                    "btb_adaptive"])
def test_replays_route_as_with_a_plain_generator(policy, monkeypatch):
    tr = load_trace(shipped_traces()["mooncake_conversation"]).rows(0, 600)
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=8)
    kw = {"router_temperature": 0.5} if policy == "kv_aware" else {}   # draws random() too
    seen = []

    class Recorded(policy_class(policy)):
        def reset(self, view):
            seen.append(type(view.rng))
            super().reset(view)

    fast = simulate(tr, Recorded(**kw), cluster, seed=3)
    monkeypatch.setattr(engine_module, "router_rng", lambda g: g)
    plain = simulate(tr, Recorded(**kw), cluster, seed=3)
    assert seen == [RouterRng, np.random.Generator]
    assert fast.requests.equals(plain.requests)
    assert fast.requests["replica"].nunique() > 1


def test_copies_and_pickles_continue_the_same_sequence():
    """A deep copy or a pickle taken mid-block (a router kept for later, a worker's result) draws
    what the original would have drawn next."""
    import copy
    import pickle

    g = RouterRng(np.random.default_rng(5))
    for _ in range(7):
        g.integers(9)
    g.random()
    restored, copied = pickle.loads(pickle.dumps(g)), copy.deepcopy(g)
    assert restored.generator.bit_generator is restored._bg
    ahead = [g.integers(9) for _ in range(2000)]
    assert [restored.integers(9) for _ in range(2000)] == ahead
    assert [copied.integers(9) for _ in range(2000)] == ahead
