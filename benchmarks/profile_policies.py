"""Where each policy spends its time at 4 vs 64 replicas (issue 14).

Replays the Bursted-shaped trace of ``btb_core.bursted_shaped`` (``--windows``, default 2 = 5,120
rows), or with ``--trace mooncake_conversation`` the first ``--mooncake-rows`` rows of the shipped
Mooncake conversation trace, with each policy on 4 and 64 replicas (Llama-3.3-70B on 4x H100,
``prefill_first``) under cProfile and writes the top functions (by own time and by cumulative time,
with call counts) to ``<out-dir>/[mooncake_]<policy>_<replicas>r_cprofile.txt`` (default
``benchmarks/profiles``). With ``pyinstrument`` (in the ``dev`` extra) it also writes its call-tree
text to ``..._pyinstrument.txt``. Call counts are exact; times are noisy on a shared machine.

Run: ``.venv/bin/python benchmarks/profile_policies.py [--windows 2] [--policies cache_aware btb]
[--replicas 4 64] [--trace mooncake_conversation] [--out-dir benchmarks/profiles/after]``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    print(f"written {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--policies", nargs="+", default=["cache_aware", "btb"])
    ap.add_argument("--replicas", type=int, nargs="+", default=[4, 64])
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--trace", choices=["bursted_shaped", "mooncake_conversation"],
                    default="bursted_shaped")
    ap.add_argument("--mooncake-rows", type=int, default=5000)
    ap.add_argument("--out-dir", type=Path, default=HERE / "profiles",
                    help="where the profiles go (default benchmarks/profiles)")
    a = ap.parse_args(argv)

    from btb_core.routers import make_router
    from btb_core.sim import ClusterConfig, simulate
    from btb_core.bursted_shaped import bursted_shaped_trace

    try:
        import pyinstrument
    except ImportError:
        pyinstrument = None
        print("pyinstrument not installed: cProfile only")
    out_dir = a.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    if a.trace == "mooncake_conversation":
        from btb_core.paths import DATA_DIR
        from btb_core.trace import load_mooncake

        trace = load_mooncake(DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl")
        trace = trace.rows(0, min(a.mooncake_rows, len(trace)))
        label, tag = f"mooncake conversation (first {len(trace):,} rows)", "mooncake_"
    else:
        trace = bursted_shaped_trace(windows=a.windows)
        label, tag = f"bursted_shaped_trace(windows={a.windows}) = {len(trace):,} rows", ""
    for policy in a.policies:
        for replicas in a.replicas:
            cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=replicas, scheduler="prefill_first")
            prof = cProfile.Profile()
            prof.enable()
            simulate(trace, make_router(policy), cluster, seed=0, progress=False)
            prof.disable()
            buf = io.StringIO()
            buf.write(f"# {policy}, {replicas} replicas, {label}, prefill_first; cProfile (times "
                      f"inflated by profiling, noisy shared machine; call counts exact)\n\n"
                      f"## by own time (tottime)\n")
            st = pstats.Stats(prof, stream=buf)
            st.strip_dirs().sort_stats("tottime").print_stats(a.top)
            buf.write("\n## by cumulative time\n")
            st.sort_stats("cumulative").print_stats(a.top)
            _write(out_dir / f"{tag}{policy}_{replicas}r_cprofile.txt", buf.getvalue())
            if pyinstrument is not None:
                p = pyinstrument.Profiler(interval=0.001)
                p.start()
                simulate(trace, make_router(policy), cluster, seed=0, progress=False)
                p.stop()
                _write(out_dir / f"{tag}{policy}_{replicas}r_pyinstrument.txt",
                       p.output_text(unicode=False, color=False, show_all=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
