"""What does a prefill of a few new tokens after a long cached context cost on the real engine?

Issue 18: the validation trace is mostly bursts of requests that share a 1-2k-token prefix and add
40-300 tokens of their own, so most of its prefill work is *few new tokens after a long cached
context*. The calibration's older points had at least 256 new tokens, where the FLOP terms (``a``
per token, ``b`` per causal (query, key) pair; ``btb_core.engine.calibrate``) fit to a few percent.
This script measures the other corner directly on one server: for each cached context ``C`` and
new-token count ``S`` it warms the ``C``-token prefix, then sends 1 and then ``--k`` requests at
once, each with ``S`` new tokens of its own after that prefix (all in one engine step), and takes
the marginal cost of one more such request, ``(TTFT of the last of k - TTFT of 1) / (k - 1)``:
the part of its cost that is serial on the server's core. It then fits that marginal cost three
ways (relative least squares over the grid): ``a S + b pairs`` (the older model),
``a S + b pairs + e C`` (``CostModel.context_s_per_token``) and the same plus a constant per
request, and prints each fit's relative errors.

It also attributes the CPU time of one burst (``--k`` x 2 requests, 32 new tokens after 4,096
cached) to the server's processes (API server, engine core, worker; from ``/proc``), with a
burst of short prompts (32 new after 512) for comparison: how much of the context-proportional
cost is the front end handling the whole prompt on the same core.

Needs the engine (``make engine``). About 3 minutes; run on a quiet machine. Prints tables and
writes ``benchmarks/results_engine_context.json`` (temp file + rename).

Run: ``.venv/bin/python benchmarks/engine_context_cost.py [--k 8] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from btb_core.engine.calibrate import fit_cost, measure
from btb_core.engine.client import complete, complete_at_once
from btb_core.engine.server import ENGINE_BLOCK_TOKENS, SERVED_MODEL_NAME, EngineCluster
from btb_core.engine.text import PromptBuilder
from btb_core.fileio import atomic_write_bytes

from _machine import load_average, machine_start

HERE = Path(__file__).resolve().parent
CONTEXTS = (512, 1024, 2048, 4096)
NEW_TOKENS = (32, 64, 256)


def prompts(salt: int, cached: int, new: int, k: int) -> tuple[str, list[str]]:
    """The ``cached``-token prefix text and ``k`` prompts of ``cached + new`` tokens sharing it,
    each with new blocks of its own."""
    pb = PromptBuilder(ENGINE_BLOCK_TOKENS, salt)
    base = list(range(cached // ENGINE_BLOCK_TOKENS))
    nb = -(-(cached + new) // ENGINE_BLOCK_TOKENS)
    out = [pb.text(base + [1_000_000 + 1_000 * i + j for j in range(nb - len(base))], cached + new)
           for i in range(k)]
    return pb.text(base, cached), out


def cpu_by_process(session: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of every process in ``session``, by process name."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == session:
            key = {"python": "api_server"}.get(name, name)
            out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def fit_rel(columns: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares on relative error: coefficients and each row's relative error."""
    coef, *_ = np.linalg.lstsq(columns / y[:, None], np.ones_like(y), rcond=None)
    return coef, columns @ coef / y - 1.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=8, help="requests sent at once (default 8)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds over the grid (default 3)")
    ap.add_argument("--out", type=Path, default=HERE / "results_engine_context.json")
    args = ap.parse_args()
    k = args.k
    machine = machine_start()
    rows, cpu_rows = [], []
    salt = 900_000
    with EngineCluster(1) as cluster:
        server = cluster.servers[0]
        port = server.port
        calibration = measure(port, repeats=2)
        fit = fit_cost(calibration)
        fit_no_e = fit_cost(calibration, context_term=False)
        print("calibration fit:", {a: float(f"{v:.4g}") for a, v in fit.as_dict().items()})
        for rep in range(args.repeats):
            for c in CONTEXTS:
                for s in NEW_TOKENS:
                    last = {}
                    for n in (1, k):
                        salt += 1
                        prefix, texts = prompts(salt, c, s, n)
                        complete(port, SERVED_MODEL_NAME, prefix, 1)   # the cached context
                        done = complete_at_once(port, SERVED_MODEL_NAME, texts, 1)
                        if any(d.cached_tokens != c for d in done):
                            raise RuntimeError(f"expected {c} cached tokens, engine reported "
                                               f"{[d.cached_tokens for d in done]}")
                        last[n] = max(d.ttft_s for d in done)
                    m = (last[k] - last[1]) / (k - 1)
                    rows.append({"round": rep, "cached_tokens": c, "new_tokens": s, "k": k,
                                 "ttft_1_s": round(last[1], 5), "ttft_k_s": round(last[k], 5),
                                 "marginal_s": round(m, 6)})
                    print(f"round {rep}  C={c:5d}  S={s:4d}  1 request {last[1]:.4f} s  "
                          f"{k} at once {last[k]:.4f} s  marginal {1e3 * m:.2f} ms", flush=True)
        for c, s in ((4096, 32), (512, 32)):
            for rep in range(2):
                salt += 1
                prefix, texts = prompts(salt, c, s, 2 * k)
                complete(port, SERVED_MODEL_NAME, prefix, 1)
                time.sleep(0.3)
                before = cpu_by_process(server.proc.pid)
                complete_at_once(port, SERVED_MODEL_NAME, texts, 1)
                after = cpu_by_process(server.proc.pid)
                used = {p: round(after[p] - before.get(p, 0.0), 3) for p in after}
                cpu_rows.append({"cached_tokens": c, "new_tokens": s, "requests": 2 * k,
                                 "round": rep, "cpu_s": used})
                print(f"CPU of {2 * k} requests (C={c}, S={s}): {used}", flush=True)
    machine["load_average_end"] = load_average()

    # the median marginal cost per (C, S) over rounds, and three fits of it
    grid = sorted({(r["cached_tokens"], r["new_tokens"]) for r in rows})
    med = np.array([np.median([r["marginal_s"] for r in rows
                               if (r["cached_tokens"], r["new_tokens"]) == g]) for g in grid])
    cc = np.array([g[0] for g in grid], dtype=float)
    ss = np.array([g[1] for g in grid], dtype=float)
    pairs = ss * cc + 0.5 * ss * ss
    models = {"a S + b pairs": np.c_[ss, pairs],
              "a S + b pairs + e C": np.c_[ss, pairs, cc],
              "a S + b pairs + e C + per request": np.c_[ss, pairs, cc, np.ones_like(ss)]}
    fits = {}
    for name, cols in models.items():
        coef, rel = fit_rel(cols, med)
        fits[name] = {"coefficients": [float(f"{x:.4g}") for x in coef],
                      "rel_error_rms": round(float(np.sqrt(np.mean(rel ** 2))), 4),
                      "rel_error_max": round(float(np.max(np.abs(rel))), 4),
                      "rel_error": [round(float(x), 4) for x in rel]}
        print(f"{name:36s} coefficients {fits[name]['coefficients']}  rel. error rms "
              f"{fits[name]['rel_error_rms']:.3f}, max {fits[name]['rel_error_max']:.3f}")
    # the calibration's own fits (to lone requests), without and with e, on the same marginals
    cal_pred = fit_no_e.linear_s_per_token * ss + fit_no_e.attention_s_per_pair * pairs
    cal_pred_e = (fit.linear_s_per_token * ss + fit.attention_s_per_pair * pairs
                  + fit.context_s_per_token * cc)
    table = [{"cached_tokens": int(c), "new_tokens": int(s), "marginal_s": round(float(m), 6),
              "calibration_without_e_ratio": round(float(m / p), 4),
              "calibration_with_e_ratio": round(float(m / pe), 4)}
             for c, s, m, p, pe in zip(cc, ss, med, cal_pred, cal_pred_e)]
    print("\n    C     S  marginal ms  measured / calibration fit without e, with e")
    for t in table:
        print(f"{t['cached_tokens']:5d} {t['new_tokens']:5d}  {1e3 * t['marginal_s']:10.2f}  "
              f"{t['calibration_without_e_ratio']:8.3f} {t['calibration_with_e_ratio']:8.3f}")
    doc = {"machine": machine, "calibration_fit": fit.as_dict(),
           "calibration_fit_without_e": fit_no_e.as_dict(), "rows": rows,
           "marginal_by_grid": table, "fits_of_marginals": fits, "cpu_by_process": cpu_rows}
    atomic_write_bytes(args.out, (json.dumps(doc, indent=1) + "\n").encode())
    print(f"wrote {args.out.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
