"""The X/Y/Z burst detector: window boundaries, expiry, validation, and a brute-force property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from btb_core.btb_config import BTBConfig
from btb_core.detector import BurstDetector, prefix_key
from btb_core.errors import ConfigError


def test_two_arrivals_exactly_z_apart_are_a_burst():
    det = BurstDetector(BTBConfig(x_repeats=2, z_s=1.0))
    assert det.observe("p", 0.0) is False
    assert det.observe("p", 1.0) is True  # "within Z" is inclusive


def test_two_arrivals_just_over_z_apart_are_not():
    det = BurstDetector(BTBConfig(x_repeats=2, z_s=1.0))
    det.observe("p", 0.0)
    assert det.observe("p", 1.0 + 1e-9) is False


def test_inclusive_boundary_survives_float_rounding():
    # 1.1 - 1.0 is 0.10000000000000009 in binary; expiry and the window test must agree.
    det = BurstDetector(BTBConfig(x_repeats=2, z_s=1.0))
    det.observe("p", 0.1)
    assert det.observe("p", 1.1) is True


def test_x3_needs_three_in_the_window():
    det = BurstDetector(BTBConfig(x_repeats=3, z_s=1.0))
    assert [det.observe("p", t) for t in (0.0, 0.6, 1.2)] == [False, False, False]
    assert det.observe("p", 1.5) is True  # 0.6, 1.2, 1.5 span 0.9 s


def test_keys_are_independent():
    det = BurstDetector(BTBConfig(x_repeats=2, z_s=1.0))
    assert det.observe("a", 0.0) is False
    assert det.observe("b", 0.1) is False
    assert det.observe("a", 0.2) is True
    assert det.observe("b", 5.0) is False


def test_x1_marks_every_arrival_active():
    det = BurstDetector(BTBConfig(x_repeats=1, z_s=0.0))
    assert det.observe("p", 3.0) is True


def test_stale_keys_expire_and_memory_is_bounded():
    det = BurstDetector(BTBConfig(x_repeats=2, z_s=1.0))
    for i in range(1000):  # one new key every 0.1 s: at most 11 keys within any 1 s
        det.observe(i, i * 0.1)
        assert det.num_tracked <= 12
    assert det.count_in_window(999, 99.9) == 1
    assert det.count_in_window(0, 99.9) == 0


def test_count_in_window_caps_at_x():
    det = BurstDetector(BTBConfig(x_repeats=2, z_s=1.0))
    for t in (0.0, 0.1, 0.2):
        det.observe("p", t)
    assert det.count_in_window("p", 0.2) == 2


def test_time_must_not_go_backwards():
    det = BurstDetector()
    det.observe("p", 2.0)
    with pytest.raises(ValueError, match="now_s=1.0"):
        det.observe("p", 1.0)


@pytest.mark.parametrize("kwargs, field", [
    ({"x_repeats": 0}, "x_repeats=0"),
    ({"x_repeats": 1.5}, "x_repeats=1.5"),
    ({"x_repeats": True}, "x_repeats=True"),
    ({"z_s": -1.0}, "z_s=-1.0"),
    ({"z_s": float("inf")}, "z_s=inf"),
    ({"y_tokens": 0}, "y_tokens=0"),
    ({"m_replicas": -1}, "m_replicas=-1"),
])
def test_config_errors_name_field_and_value(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        BTBConfig(**kwargs)


def test_prefix_key_is_the_yth_chained_id():
    assert prefix_key((10, 11, 12, 13), 3) == 12
    assert prefix_key((10, 11), 3) is None
    assert prefix_key((10, 11), 0) is None


def _brute_force(events, x, z):
    out = []
    for i, (key, t) in enumerate(events):
        times = [tt for kk, tt in events[: i + 1] if kk == key]
        out.append(len(times) >= x and t - times[-x] <= z)
    return out


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5])),
                   min_size=1, max_size=40),
    x=st.integers(1, 4),
    z=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
)
def test_matches_brute_force(steps, x, z):
    t = 0.0
    events = []
    for key, dt in steps:
        t += dt
        events.append((key, t))
    det = BurstDetector(BTBConfig(x_repeats=x, z_s=z))
    assert [det.observe(k, tt) for k, tt in events] == _brute_force(events, x, z)


def test_exactly_z_apart_survives_float_rounding():
    # 2.003207 - 1.003207 evaluates to 1.0000000000000002 in binary floating point
    from btb_core.detector import BurstDetector

    det = BurstDetector(BTBConfig(x_repeats=2, z_s=1.0))
    assert det.observe("k", 1.003207) is False
    assert det.observe("k", 2.003207) is True
    assert det.observe("j", 5.0) is False
    assert det.observe("j", 6.000001) is False  # 1 us past Z is outside


class _ExpireEveryArrival(BurstDetector):
    """The detector as it was before the expiry bound: the front key is looked at on every
    arrival (the plain reference for the bound that skips that look)."""

    def observe(self, key, now_s):
        self._bound_s = float("-inf")   # never skip the expiry loop
        return super().observe(key, now_s)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.1, 0.5, 1.0, 1.0 + 1e-12,
                                                                   2.5])), max_size=60),
       x=st.integers(1, 3), z=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
def test_expiry_bound_equals_expiring_at_every_arrival(steps, x, z):
    """The bound that skips the expiry look-up leaves the same answers and the same tracked keys
    (in the same order) as looking at the front key on every arrival."""
    cfg = BTBConfig(x_repeats=x, z_s=z)
    fast, plain = BurstDetector(cfg), _ExpireEveryArrival(cfg)
    t = 0.0
    for key, dt in steps:
        t += dt
        assert fast.observe(key, t) == plain.observe(key, t)
        assert list(fast._times.items()) == list(plain._times.items())
