"""The X/Y/Z burst detector of Bite the Bullet (``DESIGN.md`` sections 1 and 5).

A prefix key (the chained id of a prompt's ``Y``-th block, which names its first ``Y`` blocks) is
*active* at an arrival when at least ``X`` arrivals of that key, this one included, fall within the
last ``Z`` seconds: ``t_now - t_(X-th most recent) <= Z`` (inclusive, so two arrivals exactly ``Z``
apart count, up to a 0.1 ns tolerance so that float rounding of times like ``2.003207 - 1.003207`` cannot
drop a pair that is exactly ``Z`` apart). The reference study uses ``X = 2``, ``Z = 1 s``.

Work and memory
---------------
Each key keeps only its last ``X`` arrival times (a ``deque(maxlen=X)``), which is all the test
needs, so an arrival is O(1). Keys whose last arrival is more than ``Z`` seconds old can never be
part of a qualifying window again; they sit in an insertion-ordered map sorted by last arrival and
are dropped from its front on later arrivals, each key once per insertion, so expiry is O(1)
amortised and memory is bounded by the keys seen in the last ``Z`` seconds.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from .btb_config import DEFAULT_BTB, BTBConfig


class BurstDetector:
    """Sliding-window repeat counter over prefix keys.

    Parameters
    ----------
    config : BTBConfig
        Uses its ``x_repeats`` (X) and ``z_s`` (Z); default :data:`~btb_core.btb_config.DEFAULT_BTB`
        (validated when the config was built).
    """

    def __init__(self, config: BTBConfig = DEFAULT_BTB) -> None:
        if not isinstance(config, BTBConfig):
            raise TypeError(f"BurstDetector: config must be a BTBConfig, got {type(config).__name__}")
        self.config = config
        self._times: OrderedDict = OrderedDict()  # key -> deque of its last X arrival times
        self._last_s = float("-inf")
        # a lower bound of the front key's last arrival (the earliest last arrival of any key):
        # while ``now - bound <= Z`` nothing can expire, so the front is not looked at
        self._bound_s = float("-inf")

    @property
    def num_tracked(self) -> int:
        """Keys currently held (those seen within the last ``z_s`` seconds, plus not-yet-expired
        ones until the next arrival)."""
        return len(self._times)

    def observe(self, key, now_s: float) -> bool:
        """Record an arrival of ``key`` at ``now_s``; return whether ``key`` is active now.

        Raises
        ------
        ValueError
            If ``now_s`` is earlier than the previous arrival (the detector needs time order).
        """
        now_s = float(now_s)
        if now_s < self._last_s:
            raise ValueError(f"BurstDetector.observe: now_s={now_s!r} is earlier than the previous "
                             f"arrival at {self._last_s!r}")
        self._last_s = now_s
        x, z = self.config.x_repeats, self.config.z_s + _EPS_S
        times = self._times
        # expire keys whose last arrival is older than the window (the front's last arrival only
        # grows as keys move to the end, so the bound stays below it)
        if now_s - self._bound_s > z:
            bound = now_s
            while times:
                oldest_key, oldest = next(iter(times.items()))
                if now_s - oldest[-1] <= z:
                    bound = oldest[-1]
                    break
                del times[oldest_key]
            self._bound_s = bound
        window = times.get(key)
        if window is None:
            window = deque(maxlen=x)
            times[key] = window
        else:
            times.move_to_end(key)
        window.append(now_s)
        return len(window) == x and now_s - window[0] <= z

    def count_in_window(self, key, now_s: float) -> int:
        """Arrivals of ``key`` within ``[now_s - z_s, now_s]``, counted up to ``x_repeats``."""
        window = self._times.get(key)
        if not window:
            return 0
        return sum(1 for t in window if now_s - t <= self.config.z_s + _EPS_S)


#: Tolerance of the inclusive window test, seconds: far below any trace's time resolution (1 us),
#: above the rounding of differences of times up to ~1e5 s.
_EPS_S = 1e-10


def prefix_key(hash_ids, y_blocks: int):
    """The detector key of a prompt: its ``y_blocks``-th chained block id, or ``None`` when the
    prompt has fewer than ``y_blocks`` ids. Callers also require ``y_blocks`` *full* blocks."""
    if y_blocks < 1 or len(hash_ids) < y_blocks:
        return None
    return hash_ids[y_blocks - 1]


__all__ = ["BurstDetector", "prefix_key"]
