"""Where a saturated real engine's time goes against the simulator's, step by step (issue 18).

On one vLLM CPU server the simulator's mean TTFT comes out ~9% below the engine's (README
section 14). This script looks for where that gap sits, offline, in a validation result
(``btb validate-engine --out DIR``; default: the shipped run in
``data/engine_validation/measured/``): no engine needed.

For every one-server run it simulates the run again (same send times, the result's own fitted
cost model, as ``btb_core.engine.validation.compare``) and records the
simulator's engine steps (its ``chunked`` scheduler's operations: every chunk's new tokens ``S``
and tokens already computed or cached ``C``). A step that completes a request's prompt ends at
that request's first token, in the simulator and on the engine, so the time between two such
steps on a replica that stayed busy between them is the duration of the steps in between, on both
sides: this script compares them. That holds only where the server never idles between the two
steps, on the engine as in the simulator, which one server under the validation trace never
does; on two servers the engine's gaps between first tokens include idle time the simulator does
not see there, so the script reads one-server runs only. It also holds only where the engine's
steps are the simulator's: a step counts when the requests whose prompts it completes are
exactly one group of the engine's first tokens (consecutive first tokens less than
:data:`GROUP_GAP_S` apart), and an interval when both of its ends count. On the AVX-512
machine's shipped run 215 of the 216 steps count (the engine split one step's first tokens
57 ms apart once); in a one-server run on an AVX2 machine (2026-12-02) three of six runs kept
the simulator's steps throughout, and three merged its eighteen steps into fifteen from their
fourth step on: without this check their steps were paired with the wrong ones (ratios of 0.5
and 1.6 side by side).

Printed: per step of the run (numbered from the first), the median over runs of the real and the
simulated duration and their ratio, with what the step did (chunks, new tokens, cached context,
arrivals during it); then the step model of the simulator (``calibrate.design_row``'s terms: a
fixed cost per step, per new token, per attention pair ``S C + S^2 / 2``, per token of context
``C``, plus ``arrival_overhead_s`` per request arriving during the step) fitted by non-negative
least squares to the *real* step durations, beside the calibration's fit of the same terms to
lone requests. If the two fits agree, the gap is the engine's speed during the replays; if a term
differs, the lone-request calibration misses how that term behaves in busy steps.

Writes ``benchmarks/results_engine_step_gaps.json`` for the shipped run, ``DIR/step_gaps.json`` for
``--result DIR`` (temp file + rename; ``--out`` elsewhere): the
same input gives the same file, byte for byte.

Run: ``.venv/bin/python benchmarks/engine_step_gaps.py [--result DIR] [--out FILE]``
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from _machine import shown_path, write_json

HERE = Path(__file__).resolve().parent

#: First tokens closer than this (s) are one engine step's. On the shipped run one step's first
#: tokens arrive within 4-12 ms of each other and steps complete prompts >= 130 ms apart.
GROUP_GAP_S = 0.03

#: The terms of the step model fitted to the real step durations, in this order.
TERMS = ("step_overhead_s", "linear_s_per_token", "attention_s_per_pair", "context_s_per_token",
         "arrival_overhead_s")


@contextmanager
def recorded_steps():
    """Collect the simulator's engine steps while the block runs: ``(start_s, [(request index,
    new tokens S, tokens before C), ...])`` per ``iter`` operation, in order (by wrapping the
    simulator's ``start_op`` for the block's duration; one server, so no replica is recorded)."""
    from btb_core.sim.engine import Simulator

    log: list = []
    orig = Simulator.start_op

    def start_op(self, rep, kind, duration, data):
        if kind == "iter":
            log.append((self.now, [(j.req.index, c, j.done_tokens) for j, c in data]))
        return orig(self, rep, kind, duration, data)

    Simulator.start_op = start_op
    try:
        yield log
    finally:
        Simulator.start_op = orig


def run_intervals(real: pd.DataFrame, trace, fitted) -> list[dict]:
    """The busy stretches between consecutive prompt-completing steps of one one-server run (see
    the module docstring), one dict each: step (its index among the run's steps), real and
    simulated duration (s), and the chunks, new tokens, attention pairs, context tokens and
    arrivals of that step."""
    from btb_core.engine.validation import compare

    with recorded_steps() as steps:
        df = compare(real, trace, fitted, 1)
    sent = df["sent_s"].to_numpy()
    real_fin = sent + df["ttft_s"].to_numpy()
    sim_fin = sent + df["sim_ttft_s"].to_numpy()
    last = {}                         # request -> the step that completes its prompt
    for k, (_start, chunks) in enumerate(steps):
        for i, _s, _c in chunks:
            last[i] = k
    ends: dict = {}
    for i, k in last.items():
        ends.setdefault(k, []).append(i)
    groups = engine_groups(real_fin)
    out = []
    prev = None
    for k, (start, chunks) in enumerate(steps):
        fin = ends.get(k)
        if not fin:
            continue
        rf = max(real_fin[i] for i in fin)
        sf = max(sim_fin[i] for i in fin)
        same = frozenset(fin) in groups      # the engine completed these prompts in one step
        # busy throughout: the previous step completed a prompt and this one started when it
        # ended (its requests' simulated first token, less the front-end latency)
        if (same and prev is not None and prev[3] and prev[2] == k - 1
                and abs(start - (prev[1] - fitted.frontend_s)) < 1e-6):
            out.append({"step": k, "real_s": rf - prev[0], "sim_s": sf - prev[1],
                        "chunks": len(chunks), "finished": len(fin),
                        "new_tokens": sum(s for _, s, _ in chunks),
                        "pairs": sum(s * c + 0.5 * s * s for _, s, c in chunks),
                        "context_tokens": sum(c for _, _, c in chunks),
                        "arrivals": int(((sent >= start) & (sent < sf)).sum())})
        prev = (rf, sf, k, same)
    return out


def engine_groups(first_token_s) -> set:
    """The engine's steps as seen by the client: sets of request indices whose first tokens
    (``first_token_s``, indexed by request) follow each other less than :data:`GROUP_GAP_S`
    apart."""
    t = np.asarray(first_token_s, dtype=float)
    order = np.argsort(t, kind="stable")
    cuts = np.flatnonzero(np.diff(t[order]) >= GROUP_GAP_S) + 1
    return {frozenset(int(i) for i in part) for part in np.split(order, cuts)}


def fit_steps(d: pd.DataFrame, column: str) -> dict:
    """Non-negative least squares of ``d[column]`` on the step model's terms (:data:`TERMS`);
    returns the coefficients and the fit's rms relative error."""
    from btb_core.engine.calibrate import _nnls

    a = np.column_stack([np.ones(len(d)), d["new_tokens"], d["pairs"], d["context_tokens"],
                         d["arrivals"]]).astype(float)
    y = d[column].to_numpy(dtype=float)
    coef = _nnls(a / y[:, None], np.ones(len(y)))      # relative error, as the calibration fits
    rel = a @ coef / y - 1.0
    return {**{t: float(c) for t, c in zip(TERMS, coef)},
            "rms_rel_error": float(np.sqrt(np.mean(rel ** 2)))}


def analyse(result_dir) -> dict:
    """Everything the script prints, as a dict (see the module docstring). Raises ``SystemExit``
    with a one-line message when ``result_dir`` is not a readable validation result or has no
    one-server run."""
    from btb_core.engine.validation import head, load_result, load_validation_trace

    num_replicas = 1
    path = Path(result_dir)
    if not path.is_dir():
        what = "not a folder" if path.exists() else "no such folder"
        raise SystemExit(f"{result_dir}: {what} (a `btb validate-engine --out DIR` result)")
    try:
        result = load_result(path)
    except (OSError, ValueError, KeyError) as exc:      # missing files, bad JSON or CSV
        raise SystemExit(f"{result_dir}: not a readable validation result "
                         f"(`btb validate-engine --out DIR` writes one): {type(exc).__name__}: {exc}")
    reqs = result.requests
    if "num_replicas" not in reqs:
        raise SystemExit(f"{result_dir}: requests.csv is not a validation result's "
                         "(no column 'num_replicas')")
    reqs = reqs[reqs["num_replicas"] == num_replicas]
    if reqs.empty:
        raise SystemExit(f"{result_dir}: no one-server run in this result (run "
                         f"`btb validate-engine --replicas 1 ...`)")
    fitted = result.fitted_for(num_replicas)
    expected = result.info.get("trace_requests")   # requests replayed per run (after --max-requests)
    full = load_validation_trace()
    ids = [str(i) for i in full.table["request_id"]]
    rows = []
    skipped = 0
    try:
        for (policy, repeat), real in reqs.groupby(["policy", "repeat"], sort=False):
            real = real.reset_index(drop=True)
            run = f"{result_dir}: run {policy} / repeat {int(repeat)}"
            got = [str(i) for i in real["request_id"]]
            if got != ids[:len(got)]:
                # rows missing inside the run, repeated or out of order: the simulation of the
                # trace's first requests would pair with the wrong real ones
                print(f"warning: {run}: its requests are not the trace's first {len(got)} in order "
                      f"(rows missing, repeated or reordered in requests.csv); run skipped",
                      file=sys.stderr)
                skipped += 1
                continue
            if expected is not None and len(real) < int(expected):
                print(f"warning: {run} has {len(real)} of the {int(expected)} requests each run "
                      f"replayed (requests.csv cut short?); analysing those {len(real)}",
                      file=sys.stderr)
            trace = head(full, len(real))
            for row in run_intervals(real, trace, fitted):
                rows.append({"policy": policy, "repeat": int(repeat), **row})
    except (KeyError, TypeError, ValueError) as exc:     # a column missing or not numeric
        raise SystemExit(f"{result_dir}: requests.csv is not a validation result's "
                         f"(a column missing or not numeric: {type(exc).__name__}: {exc})")
    if not rows and skipped == reqs.groupby(["policy", "repeat"]).ngroups:
        raise SystemExit(f"{result_dir}: no one-server run whose requests are the validation trace's "
                         f"first ones in order (the warnings above name them)")
    if not rows:
        raise SystemExit(f"{result_dir}: no busy stretch between prompt-completing steps in its "
                         f"one-server runs")
    d = pd.DataFrame(rows)
    d["ratio"] = d["real_s"] / d["sim_s"]
    per_step = (d.groupby("step").agg(runs=("ratio", "size"), real_s=("real_s", "median"),
                                      sim_s=("sim_s", "median"), ratio=("ratio", "median"),
                                      chunks=("chunks", "median"), new_tokens=("new_tokens", "median"),
                                      context_tokens=("context_tokens", "median"),
                                      arrivals=("arrivals", "median"))
                .reset_index())
    calib = {t: float(getattr(fitted, t)) for t in TERMS}
    shown = shown_path(result_dir)
    return {"result": shown if not Path(shown).is_absolute() else Path(shown).name,
            "num_replicas": num_replicas, "runs": int(len(
        d.groupby(["policy", "repeat"]))), "intervals": int(len(d)),
            "real_over_sim_median": float(d["ratio"].median()),
            "real_minus_sim_mean_s": float((d["real_s"] - d["sim_s"]).mean()),
            "real_total_s": float(d["real_s"].sum()), "sim_total_s": float(d["sim_s"].sum()),
            "calibration_fit": calib, "fit_to_real_steps": fit_steps(d, "real_s"),
            "fit_to_simulated_steps": fit_steps(d, "sim_s"),
            "per_step": per_step.round(6).to_dict("records")}


def main(argv=None) -> int:
    from btb_core.engine.validation import SHIPPED_RESULT

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--result", type=Path, default=Path(SHIPPED_RESULT),
                    help="a validation result folder (default: the shipped measured run)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON file written (default: benchmarks/results_engine_step_gaps.json for "
                         "the shipped run, DIR/step_gaps.json for --result DIR)")
    args = ap.parse_args(argv)
    if args.out is None:     # a user's result never overwrites the shipped figures
        shipped = args.result.resolve() == Path(SHIPPED_RESULT).resolve()
        args.out = (HERE / "results_engine_step_gaps.json" if shipped
                    else args.result / "step_gaps.json")
    if args.out.is_dir():
        ap.error(f"--out {args.out}: is a folder; give a file name")
    if not args.out.parent.is_dir():
        what = "is not a folder" if args.out.parent.exists() else "does not exist"
        ap.error(f"--out {args.out}: {args.out.parent} {what}")
    out = analyse(args.result)
    pd.set_option("display.width", 160)
    print(f"{out['runs']} one-server runs, {out['intervals']} busy steps; "
          f"real / simulated step duration: median {out['real_over_sim_median']:.3f}, "
          f"{out['real_total_s']:.2f} s against {out['sim_total_s']:.2f} s in all")
    print(pd.DataFrame(out["per_step"]).round(3).to_string(index=False))
    fits = pd.DataFrame({"calibration (lone requests)": out["calibration_fit"],
                         "fitted to the real steps": out["fit_to_real_steps"],
                         "fitted to the simulated steps": out["fit_to_simulated_steps"]})
    print(fits.to_string(float_format=lambda v: f"{v:.4g}"))
    write_json(args.out, out)
    print(f"wrote {shown_path(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
