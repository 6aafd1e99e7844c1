"""``btb cost``: prefill vs KV-load times for a prefix, per token count (issue 3).

Examples
--------
``btb cost``                      the standard setup (Llama-3.3-70B on 4x H100), attention on
``btb cost --linear``             the published linear reference table (71.4 us/token)
``btb cost --model qwen3-8b --gpu h200 --gpus 2 --tokens 4096 65536 --json``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

from ..cost import (DEFAULT_TOKENS, REFERENCE_SETUP, TIERS, ZERO_SETUP_LATENCY_S, CostModel,
                    cost_model_for_setup, ratios, reference_cost_model)
from ..errors import ConfigError
from ..formatting import format_column
from ..specs import GPUS, MODELS, SETUPS, STANDARD_SETUP, NodeSpec, model_for, node_for

_TIER_LABEL = {"hbm": "HBM", "dram": "host DRAM", "rdma": "RDMA", "nvme": "NVMe"}
#: Short tier names for the table's column headers (the table fits 120 columns).
_COLUMN_LABEL = {"hbm": "HBM", "dram": "DRAM", "rdma": "RDMA", "nvme": "NVMe"}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``cost`` subcommand."""
    p = subparsers.add_parser(
        "cost", help="prefill vs KV-load (HBM, DRAM, RDMA, NVMe) times per prefix length",
        description="Time to make a prefix's KV usable: recompute it (prefill) or load it from "
                    "HBM, host DRAM, a peer over RDMA, or NVMe. Times in milliseconds.")
    p.add_argument("--setup", choices=sorted([*SETUPS, REFERENCE_SETUP]), default=None,
                   metavar="SETUP",
                   help=f"named setup: {' '.join(sorted([*SETUPS, REFERENCE_SETUP]))} (default "
                        f"{STANDARD_SETUP}); --model/--gpu/--gpus override it")
    p.add_argument("--model", choices=sorted(MODELS), default=None,
                   help="model preset (default: the setup's, llama-3.3-70b)")
    p.add_argument("--gpu", choices=sorted(GPUS), default=None,
                   help="GPU preset (default: the setup's, h100)")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="GPUs per node = tensor-parallel degree (default: the setup's, 4)")
    p.add_argument("--mfu", type=float, default=None, metavar="F",
                   help="prefill model-FLOPs utilisation in (0, 1] (default 0.5)")
    p.add_argument("--linear", action="store_true",
                   help="the published linear table: no attention term, every parameter in "
                        "2*P*S, no setup latency. With no --setup/--model/--gpu/--gpus it is the "
                        "reference setup exactly (70.6e9 params, 989e12 FLOP/s per GPU)")
    p.add_argument("--tokens", type=int, nargs="+", default=None, metavar="N",
                   help=f"prefix lengths (default {' '.join(map(str, DEFAULT_TOKENS))})")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def build_cost_model(args: argparse.Namespace) -> CostModel:
    """The :class:`CostModel` the options describe.

    Raises
    ------
    ConfigError
        Invalid ``--gpus`` / ``--mfu`` (message names the option and value).
    """
    if args.gpus is not None and args.gpus < 1:
        raise ConfigError(f"--gpus must be >= 1, got {args.gpus}")
    if args.mfu is not None and not 0.0 < args.mfu <= 1.0:
        raise ConfigError(f"--mfu must be in (0, 1], got {args.mfu}")
    custom = args.model is not None or args.gpu is not None or args.gpus is not None
    if args.setup == REFERENCE_SETUP or (args.linear and args.setup is None and not custom):
        cm = reference_cost_model()
        if custom:
            raise ConfigError(f"--setup {REFERENCE_SETUP} is fixed; drop --model/--gpu/--gpus")
    else:
        base = cost_model_for_setup(args.setup or STANDARD_SETUP)
        model = model_for(args.model) if args.model else base.model
        gpu = node_for(args.gpu, 1).gpu if args.gpu else base.node.gpu
        node = NodeSpec(gpu, args.gpus or base.node.num_gpus, base.node.disk_shared)
        cm = CostModel(model, node)
        if args.linear:
            cm = CostModel(dataclasses.replace(model, embedding_params=0), node, attention=False,
                           setup_latency_s=ZERO_SETUP_LATENCY_S)
    if args.mfu is not None:
        cm = cm.replace(mfu=args.mfu)
    return cm


def _fmt_ms(value: float) -> str:
    """Three significant figures, no exponent: 0.196, 13.1, 571, 9,137."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if value >= 1000:
        return f"{value:,.0f}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(value)))))
    return f"{value:.{digits}f}"


def format_table(cm: CostModel, rows: list[dict]) -> str:
    """The human-readable table ``btb cost`` prints."""
    d = cm.describe()
    head = (f"{d['model']} on {d['num_gpus']}x {d['gpu']}\n"
            f"MFU {cm.mfu:g} | attention term {'on' if cm.attention else 'off'} | "
            f"linear term {d['prefill_us_per_token_linear']:.1f} us/token | "
            f"KV {d['kv_bytes_per_token']:,} B/token")
    bw = d["node_bytes_per_s"]
    bws = ("node bandwidths: " + ", ".join(
        f"{_TIER_LABEL[t]} {_fmt_ms(bw[t] / 1e9)} GB/s" for t in TIERS)
        + (" (one shared drive)" if d["disk_shared"] else ""))
    cols = ["tokens", "prefill ms"] + [f"{_COLUMN_LABEL[t]} ms" for t in TIERS] + \
        [f"prefill/{_COLUMN_LABEL[t]}" for t in TIERS]
    # one precision per column (3 significant figures of its smallest value)
    rat = ratios(rows)
    columns = [[f"{r['tokens']:,}" for r in rows], format_column([r["prefill_ms"] for r in rows])]
    columns += [format_column([r[f"{t}_ms"] for r in rows]) for t in TIERS]
    columns += [format_column(rat[f"prefill_over_{t}"], suffix="x") for t in TIERS]
    body = [list(row) for row in zip(*columns)]
    widths = [max(len(c), *(len(b[j]) for b in body)) for j, c in enumerate(cols)]
    lines = [head, bws, "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the table (or JSON); exit code 0."""
    cm = build_cost_model(args)
    tokens = args.tokens if args.tokens is not None else list(DEFAULT_TOKENS)
    bad = [t for t in tokens if t < 1]
    if bad:
        raise ConfigError(f"--tokens must be >= 1, got {bad[0]}")
    from ..trace import MAX_TOKENS

    huge = [t for t in tokens if t > MAX_TOKENS]
    if huge:
        raise ConfigError(f"--tokens {huge[0]}: more than 2^40 tokens (not a prompt length)")
    rows = cm.table_rows(tokens)
    if args.json:
        print(json.dumps({"setup": cm.describe(), "rows": rows, "ratios": ratios(rows)},
                         indent=2))
    else:
        print(format_table(cm, rows))
    return 0
