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
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class DetectorConfig:
    """Thresholds of the burst detector.

    Attributes
    ----------
    x_repeats : int >= 1
        Arrivals of the same prefix needed within the window (2, reference study).
    z_s : float >= 0
        Window length in seconds (1.0, reference study).

    Raises
    ------
    ConfigError
        On ``x_repeats < 1`` or ``z_s < 0`` / non-finite; the message names the field and value.
    """

    x_repeats: int = 2
    z_s: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.x_repeats, bool) or not isinstance(self.x_repeats, int) \
                or self.x_repeats < 1:
            raise ConfigError(f"DetectorConfig: x_repeats={self.x_repeats!r} must be an int >= 1")
        z = self.z_s
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not (0.0 <= z < float("inf")):
            raise ConfigError(f"DetectorConfig: z_s={z!r} must be a finite number >= 0")


class BurstDetector:
    """Sliding-window repeat counter over prefix keys.

    Parameters
    ----------
    x_repeats : int
    z_s : float
        See :class:`DetectorConfig`.

    Raises
    ------
    ConfigError
        On invalid thresholds.
    """

    def __init__(self, x_repeats: int = 2, z_s: float = 1.0) -> None:
        self.config = DetectorConfig(x_repeats, z_s)
        self._times: OrderedDict = OrderedDict()  # key -> deque of its last X arrival times
        self._last_s = float("-inf")

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
        # expire keys whose last arrival is older than the window
        while times:
            oldest_key, oldest = next(iter(times.items()))
            if now_s - oldest[-1] <= z:
                break
            del times[oldest_key]
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


__all__ = ["BurstDetector", "DetectorConfig", "prefix_key"]
