"""Power of two choices: two distinct random replicas, keep the less loaded.

Reference: ``sgl-model-gateway/src/policies/power_of_two.rs`` (sgl-project/sglang @ 065f331f; same
rule in its continuation smg-project/smg ``model_gateway/src/policies/power_of_two.rs``): draw
``i`` uniformly, then ``j = (i + 1 + U{0..n-2}) mod n`` so the two differ, and take ``i`` when
``load_i <= load_j`` (ties favour the first draw).

Which load: the gateway compares the **engine-reported token loads** its load monitor caches for
both candidates (``cached_loads``, filled by ``update_loads`` from each engine's ``get_load``) and
falls back to its own in-flight request counts only when a candidate has no engine report. SGLang's
engine reports ``Scheduler.get_load`` (``python/sglang/srt/managers/scheduler.py``): tokens held in
KV by running requests plus the prompt tokens of its waiting queue. Here that is
``view.active_blocks(r) * block_tokens + view.queued_prompt_tokens(r)`` (``load="engine"``, the
default, as upstream). ``load="in_flight"`` is this project's earlier rule (the router's own
in-flight request count), kept to reproduce earlier results. The monitor refreshes its cache
periodically (``load_monitor_interval``); run with ``--load-lag-s`` to give the router snapshot
loads instead of live ones.
"""

from __future__ import annotations

from ..errors import ConfigError
from .least_load import InFlightLoad, InFlightRouter
from .params import RouterParam


class PowerOfTwoRouter(InFlightRouter):
    """Pick two distinct replicas with ``view.rng`` and route to the one with the lower load.

    Parameters
    ----------
    load : {"engine", "in_flight"}
        Engine-reported token load (KV tokens held by running requests + queued prompt tokens;
        default, as the gateway) or the router's own in-flight request count (earlier releases
        of this project).

    Raises
    ------
    ConfigError
        On an unknown ``load``.

    Notes
    -----
    With one replica it always returns 0 without drawing.
    """

    name = "power_of_two"
    PARAMS = (
        RouterParam("load", str, "engine", "compare engine token loads or own in-flight counts",
                    ("engine", "in_flight")),
    )

    def __init__(self, load: str = "engine") -> None:
        if load not in ("engine", "in_flight"):
            raise ConfigError(f"power_of_two: load={load!r} must be 'engine' or 'in_flight'")
        self.load_source = load

    def reset(self, view) -> None:
        super().reset(view)
        self.load = InFlightLoad(view.num_replicas)

    def engine_load(self, replica: int) -> int:
        """Tokens the engine reports as load: running requests' KV tokens + queued prompt tokens."""
        v = self.view
        return v.active_blocks(replica) * v.block_tokens + v.queued_prompt_tokens(replica)

    def route(self, request) -> int:
        cands = self.candidates()
        n = len(cands)
        if n == 1:
            replica = cands[0]
        else:
            rng = self.view.rng
            i = int(rng.integers(n))
            j = (i + 1 + int(rng.integers(n - 1))) % n
            i, j = cands[i], cands[j]
            if self.load_source == "engine":
                li, lj = self.engine_load(i), self.engine_load(j)
            else:
                li, lj = self.load.loads[i], self.load.loads[j]
            replica = i if li <= lj else j
        self.load.add(request, replica)
        return replica
