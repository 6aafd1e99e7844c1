"""``btb synth``: build a Bursted dataset (normal + synthetic burst windows) (issue 6).

Examples
--------
``btb synth --out build/bursted``                      default preset on the shipped Mooncake trace
``btb synth --preset quick --seed 1 --out build/q``    a tiny dataset (tests, notebook quick run)
``btb synth --base art_chat.parquet --preset reference --out build/bursted-art``
``btb synth --out build/b --decoy-requests 3 --background-rows 100``
"""

from __future__ import annotations

import argparse
import dataclasses

from ..errors import ConfigError
from ..synth import DEFAULT_BASE, check_out, PRESETS, SPLITS, SynthConfig, generate, load_base, preset, \
    push_to_hub, write
from ..trace import FORMATS

#: CLI flag -> (SynthConfig field, type, help).
_OVERRIDES = {
    "train_windows": (int, "windows in the train split"),
    "test_windows": (int, "windows in the test split"),
    "synthetic_fraction": (float, "share of each split's windows that are synthetic"),
    "normal_rows": (int, "consecutive base-trace rows per normal window"),
    "jobs": (int, "jobs per synthetic window"),
    "job_size": (int, "requests per job"),
    "prefix_tokens": (int, "shared prefix of a job's requests, tokens (multiple of the block size)"),
    "suffix_tokens": (int, "each request's own suffix, tokens"),
    "output_tokens": (int, "output tokens of generated requests"),
    "span_s": (float, "seconds over which a job's requests arrive"),
    "first_job_s": (float, "start of the first job, s"),
    "job_gap_s": (float, "seconds between job starts"),
    "jitter_s": (float, "up to this much random delay per job start, s"),
    "decoys": (int, "decoy jobs per synthetic window"),
    "decoy_requests": (int, "requests per decoy job (1 = single-request decoys; e.g. 3)"),
    "decoy_span_s": (float, "seconds within which a decoy's requests arrive"),
    "decoy_prefix_tokens": (int, "shared prefix of a decoy's requests (default: --prefix-tokens)"),
    "background_rows": (int, "base-trace rows added to each synthetic window"),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``synth`` subcommand."""
    p = subparsers.add_parser(
        "synth", help="build a Bursted dataset (train/test windows with same-prefix bursts)",
        description="Cut normal windows from a base trace and generate synthetic windows of "
                    "same-prefix jobs and decoys; write one parquet per split, manifest.json and "
                    "a dataset card README.md. Every option below overrides the preset.")
    p.add_argument("--base", default=None, metavar="PATH|HF_ID",
                   help=f"base trace: Mooncake/ART JSONL, ART parquet (or a directory of them), or "
                        f"an ART-Chat Hub id (default {DEFAULT_BASE.relative_to(DEFAULT_BASE.parents[3])})")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--preset", choices=sorted(PRESETS), default="default",
                   help="default: fits the shipped Mooncake trace; reference: the published build "
                        "(needs >= 20,000 base rows, e.g. ART-Chat); quick: tiny")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out dataset (only an empty directory or one btb synth wrote)")
    p.add_argument("--push-to-hub", default=None, metavar="REPO",
                   help="after writing, upload the directory to this Hub dataset repo (owner/name)")
    p.add_argument("--format", choices=[f for f in FORMATS if f != "bursted"], default=None,
                   dest="fmt", help="base trace format (default: detected)")
    p.add_argument("--block-tokens", type=int, default=None, metavar="N",
                   help="override the base trace's block size")
    p.add_argument("--max-rows", type=int, default=None, metavar="N",
                   help="ART base only: read the first N rows")
    g = p.add_argument_group("sizes, spans and counts (override the preset)")
    for name, (typ, text) in _OVERRIDES.items():
        default = getattr(PRESETS["default"], name)
        g.add_argument("--" + name.replace("_", "-"), type=typ, default=None, dest=name,
                       metavar="N" if typ is int else "X",
                       help=text if default is None else f"{text} (default preset: {default})")
    p.set_defaults(func=run)


def _print_counts(counts: dict, block_tokens: int, config: SynthConfig, out: str) -> None:
    print(f"Bursted dataset written to {out} (block_tokens = {block_tokens})")
    print(f"{'split':<6} {'windows':>7} {'normal':>7} {'synthetic':>9} {'rows':>9}")
    for s in SPLITS:
        c = counts[s]
        print(f"{s:<6} {c['windows']:>7} {c['normal_windows']:>7} {c['synthetic_windows']:>9} "
              f"{c['rows']:>9,}")
    total = sum(counts[s]["rows"] for s in SPLITS)
    print(f"{'total':<6} {sum(counts[s]['windows'] for s in SPLITS):>7} "
          f"{sum(counts[s]['normal_windows'] for s in SPLITS):>7} "
          f"{sum(counts[s]['synthetic_windows'] for s in SPLITS):>9} {total:>9,}")

    def n(count: int, noun: str) -> str:
        return f"{count:,} {noun}{'' if count == 1 else 's'}"

    print(f"normal window = {n(config.normal_rows, 'row')}; synthetic window = "
          f"{n(config.jobs, 'job')} x "
          f"{config.job_size:,} + {config.decoys} decoys x {config.decoy_requests}"
          + (f" + {config.background_rows:,} background" if config.background_rows else "")
          + f" = {n(config.synthetic_window_rows(), 'row')}")


def _flagged(exc: ConfigError) -> ConfigError:
    """The same error naming the command-line flag instead of the dataclass field."""
    msg = str(exc)
    for name in _OVERRIDES:
        msg = msg.replace(f"SynthConfig.{name} ", f"--{name.replace('_', '-')} ")
    return ConfigError(msg)


def run(args: argparse.Namespace) -> int:
    """Build and write the dataset, print its counts; push it if asked. Returns 0."""
    if args.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {args.seed}")
    if args.block_tokens is not None and args.block_tokens <= 0:
        raise ConfigError(f"--block-tokens must be positive, got {args.block_tokens}")
    if args.max_rows is not None and args.max_rows <= 0:
        raise ConfigError(f"--max-rows must be positive, got {args.max_rows}")
    overrides = {name: getattr(args, name) for name in _OVERRIDES}
    try:
        config = preset(args.preset, **overrides)
    except ConfigError as exc:
        raise _flagged(exc) from None
    check_out(args.out, overwrite=args.overwrite)  # fail fast; write() checks again under a lock
    if args.push_to_hub is not None and "/" not in args.push_to_hub:
        raise ConfigError(f"--push-to-hub {args.push_to_hub!r}: must be a Hub dataset id "
                          f"'owner/name'")
    base, info = load_base(args.base, fmt=args.fmt, block_tokens=args.block_tokens,
                           max_rows=args.max_rows)
    import numpy as np

    try:
        ds = generate(base, config, np.random.default_rng(args.seed), seed=args.seed,
                      preset_name=args.preset, base_info=info)
    except ConfigError as exc:
        raise _flagged(exc) from None
    out = write(ds, args.out, overwrite=args.overwrite)
    _print_counts(ds.counts(), ds.block_tokens, config, str(out))
    changed = {k: v for k, v in dataclasses.asdict(config).items()
               if v != getattr(PRESETS[args.preset], k)}
    if changed:
        print("overrides: " + ", ".join(f"{k}={v}" for k, v in changed.items()))
    if args.push_to_hub:
        url = push_to_hub(out, args.push_to_hub)
        print(f"pushed to {url}")
    return 0
