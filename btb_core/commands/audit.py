"""``btb audit``: deep-prefix fan-out and arrival burstiness of traces (issue 2).

Examples
--------
``btb audit data/traces/mooncake/conversation_trace.jsonl``
``btb audit data/traces/mooncake/*.jsonl --depth-tokens 1024 65536 --window-s 10 60 --json``
``btb audit data/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv`` (fan-out: n/a, no prefix
info; burstiness still reported)
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap

import pandas as pd

from ..audit import DEFAULT_BIN_S, DEFAULT_DEPTH_TOKENS, DEFAULT_WINDOW_S, burstiness, fanout_table
from ..errors import ConfigError
from ..fileio import jsonable
from ..trace import FORMATS, load_trace
from .tables import TABLE_WIDTH, add_wide_option, render


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``audit`` subcommand."""
    p = subparsers.add_parser(
        "audit", help="deep-prefix fan-out and burstiness of traces",
        description="Largest number of requests sharing the same first DEPTH tokens within any "
                    "WINDOW seconds (deep-prefix fan-out), and peak vs mean arrival rate. Traces "
                    "without prefix hash ids (Azure CSV) get fan-out 'n/a' with a note.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="trace files (Mooncake/ART JSONL, ART/Bursted parquet, Azure CSV) or "
                        "Bursted directories")
    p.add_argument("--depth-tokens", type=int, nargs="+", default=list(DEFAULT_DEPTH_TOKENS),
                   metavar="N", help="shared-prefix depths in tokens (default "
                                     f"{' '.join(map(str, DEFAULT_DEPTH_TOKENS))})")
    p.add_argument("--window-s", type=float, nargs="+", default=list(DEFAULT_WINDOW_S),
                   metavar="S", help="window lengths in seconds (default "
                                     f"{' '.join(f'{w:g}' for w in DEFAULT_WINDOW_S)})")
    p.add_argument("--exclude-sessions", action="store_true",
                   help="do not count a request that a later request in the window strictly "
                        "extends (earlier turns of a growing conversation)")
    p.add_argument("--format", choices=FORMATS, default=None, dest="fmt",
                   help="trace format (default: detected from the file)")
    p.add_argument("--block-tokens", type=int, default=None, metavar="N",
                   help="override the format's block size")
    p.add_argument("--strict", action="store_true",
                   help="unsorted arrivals are an error instead of being sorted with a warning")
    p.add_argument("--burstiness", action="store_true",
                   help="with --json: print the burstiness rows instead of the fan-out rows")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of tables")
    add_wide_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load every trace, print the fan-out and burstiness tables (or JSON). Returns 0."""
    for d in args.depth_tokens:
        if d <= 0:
            raise ConfigError(f"--depth-tokens must be positive, got {d}")
    for w in args.window_s:
        if not w > 0 or not math.isfinite(w):
            raise ConfigError(f"--window-s must be a positive number of seconds, got {w}")
    if args.block_tokens is not None and args.block_tokens <= 0:
        raise ConfigError(f"--block-tokens must be positive, got {args.block_tokens}")
    traces, paths = [], []
    for path in args.paths:
        tr = load_trace(path, fmt=args.fmt, block_tokens=args.block_tokens, strict=args.strict)
        traces.append(tr)
        paths.append(str(path))
    fan = fanout_table(traces, args.depth_tokens, args.window_s, (bool(args.exclude_sessions),))
    burst = pd.concat([burstiness(t, DEFAULT_BIN_S) for t in traces], ignore_index=True)
    if args.json:
        table = burst if args.burstiness else fan
        rows = jsonable(table.to_dict(orient="records"))
        print(json.dumps(rows, indent=2))
        return 0
    show = fan[["trace", "depth_tokens", "window_s", "max_fanout", "keys_at_max",
                "eligible_requests", "window_start_s"]].copy()
    show["max_fanout"] = show["max_fanout"].astype(object).where(show["max_fanout"].notna(), "n/a")
    show["keys_at_max"] = show["keys_at_max"].astype(object).where(show["keys_at_max"].notna(), "")
    show["eligible_requests"] = show["eligible_requests"].astype(object).where(
        show["eligible_requests"].notna(), "")
    mode = "excluding earlier turns" if args.exclude_sessions else "all requests"
    print(textwrap.fill(f"Deep-prefix fan-out ({mode}): max requests sharing the first "
                        f"depth_tokens tokens within window_s seconds", TABLE_WIDTH))
    print(render(show, wide=args.wide, drop=("window_start_s", "eligible_requests", "keys_at_max")))
    for name, note in fan.loc[fan["note"] != "", ["trace", "note"]].drop_duplicates().itertuples(
            index=False):
        print(f"note: {name}: deep-prefix fan-out {note}")
    print()
    print("Burstiness: requests per second, peak bin vs mean")
    print(render(burst, wide=args.wide, float_format=lambda x: f"{x:.3g}",
                 drop=("zero_bins_frac", "bins", "cv")))
    return 0
