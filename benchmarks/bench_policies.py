"""Replay speed of every routing policy, and how it scales with the replica count (issue 14).

Times every policy of :data:`btb_core.routers.POLICIES` except the external ``sglang_gateway``
(round_robin, random, power_of_two, least_load, cache_aware, kv_aware, llm_d, btb, btb_adaptive)
on two traces -- the Bursted-shaped trace of ``btb_core.bursted_shaped`` (``--windows`` windows of it;
30 windows = 76,800 rows, the test split's shape; default 2 = 5,120 rows) and the first
``--mooncake-rows`` rows of the shipped Mooncake conversation trace (default 5,000 of 12,031) -- at 4, 16 and 64 replicas of Llama-3.3-70B on 4x H100 (``--scheduler``, default
``prefill_first``, the setup issue 14 measured).

Each (trace, replicas, policy) case runs in its own process (one core at a time), so peak RSS
is per case. Every case's process builds its trace once and replays it once unrecorded (a fresh
process's first replay pays one-time costs); then the cases take turns: in each of ``--repeats``
rounds every case of the trace replays once, in an order rotated by one case per round, so each
case's replays are spread over the whole run. The time of one replay is its **CPU time**
(``time.process_time``: the 2 cores of the machine are shared, so wall time mostly measures the
neighbours), after a ``gc.collect()`` outside the timing (the previous replay's garbage is not
this one's cost; ``timeit`` goes further and disables the collector). Each case's figure is its
**minimum** over the rounds (the least disturbed replay, as the Python ``timeit`` documentation
advises), and the ratios compare those minima. This VM's speed moves by 10-50% within seconds to
minutes: with each case's replays back to back (the first version of this script) a case whose
few seconds fell in a slow spell had every replay slowed, and the ratios moved by about +-0.2
between runs; interleaved, two runs of the table (2026-12-01, 19:21 and 20:02 UTC, the second on a
much noisier machine) gave ratios to ``round_robin`` 0.02 apart on average (largest 0.14) and
64/4 ratios 0.04 apart. The JSON also has, per ratio, the least, median and largest of the
same-round ratios (``*_rounds``), which move about three times as much between runs (0.05 and
0.13): a slow spell hits one case of a pair and not the other.

Columns printed:

- ``req/s``: requests / minimum CPU seconds of one replay;
- ``x rr``: ``round_robin``'s least CPU time / this case's, on the same trace and replica count in
  this run (= the ratio of their requests/s; the issue's goal: >= 0.8);
- ``64/4``: least CPU time per request at 64 replicas / at 4 (the goal: <= 1.2), on the row of 64
  replicas;
- ``rounds``: the least and largest same-round value of the ratio beside it (how much one round's
  comparison scatters);
- ``peak RSS``: the case process's maximum resident set (MB), trace included.

After the table, the fleet-scale case: a ``--fleet-rows`` (default 1,000,000, the issue's size)
row Bursted-shaped trace on 256 replicas with ``btb`` (goal: under 60 s on one core, under 2 GB peak
RSS), one replay (no warm-up), in its own process; reported: the replay's CPU and wall seconds, the trace
build's, and the process's peak RSS (trace included). ``--fleet-rows 0`` skips it; ``--fleet`` runs
only it.

Run: ``.venv/bin/python benchmarks/bench_policies.py [--windows 2] [--mooncake-rows 5000] [--repeats 5] [--replicas 4 16 64]
[--policies ...] [--fleet-rows N]`` (``make bench``) or ``... --fleet`` (``make bench-fleet``).
Writes ``benchmarks/results_policies.json`` (every case, and the fleet case under ``"fleet"``) and
``results_fleet.json`` (temp file + rename).
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _machine import load_average, machine_start, shown_path, write_json  # noqa: E402  (benchmarks/ helpers)

#: Rows of the fleet-scale case in issue 14's goal (< 60 s on one core, < 2 GB peak RSS).
FLEET_GOAL_ROWS = 1_000_000

#: Every shipped policy but the external SGLang gateway (timed by bench_gateway.py).
POLICIES = ("round_robin", "random", "power_of_two", "least_load", "cache_aware", "kv_aware",
            "llm_d", "btb", "btb_adaptive")


def _trace(name: str, windows: int, rows: int | None, mooncake_rows: int | None = None):
    from btb_core.paths import DATA_DIR
    from btb_core.trace import load_mooncake
    from btb_core.bursted_shaped import bursted_shaped_trace

    if name == "mooncake_conversation":
        trace = load_mooncake(DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl")
        return trace if mooncake_rows is None else trace.rows(0, min(mooncake_rows, len(trace)))
    trace = bursted_shaped_trace(windows=windows)
    if rows is not None:
        if len(trace) < rows:
            raise ValueError(f"bursted_shaped_trace(windows={windows}) has only {len(trace)} rows")
        trace = trace.rows(0, rows)
    return trace


def _serve(args: dict, conn) -> None:
    """A case's process: build the trace, replay once unrecorded (unless ``args["warmup"]`` is
    False), then replay once per ``"run"``
    received on ``conn`` (answering ``(cpu_s, wall_s, events, ttft_mean_s)``) until ``"stop"``
    (answering the peak RSS, MB)."""
    try:
        from btb_core.routers import make_router
        from btb_core.sim import ClusterConfig, simulate

        b0, bw0 = time.process_time(), time.perf_counter()
        trace = _trace(args["trace"], args["windows"], args.get("rows"), args.get("mooncake_rows"))
        build = (time.process_time() - b0, time.perf_counter() - bw0)
        cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=args["replicas"],
                                           scheduler=args["scheduler"])
        if args.get("warmup", True):
            simulate(trace, make_router(args["policy"]), cluster, seed=0, progress=False)
        conn.send({"rows": len(trace), "trace_build": build})
        while True:
            cmd = conn.recv()
            if cmd == "stop":
                conn.send(round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
                return
            router = make_router(args["policy"])
            gc.collect()       # the previous replay's garbage is not this one's time (as timeit)
            c0, t0 = time.process_time(), time.perf_counter()
            res = simulate(trace, router, cluster, seed=0, progress=False)
            conn.send((time.process_time() - c0, time.perf_counter() - t0, res.metrics["events"],
                       res.metrics["ttft_mean_s"]))
            del router, res
    except BaseException as exc:  # report, do not hang the parent on recv()
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        raise


class _Case:
    """A case's process (:func:`_serve`), driven from the parent."""

    def __init__(self, ctx, args: dict) -> None:
        self.args = args
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(args, child), daemon=True)
        self.proc.start()
        child.close()
        self.runs: list[tuple] = []
        self.started: list[float] = []      # parent's clock when each replay was asked for
        self.info = None

    def _recv(self):
        got = self.conn.recv()
        if isinstance(got, dict) and "error" in got:
            raise RuntimeError(f"case {self.args} failed: {got['error']}")
        return got

    def ready(self) -> None:
        self.info = self._recv()

    def replay(self) -> tuple:
        self.started.append(time.perf_counter())
        self.conn.send("run")
        self.runs.append(self._recv())
        return self.runs[-1]

    def finish(self, t0: float = 0.0) -> dict:
        """Stop the process; the case's row (the JSON's fields; ``started_s_all``: when each replay
        was asked for, seconds after ``t0``)."""
        self.conn.send("stop")
        rss = self._recv()
        self.proc.join()
        a, runs, n = self.args, self.runs, self.info["rows"]
        cpu = min(r[0] for r in runs)      # the least disturbed replay (see the module docstring)
        if len({(r[2], r[3]) for r in runs}) != 1:
            raise RuntimeError(f"case {a}: replays of the same inputs differ: {runs}")
        build = self.info["trace_build"]
        return {
            "trace": a["trace"], "rows": n, "replicas": a["replicas"], "policy": a["policy"],
            "scheduler": a["scheduler"], "repeats": len(runs),
            "cpu_s_min": round(cpu, 4),
            "cpu_s_median": round(statistics.median(r[0] for r in runs), 4),
            "cpu_s_all": [round(r[0], 4) for r in runs],
            "wall_s_all": [round(r[1], 4) for r in runs],
            "started_s_all": [round(t - t0, 3) for t in self.started],
            "trace_build_cpu_s": round(build[0], 3), "trace_build_wall_s": round(build[1], 3),
            "requests_per_s_cpu": round(n / cpu), "cpu_us_per_request": round(1e6 * cpu / n, 2),
            "peak_rss_mb": rss, "events": runs[0][2], "ttft_mean_s": round(runs[0][3], 6),
        }


def _interleaved(trace: str, a, on_replay=None) -> list[dict]:
    """Every (replicas, policy) case of ``trace``, each in its own process, replayed in
    ``a.repeats`` rounds (order rotated by one case per round; the module docstring); rows in
    (replicas, policy) order, with ``cpu_s_all`` in round order."""
    ctx = mp.get_context("spawn")
    cases = [_Case(ctx, {"trace": trace, "windows": a.windows, "replicas": n,
                         "mooncake_rows": a.mooncake_rows or None, "policy": policy,
                         "scheduler": a.scheduler})
             for n in a.replicas for policy in a.policies]
    try:
        for c in cases:
            c.ready()
        t0 = time.perf_counter()
        k = len(cases)
        for rnd in range(a.repeats):
            for i in range(k):
                c = cases[(i + rnd) % k]
                c.replay()
                if on_replay is not None:
                    on_replay(rnd, c)
        return [c.finish(t0) for c in cases]
    finally:
        for c in cases:
            if c.proc.is_alive():
                c.proc.kill()
                c.proc.join()


def _write(path: Path, payload: dict) -> None:
    print(f"written {write_json(path, payload)}")


def _fleet(a) -> dict:
    """The fleet-scale case (btb, 256 replicas, ``a.fleet_rows`` rows); prints one line."""
    windows = 2 * -(-a.fleet_rows // 5120) + 1  # a normal + a synthetic window = 5,120 rows
    t0 = time.perf_counter()
    case = _Case(mp.get_context("spawn"),
                 {"trace": "bursted_shaped", "windows": windows, "rows": a.fleet_rows, "replicas": 256,
                  "policy": "btb", "scheduler": a.scheduler, "warmup": False})
    try:
        case.ready()
        case.replay()
        row = case.finish()
    finally:
        if case.proc.is_alive():
            case.proc.kill()
            case.proc.join()
    row["case_wall_s_with_trace_build"] = round(time.perf_counter() - t0, 2)
    row["goal"] = "replay < 60 CPU s on one core and peak RSS < 2,048 MB (issue 14)"
    # the goal is stated for the size; a smaller cut is a measurement, not a verdict
    row["goal_met"] = (bool(row["cpu_s_median"] < 60 and row["peak_rss_mb"] < 2048)
                       if row["rows"] >= FLEET_GOAL_ROWS else None)
    print(f"fleet: {row['rows']:,} rows, 256 replicas, btb: replay CPU {row['cpu_s_median']:.1f} s "
          f"(wall {row['wall_s_all'][0]:.1f} s; {row['requests_per_s_cpu']:,} req/s), trace build "
          f"CPU {row['trace_build_cpu_s']:.1f} s, peak RSS {row['peak_rss_mb']:,} MB; goal < 60 s and "
          f"< 2,048 MB at {FLEET_GOAL_ROWS:,} rows: {_verdict(row)}", flush=True)
    return row


def _verdict(row: dict) -> str:
    return {True: "met", False: "NOT met", None: "not judged (smaller cut)"}[row["goal_met"]]


def _rounds(num: dict | None, den: dict | None) -> list | None:
    """``[least, median, largest]`` over the rounds of ``num``'s CPU time / ``den``'s in the same
    round (None when either is missing)."""
    if num is None or den is None:
        return None
    ratios = [x / y for x, y in zip(num["cpu_s_all"], den["cpu_s_all"])]
    return [round(min(ratios), 3), round(statistics.median(ratios), 3), round(max(ratios), 3)]


def _summarise(rows: list[dict], a, machine: dict, final: bool, fleet: dict | None = None) -> None:
    """Fill the ratio columns, write the JSON; when ``final``, also print the table."""
    by = {(r["trace"], r["replicas"], r["policy"]): r for r in rows}
    lo, hi = min(a.replicas), max(a.replicas)
    for r in rows:
        rr = by.get((r["trace"], r["replicas"], "round_robin"))
        r["ratio_to_round_robin"] = round(rr["cpu_s_min"] / r["cpu_s_min"], 3) if rr else None
        r["ratio_to_round_robin_rounds"] = _rounds(rr, r)
        small = by.get((r["trace"], lo, r["policy"]))
        key = f"cost_ratio_vs_{lo}_replicas"
        r[key] = (round(r["cpu_us_per_request"] / small["cpu_us_per_request"], 3)
                  if small else None)
        r[key + "_rounds"] = _rounds(r, small)
    machine["load_average_end"] = load_average()
    payload = {"machine": machine, "complete": final,
               "args": {k: (shown_path(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
               "cases": rows, "fleet": fleet}
    out = a.out or HERE / "results_policies.json"
    if not final:
        write_json(out, payload)      # partial results, rewritten after every round
        return
    print()
    print(f"{'trace':<22} {'repl':>4} {'policy':<13} {'req/s (CPU)':>11} {'x rr':>6} {'rounds':>11} "
          f"{f'{hi}/{lo}':>6} {'rounds':>11} {'peak RSS MB':>11}")

    def rng(v):
        return "" if v is None else f"{v[0]:.2f}-{v[2]:.2f}"

    for r in rows:
        key = f"cost_ratio_vs_{lo}_replicas"
        ratio, spread = (r[key], r[key + "_rounds"]) if r["replicas"] == hi else (None, None)
        print(f"{r['trace']:<22} {r['replicas']:>4} {r['policy']:<13} {r['requests_per_s_cpu']:>11,} "
              f"{r['ratio_to_round_robin'] or float('nan'):>6.2f} {rng(r['ratio_to_round_robin_rounds']):>11} "
              f"{'' if ratio is None else f'{ratio:.2f}':>6} {rng(spread):>11} {r['peak_rss_mb']:>11,.0f}")
    slow = [f"{r['trace']}/{r['replicas']}/{r['policy']}" for r in rows
            if r["ratio_to_round_robin"] is not None and r["ratio_to_round_robin"] < 0.8]
    steep = [f"{r['trace']}/{r['policy']}" for r in rows
             if r["replicas"] == hi and (r[f"cost_ratio_vs_{lo}_replicas"] or 0) > 1.2]
    print(f"below 0.8x round_robin: {', '.join(slow) or 'none'}")
    print(f"{hi}-vs-{lo} cost ratio above 1.2: {', '.join(steep) or 'none'}")
    if fleet is not None:
        print(f"{'fleet (bursted_shaped)':<22} {fleet['replicas']:>4} {'btb':<13} "
              f"{fleet['requests_per_s_cpu']:>11,} {'':>6} {'':>6} {fleet['peak_rss_mb']:>11,.0f}   "
              f"{fleet['rows']:,} rows: replay {fleet['cpu_s_median']:.1f} CPU s / "
              f"{fleet['wall_s_all'][0]:.1f} wall s (goal < 60 s, < 2,048 MB: {_verdict(fleet)})")
    _write(out, payload)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=2,
                    help="windows of the Bursted-shaped trace (30 = 76,800 rows; default 2 = 5,120)")
    ap.add_argument("--mooncake-rows", type=int, default=5000,
                    help="first rows of the Mooncake conversation trace (0 = all 12,031; default 5,000)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="rounds: replays per case (default 5); req/s and ratios from each case's "
                         "least CPU time")
    ap.add_argument("--replicas", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--traces", nargs="+", default=["bursted_shaped", "mooncake_conversation"],
                    choices=["bursted_shaped", "mooncake_conversation"])
    ap.add_argument("--scheduler", default="prefill_first", choices=["prefill_first", "chunked"])
    ap.add_argument("--fleet", action="store_true",
                    help="run only the fleet-scale case (btb, 256 replicas, --fleet-rows rows)")
    ap.add_argument("--fleet-rows", type=int, default=1_000_000,
                    help="rows of the fleet-scale case (default 1,000,000, the issue's size; 0 = skip it)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    machine = machine_start()
    if a.fleet:
        row = _fleet(a)
        machine["load_average_end"] = load_average()
        _write(a.out or HERE / "results_fleet.json", {"machine": machine, "case": row})
        return 0
    rows = []
    for trace in a.traces:
        n_cases = len(a.replicas) * len(a.policies)
        print(f"{trace}: {n_cases} cases, each in its own process; {a.repeats} rounds", flush=True)

        def show(rnd, c, n_cases=n_cases):
            cpu, wall = c.runs[-1][:2]
            print(f"  round {rnd + 1}/{a.repeats} {c.args['trace']:<22} {c.args['replicas']:>3} replicas "
                  f"{c.args['policy']:<13} {c.info['rows'] / cpu:>8,.0f} req/s (CPU {cpu:.3f} s, "
                  f"wall {wall:.3f} s)", flush=True)

        rows.extend(_interleaved(trace, a, show))
        _summarise(rows, a, machine, final=False)  # partial results survive an interrupted run
    fleet = None
    if a.fleet_rows > 0:
        fleet = _fleet(a)
        if a.out is None:
            _write(HERE / "results_fleet.json", {"machine": dict(machine), "case": fleet})
    _summarise(rows, a, machine, final=True, fleet=fleet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
