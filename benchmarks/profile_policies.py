"""Where ``cache_aware`` and ``btb`` spend their time at 4 vs 64 replicas (issue 14).

Replays the Bursted-shaped trace of ``btb_core.bursted_shaped`` (``--windows``, default 2 = 5,120 rows)
with each policy on 4 and 64 replicas (Llama-3.3-70B on 4x H100, ``prefill_first``) under cProfile
and writes the top functions (by own time and by cumulative time, with call counts) to
``benchmarks/profiles/<policy>_<replicas>r_cprofile.txt``. If ``pyinstrument`` is importable
(``pip install pyinstrument``; optional, not a project dependency) it also writes its call-tree text
to ``..._pyinstrument.txt``. Call counts are exact; times are noisy on a shared machine.

Run: ``.venv/bin/python benchmarks/profile_policies.py [--windows 2] [--policies cache_aware btb]
[--replicas 4 64]``.
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
    a = ap.parse_args(argv)

    from btb_core.routers import make_router
    from btb_core.sim import ClusterConfig, simulate
    from btb_core.bursted_shaped import bursted_shaped_trace

    try:
        import pyinstrument
    except ImportError:
        pyinstrument = None
        print("pyinstrument not installed: cProfile only")
    out_dir = HERE / "profiles"
    out_dir.mkdir(exist_ok=True)
    trace = bursted_shaped_trace(windows=a.windows)
    for policy in a.policies:
        for replicas in a.replicas:
            cluster = ClusterConfig.from_setup("70b_h100x4", num_replicas=replicas, scheduler="prefill_first")
            prof = cProfile.Profile()
            prof.enable()
            simulate(trace, make_router(policy), cluster, seed=0, progress=False)
            prof.disable()
            buf = io.StringIO()
            buf.write(f"# {policy}, {replicas} replicas, bursted_shaped_trace(windows={a.windows}) "
                      f"= {len(trace):,} rows, prefill_first; cProfile (times inflated by profiling, "
                      f"noisy shared machine; call counts exact)\n\n## by own time (tottime)\n")
            st = pstats.Stats(prof, stream=buf)
            st.strip_dirs().sort_stats("tottime").print_stats(a.top)
            buf.write("\n## by cumulative time\n")
            st.sort_stats("cumulative").print_stats(a.top)
            _write(out_dir / f"{policy}_{replicas}r_cprofile.txt", buf.getvalue())
            if pyinstrument is not None:
                p = pyinstrument.Profiler(interval=0.001)
                p.start()
                simulate(trace, make_router(policy), cluster, seed=0, progress=False)
                p.stop()
                _write(out_dir / f"{policy}_{replicas}r_pyinstrument.txt",
                       p.output_text(unicode=False, color=False, show_all=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
