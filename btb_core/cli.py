"""The ``btb`` command line.

Each subcommand lives in ``btb_core/commands/<name>.py`` and defines ``register(subparsers)``,
which adds its parser and sets ``func`` (a callable taking the parsed args, returning an exit code).
User-facing errors (:class:`btb_core.errors.BTBError`, ``FileNotFoundError``) print as one line
on stderr and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

# Arrow's default allocator (mimalloc) keeps the pages it freed resident: reading the default
# Bursted test split for a dataset replay left ~100 MB of them (peak RSS 296 MB vs 213 MB with the
# C library's allocator, measured on that split). Arrow reads this variable when it first
# allocates, so it is set before anything imports pyarrow (pandas does); a value the user set wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

from .errors import BTBError

COMMANDS = ("cost", "audit", "synth", "replay", "sweep", "suite", "gateway-check", "validate-engine")


#: One example per subcommand for ``btb --help`` (run from the repository root).
EXAMPLES = {
    "cost": "btb cost --linear                      # the published linear prefill / KV-load table",
    "audit": "btb audit data/traces/mooncake/conversation_trace.jsonl --window-s 10 60",
    "synth": "btb synth --out build/bursted-quick --preset quick",
    "replay": "btb replay --trace data/traces/mooncake/conversation_trace.jsonl --policy cache_aware btb",
    "sweep": "btb sweep --grid examples/sweep_grid.yaml --workers 2",
    "suite": "btb suite --policies cache_aware btb --scale 0.5 --workers 2",
    "gateway-check": "btb gateway-check --burst --replicas 4",
    "validate-engine": "btb validate-engine --json                 # needs `make engine` (vLLM CPU)",
}

DESCRIPTION = ("Route LLM inference under bursty, same-prefix traffic: cost model, trace audits,\n"
               "Bursted datasets, simulated replays and parameter sweeps.")


def plain(text: str | None) -> str | None:
    """Docstring text for a terminal: reST markup (``code``, :mod:`x`, ``::``) removed."""
    if not text:
        return text
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    text = text.replace("``", "`").replace("::\n", ":\n")
    return text


def wrap(text: str | None, width: int = 100) -> str | None:
    """Help text for a terminal: lines longer than ``width`` re-wrapped (indentation kept)."""
    if not text:
        return text
    import textwrap

    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[:len(line) - len(line.lstrip())]
        bullet = indent + ("  " if line.lstrip().startswith(("- ", "* ")) else "")
        out.append(textwrap.fill(line, width, subsequent_indent=bullet, break_on_hyphens=False))
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    epilog = "examples (one per command; `btb COMMAND --help` for every option):\n" + "\n".join(
        f"  {EXAMPLES.get(name, f'btb {name} --help')}" for name in COMMANDS)
    parser = argparse.ArgumentParser(prog="btb", description=DESCRIPTION, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands")
    for name in COMMANDS:
        importlib.import_module(f"btb_core.commands.{name.replace('-', '_')}").register(sub)
    for name, p in sub.choices.items():
        p.description = wrap(plain(p.description))
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        p.set_defaults(command_parser=p)      # for the command's own usage in errors (main)
        if name in EXAMPLES and not p.epilog:
            p.epilog = f"example:\n  {EXAMPLES[name]}"
    return parser


def main(argv: list[str] | None = None) -> int:
    import warnings

    from .trace import TraceWarning

    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:     # argparse reports a command's unknown options with the top-level usage
        args.command_parser.error(f"unrecognized arguments: {' '.join(extras)}")

    def one_line(message, category, filename, lineno, file=None, line=None):
        (file or sys.stderr).write(f"btb {args.command}: warning: {message}\n")

    try:
        with warnings.catch_warnings():  # restores the caller's warning state afterwards
            warnings.showwarning = one_line
            warnings.simplefilter("always", TraceWarning)  # one line per trace, even if repeated
            seed = getattr(args, "seed", None)
            if seed is not None and not 0 <= seed < 2 ** 63:  # numpy's default_rng takes no negatives
                from .errors import ConfigError

                raise ConfigError(f"--seed must be >= 0, got {seed}" if seed < 0
                                  else f"--seed must be < 2**63, got {seed}")
            return int(args.func(args) or 0)
    except BTBError as exc:
        print(f"btb {args.command}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `btb audit ... --json | head`
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as exc:  # missing input, read-only FS, disk full, a path through a file, ...
        from .fileio import os_error_text

        text = str(exc) if isinstance(exc, FileNotFoundError) and exc.errno is None \
            else os_error_text(exc)
        print(f"btb {args.command}: error: {_one_line(text)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"btb {args.command}: error: out of memory (reduce the sizes asked for)", file=sys.stderr)
        return 2
    except UnicodeDecodeError as exc:  # a binary file where text was expected
        print(f"btb {args.command}: error: input is not UTF-8 text ({exc.reason} at byte {exc.start})",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"btb {args.command}: interrupted", file=sys.stderr)
        return 130


def _one_line(text: str) -> str:
    """Messages stay on one line (a path or value with a newline is escaped)."""
    try:  # undecodable file names: byte 0xff shown as \xff
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\r", "\\r").replace("\n", "\\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
