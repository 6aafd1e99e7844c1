"""``btb_core.sim.rng.RouterRng`` gives numpy's own sequence: any mix of its fast scalar draws
(``integers(n)``, ``random()``) and of numpy's own methods returns what a plain
``numpy.random.Generator`` returns, and leaves the bit generator in the same state; it is a
``Generator`` to libraries; replays through it route exactly as through a plain generator."""

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
    st.tuples(st.just("normal"), st.none()),                     # numpy's own methods
    st.tuples(st.just("choice_p"), st.integers(2, 6)),
    st.tuples(st.just("permutation"), st.integers(1, 9)),
    st.tuples(st.just("shuffle"), st.integers(1, 9)),
    st.tuples(st.just("kept"), st.integers(1, 9)),               # a method kept across draws
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
    if kind == "choice_p":
        p = np.arange(1, arg + 1, dtype=float)
        return g.choice(arg, size=3, p=p / p.sum()).tolist()
    if kind == "permutation":
        return g.permutation(arg).tolist()
    if kind == "shuffle":
        x = list(range(arg))
        g.shuffle(x)
        return x
    if kind == "kept":
        draw = g.choice
        first = [int(g.integers(7)), g.random()]
        return first + [int(draw(arg))]
    return [int(g.integers(7)) if i % 2 else g.random() for i in range(arg)]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2 ** 63 - 1), calls=st.lists(_CALLS, max_size=40))
def test_any_mix_of_draws_is_numpys_sequence(seed, calls):
    plain = np.random.default_rng(seed)
    fast = RouterRng(np.random.default_rng(seed))
    for kind, arg in calls:
        assert _call(fast, kind, arg) == _call(plain, kind, arg), (kind, arg)
    assert fast.bit_generator.state == plain.bit_generator.state
    # and the next draws after handing the state back still agree
    assert fast.integers(5) == int(plain.integers(5))
    assert fast.random() == plain.random()


def test_scalar_draws_are_python_numbers_and_edge_bounds():
    seed = 20261201
    plain, fast = np.random.default_rng(seed), RouterRng(np.random.default_rng(seed))
    assert type(fast.integers(6)) is np.int64 and type(fast.random()) is float   # as numpy
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
    assert fast.bit_generator.state == plain.bit_generator.state


def test_lemire_rejections_follow_numpy():
    """Bounds just above 2**31 reject about half their first draws (Lemire's threshold is
    ``2**32 mod n``), so this run takes the rejection loop hundreds of times."""
    plain, fast = np.random.default_rng(7), RouterRng(np.random.default_rng(7))
    bounds = [2 ** 31 + 5, 3 * 2 ** 30 + 1, 2 ** 32 - 1, 6, 2 ** 31, 1000003]
    got = [fast.integers(bounds[i % 6]) for i in range(3000)]
    assert got == [int(plain.integers(bounds[i % 6])) for i in range(3000)]
    assert fast.bit_generator.state == plain.bit_generator.state


def test_only_pcg64_is_wrapped():
    other = np.random.Generator(np.random.MT19937(1))
    with pytest.raises(TypeError, match="PCG64"):
        RouterRng(other)
    with pytest.raises(TypeError, match="PCG64"):
        RouterRng(other.bit_generator)
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
    assert type(restored) is RouterRng and type(copied) is RouterRng
    ahead = [g.integers(9) for _ in range(2000)]
    assert [restored.integers(9) for _ in range(2000)] == ahead
    assert [copied.integers(9) for _ in range(2000)] == ahead


def test_a_generator_to_libraries_and_copies_share_the_stream():
    """``view.rng`` is a ``numpy.random.Generator``: numpy and pandas take it as one and draw
    what they would draw from the plain generator; ``copy.copy`` shares the stream, as numpy's
    copy of a Generator shares its bit generator; every pickle protocol round-trips."""
    import copy
    import pickle

    import pandas as pd

    fast, plain = RouterRng(np.random.default_rng(11)), np.random.default_rng(11)
    assert isinstance(fast, np.random.Generator) and np.random.default_rng(fast) is fast
    fast.integers(5), plain.integers(5)
    s = pd.Series(range(50))
    assert s.sample(5, random_state=fast).tolist() == s.sample(5, random_state=plain).tolist()
    assert fast.integers(9) == plain.integers(9)
    twin = copy.copy(fast)
    assert [twin.integers(9), fast.integers(9)] == [plain.integers(9), plain.integers(9)]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(fast, protocol=protocol))
        assert type(back) is RouterRng
        assert back.bit_generator.state == fast.bit_generator.state


def test_numpy_code_calling_back_into_the_generator_draws_from_its_state():
    """While numpy's own code runs the fast paths are off: a subclass whose ``random`` numpy's
    ``choice`` might call on itself still gets numpy's numbers."""
    fast, plain = RouterRng(np.random.default_rng(3)), np.random.default_rng(3)
    fast.random(), plain.random()
    assert fast.choice(10, size=4, p=np.full(10, 0.1)).tolist() == \
        plain.choice(10, size=4, p=np.full(10, 0.1)).tolist()
    # a scalar choice with p calls self.random() with no size, which would be the fast path
    for _ in range(3):
        assert fast.choice(10, p=np.full(10, 0.1)) == plain.choice(10, p=np.full(10, 0.1))
        assert fast.integers(7) == plain.integers(7)
    fast._inside = True                         # as inside numpy's code: numpy's own path,
    for draw in (lambda g: g.integers(7), lambda g: g.random()):   # so nothing read ahead
        assert draw(fast) == draw(plain)
        assert np.random.Generator.bit_generator.__get__(fast).state == plain.bit_generator.state
    fast._inside = False
    assert fast.integers(7) == plain.integers(7)
