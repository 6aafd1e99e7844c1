"""Does a request *leaving* a busy vLLM CPU server slow the step it computes next?

Issue 18: the simulator is still a few percent optimistic against the real engine after the
arrival overhead (``CostModel.arrival_overhead_s``: the API server's work on each arriving request
shares the engine's core). Its mirror image is a candidate for the rest: when a step finishes, the
API server streams each finished request's token and closes its stream on the same core while the
engine computes the next step. The validation trace's requests all have one output token, so each
request leaves right after its prefill step.

The measurement reads it off the clock of a long decode. A request ``L`` (128-token prompt, 260
output tokens) streams one token per engine step, so its inter-token gaps are step times. After
its 60th token a cold 2,048-token blocker ``B`` (one full step) is sent, and 0.15 s later ``k``
requests of 1,056 tokens (1,024 cached first, 32 new, one output token), 10 ms apart: they arrive
during ``B``'s step and are prefilled together in a step of their own. The step that produced
their tokens is the last of ``L``'s long gaps (over 3x its undisturbed gap) to end before their
first tokens arrived, give or take two undisturbed gaps; the ``--after`` gaps following it are
where the departing requests' work lands. With ``k = 0`` one request departs
there (``B``), with ``k`` the ``k`` requests (``B`` left one step earlier). Excess = sum of
those gaps minus ``--after`` times ``L``'s median undisturbed gap (tokens 20-55 and the last 60);
per departure = the excess after the ``k`` requests' step / ``k``. The ``k = 0`` rounds give the
excess after a large step (``B``'s: one departure, and 64 newly cached blocks).

Needs the engine (``make engine``). About 4 minutes with the defaults; run on a quiet machine.
Prints one line per round and a summary; writes ``benchmarks/results_engine_departure.json``
(temp file + rename).

Run: ``.venv/bin/python benchmarks/engine_departure_cost.py [--k 16] [--rounds 5] [--after 4]``
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

from btb_core.engine.client import complete
from btb_core.engine.server import ENGINE_BLOCK_TOKENS as BT, SERVED_MODEL_NAME
from btb_core.engine.text import PromptBuilder
from btb_core.fileio import atomic_write_bytes

from _machine import load_average, machine_start, warm_engine

HERE = Path(__file__).resolve().parent


def token_times(port: int, prompt: str, max_tokens: int, on_token) -> np.ndarray:
    """``time.perf_counter()`` at every streamed token of one request (``on_token(n)`` after the
    n-th)."""
    times: list[float] = []

    def chunk(n):
        times.append(time.perf_counter())
        on_token(n)

    complete(port, SERVED_MODEL_NAME, prompt, max_tokens, on_chunk=chunk)
    return np.array(times)


def one_round(port: int, k: int, salt: int, after: int) -> dict:
    side = PromptBuilder(BT, salt + 1)
    base = list(range(1024 // BT))
    complete(port, SERVED_MODEL_NAME, side.text(base, 1024), 1)       # the k requests' prefix
    l_text = PromptBuilder(BT, salt + 2).text(list(range(50_000, 50_004)), 128)
    b_text = PromptBuilder(BT, salt + 3).text(list(range(60_000, 60_064)), 2048)
    shorts = [side.text(base + [1_000_000 + 10 * i], 1056) for i in range(k)]
    out: dict = {}
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def send(key, text):
        try:
            out[key] = complete(port, SERVED_MODEL_NAME, text, 1)
        except BaseException as exc:      # re-raised below
            errors.append(exc)

    def launch():
        senders = [threading.Thread(target=send, args=("B", b_text), daemon=True)]
        senders[0].start()
        time.sleep(0.15)
        for i, text in enumerate(shorts):
            senders.append(threading.Thread(target=send, args=(i, text), daemon=True))
            senders[-1].start()
            time.sleep(0.01)
        for t in senders:
            t.join()

    def on_token(n):      # off L's reading thread, so its token times stay the engine's
        if n == 60:
            threads.append(threading.Thread(target=launch, daemon=True))
            threads[-1].start()

    lt = token_times(port, l_text, 260, on_token)
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"request failed: {errors[0]}") from errors[0]
    gaps = np.diff(lt)
    g0 = float(np.median(np.concatenate([gaps[20:55], gaps[-60:]])))
    leaving = [out[i].first_token_s for i in range(k)] if k else [out["B"].first_token_s]
    # the step that produced their tokens: the last of L's long gaps (> 3x undisturbed) to end
    # before their first tokens arrived, give or take two undisturbed gaps (a finished request's
    # token can reach the client after L's token of the same step)
    t = float(np.median(leaving)) + 2 * g0
    long_before = np.flatnonzero((gaps > 3 * g0) & (lt[1:] <= t))
    if not len(long_before):
        raise RuntimeError("no long step of L ends before the departing requests' first tokens")
    step = int(long_before[-1])
    nxt = gaps[step + 1:step + 1 + after]
    return {"k": k, "departures": max(k, 1), "g0_ms": round(1e3 * g0, 3),
            "step_gap_ms": round(1e3 * float(gaps[step]), 2),
            "after_gaps_ms": [round(1e3 * float(x), 2) for x in nxt],
            "excess_ms": round(1e3 * float(np.sum(nxt - g0)), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=16, help="requests departing together (default 16)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, each k = 0 then k (default 5)")
    ap.add_argument("--after", type=int, default=4, help="gaps read after the step (default 4)")
    ap.add_argument("--out", type=Path, default=HERE / "results_engine_departure.json")
    args = ap.parse_args()
    if args.k < 2 or args.rounds < 1 or args.after < 1:
        ap.error("--k must be >= 2, --rounds and --after >= 1")
    machine = machine_start()
    rows = []
    with warm_engine() as port:
        for rnd in range(args.rounds):
            for k in (0, args.k):
                row = {"round": rnd, **one_round(port, k, 700_000 + 1_000 * rnd + k, args.after)}
                rows.append(row)
                print(f"round {rnd}  k={k:3d}  undisturbed gap {row['g0_ms']:6.2f} ms  step "
                      f"{row['step_gap_ms']:7.1f} ms  next gaps {row['after_gaps_ms']} ms  excess "
                      f"{row['excess_ms']:6.1f} ms", flush=True)
    machine["load_average_end"] = load_average()
    e0 = np.array([r["excess_ms"] for r in rows if r["k"] == 0])
    ek = np.array([r["excess_ms"] for r in rows if r["k"] == args.k])

    def sem(x):
        return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")

    per, per_sem = float(ek.mean()) / args.k, sem(ek) / args.k
    print(f"\nexcess after the blocker's step (a cold 2,048-token prompt, one departure): "
          f"{e0.mean():.1f} ms (standard error {sem(e0):.1f})")
    print(f"excess after the step of the {args.k} requests that depart together: {ek.mean():.1f} ms "
          f"(standard error {sem(ek):.1f}): {per:.2f} ms per departure (standard error {per_sem:.2f})")
    doc = {"machine": machine, "args": {"k": args.k, "rounds": args.rounds, "after": args.after},
           "rows": rows, "excess_after_blocker_step_ms": round(float(e0.mean()), 3),
           "excess_after_blocker_step_sem_ms": round(sem(e0), 3),
           "excess_after_k_departures_ms": round(float(ek.mean()), 3),
           "excess_after_k_departures_sem_ms": round(sem(ek), 3),
           "per_departure_ms": round(per, 3), "per_departure_sem_ms": round(per_sem, 3)}
    atomic_write_bytes(args.out, (json.dumps(doc, indent=1) + "\n").encode())
    print(f"wrote {args.out.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
