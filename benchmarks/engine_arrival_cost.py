"""How much does a request arriving at a busy vLLM CPU server slow the step it is computing?

Issue 18: with a warm engine and the cached-context term, the simulator is still a few to ~20%
optimistic on the validation trace. One candidate: on a CPU server the API-server process (HTTP,
tokenising, request handling) shares the core with the engine, so every request that arrives while
a step runs takes some of that step's time. The simulator models it as
``CostModel.arrival_overhead_s`` (each arrival at a busy replica pushes the running operation's
end back), which the calibration measures the same way (``btb_core.engine.calibrate.measure_arrival``,
one step alone vs with 24 arrivals, 4 rounds); this script is the longer, standalone measurement.

This script measures it on one warm server: a cold ``--long-tokens`` prompt (one engine step at
the default 2,048) is sent alone, then with ``k`` requests of ``--side-tokens`` tokens (all but the
last ``--side-new`` cached) arriving one after another during its step, and compares the long
prompt's TTFT. The side requests cannot join its step (it fills the budget), so any difference is
work done on the core while it computes: ``(TTFT with k - TTFT alone) / k`` per arriving request.

Needs the engine (``make engine``). About 1.5 minutes; run on a quiet machine. Prints a table and
writes ``benchmarks/results_engine_arrival.json`` (temp file + rename).

Run: ``.venv/bin/python benchmarks/engine_arrival_cost.py [--k 0 8 16] [--repeats 4]``
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

from btb_core.engine.calibrate import measure
from btb_core.engine.client import complete
from btb_core.engine.server import ENGINE_BLOCK_TOKENS, SERVED_MODEL_NAME, EngineCluster
from btb_core.engine.text import PromptBuilder
from btb_core.fileio import atomic_write_bytes

from _machine import load_average, machine_start

HERE = Path(__file__).resolve().parent


def one_round(port: int, salt: int, k: int, long_tokens: int, side_tokens: int, side_new: int,
              spread_s: float) -> float:
    """TTFT of the long prompt with ``k`` side requests arriving over ``spread_s`` seconds."""
    bt = ENGINE_BLOCK_TOKENS
    long_pb = PromptBuilder(bt, salt)
    side_pb = PromptBuilder(bt, salt + 500)
    cached = side_tokens - side_new
    base = list(range(cached // bt))
    complete(port, SERVED_MODEL_NAME, side_pb.text(base, cached), 1)   # the side prefix, cached
    long_text = long_pb.text(list(range(100_000, 100_000 + -(-long_tokens // bt))), long_tokens)
    nb = -(-side_tokens // bt) - len(base)
    out: dict = {}

    def run_long() -> None:
        out["long"] = complete(port, SERVED_MODEL_NAME, long_text, 1)

    def run_side(i: int) -> None:
        text = side_pb.text(base + [1_000_000 + 100 * i + j for j in range(nb)], side_tokens)
        out[i] = complete(port, SERVED_MODEL_NAME, text, 1)

    main = threading.Thread(target=run_long)
    main.start()
    time.sleep(0.05)                     # the long prompt's step has started
    sides = []
    for i in range(k):
        t = threading.Thread(target=run_side, args=(i,))
        t.start()
        sides.append(t)
        time.sleep(spread_s / k)
    main.join()
    for t in sides:
        t.join()
    return out["long"].ttft_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=[0, 8, 16],
                    help="requests arriving during the long prompt's step (default 0 8 16)")
    ap.add_argument("--repeats", type=int, default=4, help="rounds over every k (default 4)")
    ap.add_argument("--long-tokens", type=int, default=2048)
    ap.add_argument("--side-tokens", type=int, default=1056)
    ap.add_argument("--side-new", type=int, default=32)
    ap.add_argument("--spread-s", type=float, default=0.6,
                    help="seconds over which the side requests arrive (default 0.6)")
    ap.add_argument("--out", type=Path, default=HERE / "results_engine_arrival.json")
    args = ap.parse_args()
    if 0 not in args.k:
        ap.error("--k must include 0 (the long prompt alone)")
    machine = machine_start()
    rows = []
    salt = 960_000
    with EngineCluster(1) as cluster:
        port = cluster.servers[0].port
        measure(port, repeats=1)          # warms the server (and its calibration pass)
        for rep in range(args.repeats):
            for k in args.k:
                salt += 1_000
                ttft = one_round(port, salt, k, args.long_tokens, args.side_tokens, args.side_new,
                                 args.spread_s)
                rows.append({"round": rep, "k": k, "long_ttft_s": round(ttft, 5)})
                print(f"round {rep}  k={k:3d}  long prompt TTFT {ttft:.4f} s", flush=True)
    machine["load_average_end"] = load_average()
    alone = float(np.mean([r["long_ttft_s"] for r in rows if r["k"] == 0]))
    by_k = {}
    for k in args.k:
        mean = float(np.mean([r["long_ttft_s"] for r in rows if r["k"] == k]))
        by_k[str(k)] = {"mean_long_ttft_s": round(mean, 5), "slowdown": round(mean / alone, 4),
                        "per_arrival_s": round((mean - alone) / k, 5) if k else None}
        extra = f", {1e3 * (mean - alone) / k:.1f} ms per arriving request" if k else ""
        print(f"k={k:3d}: mean {mean:.4f} s ({mean / alone:.3f}x alone){extra}")
    doc = {"machine": machine, "args": {a: (str(v) if isinstance(v, Path) else v)
                                        for a, v in vars(args).items() if a != "out"},
           "rows": rows, "by_k": by_k}
    atomic_write_bytes(args.out, (json.dumps(doc, indent=1) + "\n").encode())
    print(f"wrote {args.out.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
