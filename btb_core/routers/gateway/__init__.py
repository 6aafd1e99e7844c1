"""The real SGLang Model Gateway in the loop: text encoding, process lifecycle, the router.

Needs the optional ``gateway`` extra (``sglang-router``, pinned in ``pyproject.toml``).
"""

from .process import GATEWAY_POLICIES, GatewayError, SGLangGateway, gateway_available
from .router import SGLangGatewayRouter
from .text import BlockText

__all__ = ["GATEWAY_POLICIES", "BlockText", "GatewayError", "SGLangGateway",
           "SGLangGatewayRouter", "gateway_available"]
