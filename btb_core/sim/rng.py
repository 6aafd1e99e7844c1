"""The router's random draws: numpy's PCG64 ``Generator``, with its two scalar draws made cheap.

Routers draw one or two scalars per request (``power_of_two``'s two candidates, ties broken at
random by ``least_load``, ``kv_aware``, ``llm_d`` and ``btb_adaptive``, ``kv_aware``'s softmax
sample). ``numpy.random.Generator.integers(n)`` costs ~1.1 us a call on the benchmark machine
(argument checks, a lock, a numpy scalar), as much as a whole cache-aware match. :class:`RouterRng`
returns the **same numbers** from the same generator for ``integers(n)`` and ``random()``, at
~0.5 us for ``integers(n)`` (``benchmarks/bench_rng.py``): it takes the generator's raw 64-bit outputs in blocks (``bit_generator.random_raw``) and
applies numpy's own transforms to them in Python:

- ``random()``: ``(next64 >> 11) * 2**-53`` (``pcg64_next_double``, numpy
  ``numpy/random/src/pcg64/pcg64.h``);
- ``integers(n)``, ``1 <= n <= 2**32``: Lemire's multiply-and-reject on 32-bit draws
  (``buffered_bounded_lemire_uint32`` in ``numpy/random/src/distributions/distributions.c``, which
  ``random_bounded_uint64_fill`` calls for ranges below 2**32; ``n == 2**32`` takes one 32-bit
  draw as is), where a 32-bit draw is the low half of a 64-bit output and the next one its high
  half (``pcg64_next32`` keeps that half in ``has_uint32`` / ``uinteger``).

Every other attribute (``choice``, ``shuffle``, ``bit_generator``, ``integers`` with other
arguments, ...) goes to the wrapped generator after its state is set to exactly where the fast
draws left it, so any mix of calls gives numpy's sequence (checked against numpy over mixed draws
in ``tests/test_router_rng.py``). Draw through this object: a reference to the wrapped generator
or its bit generator kept across fast draws would see a state that the block read ahead.

Scalar draws return Python ``int`` / ``float`` (numpy returns ``numpy.int64`` for ``integers``).
"""

from __future__ import annotations

import numpy as np

#: Raw 64-bit outputs read per block (about 2 us per 1,024 through ``random_raw``).
_BLOCK = 1024

_MASK32 = 0xFFFFFFFF
_INT64 = np.int64
_FLOAT64 = np.float64
_TWO_M53 = 1.0 / 9007199254740992.0


class RouterRng:
    """A ``numpy.random.Generator`` (PCG64) whose scalar ``integers(n)`` and ``random()`` are
    computed in Python from blocks of raw outputs, giving numpy's exact sequence.

    Parameters
    ----------
    generator : numpy.random.Generator
        Its bit generator must be ``PCG64`` (``numpy.random.default_rng``'s).

    Raises
    ------
    TypeError
        For another bit generator (:func:`router_rng` passes those through unchanged).

    Notes
    -----
    ``integers(n)`` takes the fast path for a Python ``int`` ``1 <= n <= 2**32`` with every other
    argument at its default; anything else (``integers(0)``'s ``ValueError`` included) is
    numpy's own call.
    """

    __slots__ = ("_gen", "_bg", "_raw", "_pos", "_state0", "_has32", "_u32", "_live")

    def __init__(self, generator: np.random.Generator) -> None:
        self._gen = generator
        self._bg = generator.bit_generator
        if type(self._bg) is not np.random.PCG64:
            raise TypeError(f"RouterRng needs a PCG64 generator, not {type(self._bg).__name__} "
                            "(router_rng() returns other generators as they are)")
        self._raw: list[int] = []
        self._pos = 0
        self._state0 = None
        self._has32 = 0
        self._u32 = 0
        self._live = False          # True while the block holds outputs the generator has passed

    # -- the exact state ---------------------------------------------------------------------
    def _refill(self) -> None:
        bg = self._bg
        state = bg.state
        if not self._live:          # take the pending 32-bit half from the generator
            self._has32 = state["has_uint32"]
            self._u32 = state["uinteger"]
            self._live = True
        self._state0 = state
        self._raw = bg.random_raw(_BLOCK).tolist()
        self._pos = 0

    def _sync(self) -> None:
        """Put the wrapped generator exactly where the fast draws are and drop the block."""
        if not self._live:
            return
        bg = self._bg
        bg.state = self._state0
        if self._pos:
            bg.random_raw(self._pos)
        state = bg.state
        state["has_uint32"] = self._has32
        state["uinteger"] = self._u32
        bg.state = state
        self._raw = []
        self._pos = 0
        self._live = False

    def _next32(self) -> int:
        """The next 32-bit draw: the pending high half, or the low half of the next output."""
        if not self._live:          # the pending half is the generator's until the first block
            self._refill()
        if self._has32:
            self._has32 = 0
            return self._u32
        pos = self._pos
        if pos == len(self._raw):
            self._refill()
            pos = 0
        self._pos = pos + 1
        v = self._raw[pos]
        self._has32 = 1
        self._u32 = v >> 32
        return v & _MASK32

    # -- the two fast draws ------------------------------------------------------------------
    def integers(self, low, high=None, size=None, dtype=_INT64, endpoint=False):
        """``Generator.integers``; ``integers(n)`` for an ``int`` ``1 <= n <= 2**32`` returns
        numpy's number as a Python ``int``."""
        if high is None and type(low) is int and 1 < low < 0x100000000 and size is None \
                and dtype is _INT64 and not endpoint:
            # Lemire's method, as buffered_bounded_lemire_uint32 (module docstring); the first
            # 32-bit draw is _next32 written out (a call costs as much as the rest)
            if self._has32 and self._live:
                self._has32 = 0
                m = self._u32 * low
            else:
                m = self._next32() * low
            if m & _MASK32 < low:
                threshold = (0x100000000 - low) % low
                while m & _MASK32 < threshold:
                    m = self._next32() * low
            return m >> 32
        if high is None and type(low) is int and (low == 1 or low == 0x100000000) \
                and size is None and dtype is _INT64 and not endpoint:
            return 0 if low == 1 else self._next32()     # numpy draws nothing for one value
        self._sync()
        return self._gen.integers(low, high, size, dtype, endpoint)

    def random(self, size=None, dtype=_FLOAT64, out=None):
        """``Generator.random``; ``random()`` returns numpy's float."""
        if size is None and out is None and dtype is _FLOAT64:
            pos = self._pos
            if pos == len(self._raw):
                self._refill()
                pos = 0
            self._pos = pos + 1
            return (self._raw[pos] >> 11) * _TWO_M53
        self._sync()
        return self._gen.random(size, dtype, out)

    # -- everything else: the wrapped generator, in sync ---------------------------------------
    def __getattr__(self, name):
        if name.startswith("__") or name in RouterRng.__slots__:   # copy/pickle probes, unset slots
            raise AttributeError(name)
        self._sync()
        return getattr(self._gen, name)

    @property
    def generator(self) -> np.random.Generator:
        """The wrapped generator, set to the state the draws so far left."""
        self._sync()
        return self._gen

    def __repr__(self) -> str:
        return f"RouterRng({self._bg.__class__.__name__})"


def router_rng(generator: np.random.Generator):
    """``generator`` wrapped in :class:`RouterRng` when its bit generator is PCG64, else itself."""
    if type(generator.bit_generator) is np.random.PCG64:
        return RouterRng(generator)
    return generator


__all__ = ["RouterRng", "router_rng"]
