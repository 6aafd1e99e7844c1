"""The router's random draws: numpy's PCG64 ``Generator``, with its two scalar draws made cheap.

Routers draw one or two scalars per request (``power_of_two``'s two candidates, ties broken at
random by ``least_load``, ``kv_aware``, ``llm_d`` and ``btb_adaptive``, ``kv_aware``'s softmax
sample). ``numpy.random.Generator.integers(n)`` costs ~1.1 us a call on the benchmark machine
(argument checks, a lock, building the result), as much as a whole cache-aware match.
:class:`RouterRng` is a ``numpy.random.Generator`` that returns the **same numbers** for
``integers(n)`` and ``random()`` at about half that (``benchmarks/bench_rng.py``): it takes the bit
generator's raw 64-bit outputs in blocks (``random_raw``) and applies numpy's own transforms to
them in Python:

- ``random()``: ``(next64 >> 11) * 2**-53`` (``pcg64_next_double``, numpy
  ``numpy/random/src/pcg64/pcg64.h``);
- ``integers(n)``, ``1 <= n <= 2**32``: Lemire's multiply-and-reject on 32-bit draws
  (``buffered_bounded_lemire_uint32`` in ``numpy/random/src/distributions/distributions.c``, which
  ``random_bounded_uint64_fill`` calls for ranges below 2**32; ``n == 2**32`` takes one 32-bit
  draw as is; ``n == 1`` draws nothing), where a 32-bit draw is the low half of a 64-bit output
  and the next one its high half (``pcg64_next32`` keeps that half in ``has_uint32`` /
  ``uinteger``).

Every other method (``choice``, ``shuffle``, ``integers`` with other arguments, ...) and the
``bit_generator`` property first set the bit generator's state to exactly where the fast draws
left it, then run numpy's own code (with the fast paths off meanwhile, in case numpy's code calls
``random`` or ``integers`` on itself), so any mix of calls gives numpy's sequence (checked against
numpy over mixed draws in ``tests/test_router_rng.py``). Keep the generator, not its bit generator:
a bit generator held across fast draws sees a state the block has read ahead of.
"""

from __future__ import annotations

import numpy as np

#: Raw 64-bit outputs read per block (about 2 us per 1,024 through ``random_raw``).
_BLOCK = 1024

_MASK32 = 0xFFFFFFFF
_INT64 = np.int64
_FLOAT64 = np.float64
_TWO_M53 = 1.0 / 9007199254740992.0
_Generator = np.random.Generator


def _restore(bit_generator) -> "RouterRng":
    """Unpickling and copying: a :class:`RouterRng` on ``bit_generator`` (already in sync)."""
    return RouterRng(bit_generator)


class RouterRng(_Generator):
    """A ``numpy.random.Generator`` on a PCG64 bit generator whose scalar ``integers(n)`` and
    ``random()`` are computed in Python from blocks of raw outputs, giving numpy's exact
    sequence (module docstring).

    Parameters
    ----------
    bit_generator : numpy.random.PCG64 or numpy.random.Generator
        The PCG64 bit generator to draw from (of a ``Generator``: its bit generator, shared).

    Raises
    ------
    TypeError
        For another bit generator (:func:`router_rng` passes those through unchanged).

    Notes
    -----
    ``integers(n)`` takes the fast path for a Python ``int`` ``1 <= n <= 2**32`` with every other
    argument at its default and returns a ``numpy.int64``, as numpy does; anything else
    (``integers(0)``'s ``ValueError`` included) is numpy's own call.
    """

    __slots__ = ("_raw", "_pos", "_state0", "_has32", "_u32", "_live", "_inside")

    def __init__(self, bit_generator) -> None:
        if isinstance(bit_generator, _Generator):
            bit_generator = bit_generator.bit_generator
        if type(bit_generator) is not np.random.PCG64:
            raise TypeError(f"RouterRng needs a PCG64 bit generator, not "
                            f"{type(bit_generator).__name__} (router_rng() returns other "
                            "generators as they are)")
        super().__init__(bit_generator)
        self._raw: list[int] = []
        self._pos = 0
        self._state0 = None
        self._has32 = 0
        self._u32 = 0
        self._live = False          # True while the block holds outputs the bit generator passed
        self._inside = False        # True while numpy's own code runs (fast paths off)

    # -- the exact state ---------------------------------------------------------------------
    def _refill(self) -> None:
        bg = _Generator.bit_generator.__get__(self)
        state = bg.state
        if not self._live:          # take the pending 32-bit half from the bit generator
            self._has32 = state["has_uint32"]
            self._u32 = state["uinteger"]
            self._live = True
        self._state0 = state
        self._raw = bg.random_raw(_BLOCK).tolist()
        self._pos = 0

    def _sync(self) -> None:
        """Put the bit generator exactly where the fast draws are and drop the block."""
        if not self._live:
            return
        bg = _Generator.bit_generator.__get__(self)
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
        if not self._live:          # the pending half is the bit generator's until the first block
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
        """``Generator.integers``; ``integers(n)`` for an ``int`` ``1 <= n <= 2**32`` is
        computed here (the same number)."""
        if high is None and type(low) is int and 1 < low < 0x100000000 and size is None \
                and dtype is _INT64 and not endpoint and not self._inside:
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
            return _INT64(m >> 32)
        if high is None and type(low) is int and (low == 1 or low == 0x100000000) \
                and size is None and dtype is _INT64 and not endpoint and not self._inside:
            return _INT64(0 if low == 1 else self._next32())   # numpy draws nothing for one value
        return self._numpy("integers", low, high, size, dtype, endpoint)

    def random(self, size=None, dtype=_FLOAT64, out=None):
        """``Generator.random``; ``random()`` is computed here (the same float)."""
        if size is None and out is None and dtype is _FLOAT64 and not self._inside:
            pos = self._pos
            if pos == len(self._raw):
                self._refill()
                pos = 0
            self._pos = pos + 1
            return (self._raw[pos] >> 11) * _TWO_M53
        return self._numpy("random", size, dtype, out)

    # -- everything else: numpy's code, in sync ------------------------------------------------
    def _numpy(self, name: str, *args, **kwargs):
        """``Generator.<name>(*args, **kwargs)`` after :meth:`_sync`, fast paths off meanwhile."""
        self._sync()
        inside, self._inside = self._inside, True
        try:
            return getattr(_Generator, name)(self, *args, **kwargs)
        finally:
            self._inside = inside

    @property
    def bit_generator(self):
        """The bit generator, set to the state the draws so far left (do not keep it across
        draws: the fast draws read it ahead)."""
        self._sync()
        return _Generator.bit_generator.__get__(self)

    def __copy__(self):
        # numpy's copy.copy of a Generator shares its bit generator, so the two draw one stream;
        # two RouterRng on one bit generator would each read ahead of the other
        return self

    def __reduce__(self):
        self._sync()
        return _restore, (_Generator.bit_generator.__get__(self),)

    def __repr__(self) -> str:
        return "RouterRng(PCG64)"


def _delegate(name: str):
    def method(self, *args, **kwargs):
        return self._numpy(name, *args, **kwargs)
    method.__name__ = name
    method.__qualname__ = f"RouterRng.{name}"
    method.__doc__ = f"``numpy.random.Generator.{name}`` (in sync with the fast draws)."
    return method


for _name in dir(_Generator):
    if (not _name.startswith("_") and _name not in RouterRng.__dict__
            and callable(getattr(_Generator, _name))):
        setattr(RouterRng, _name, _delegate(_name))
del _name


def router_rng(generator: np.random.Generator):
    """``generator``'s bit generator in a :class:`RouterRng` when it is PCG64, else
    ``generator`` itself."""
    if type(generator.bit_generator) is np.random.PCG64:
        return RouterRng(generator.bit_generator)
    return generator


__all__ = ["RouterRng", "router_rng"]
