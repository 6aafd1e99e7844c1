"""Is one real engine step with several prefilling requests as costly as the sum of their parts?

Issue 18: on one vLLM CPU server the simulator is 12-25% optimistic while the calibration, made of
requests sent one at a time, fits the lone requests to a few percent. One candidate cause is a step
cost that grows faster than the simulator's additive step model when several requests share the
engine's chunk budget (``calibrate.design_row``: per step a fixed overhead, a linear term per token,
an attention term per (query, key) pair of each request). This script measures it directly: it
starts one server, calibrates it (``calibrate.measure``, one repeat), then sends ``k`` cold prompts
of ``--tokens`` words each at once, for every ``k`` of ``--k`` (interleaved, ``--repeats`` rounds),
and compares the time to the last first token with the fitted model's prediction for those ``k``
requests sharing steps of ``ENGINE_CHUNK_TOKENS`` tokens. If the step model is additive, the ratio
measured / predicted is the same for every ``k`` (whatever the machine's speed at that moment).

``--two-servers`` measures the other candidate, two servers on one machine slowing each other
down: it starts two servers and, per round, sends ``max(--k)`` prompts to server 0 alone, then to
server 1 alone, then to both at once, and reports each server's time with the other busy over its
time alone (1.0: no interference).

Needs the engine (``make engine``). Prints a table and writes
``benchmarks/results_engine_additivity.json`` (temp file + rename). About 2 minutes. Run on a
quiet machine: another job on the server's core changes every figure (the ratios across ``k``
within one round are more robust than their level).

Run: ``.venv/bin/python benchmarks/engine_batch_additivity.py [--tokens 1024] [--k 1 2 4 8]
[--two-servers]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from btb_core.engine.calibrate import fit_cost, measure
from btb_core.engine.client import complete_at_once
from btb_core.engine.server import (ENGINE_BLOCK_TOKENS, ENGINE_CHUNK_TOKENS, SERVED_MODEL_NAME,
                                    EngineCluster)
from btb_core.engine.text import PromptBuilder
from btb_core.fileio import atomic_write_bytes

from _machine import load_average, machine_start

HERE = Path(__file__).resolve().parent


def predicted_s(fit, k: int, tokens: int) -> float:
    """The fitted step model for ``k`` cold ``tokens``-token requests sent at once: they fill steps
    of ``ENGINE_CHUNK_TOKENS`` tokens one after another; each request's attention sums to
    ``tokens**2 / 2`` pairs whatever its chunking."""
    total = k * tokens
    steps = -(-total // ENGINE_CHUNK_TOKENS)
    return (fit.frontend_s + steps * fit.step_overhead_s + fit.linear_s_per_token * total
            + fit.attention_s_per_pair * k * tokens * tokens / 2)


def burst(port: int, k: int, tokens: int, salt: int) -> list[float]:
    """TTFT of ``k`` cold requests sent at once (own text each), seconds."""
    ids = [i for i in range(-(-tokens // ENGINE_BLOCK_TOKENS))]
    texts = [PromptBuilder(ENGINE_BLOCK_TOKENS, salt + i).text(ids, tokens) for i in range(k)]
    return [c.ttft_s for c in complete_at_once(port, SERVED_MODEL_NAME, texts, 1)]


def interference(args) -> int:
    """Each server's time for ``max(args.k)`` prompts with the other server busy / alone."""
    import threading as _t

    k = max(args.k)
    machine = machine_start()
    rows = []
    salt = 800_000
    with EngineCluster(2) as cluster:
        ports = [s.port for s in cluster.servers]
        for p in ports:
            burst(p, 1, 512, salt)   # warm-up, not recorded
        for rep in range(args.repeats):
            alone = []
            for p in ports:
                salt += 1_000
                alone.append(max(burst(p, k, args.tokens, salt)))
            both: list = [None, None]

            def run(i: int, s: int) -> None:
                both[i] = max(burst(ports[i], k, args.tokens, s))

            threads = [_t.Thread(target=run, args=(i, salt + 100 * (i + 1))) for i in range(2)]
            salt += 1_000
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            row = {"round": rep, "k": k, "tokens": args.tokens,
                   "alone_s": [round(x, 4) for x in alone], "both_busy_s": [round(x, 4) for x in both],
                   "slowdown": [round(b / a, 4) for a, b in zip(alone, both)]}
            rows.append(row)
            print(f"round {rep}: server 0 {alone[0]:.3f} s alone, {both[0]:.3f} s both busy "
                  f"({both[0] / alone[0]:.3f}x); server 1 {alone[1]:.3f} s, {both[1]:.3f} s "
                  f"({both[1] / alone[1]:.3f}x)", flush=True)
    machine["load_average_end"] = load_average()
    doc = {"machine": machine, "rows": rows}
    atomic_write_bytes(args.out, (json.dumps(doc, indent=1) + "\n").encode())
    print(f"wrote {args.out.name}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024, help="prompt length, tokens (default 1024)")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8],
                    help="requests sent at once (default 1 2 4 8)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds over every k (default 3)")
    ap.add_argument("--two-servers", action="store_true",
                    help="measure two servers slowing each other down instead")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON output (default results_engine_additivity.json, or "
                         "results_engine_interference.json with --two-servers)")
    args = ap.parse_args()
    if args.out is None:
        args.out = HERE / ("results_engine_interference.json" if args.two_servers
                           else "results_engine_additivity.json")
    if args.two_servers:
        return interference(args)
    machine = machine_start()
    rows = []
    salt = 700_000
    with EngineCluster(1) as cluster:
        port = cluster.servers[0].port
        fit = fit_cost(measure(port, repeats=1))
        burst(port, 2, 512, salt)   # warm-up, not recorded
        for rep in range(args.repeats):
            for k in args.k:
                salt += 1_000
                ttft = burst(port, k, args.tokens, salt)
                pred = predicted_s(fit, k, args.tokens)
                rows.append({"round": rep, "k": k, "tokens": args.tokens,
                             "last_ttft_s": round(max(ttft), 4), "predicted_s": round(pred, 4),
                             "measured_over_predicted": round(max(ttft) / pred, 4)})
                print(f"round {rep}  k={k:2d}  last TTFT {max(ttft):7.3f} s  predicted {pred:7.3f} s"
                      f"  ratio {max(ttft) / pred:.3f}", flush=True)
    machine["load_average_end"] = load_average()
    by_k = {}
    for k in args.k:
        r = sorted(x["measured_over_predicted"] for x in rows if x["k"] == k)
        by_k[str(k)] = {"median_ratio": r[len(r) // 2], "min": r[0], "max": r[-1]}
    base = by_k[str(args.k[0])]["median_ratio"]
    for k in args.k:
        by_k[str(k)]["relative_to_first_k"] = round(by_k[str(k)]["median_ratio"] / base, 4)
        print(f"k={k:2d}: median measured/predicted {by_k[str(k)]['median_ratio']:.3f}, "
              f"relative to k={args.k[0]}: {by_k[str(k)]['relative_to_first_k']:.3f}")
    doc = {"machine": machine, "fit": fit.as_dict(), "rows": rows, "by_k": by_k}
    atomic_write_bytes(args.out, (json.dumps(doc, indent=1) + "\n").encode())
    print(f"wrote {args.out.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
