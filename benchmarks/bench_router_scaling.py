"""cache_aware / btb replay time against trace length on 16 replicas (issue 17: linear, not quadratic).

The shipped Mooncake conversation trace (12,031 rows, about an hour) is tiled end to end with fresh
block ids per copy, so every copy brings new prompts and the routers' approximate prefix trees keep
growing past ``max_tree_size`` (2**26 tokens per replica): from then on every trim (each 120 s of
simulated time) evicts. Before issue 17 a trim rebuilt a heap over every leaf of every tree, so the
work per trim grew with the tree and the replay time with the square of the trace length (issue 17:
100k rows 9.6 s, 300k rows 182 s, 1M rows not done in 10 minutes); now leaves wait in a heap kept
current by insertion and a trim costs what it removes.

``--reference`` also runs the old full-rebuild eviction (kept here, not in the package, on top of
the per-block index :class:`~btb_core.routers.prefix_tree_blocks.BlockPrefixIndex` that issue 14's
run tree replaced) on the smaller sizes for comparison.

Run: ``.venv/bin/python benchmarks/bench_router_scaling.py [--rows 100000 300000 1000000]
[--reference]``. Prints a table and writes ``benchmarks/results_router_scaling.json``. One process,
one core; wall times on a shared VM vary by +-25 % between runs.
"""

from __future__ import annotations

import argparse
import heapq
import json
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from btb_core.paths import DATA_DIR
from btb_core.routers import make_router
from btb_core.routers.prefix_tree_blocks import BlockPrefixIndex
from btb_core.sim import ClusterConfig, simulate
from btb_core.trace import Trace, load_mooncake

HERE = Path(__file__).resolve().parent


def tiled_trace(rows: int) -> Trace:
    """``rows`` rows of the Mooncake conversation trace tiled end to end, fresh ids per copy."""
    base = load_mooncake(DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl")
    n = len(base)
    copies = -(-rows // n)
    span = base.duration_s + 1.0
    id_step = int(base.hash_flat.max()) + 1
    lengths = np.diff(base.hash_offsets)
    arrival = np.concatenate([base.arrival_s + k * span for k in range(copies)])[:rows]
    inp = np.tile(base.input_length, copies)[:rows]
    out = np.tile(base.output_length, copies)[:rows]
    all_lengths = np.tile(lengths, copies)[:rows]
    offsets = np.zeros(rows + 1, np.int64)
    np.cumsum(all_lengths, out=offsets[1:])
    flat = np.concatenate([base.hash_flat.astype(np.int64) + k * id_step
                           for k in range(copies)])[: offsets[-1]]
    if flat.max() > np.iinfo(np.int32).max:
        raise ValueError("too many ids for int32")
    flat = flat.astype(np.int32)
    flat.flags.writeable = False
    views = np.empty(rows, dtype=object)
    for i, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        views[i] = flat[a:b]
    table = pd.DataFrame({"request_id": np.arange(rows, dtype=np.int64), "arrival_s": arrival,
                          "input_length": inp, "output_length": out, "hash_ids": views})
    return Trace(table, base.block_tokens, f"mooncake_x{copies}", True, flat, offsets, None)


class RebuildIndex(BlockPrefixIndex):
    """The eviction before issue 17: every trim heapifies all leaves of the replica's tree."""

    def evict_to(self, replica: int, max_tokens: int) -> int:
        if self._size_tokens[replica] <= max_tokens:
            return 0
        held, children, rank = self._time[replica], self._children[replica], self._rank[replica]
        heap = [(t, seq, h) for seq, (h, t) in enumerate(held.items()) if children[h] == 0]
        heapq.heapify(heap)
        seq = len(heap)
        removed = 0
        while heap and self._size_tokens[replica] > max_tokens:
            t, _, h = heapq.heappop(heap)
            if h not in held or children[h] != 0 or held[h] != t:
                continue
            del held[h], children[h], rank[h]
            self._size_tokens[replica] -= self._tokens[h]
            removed += 1
            p = self._parent[h]
            if p is not None and p in children:
                if held[p] < t:   # lazy access times: the parent takes its child's (insert)
                    held[p] = t
                children[p] -= 1
                if children[p] == 0:
                    heapq.heappush(heap, (held[p], seq, p))
                    seq += 1
        self._leaves[replica] = []  # the incremental heap is not used by this reference
        return removed


def run(trace: Trace, policy: str, reference: bool, max_tree_size: int | None = None) -> dict:
    import btb_core.routers.cache_aware as ca

    cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=16, scheduler="chunked")
    saved = ca.ApproxPrefixIndex
    if reference:
        ca.ApproxPrefixIndex = RebuildIndex
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        params = {} if max_tree_size is None else {"max_tree_size": max_tree_size}  # btb too
        res = simulate(trace, make_router(policy, **params), cluster, seed=0, progress=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        ca.ApproxPrefixIndex = saved
    return {"policy": policy, "eviction": "rebuild (before)" if reference else "incremental",
            "rows": len(trace), "replicas": 16, "max_tree_size": max_tree_size or 2 ** 26,
            "simulate_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "us_per_row": round(1e6 * wall / len(trace), 1),
            "cpu_us_per_row": round(1e6 * cpu / len(trace), 1),
            "ttft_mean_s": res.metrics["ttft_mean_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    ap.add_argument("--policies", nargs="+", default=["cache_aware", "btb"])
    ap.add_argument("--reference", action="store_true",
                    help="also time the old full-rebuild eviction on sizes up to 300,000 rows")
    ap.add_argument("--max-tree-size", type=int, default=None,
                    help="cache_aware tree bound in tokens (default the shipped 2**26); a smaller "
                         "bound makes trims evict from the first copies on, so shorter runs show "
                         "the scaling")
    ap.add_argument("--out", default="results_router_scaling.json")
    args = ap.parse_args()
    results = []
    print(f"{'policy':<12} {'eviction':<17} {'rows':>9} {'simulate s':>10} {'us/row':>7} "
          f"{'cpu s':>8} {'cpu us/row':>10}")
    for rows in args.rows:
        trace = tiled_trace(rows)
        for policy in args.policies:
            cases = [False] + ([True] if args.reference and rows <= 300_000 else [])
            for ref in cases:
                r = run(trace, policy, ref, args.max_tree_size)
                results.append(r)
                print(f"{r['policy']:<12} {r['eviction']:<17} {r['rows']:>9,} {r['simulate_s']:>10.1f} "
                      f"{r['us_per_row']:>7.1f} {r['cpu_s']:>8.1f} {r['cpu_us_per_row']:>10.1f}",
                      flush=True)
    out = HERE / args.out
    out.write_text(json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                               "results": results}, indent=1) + "\n")
    print(f"written {out.name}")


if __name__ == "__main__":
    main()
