"""What the engine benchmarks record about the machine they ran on (imported by the scripts in
this folder, which run with it on ``sys.path``)."""

from __future__ import annotations

import os
import platform


def load_average() -> list[float]:
    """The 1/5/15-minute load averages, rounded to 0.01."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_start() -> dict:
    """``cpus``, ``python``, ``platform`` and ``load_average_start``; the caller adds
    ``load_average_end`` (:func:`load_average`) when its measurements are done."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "load_average_start": load_average()}
