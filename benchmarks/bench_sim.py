"""Simulator throughput: simulated requests per second, events per second, peak RSS.

Replays (1) the full shipped Mooncake conversation trace and (2) a 76,800-row trace shaped like the
Bursted test split (btb_core/bursted_shaped.py) with round_robin on 4, 16 and 64 replicas of
Llama-3.3-70B on 4x H100 (chunked scheduler). Each case runs in its own process (one core), so
peak RSS is per case; each case runs 3 times and the median (by end-to-end rate) is reported, with
all three rates in the JSON. Prints a table and writes benchmarks/results_sim.json.

"End to end" = building/loading the trace + simulating (the figure the issue's 35,000 req/s target
is about); "with imports" also counts importing numpy/pandas/btb_core in the fresh process
(~0.4 s, paid once per process, not per trace).

Run: ``.venv/bin/python benchmarks/bench_sim.py`` (about a minute and a half).

The machine is a VM whose speed drifts by +-25% between runs; the CPU-time rate
(``requests_per_s_end_to_end_cpu_time``, process CPU seconds instead of wall seconds) is steadier.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _case(trace_name: str, replicas: int, queue) -> None:
    t_import = time.perf_counter()
    from btb_core.paths import DATA_DIR
    from btb_core.routers import make_router
    from btb_core.sim import ClusterConfig, simulate
    from btb_core.trace import load_mooncake
    from btb_core.bursted_shaped import bursted_shaped_trace

    t0 = time.perf_counter()
    c0 = time.process_time()
    if trace_name == "mooncake_conversation":
        trace = load_mooncake(DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl")
    else:
        trace = bursted_shaped_trace()
    t1 = time.perf_counter()
    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=replicas, scheduler="chunked")
    res = simulate(trace, make_router("round_robin"), cluster, seed=0, progress=False)
    t2 = time.perf_counter()
    c2 = time.process_time()
    n = len(trace)
    queue.put({
        "trace": trace_name, "replicas": replicas, "requests": n,
        "import_s": round(t0 - t_import, 3), "load_s": round(t1 - t0, 3), "simulate_s": round(t2 - t1, 3),
        "requests_per_s_end_to_end": round(n / (t2 - t0)),
        "requests_per_s_end_to_end_cpu_time": round(n / (c2 - c0)),
        "requests_per_s_with_imports": round(n / (t2 - t_import)),
        "requests_per_s_simulate_only": round(n / (t2 - t1)),
        "events": res.metrics["events"], "events_per_s": round(res.metrics["events"] / (t2 - t1)),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "ttft_mean_s": round(res.metrics["ttft_mean_s"], 4),
    })


REPEATS = 3


def main() -> int:
    ctx = mp.get_context("spawn")
    rows = []
    for trace_name in ("mooncake_conversation", "bursted_shaped_76800"):
        for replicas in (4, 16, 64):
            runs = []
            for _ in range(REPEATS):  # a VM's speed drifts: report the median of fresh processes
                q = ctx.Queue()
                p = ctx.Process(target=_case, args=(trace_name, replicas, q))
                p.start()
                runs.append(q.get())
                p.join()
            runs.sort(key=lambda r: r["requests_per_s_end_to_end"])
            row = dict(runs[len(runs) // 2])
            row["repeats"] = REPEATS
            row["requests_per_s_end_to_end_all"] = [r["requests_per_s_end_to_end"] for r in runs]
            rows.append(row)
            print(f"{row['trace']:<22} replicas={replicas:<3} req/s end-to-end "
                  f"{row['requests_per_s_end_to_end']:>7,} (CPU time {row['requests_per_s_end_to_end_cpu_time']:>7,}; "
                  f"with imports {row['requests_per_s_with_imports']:>7,})  "
                  f"simulate-only {row['requests_per_s_simulate_only']:>7,}  "
                  f"events/s {row['events_per_s']:>8,}  peak RSS {row['peak_rss_mb']:>6} MB  "
                  f"(import {row['import_s']} s, load {row['load_s']} s, simulate {row['simulate_s']} s)",
                  flush=True)
    by = {(r["trace"], r["replicas"]): r for r in rows}
    for t in ("mooncake_conversation", "bursted_shaped_76800"):
        ratio = by[(t, 64)]["simulate_s"] / by[(t, 4)]["simulate_s"]
        print(f"{t}: time per request at 64 replicas / at 4 = {ratio:.2f}")
    out = HERE / "results_sim.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"machine": {"cpus": os.cpu_count()}, "cases": rows}, indent=2))
    os.replace(tmp, out)
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
