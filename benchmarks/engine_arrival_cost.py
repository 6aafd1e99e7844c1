"""How much does a request arriving at a busy vLLM CPU server slow the step it is computing?

Issue 18: on a CPU server the API-server process (HTTP, tokenising, request handling) shares the
core with the engine, so every request that arrives while a step runs takes some of that step's
time. The simulator models it as ``CostModel.arrival_overhead_s`` (each arrival at a busy replica
pushes the running operation's end back), and the calibration measures it with
``btb_core.engine.calibrate.measure_arrival``: a cold 2,048-token prompt (one full engine step)
alone, then again with ``k`` requests of 1,056 tokens (all but the last 32 cached) arriving one
after another during its step. They cannot join the step (it fills the budget), so
``(TTFT with k - TTFT alone) / k`` is the core's time per arriving request.

This script runs that same measurement for several ``k`` on one warm server, ``--rounds`` rounds
each (rounds interleaved over ``k``), and prints the per-arrival cost and the spread of one
round's estimate per ``k``: how linear the cost is in the arrivals, and how many arrivals and
rounds the calibration needs (``calibrate.ARRIVAL_REQUESTS``, ``ARRIVAL_ROUNDS``).

Needs the engine (``make engine``). About 2 minutes; run on a quiet machine. Prints a table and
writes ``benchmarks/results_engine_arrival.json`` (temp file + rename).

``--side-tokens 1056 3104`` measures arriving requests of several prompt lengths, ``--side-new`` how
many of their tokens are not cached (README section 14: the cost grows with the cached part).

Run: ``.venv/bin/python benchmarks/engine_arrival_cost.py [--k 8 12 24] [--rounds 4]
[--side-tokens 1056 3104] [--side-new 32]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from btb_core.engine.calibrate import check_arrival_sizes, measure_arrival
from btb_core.fileio import atomic_write_bytes

from _machine import load_average, machine_start, warm_engine

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " Starts one real vLLM CPU "
                                 "server (make engine) and takes a few minutes.")
    ap.add_argument("--k", type=int, nargs="+", default=[8, 12, 24],
                    help="requests arriving during the step (default 8 12 24)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per k (default 4)")
    ap.add_argument("--side-tokens", type=int, nargs="+", default=[1056],
                    help="prompt length of the arriving requests, tokens (default 1056, the "
                         "calibration's); several values measure how the cost grows with it")
    ap.add_argument("--side-new", type=int, default=32,
                    help="uncached tokens of each arriving request (default 32; >= the prompt "
                         "length: none cached)")
    ap.add_argument("--out", type=Path, default=HERE / "results_engine_arrival.json",
                    help="JSON file to write (default benchmarks/results_engine_arrival.json, the "
                         "shipped figures of the default run: give another path for other runs)")
    args = ap.parse_args()
    if any(k < 1 for k in args.k) or args.rounds < 1:
        ap.error("--k values and --rounds must be >= 1")
    for side in args.side_tokens:    # refused before a server starts
        try:
            check_arrival_sizes(side, min(args.side_new, side) if side >= 1 else args.side_new)
        except ValueError as exc:
            ap.error(f"--side-tokens {side} --side-new {args.side_new}: {exc}")
    machine = machine_start()
    rows = []
    with warm_engine() as port:
        for rnd in range(args.rounds):
            for n, (k, side) in enumerate((k, side) for side in args.side_tokens for k in args.k):
                alone, busy = measure_arrival(port, rounds=1, k=k,
                                              salt=960_000 + 10_000 * rnd + 200 * n,
                                              side_tokens=side,
                                              side_new=min(args.side_new, side))
                per = (busy["ttft_s"] - alone["ttft_s"]) / k
                rows.append({"round": rnd, "k": k, "side_tokens": side,
                             "alone_ttft_s": round(alone["ttft_s"], 5),
                             "with_k_ttft_s": round(busy["ttft_s"], 5),
                             "per_arrival_s": round(per, 6)})
                print(f"round {rnd}  k={k:3d}  arriving {side:5d} tokens  alone {alone['ttft_s']:.4f} s"
                      f"  with k {busy['ttft_s']:.4f} s  {1e3 * per:6.2f} ms per arrival", flush=True)
    machine["load_average_end"] = load_average()
    by_k = {}
    print("\n  k  arriving tokens  per arrival (mean / median of rounds)  sd of one round  with k / alone")
    for side in args.side_tokens:
        for k in args.k:
            mine = [r for r in rows if r["k"] == k and r["side_tokens"] == side]
            per = np.array([r["per_arrival_s"] for r in mine])
            ratio = np.mean([r["with_k_ttft_s"] / r["alone_ttft_s"] for r in mine])
            sd = float(np.std(per, ddof=1)) if len(per) > 1 else float("nan")
            key = str(k) if args.side_tokens == [1056] else f"{k}x{side}"
            by_k[key] = {"per_arrival_s": round(float(per.mean()), 6),
                         "per_arrival_median_s": round(float(np.median(per)), 6),
                         "per_arrival_sd_one_round_s": round(sd, 6),
                         "slowdown": round(float(ratio), 4)}
            print(f"{k:3d}  {side:15d}  {1e3 * per.mean():8.2f} / {1e3 * np.median(per):6.2f} ms"
                  f" {1e3 * sd:20.2f} ms {ratio:15.3f}")
    doc = {"machine": machine, "args": {"k": args.k, "rounds": args.rounds,
                                        "side_tokens": args.side_tokens, "side_new": args.side_new},
           "rows": rows, "by_k": by_k}
    atomic_write_bytes(args.out, (json.dumps(doc, indent=1) + "\n").encode())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
