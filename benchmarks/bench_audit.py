"""Benchmark the trace layer and the audit on the shipped traces (issue 2, item 6).

Prints, and writes to ``benchmarks/results_audit.json``:
* load time and resident bytes per row of each shipped trace (interned ids vs the raw JSON lists);
* time of the default audit grid (depths 1k/4k/8k tokens x windows 10/60 s, with and without
  excluding earlier turns) on the 12,031-row Mooncake conversation trace (target: a few seconds);
* the same grid on the conversation trace tiled 20 times end to end (240,620 rows) to show the
  ``O(n log n)`` scaling.

Run: ``.venv/bin/python benchmarks/bench_audit.py``. Timings are best of 3 runs on this machine.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from btb_core.audit import fanout_table
from btb_core.paths import REPO_ROOT
from btb_core.trace import load_trace, make_trace, shipped_traces


def best_of(fn, repeats: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def raw_list_bytes(path: Path) -> float:
    """Bytes per row of the naive representation: a Python list of Python ints per row."""
    rows = [json.loads(line)["hash_ids"] for line in open(path)]
    total = sum(sys.getsizeof(r) + sum(sys.getsizeof(x) for x in r) for r in rows)
    return total / len(rows)


def tiled(trace, copies: int):
    """``copies`` back-to-back copies of ``trace`` (ids made distinct per copy)."""
    span = trace.duration_s + 1.0
    t = np.concatenate([trace.arrival_s + k * span for k in range(copies)])
    shift = int(trace.hash_flat.max()) + 1
    hids = [trace.table["hash_ids"][i] + k * shift for k in range(copies) for i in range(len(trace))]
    return make_trace(t, np.tile(trace.input_length, copies), np.tile(trace.output_length, copies),
                      hids, block_tokens=trace.block_tokens, name=f"{trace.name}x{copies}")


def main() -> int:
    results: dict = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                 "platform": platform.platform()}, "load": {}, "audit": {}}
    for key, path in shipped_traces().items():
        secs, tr = best_of(lambda: load_trace(path))
        row = {"rows": len(tr), "load_s": round(secs, 4),
               "bytes_per_row": round(tr.memory_bytes() / len(tr), 1)}
        if tr.has_prefix_info:
            row["raw_python_lists_bytes_per_row"] = round(raw_list_bytes(path), 1)
        results["load"][key] = row
        print(f"load {key:24s} {len(tr):7,d} rows  {secs * 1e3:7.1f} ms  "
              f"{row['bytes_per_row']:7.1f} B/row"
              + (f"  (raw Python lists: {row['raw_python_lists_bytes_per_row']:,.0f} B/row)"
                 if tr.has_prefix_info else ""))
    conv = load_trace(shipped_traces()["mooncake_conversation"])
    for tr in (conv, tiled(conv, 20)):
        secs, df = best_of(lambda: fanout_table(tr))
        results["audit"][tr.name] = {"rows": len(tr), "grid_cells": len(df),
                                     "seconds": round(secs, 4),
                                     "max_fanout": df["max_fanout"].astype(int).tolist()}
        print(f"audit {tr.name:24s} {len(tr):7,d} rows  default grid ({len(df)} cells): "
              f"{secs:.3f} s")
    out = REPO_ROOT / "benchmarks" / "results_audit.json"
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".results_audit.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(results, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, out)
    print(f"wrote {out.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
