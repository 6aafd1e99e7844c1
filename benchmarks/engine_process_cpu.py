"""Where one pinned core's time goes on a real vLLM CPU server: API server, engine core, worker.

Issue 18: on one server the simulator's mean TTFT comes out ~9% below the engine's (README
section 14). A vLLM CPU server is three processes on the one core it is pinned to: the API server
(HTTP, tokenising, streaming; the process group's leader), the engine core (scheduler) and the
worker (the model). This script reads each one's CPU time from the kernel
(``btb_core.engine.server.process_group_cpu_s``) around

1. ``--idle-s`` seconds with nothing to do (what each process spends waiting);
2. lone requests, ``--lone`` of each kind: cold 512 / 1,024 / 2,048-token prompts and 1,024 /
   2,048-token prompts with all but 32 / 64 tokens cached (the prefix sent just before);
3. ``--replays`` replays of the engine validation trace (84 requests) routed to the one server,
   each compared with the simulator fitted to a calibration made just before (as
   ``btb validate-engine --replicas 1`` does): makespan (last first token) and mean TTFT, real and
   simulated, the API server's CPU per request against the fit's ``arrival_overhead_s``, and the
   engine steps and tokens they took: the engine's own count (``/metrics``:
   ``vllm:iteration_tokens_total``, one observation per step) against the simulator's (its
   chunked scheduler's operations, counted by wrapping its ``op_done`` in this script).

Needs the engine (``make engine``); starts one server; about 4 minutes; run on a quiet machine.
Prints a table and writes ``benchmarks/results_engine_process_cpu.json`` (temp file + rename).

Run: ``.venv/bin/python benchmarks/engine_process_cpu.py [--lone 8] [--replays 3] [--idle-s 5]``
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

from _machine import load_average, machine_start, shown_path, write_json

HERE = Path(__file__).resolve().parent
#: (kind, prompt tokens, cached tokens) of the lone requests.
LONE = (("cold", 512, 0), ("cold", 1024, 0), ("cold", 2048, 0),
        ("cached", 1024, 992), ("cached", 2048, 1984))
ROLES = ("api", "engine_core", "worker", "other")
#: vLLM's per-step token histogram: its count is the number of engine steps, its sum their tokens.
STEPS, TOKENS = "vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum"


#: The simulator's engine steps and tokens, counted by :func:`_count_sim_steps` (reset per replay).
SIM_STEPS = {"steps": 0, "tokens": 0}


def _count_sim_steps() -> None:
    """Wrap the simulator's chunked scheduler so that each finished operation adds its steps
    (one per ``iter``, ``k`` per decode ``stretch``) and scheduled tokens to :data:`SIM_STEPS`.
    A measurement hook of this script only: the simulator itself does not count them."""
    from btb_core.sim.schedulers.chunked import Chunked

    done = Chunked.op_done

    def op_done(self, sim, rep, kind, data):
        if kind == "iter":
            SIM_STEPS["steps"] += 1
            SIM_STEPS["tokens"] += sum(c for _, c in data) + rep.n_decode
        elif kind == "stretch":      # (decodes, context tokens, steps)
            SIM_STEPS["steps"] += data[2]
            SIM_STEPS["tokens"] += data[0] * data[2]
        return done(self, sim, rep, kind, data)

    Chunked.op_done = op_done


def _delta(a: dict, b: dict) -> dict:
    return {r: round(b.get(r, 0.0) - a.get(r, 0.0), 6) for r in ROLES if r in a or r in b}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " Starts one real vLLM CPU "
                                 "server (make engine) and takes about 4 minutes.")
    ap.add_argument("--lone", type=int, default=8, help="lone requests of each kind (default 8)")
    ap.add_argument("--replays", type=int, default=3, help="replays of the validation trace (default 3)")
    ap.add_argument("--idle-s", type=float, default=5.0, help="idle span measured, s (default 5)")
    ap.add_argument("--out", type=Path, default=HERE / "results_engine_process_cpu.json",
                    help="JSON file to write (default benchmarks/results_engine_process_cpu.json, "
                         "the shipped figures: give another path for other runs)")
    args = ap.parse_args()
    if args.lone < 1:
        ap.error(f"--lone {args.lone}: must be >= 1")
    if args.replays < 1:
        ap.error(f"--replays {args.replays}: must be >= 1")
    if not (math.isfinite(args.idle_s) and args.idle_s > 0):
        ap.error(f"--idle-s {args.idle_s:g}: must be a finite number of seconds > 0")
    if not args.out.parent.is_dir():     # found now, not after the run
        ap.error(f"--out {args.out}: folder {args.out.parent} does not exist")

    from btb_core.engine import calibrate as cal
    from btb_core.engine.client import complete
    from btb_core.engine.replay import replay
    from btb_core.engine.server import ENGINE_BLOCK_TOKENS, SERVED_MODEL_NAME, EngineCluster
    from btb_core.engine.text import PromptBuilder
    from btb_core.engine.validation import compare, load_validation_trace
    from btb_core.routers import make_router

    _count_sim_steps()
    machine = machine_start()
    bt = ENGINE_BLOCK_TOKENS
    out: dict = {"machine": machine, "args": {k: (shown_path(v) if isinstance(v, Path) else v)
                                              for k, v in vars(args).items()}}
    with EngineCluster(1) as cluster:
        server = cluster.servers[0]
        port = cluster.ports[0]
        print("calibrating (about 2 minutes) ...", flush=True)
        calibration = cal.measure(port, repeats=2)
        fit = cal.fit_cost(calibration)
        out["fit"] = fit.as_dict()

        a = server.process_cpu_s()
        time.sleep(args.idle_s)
        idle = _delta(a, server.process_cpu_s())
        out["idle"] = {"span_s": args.idle_s, "cpu_s": idle,
                       "share_of_core": {r: round(v / args.idle_s, 4) for r, v in idle.items()}}
        print(f"idle {args.idle_s:g} s: " + ", ".join(f"{r} {v:.3f} s" for r, v in idle.items()))

        def ids(n_tokens: int) -> list[int]:
            return [1000 + i for i in range(-(-n_tokens // bt))]

        out["lone"] = []
        for n, (kind, length, cached) in enumerate(LONE):
            rows = []
            for j in range(args.lone):
                pb = PromptBuilder(bt, 880_000 + 1_000 * n + j)
                if cached:
                    complete(port, SERVED_MODEL_NAME, pb.text(ids(length), cached), 1)
                time.sleep(0.05)     # the prefix's request has ended on the server
                a = server.process_cpu_s()
                t0 = time.perf_counter()
                c = complete(port, SERVED_MODEL_NAME, pb.text(ids(length), length), 1)
                window = time.perf_counter() - t0
                rows.append({"ttft_s": c.ttft_s, "window_s": window, "cached_tokens": c.cached_tokens,
                             **_delta(a, server.process_cpu_s())})
            med = {k: float(np.median([r.get(k, 0.0) for r in rows])) for k in rows[0]}
            med.update({"kind": kind, "input_length": length,
                        "fit_ttft_s": float(np.ravel(fit.predict_ttft_s(
                            length - med["cached_tokens"], med["cached_tokens"]))[0])})
            out["lone"].append(med)
            print(f"lone {kind:6s} {length:5d} tokens: TTFT {med['ttft_s']:.4f} s (fit "
                  f"{med['fit_ttft_s']:.4f}); CPU api {med.get('api', 0):.4f}, engine core "
                  f"{med.get('engine_core', 0):.4f}, worker {med.get('worker', 0):.4f} s")

        trace = load_validation_trace()
        n_req = len(trace.table)
        out["replays"] = []
        for rep in range(args.replays):
            m0 = server.metrics()
            a = server.process_cpu_s()
            t0 = time.perf_counter()
            real = replay(trace, make_router("round_robin"), [port], salt=890_000 + 1_000 * rep)
            wall = time.perf_counter() - t0
            cpu = _delta(a, server.process_cpu_s())
            time.sleep(0.5)          # the last step's statistics reach /metrics
            m1 = server.metrics()
            SIM_STEPS.update(steps=0, tokens=0)
            cmp = compare(real, trace, fit, 1)
            sent = real["sent_s"].to_numpy()
            row = {"replay": rep, "requests": n_req, "wall_s": round(wall, 4), "cpu_s": cpu,
                   "cpu_share_of_wall": {r: round(v / wall, 4) for r, v in cpu.items()},
                   "makespan_real_s": float((sent + real["ttft_s"].to_numpy()).max()),
                   "makespan_sim_s": float((sent + cmp["sim_ttft_s"].to_numpy()).max()),
                   "ttft_mean_real_s": float(real["ttft_s"].mean()),
                   "ttft_mean_sim_s": float(cmp["sim_ttft_s"].mean()),
                   "api_cpu_per_request_s": round(cpu.get("api", 0.0) / n_req, 6),
                   "fit_arrival_overhead_s": fit.arrival_overhead_s,
                   "steps_real": int(m1.get(STEPS, 0) - m0.get(STEPS, 0)),
                   "steps_sim": SIM_STEPS["steps"],
                   "step_tokens_real": int(m1.get(TOKENS, 0) - m0.get(TOKENS, 0)),
                   "step_tokens_sim": SIM_STEPS["tokens"]}
            row["makespan_rel_error"] = row["makespan_sim_s"] / row["makespan_real_s"] - 1
            row["ttft_mean_rel_error"] = row["ttft_mean_sim_s"] / row["ttft_mean_real_s"] - 1
            out["replays"].append(row)
            print(f"replay {rep}: wall {wall:.2f} s; CPU api {cpu.get('api', 0):.2f}, engine core "
                  f"{cpu.get('engine_core', 0):.2f}, worker {cpu.get('worker', 0):.2f} s; makespan "
                  f"real {row['makespan_real_s']:.2f} sim {row['makespan_sim_s']:.2f} s "
                  f"({100 * row['makespan_rel_error']:+.1f}%); mean TTFT real "
                  f"{row['ttft_mean_real_s']:.3f} sim {row['ttft_mean_sim_s']:.3f} s "
                  f"({100 * row['ttft_mean_rel_error']:+.1f}%); API CPU per request "
                  f"{1e3 * row['api_cpu_per_request_s']:.1f} ms (fit's arrival overhead "
                  f"{1e3 * fit.arrival_overhead_s:.1f} ms); engine steps real {row['steps_real']} "
                  f"({row['step_tokens_real']:,} tokens) sim {row['steps_sim']} "
                  f"({row['step_tokens_sim']:,} tokens)", flush=True)
    machine["load_average_end"] = load_average()
    path = write_json(args.out, out)
    print(f"written {path.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
