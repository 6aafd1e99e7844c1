"""run_experiment's table assembly (``_assemble``) against the plain per-cell inserts it replaced."""

import numpy as np
import pandas as pd

from btb_core.experiment import Cell, _assemble


def _outputs():
    rng = np.random.default_rng(3)
    cells, results = [], []
    kinds = {"w0": "synthetic", "w1": "normal", "w2": "normal"}
    for setup in ("70b_h100x4", "qwen3_8b_h100x4"):
        for sched in ("prefill_first", "chunked"):
            for policy in ("cache_aware", "btb"):
                for window, n in (("w0", 5), ("w1", 0), ("w2", 3)):
                    cells.append(Cell(setup, sched, policy, window))
                    req = pd.DataFrame({"request_id": np.arange(n, dtype=np.int64),
                                        "arrival_s": rng.random(n),
                                        "replica": rng.integers(0, 4, n).astype(np.int32),
                                        "reuse_tier": pd.Categorical.from_codes(
                                            rng.integers(0, 4, n), categories=["none", "hbm", "dram", "disk"]),
                                        "ttft_s": rng.random(n)})
                    req["row_kind"] = np.array(["base"] * n, dtype=object)
                    results.append({"metrics": {"requests": n, "ttft_mean_s": float(rng.random())},
                                    "requests": req})
    return cells, results, kinds


def _plain(cells, results, kinds):
    win_rows, frames = [], []
    for cell, out in zip(cells, results):
        kind = kinds[cell.window]
        win_rows.append({"setup": cell.setup, "scheduler": cell.scheduler, "policy": cell.policy,
                         "window": cell.window, "kind": kind, **out["metrics"]})
        r = out["requests"].copy()
        r.insert(0, "kind", kind)
        r.insert(0, "window", cell.window)
        r.insert(0, "policy", cell.policy)
        r.insert(0, "scheduler", cell.scheduler)
        r.insert(0, "setup", cell.setup)
        frames.append(r)
    return pd.DataFrame(win_rows), pd.concat(frames, ignore_index=True)


def test_assemble_matches_plain_inserts():
    cells, results, kinds = _outputs()
    want_w, want_r = _plain(cells, results, kinds)
    got_w, got_r = _assemble(cells, results, kinds)
    pd.testing.assert_frame_equal(got_w, want_w, check_exact=True)
    pd.testing.assert_frame_equal(got_r, want_r, check_exact=True)
