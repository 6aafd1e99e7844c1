"""Benchmark the real-gateway policy (issue 13): wall time of ``sglang_gateway`` replays.

Prints, and writes to ``benchmarks/results_gateway.json``:
* gateway start-up (process launch to every worker healthy) and stop;
* a replay of the first 500 rows of the shipped Mooncake conversation trace under
  ``sglang_gateway`` (start-up included) against the same replay under ``cache_aware``, and the
  per-decision overhead (HTTP through the gateway, held responses, load settling).

Run: ``.venv/bin/python benchmarks/bench_gateway.py``. Best of 3 runs; the machine is shared
(2 cores), so figures measured while other jobs run are noisy.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

from btb_core.paths import DATA_DIR, REPO_ROOT
from btb_core.routers import make_router
from btb_core.routers.gateway import SGLangGateway, gateway_available
from btb_core.sim import ClusterConfig, simulate
from btb_core.trace import load_trace


def best_of(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    if not gateway_available():
        print("sglang-router is not installed: pip install -e '.[gateway]'", file=sys.stderr)
        return 2
    trace = load_trace(DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl").rows(0, 500)
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=4)

    def start_stop():
        with SGLangGateway(4):
            pass

    startup = best_of(start_stop)
    gw = best_of(lambda: simulate(trace, make_router("sglang_gateway"), cluster))
    ca = best_of(lambda: simulate(trace, make_router("cache_aware"), cluster))
    per_decision_ms = (gw - startup - ca) / len(trace.table) * 1e3
    out = {"gateway_start_stop_s": round(startup, 3),
           "replay_500_sglang_gateway_s": round(gw, 3),
           "replay_500_cache_aware_s": round(ca, 3),
           "overhead_per_request_ms": round(per_decision_ms, 3),
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}}
    for k, v in out.items():
        print(f"{k:32s} {v}")
    path = REPO_ROOT / "benchmarks" / "results_gateway.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
