"""``sglang_gateway``: the real SGLang Model Gateway makes every routing decision.

For each simulated arrival the router sends ``POST /generate`` through the gateway (text from
:class:`~btb_core.routers.gateway.text.BlockText`), waits until a stand-in worker received it,
and returns that worker's replica. The worker holds the response open until the simulation calls
:meth:`on_request_finished`, so the gateway's own per-worker load (requests it forwarded and has not
seen answered) follows the simulation's in-flight requests.

Ordering with a sequential simulator (the only thing that makes the gateway's view deterministic):

1. An arrival blocks the simulation until the worker has the request: the gateway has by then
   selected the worker, inserted the text in its tree and counted the load.
2. A finish only releases the held response (no wait). Before the **next** decision the router
   settles: it waits for every released response to reach the client and then polls the gateway's
   ``GET /workers`` until each worker's load equals the simulation's in-flight count. So every
   decision sees exactly the finishes that happened before it in simulated time, and no others.
3. Wall-clock time cannot change a decision: tree eviction is pinned off (see
   :data:`~btb_core.routers.gateway.process.EVICTION_INTERVAL_SECS`), health checks answer at once,
   retries and the circuit breaker are disabled.

What is not deterministic: the gateway's ``random`` and ``power_of_two`` draw from its own thread
RNG (not ``view.rng``); ``cache_aware`` and ``round_robin`` are deterministic for a trace.
"""

from __future__ import annotations

from ..base import Router
from ..params import RouterParam, check_range
from .process import GATEWAY_POLICIES, SGLangGateway, require_gateway
from .text import BlockText


class SGLangGatewayRouter(Router):
    """Route with the real SGLang Model Gateway (``sglang-router`` wheel) on loopback.

    Parameters
    ----------
    gateway_policy : {"cache_aware", "round_robin", "power_of_two", "random"}
        The gateway's ``--policy`` (default ``cache_aware``).
    cache_threshold, balance_abs_threshold, balance_rel_threshold : float, int, float
        Passed as ``--cache-threshold`` etc.; defaults 0.3 / 64 / 1.5 are the launcher's
        (``sglang_router/router_args.py`` of sglang-router 0.3.2), the same as ``cache_aware``'s.
    chars_per_block : int >= 2
        Text characters per block id (:class:`BlockText`).
    startup_timeout_s : float > 0
        Seconds to wait for the gateway to report every worker healthy.

    Notes
    -----
    The gateway is started by :meth:`reset` (one fresh gateway per simulation, so its tree starts
    empty) and stopped by :meth:`close`, which :func:`btb_core.sim.simulate` calls when the run
    ends, fails or is interrupted. Used directly, the router is also a context manager.

    Raises
    ------
    ConfigError
        On a parameter out of range.
    GatewayError
        From :meth:`reset` if the package is missing or the gateway does not come up in time.
    """

    name = "sglang_gateway"
    #: Starts a real process: default policy lists (``btb suite``) leave it out unless named.
    external = True
    PARAMS = (
        RouterParam("gateway_policy", str, "cache_aware", "the gateway's --policy",
                    GATEWAY_POLICIES),
        RouterParam("cache_threshold", float, 0.3, "gateway --cache-threshold"),
        RouterParam("balance_abs_threshold", int, 64, "gateway --balance-abs-threshold"),
        RouterParam("balance_rel_threshold", float, 1.5, "gateway --balance-rel-threshold"),
        RouterParam("chars_per_block", int, 64, "prompt text characters per block id"),
        RouterParam("startup_timeout_s", float, 60.0, "seconds to wait for the gateway to be ready"),
    )

    def __init__(self, gateway_policy: str = "cache_aware", cache_threshold: float = 0.3,
                 balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5,
                 chars_per_block: int = 64, startup_timeout_s: float = 60.0) -> None:
        p = self.name
        from ...errors import ConfigError

        if gateway_policy not in GATEWAY_POLICIES:
            raise ConfigError(f"{p}: gateway_policy={gateway_policy!r} must be one of "
                              f"{list(GATEWAY_POLICIES)}")
        check_range(p, "cache_threshold", cache_threshold, 0.0, 1.0)
        check_range(p, "balance_abs_threshold", balance_abs_threshold, 0, integer=True)
        check_range(p, "balance_rel_threshold", balance_rel_threshold, 0.0)
        check_range(p, "chars_per_block", chars_per_block, 2, integer=True)
        check_range(p, "startup_timeout_s", startup_timeout_s, 0.0, low_open=True)
        self.gateway_policy = gateway_policy
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = int(balance_abs_threshold)
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.chars_per_block = int(chars_per_block)
        self.startup_timeout_s = float(startup_timeout_s)
        self.gateway: SGLangGateway | None = None

    def reset(self, view) -> None:
        super().reset(view)
        require_gateway()
        self.close()
        self.text = BlockText(self.chars_per_block)
        self._rid: dict = {}
        self.gateway = SGLangGateway(view.num_replicas, self.gateway_policy, self.cache_threshold,
                                     self.balance_abs_threshold, self.balance_rel_threshold,
                                     startup_timeout_s=self.startup_timeout_s)
        self.gateway.start()

    def route(self, request) -> int:
        text = self.text.encode(request.hash_ids, request.input_length, request.block_tokens)
        rid, replica = self.gateway.dispatch(text)
        self._rid[request.index] = rid
        return replica

    def on_request_finished(self, request, replica: int) -> None:
        self.gateway.release(self._rid.pop(request.index))

    def close(self) -> None:
        gw, self.gateway = self.gateway, None
        if gw is not None:
            gw.close()

    def __enter__(self) -> "SGLangGatewayRouter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["SGLangGatewayRouter"]
