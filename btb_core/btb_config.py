"""BTB's thresholds X, Y, Z, M in one frozen dataclass, shared by the router, the burst detector,
the threshold explorer and sweeps (``DESIGN.md`` sections 1 and 5).

The defaults are the reference study's (``DESIGN.md`` section 5): ``X = 2`` arrivals, ``Y`` = the
burst prefix, 65,536 tokens (the Bursted jobs' shared prefix, ``DESIGN.md`` section 2), ``Z = 1 s``,
``M = 4`` replicas. They are stated here only; every other module reads them from
:class:`BTBConfig`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class BTBConfig:
    """Bite the Bullet's burst thresholds.

    Attributes
    ----------
    x_repeats : int >= 1
        X: arrivals of one prefix within ``z_s`` seconds that mark it active (2).
    y_tokens : int >= 1
        Y: the burst prefix length in tokens (65,536); the detector and copies use its
        ``y_tokens // block_tokens`` whole blocks (:meth:`y_blocks`).
    z_s : float >= 0
        Z: the detector window in seconds (1.0); inclusive.
    m_replicas : int >= 0
        M: warm copies started per active prefix (4); 0 disables copying.

    Raises
    ------
    ConfigError
        On a value outside the ranges above (bools are not integers; ``z_s`` must be finite); the
        message names the field and the value.
    """

    x_repeats: int = 2
    y_tokens: int = 65_536
    z_s: float = 1.0
    m_replicas: int = 4

    def __post_init__(self) -> None:
        def bad(name, why):
            raise ConfigError(f"BTBConfig: {name}={getattr(self, name)!r} {why}")

        for name, low in (("x_repeats", 1), ("y_tokens", 1), ("m_replicas", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                bad(name, f"must be an int >= {low}")
        z = self.z_s
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not (0.0 <= z < math.inf):
            bad("z_s", "must be a finite number >= 0")
        if not isinstance(z, float):
            object.__setattr__(self, "z_s", float(z))

    def y_blocks(self, block_tokens: int) -> int:
        """Y in whole blocks of ``block_tokens`` tokens: ``y_tokens // block_tokens``.

        Raises
        ------
        ConfigError
            If ``y_tokens`` is shorter than one block.
        """
        y = self.y_tokens // block_tokens
        if y < 1:
            raise ConfigError(f"BTBConfig: y_tokens={self.y_tokens} is shorter than one block of "
                              f"{block_tokens} tokens")
        return y

    def as_params(self) -> dict:
        """``{"x_repeats": ..., "y_tokens": ..., "z_s": ..., "m_replicas": ...}``: keyword
        arguments of :class:`btb_core.routers.btb.BTBRouter` and keys of a sweep grid's ``btb``
        policy."""
        return dataclasses.asdict(self)


#: The reference study's thresholds (every default in the package reads this).
DEFAULT_BTB = BTBConfig()

__all__ = ["BTBConfig", "DEFAULT_BTB"]
