"""Per-request fingerprints of every policy's replay, to check that a speed change kept results
bit-identical (issue 14: "results bit-identical where the rule is unchanged").

For each (trace, replicas, policy) it replays the trace with ``simulate(..., seed=0)`` and hashes
the full per-request table (every column, float64 bytes), the transfers table and the run metrics
(SHA-256). ``--out`` writes them as JSON; ``--check FILE`` compares against an earlier JSON and
exits 1 on any difference, naming the case. Traces: the Bursted-shaped trace
(``btb_core.bursted_shaped``, ``--windows``) and the first ``--mooncake-rows`` rows of the shipped
Mooncake conversation trace.

Run: ``.venv/bin/python benchmarks/replay_fingerprints.py --out before.json`` on the old code, then
``... --check before.json`` on the new one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np
import pandas as pd

POLICIES = ("round_robin", "random", "power_of_two", "least_load", "cache_aware", "kv_aware",
            "llm_d", "btb", "btb_adaptive")


def _digest(frame: pd.DataFrame) -> str:
    h = hashlib.sha256()
    h.update(",".join(map(str, frame.columns)).encode())
    for col in frame.columns:
        values = frame[col].to_numpy()
        if values.dtype.kind in "fiub":
            h.update(np.ascontiguousarray(values).tobytes())
        else:
            h.update("\x1f".join(map(str, values.tolist())).encode())
    return h.hexdigest()


def fingerprints(windows: int, mooncake_rows: int, replicas, policies, scheduler: str,
                 kv_event_lag_s: float = 0.0) -> dict:
    from btb_core.bursted_shaped import bursted_shaped_trace
    from btb_core.paths import DATA_DIR
    from btb_core.routers import make_router
    from btb_core.sim import ClusterConfig, simulate
    from btb_core.trace import load_mooncake

    moon = load_mooncake(DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl")
    traces = {"bursted_shaped": bursted_shaped_trace(windows=windows),
              "mooncake_conversation": moon.rows(0, min(mooncake_rows, len(moon)))}
    out = {}
    for tname, trace in traces.items():
        for n in replicas:
            cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=n, scheduler=scheduler)
            for policy in policies:
                res = simulate(trace, make_router(policy), cluster, seed=0, progress=False,
                               kv_event_lag_s=kv_event_lag_s)
                metrics = json.dumps({k: (v if not isinstance(v, float) else repr(v))
                                      for k, v in sorted(res.metrics.items())
                                      if isinstance(v, (int, float, str))}, sort_keys=True)
                key = f"{tname}/{n}/{policy}/{scheduler}/lag{kv_event_lag_s}"
                out[key] = {"requests": _digest(res.requests),
                            "transfers": _digest(res.transfers),
                            "metrics": hashlib.sha256(metrics.encode()).hexdigest()}
                print(key, out[key]["requests"][:12], flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--mooncake-rows", type=int, default=5000)
    ap.add_argument("--replicas", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--scheduler", default="prefill_first")
    ap.add_argument("--kv-event-lag-s", type=float, default=0.0)
    ap.add_argument("--out")
    ap.add_argument("--check")
    a = ap.parse_args(argv)
    got = fingerprints(a.windows, a.mooncake_rows, a.replicas, a.policies, a.scheduler,
                       a.kv_event_lag_s)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
    if a.check:
        with open(a.check) as f:
            want = json.load(f)
        bad = [k for k in got if k in want and got[k] != want[k]]
        missing = [k for k in got if k not in want]
        for k in bad:
            print(f"DIFFERENT: {k}")
        print(f"{len(got) - len(bad) - len(missing)} identical, {len(bad)} different, "
              f"{len(missing)} not in {a.check}")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
