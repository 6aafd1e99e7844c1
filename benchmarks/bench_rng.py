"""The router's random draws: numpy's ``Generator`` against ``btb_core.sim.rng.RouterRng`` (the
same numbers), per call, and how many draws each policy makes per request.

Part 1 times ``integers(n)`` (n = 2, 7, 64) and ``random()`` on both, interleaved, the least of
``--repeats`` rounds of ``--calls`` calls (microseconds per call, CPU time). Part 2 replays the
Bursted-shaped trace (2 windows, 5,120 rows) and the first 5,000 rows of the Mooncake conversation
trace on 4 and 64 replicas with each policy that draws, counting the draws (exact, not timed), and
multiplies them by the per-call saving of part 1: what the generator takes off each policy's
replay per request. Prints both and writes ``benchmarks/results_rng.json``.

Run: ``.venv/bin/python benchmarks/bench_rng.py`` (about 30 s).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

POLICIES = ("random", "power_of_two", "least_load", "kv_aware", "llm_d", "btb_adaptive")


def _per_call_us(make, calls: int, repeats: int) -> dict:
    """Least CPU microseconds per call of each draw, numpy vs RouterRng, rounds interleaved."""
    from btb_core.sim.rng import RouterRng

    draws = {"integers(2)": lambda g: g.integers(2), "integers(7)": lambda g: g.integers(7),
             "integers(64)": lambda g: g.integers(64), "random()": lambda g: g.random()}
    out = {}
    for name, draw in draws.items():
        best = {"numpy": float("inf"), "RouterRng": float("inf")}
        for rnd in range(repeats):
            order = ("numpy", "RouterRng") if rnd % 2 == 0 else ("RouterRng", "numpy")
            for kind in order:
                g = make() if kind == "numpy" else RouterRng(make())
                rng_calls = range(calls)
                t = time.process_time()
                for _ in rng_calls:
                    draw(g)
                best[kind] = min(best[kind], time.process_time() - t)
        out[name] = {k: round(v / calls * 1e6, 3) for k, v in best.items()}
    return out


def _draws_per_request(traces, replicas) -> list[dict]:
    """Exact draws per request of each policy (counted through a RouterRng subclass)."""
    import btb_core.sim.engine as engine_module
    from btb_core.routers import policy_class
    from btb_core.sim import ClusterConfig, simulate
    from btb_core.sim.rng import RouterRng

    count = [0]

    class Counting(RouterRng):
        __slots__ = ()

        def integers(self, *a, **k):
            count[0] += 1
            return RouterRng.integers(self, *a, **k)

        def random(self, *a, **k):
            count[0] += 1
            return RouterRng.random(self, *a, **k)

    engine_module.router_rng = Counting
    rows = []
    try:
        for name, trace in traces.items():
            for n in replicas:
                cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=n)
                for policy in POLICIES:
                    count[0] = 0
                    simulate(trace, policy_class(policy)(), cluster)
                    rows.append({"trace": name, "replicas": n, "policy": policy,
                                 "draws_per_request": round(count[0] / len(trace), 4)})
    finally:
        from btb_core.sim.rng import router_rng
        engine_module.router_rng = router_rng
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results_rng.json"))
    a = ap.parse_args(argv)
    from _machine import load_average, machine_start, shown_path, write_json
    from bench_policies import _trace

    machine = machine_start()
    per_call = _per_call_us(lambda: np.random.default_rng(12345), a.calls, a.repeats)
    print(f"per call, least CPU us of {a.repeats} rounds x {a.calls:,} calls:")
    print(f"{'draw':<14} {'numpy':>8} {'RouterRng':>10} {'saved':>7}")
    for name, v in per_call.items():
        print(f"{name:<14} {v['numpy']:8.3f} {v['RouterRng']:10.3f} {v['numpy'] - v['RouterRng']:7.3f}")
    saved_int = float(np.mean([v["numpy"] - v["RouterRng"] for k, v in per_call.items()
                               if k.startswith("integers")]))
    traces = {"bursted_shaped": _trace("bursted_shaped", 2, None),
              "mooncake_conversation": _trace("mooncake_conversation", 2, None, 5000)}
    rows = _draws_per_request(traces, (4, 64))
    print("\ndraws per request (exact) and the saving they imply (integers' mean saving per call):")
    print(f"{'trace':<22} {'repl':>4} {'policy':<13} {'draws':>6} {'saved us/request':>17}")
    for r in rows:
        r["saved_us_per_request"] = round(r["draws_per_request"] * saved_int, 3)
        print(f"{r['trace']:<22} {r['replicas']:>4} {r['policy']:<13} {r['draws_per_request']:6.2f} "
              f"{r['saved_us_per_request']:17.2f}")
    machine["load_average_end"] = load_average()
    payload = {"machine": machine, "args": {**vars(a), "out": shown_path(a.out)}, "per_call_us": per_call,
               "integers_saved_us_per_call": round(saved_int, 3), "draws": rows}
    print(f"written {write_json(a.out, payload, indent=1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
