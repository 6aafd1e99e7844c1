"""Least-load: the replica with the fewest in-flight requests this router dispatched.

Reference: SGLang Model Gateway ``sgl-model-gateway/src/policies/least_load.rs`` (sgl-project/sglang
@ bc9fd4a7) keeps, per worker, the load it dispatched and not yet completed (incremented in
``select_worker``, decremented in ``on_request_complete``) and picks the first worker with the
minimum load. That release weighs a request by its text length; the project's definition
(``DESIGN.md`` section 5) counts requests, which is the default here (``load_unit="requests"``), and
``load_unit="prompt_tokens"`` reproduces the length-weighted variant.
"""

from __future__ import annotations

from .base import Router
from .params import RouterParam
from ..errors import ConfigError


class InFlightLoad:
    """Per-replica in-flight load as the router itself tracks it (route +, finish -).

    Parameters
    ----------
    num_replicas : int
    unit : {"requests", "prompt_tokens"}
        What one request adds: 1, or its ``input_length``.

    Notes
    -----
    A finished request removes exactly what it added (kept per request index), so the load never
    goes negative and a request finished twice is ignored.
    """

    def __init__(self, num_replicas: int, unit: str = "requests") -> None:
        if unit not in ("requests", "prompt_tokens"):
            raise ConfigError(f"load unit={unit!r} must be 'requests' or 'prompt_tokens'")
        self.unit = unit
        self.loads = [0] * num_replicas
        self._pending: dict[int, tuple[int, int]] = {}

    def add(self, request, replica: int) -> None:
        """Count ``request`` as in flight on ``replica``."""
        amount = 1 if self.unit == "requests" else int(request.input_length)
        self.loads[replica] += amount
        self._pending[request.index] = (replica, amount)

    def finish(self, request) -> None:
        """Remove ``request``'s load (no-op if it was never added or already removed)."""
        entry = self._pending.pop(request.index, None)
        if entry is not None:
            replica, amount = entry
            self.loads[replica] -= amount

    def drop_replica(self, replica: int) -> None:
        """``replica`` failed: forget the requests counted there (they are routed again)."""
        self.loads[replica] = 0
        self._pending = {k: v for k, v in self._pending.items() if v[0] != replica}

    def argmin(self, candidates=None) -> int:
        """Lowest-load replica among ``candidates`` (ascending indices; default all); ties go to the
        lowest index."""
        loads = self.loads
        if candidates is None:
            return loads.index(min(loads))
        return min(candidates, key=loads.__getitem__)


class SpreadLoad(InFlightLoad):
    """:class:`InFlightLoad` (one per request) that also knows the largest and smallest load of
    all replicas without scanning them (:meth:`spread`), for routers that test the spread on every
    decision (cache-aware's imbalance rule).

    Keeps how many replicas carry each load value; a route or a finish moves one replica by one,
    so the extremes follow in O(1). ``loads`` stays a plain list that callers may read; if
    something else rewrites it (tests set loads directly), :meth:`spread` notices (it keeps a copy
    of the list it last saw, compared at C speed) and recounts.
    """

    def __init__(self, num_replicas: int) -> None:
        super().__init__(num_replicas, "requests")
        self._recount()

    def _recount(self) -> None:
        loads = self.loads
        self._seen = list(loads)
        count: dict[int, int] = {}
        for x in loads:
            count[x] = count.get(x, 0) + 1
        self._count = count
        self.hi = max(loads) if loads else 0
        self.lo = min(loads) if loads else 0

    def add(self, request, replica: int) -> None:
        loads = self.loads
        old = loads[replica]
        loads[replica] = old + 1
        self._pending[request.index] = (replica, 1)
        self._move(replica, old, old + 1)

    def finish(self, request, replica=None) -> None:
        """Remove ``request``'s load (``replica`` is ignored: the signature of a router's
        ``on_request_finished``, so a router may hand this method over as its hook)."""
        entry = self._pending.pop(request.index, None)
        if entry is None:
            return
        replica = entry[0]
        loads = self.loads
        old = loads[replica]
        loads[replica] = old - 1
        self._move(replica, old, old - 1)

    def _move(self, replica: int, old: int, new: int) -> None:
        """``replica``'s load went from ``old`` to ``new`` (one up or one down): move it between
        the per-value counts and follow the extremes."""
        seen = self._seen
        if seen[replica] != old:   # the list was rewritten from outside: recount
            self._recount()
            return
        seen[replica] = new
        count = self._count
        count[old] -= 1
        count[new] = count.get(new, 0) + 1
        if new > self.hi:
            self.hi = new
        elif new < self.lo:
            self.lo = new
        if not count[old]:         # the last replica at ``old`` left it: ``new`` is the next value
            if old == self.lo:
                self.lo = new
            elif old == self.hi:
                self.hi = new

    def drop_replica(self, replica: int) -> None:
        super().drop_replica(replica)
        self._recount()

    def spread(self) -> tuple[int, int]:
        """``(max(loads), min(loads))``."""
        if self.loads != self._seen:
            self._recount()
        return self.hi, self.lo

    def argmin(self, candidates=None) -> int:
        if candidates is None:
            return self.loads.index(self.spread()[1])
        return min(candidates, key=self.loads.__getitem__)


class InFlightRouter(Router):
    """A router that books the requests it dispatched in ``self.load`` (an :class:`InFlightLoad`
    its ``reset`` creates): a finished request leaves the book, a failed replica's requests too."""

    def on_request_finished(self, request, replica: int) -> None:
        self.load.finish(request)

    def on_replica_removed(self, replica: int, failed: bool) -> None:
        if failed:
            self.load.drop_replica(replica)


class LeastLoadRouter(InFlightRouter):
    """Send each request to the replica with the fewest in-flight requests this router dispatched.

    Parameters
    ----------
    tie_break : {"index", "random"}
        ``"index"`` (default, as SGLang's first-minimum scan) or uniformly at random among the tied
        replicas using ``view.rng``.
    load_unit : {"requests", "prompt_tokens"}
        Load per request: 1 (default, ``DESIGN.md`` section 5) or its prompt length (the SGLang
        release cited in the module docstring weighs by text length).

    Raises
    ------
    ConfigError
        On a value outside the choices above.
    """

    name = "least_load"
    PARAMS = (
        RouterParam("tie_break", str, "index", "ties: lowest index or random", ("index", "random")),
        RouterParam("load_unit", str, "requests", "load per request",
                    ("requests", "prompt_tokens")),
    )

    def __init__(self, tie_break: str = "index", load_unit: str = "requests") -> None:
        if tie_break not in ("index", "random"):
            raise ConfigError(f"least_load: tie_break={tie_break!r} must be 'index' or 'random'")
        if load_unit not in ("requests", "prompt_tokens"):
            raise ConfigError(f"least_load: load_unit={load_unit!r} must be 'requests' or "
                              "'prompt_tokens'")
        self.tie_break = tie_break
        self.load_unit = load_unit

    def reset(self, view) -> None:
        super().reset(view)
        self.load = InFlightLoad(view.num_replicas, self.load_unit)

    def route(self, request) -> int:
        loads = self.load.loads
        cands = self.candidates()
        if len(cands) == len(loads):
            cands = None
        if self.tie_break == "index":
            replica = self.load.argmin(cands)
        else:
            pool = range(len(loads)) if cands is None else cands
            low = min(loads[r] for r in pool)
            tied = [r for r in pool if loads[r] == low]
            replica = tied[int(self.view.rng.integers(len(tied)))] if len(tied) > 1 else tied[0]
        self.load.add(request, replica)
        return replica


__all__ = ["InFlightLoad", "InFlightRouter", "LeastLoadRouter", "SpreadLoad"]
