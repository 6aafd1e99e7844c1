"""Constructor parameters a router exposes on the command line, and their parsing.

Every router class lists its tunable constructor arguments in a class attribute ``PARAMS`` (a tuple
of :class:`RouterParam`). :func:`parse_router_params` turns ``["name=value", ...]`` strings (for
example from a repeatable ``btb replay --router-param cache_threshold=0.5`` option) into the keyword
arguments of that class, converting each value to the declared type and rejecting unknown names
with a :class:`~btb_core.errors.ConfigError` that lists the valid ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class RouterParam:
    """One CLI-exposable constructor argument of a router.

    Attributes
    ----------
    name : str
        The constructor keyword (also the ``--router-param`` key).
    type : type
        ``int``, ``float``, ``bool`` or ``str``; values are converted with :meth:`convert`.
    default : object
        The constructor default (documented with its source in the router's docstring). A
        default of None makes the parameter optional: ``none`` or ``off`` on the command line
        gives None.
    help : str
        One line for ``--help`` output.
    choices : tuple of str, optional
        Allowed values for ``str`` parameters.
    """

    name: str
    type: type
    default: object
    help: str
    choices: tuple = ()

    def __post_init__(self) -> None:
        if self.type not in (int, float, bool, str):
            raise ConfigError(f"RouterParam {self.name!r}: type={self.type!r} must be int, float, "
                              "bool or str")

    def convert(self, text: str, policy: str = "?") -> object:
        """Convert the command-line string ``text``; raises ``ConfigError`` naming the value."""
        where = f"router {policy!r} parameter {self.name!r}"
        if self.default is None and text.strip().lower() in ("none", "off"):
            return None  # an optional parameter switched off
        try:
            if self.type is bool:
                low = text.strip().lower()
                if low in _TRUE:
                    return True
                if low in _FALSE:
                    return False
                raise ValueError(text)
            value = self.type(text)
        except ValueError:
            article = "an" if self.type.__name__[0] in "aeiou" else "a"
            raise ConfigError(f"{where}: value {text!r} is not {article} {self.type.__name__}") from None
        if self.choices and value not in self.choices:
            raise ConfigError(f"{where}: value {value!r} not in {list(self.choices)}")
        return value


def router_params(cls) -> tuple[RouterParam, ...]:
    """The ``PARAMS`` tuple of router class ``cls`` (empty for parameterless routers)."""
    return tuple(getattr(cls, "PARAMS", ()))


def parse_router_params(cls, items: Iterable[str]) -> dict:
    """Parse ``"name=value"`` strings into constructor keyword arguments of router class ``cls``.

    Parameters
    ----------
    cls : type
        A router class from :data:`btb_core.routers.POLICIES`.
    items : iterable of str
        Each ``"name=value"``; later items override earlier ones.

    Returns
    -------
    dict
        ``{name: converted value}``, ready for ``cls(**kwargs)``.

    Raises
    ------
    ConfigError
        On an item without ``=``, an unknown name (the message lists the valid names) or a value
        that does not convert.
    """
    by_name = {p.name: p for p in router_params(cls)}
    policy = getattr(cls, "name", cls.__name__)
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"router parameter {item!r}: expected name=value")
        key, _, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in by_name:
            raise ConfigError(f"router {policy!r} has no parameter {key!r}; valid: "
                              f"{sorted(by_name) or 'none'}")
        out[key] = by_name[key].convert(text, policy)
    return out


def check_range(policy: str, field: str, value, low=None, high=None, *, integer: bool = False,
                low_open: bool = False) -> None:
    """Raise ``ConfigError`` naming ``field`` and ``value`` unless ``low <= value <= high``.

    ``low_open`` makes the lower bound strict; ``integer`` also rejects non-integers, bools and
    integers beyond 64 bits. NaN and infinities are always refused (an infinite weight or
    interval would only fail later, mid-run).
    """
    import numpy as np

    if isinstance(value, np.generic) and not isinstance(value, np.bool_):
        value = value.item()
    if integer and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{policy}: {field}={value!r} must be an integer")
    if not integer and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigError(f"{policy}: {field}={value!r} must be a number")
    if value != value:  # NaN
        raise ConfigError(f"{policy}: {field}={value!r} must not be NaN")
    if value in (float("inf"), float("-inf")):
        raise ConfigError(f"{policy}: {field}={value!r} must be finite")
    if integer and not -2 ** 63 <= value < 2 ** 63:
        raise ConfigError(f"{policy}: {field}={value!r} is beyond the 64-bit integer range")
    if low is not None and (value <= low if low_open else value < low):
        rel = ">" if low_open else ">="
        raise ConfigError(f"{policy}: {field}={value!r} must be {rel} {low}")
    if high is not None and value > high:
        raise ConfigError(f"{policy}: {field}={value!r} must be <= {high}")


__all__ = ["RouterParam", "check_range", "parse_router_params", "router_params"]
