"""What the benchmarks record about the machine they ran on, how they write their JSON, and the
warm server the engine benchmarks share (imported by the scripts in this folder, which run with it
on ``sys.path``)."""

from __future__ import annotations

import json
import os
import platform
from contextlib import contextmanager
from pathlib import Path


def load_average() -> list[float]:
    """The 1/5/15-minute load averages, rounded to 0.01."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_start() -> dict:
    """``cpus``, ``python``, ``platform`` and ``load_average_start``; the caller adds
    ``load_average_end`` (:func:`load_average`) when its measurements are done."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "load_average_start": load_average()}


def shown_path(path) -> str:
    """``path`` relative to the repository when inside it, for the JSON files (no machine paths
    in what is shipped)."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path(__file__).resolve().parent.parent))
    except ValueError:
        return str(path)


def write_json(path, payload, indent: int = 2) -> Path:
    """Write ``payload`` as JSON to ``path`` through a temporary file and a rename (a run
    interrupted mid-write leaves the previous results whole); returns the path."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=indent) + "\n")
    os.replace(tmp, path)
    return path


@contextmanager
def warm_engine():
    """One real vLLM CPU server (``btb_core.engine.server.EngineCluster(1)``), warmed by one
    unrecorded pass of the calibration plan without its arrival rounds; yields its port.

    Raises ``EngineNotInstalled`` without the engine (``make engine``)."""
    from btb_core.engine.calibrate import measure
    from btb_core.engine.server import EngineCluster

    with EngineCluster(1) as cluster:
        port = cluster.ports[0]
        measure(port, repeats=1, arrival_rounds=0)
        yield port
