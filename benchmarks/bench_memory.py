"""Peak memory and time of the dataset-mode replay of the default Bursted test split (issue 14, point 4).

The case is the README's study command on the default build (30 test windows, 70,800 requests):

    btb replay --dataset DIR --split test --policy cache_aware btb --setup 70b_h100x4 \\
        --scheduler prefill_first --replicas 4 --workers N --json

run as a child process (``python -m btb_core.cli``), once serial (``--workers 1``: one process holds
everything, the issue's goal is < 250 MB peak RSS) and once with the default pool (``--workers``
omitted: one worker per available core). Reported per run: wall seconds, CPU seconds of the
command and its workers (``RUSAGE_CHILDREN`` user + system), and peak RSS: the largest resident set
of any one process of the run (``ru_maxrss`` of the children, as ``/usr/bin/time -v`` reports it),
plus the serial run's per-process figure, which is the whole replay's footprint. The dataset is
built first when missing (``btb_core.experiment.ensure_dataset("default")``, not timed). Outputs
of the two runs are compared (the JSON results must be equal: the worker count changes nothing).

Run: ``.venv/bin/python benchmarks/bench_memory.py [--dataset DIR] [--workers-list 1 0]``
(``0`` = the default pool; about a minute per run on the 2-core machine of the README). Writes
``benchmarks/results_memory.json`` (temp file + rename).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLICIES = ("cache_aware", "btb")


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (no machine paths in the JSON)."""
    try:
        return Path(path).resolve().relative_to(HERE.parent).as_posix()
    except ValueError:
        return Path(path).name


def _replay(dataset: Path, workers: int) -> dict:
    cmd = [sys.executable, "-m", "btb_core.cli", "replay", "--dataset", str(dataset), "--split", "test",
           "--policy", *POLICIES, "--setup", "70b_h100x4", "--scheduler", "prefill_first",
           "--replicas", "4", "--json"]
    if workers:
        cmd += ["--workers", str(workers)]
    # a fresh interpreter that only waits for the command, so RUSAGE_CHILDREN covers this run alone
    probe = ("import json, resource, subprocess, sys, time\n"
             "t = time.perf_counter()\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "wall = time.perf_counter() - t\n"
             "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
             "print(json.dumps({'rc': p.returncode, 'wall_s': wall, 'cpu_s': ru.ru_utime + ru.ru_stime,\n"
             "                  'peak_rss_mb': ru.ru_maxrss / 1024, 'stdout': p.stdout, 'stderr': p.stderr}))\n")
    out = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    if r["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r['stderr'][-2000:]}")
    shown = ["btb", *(_shown(dataset) if c == str(dataset) else c for c in cmd[3:])]
    return {"command": " ".join(shown), "workers": workers or "default",
            "wall_s": round(r["wall_s"], 2), "cpu_s": round(r["cpu_s"], 2),
            "peak_rss_mb": round(r["peak_rss_mb"], 1),
            "results": json.loads(r["stdout"])["results"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", type=Path, default=None,
                    help="a Bursted dataset directory (default: the default build under build/datasets)")
    ap.add_argument("--workers-list", type=int, nargs="+", default=[1, 0],
                    help="--workers of each run (0 = omitted: the default pool); default 1 0")
    ap.add_argument("--out", type=Path, default=HERE / "results_memory.json")
    a = ap.parse_args(argv)
    from btb_core.experiment import default_workers, ensure_dataset

    dataset = a.dataset or ensure_dataset("default", seed=0)
    machine = {"cpus": os.cpu_count(), "available_cores": default_workers(),
               "python": platform.python_version(), "platform": platform.platform(),
               "load_average_start": [round(x, 2) for x in os.getloadavg()]}
    runs = []
    for w in a.workers_list:
        t0 = time.perf_counter()
        runs.append(_replay(dataset, w))
        r = runs[-1]
        print(f"  workers={r['workers']}: wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s, "
              f"peak RSS {r['peak_rss_mb']:.0f} MB ({time.perf_counter() - t0:.0f} s)", flush=True)
    identical = all(r["results"] == runs[0]["results"] for r in runs)
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    requests = sum(x["requests"] for x in runs[0]["results"] if x["dataset"] == "bursted")
    print()
    print(f"test-split replay ({requests:,} requests replayed: {', '.join(POLICIES)}; 70b_h100x4, "
          f"prefill_first, 4 replicas)")
    print(f"{'workers':>8} {'wall s':>7} {'CPU s':>7} {'peak RSS MB':>12}  goal < 250 MB")
    for r in runs:
        print(f"{str(r['workers']):>8} {r['wall_s']:>7.1f} {r['cpu_s']:>7.1f} {r['peak_rss_mb']:>12,.0f}  "
              f"{'met' if r['peak_rss_mb'] < 250 else 'NOT met'}")
    print(f"results identical across worker counts: {identical}")
    payload = {"machine": machine, "dataset": _shown(dataset), "requests_replayed": requests,
               "identical_across_workers": identical,
               "runs": [{k: v for k, v in r.items() if k != "results"} for r in runs],
               "results": runs[0]["results"]}
    tmp = a.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, a.out)
    print(f"written {a.out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
