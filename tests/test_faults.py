"""Fault injection (issue 17): every bad input or fault of the reliability pass, replayed.

Each case asserts the exit status, exactly one line on stderr with no traceback, and that no file
that existed before the command changed. Disk-full and read-only cases use real small tmpfs mounts
(root only; skipped elsewhere); killed runs are real processes killed at the chosen point.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from btb_core.cli import main
from btb_core.errors import ConfigError, TraceError
from btb_core.paths import DATA_DIR

MOONCAKE = DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl"
AZURE = DATA_DIR / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
BTB = [sys.executable, "-m", "btb_core.cli"]


# ------------------------------------------------------------------ helpers
def snapshot(root: Path) -> dict:
    """Every file under ``root``: relative path -> (sha256, size, mtime_ns)."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(root).as_posix()] = (hashlib.sha256(p.read_bytes()).hexdigest(),
                                                   p.stat().st_size, p.stat().st_mtime_ns)
    return out


def assert_unchanged(before: dict, root: Path) -> None:
    after = snapshot(root)
    changed = [k for k, v in before.items() if after.get(k) != v]
    assert not changed, f"pre-existing files changed or vanished: {changed[:5]}"


def cli(capsys, *argv):
    """Run ``btb ARGV`` in-process; returns (exit code, stdout, stderr lines)."""
    code = main([str(a) if not isinstance(a, bytes) else os.fsdecode(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def one_error(lines, *needles):
    """Exactly one stderr line, an error (no traceback), containing every needle."""
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0] and "error:" in lines[0], lines
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def refused(capsys, root: Path, argv, *needles):
    """The command exits 2 with one error line and changes no file that existed under ``root``."""
    before = snapshot(root)
    code, _, err = cli(capsys, *argv)
    assert code == 2, err
    line = one_error(err, *needles)
    assert_unchanged(before, root)
    return line


def jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mooncake_rows(n=40):
    with open(MOONCAKE) as fh:
        return [json.loads(next(fh)) for _ in range(n)]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """A `btb synth --preset quick` dataset, written once (tests copy it before changing it)."""
    root = tmp_path_factory.mktemp("quick")
    assert main(["synth", "--preset", "quick", "--out", str(root / "ds")]) == 0
    return root / "ds"


def copy_dataset(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def grid_file(path: Path, dataset: Path, out: Path, policies=None, **extra) -> Path:
    spec = {"dataset": str(dataset), "split": "train", "max_windows": 1, "replicas": [2],
            "policies": policies or {"round_robin": {}, "least_load": {}}, "out": str(out), **extra}
    path.write_text(json.dumps(spec))
    return path


def mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                       capture_output=True)
    return r.returncode == 0


@pytest.fixture
def full_fs(tmp_path):
    """A real 64 KiB tmpfs: writes beyond it fail with ENOSPC."""
    mnt = tmp_path / "full"
    if not mount_tmpfs(mnt, "size=64k"):
        pytest.skip("needs root to mount a small tmpfs")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def ro_fs(tmp_path):
    """A real read-only tmpfs."""
    mnt = tmp_path / "ro"
    if not mount_tmpfs(mnt, "size=1m,ro"):
        pytest.skip("needs root to mount a read-only tmpfs")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


# ------------------------------------------------------------------ data loss
def test_two_synth_runs_into_one_new_out_only_one_succeeds(tmp_path):
    out = tmp_path / "ds"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen([*BTB, "synth", "--preset", "quick", "--seed", str(s), "--out", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
             for s in (1, 2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in results)
    assert codes == [0, 2], results
    err = next(e for c, e in results if c == 2).splitlines()
    one_error(err, "not empty")
    winner = [1, 2][[c for c, _ in results].index(0)]
    man = json.loads((out / "manifest.json").read_text())
    assert man["seed"] == winner  # the dataset that survived is the one whose run succeeded
    from btb_core.trace import load_bursted

    assert len(load_bursted(out, split="test")) == man["counts"]["test"]["rows"]
    assert not list(tmp_path.glob(".ds.*"))  # no temporary folders left


def test_overwrite_refuses_a_directory_btb_did_not_write(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own work\n")
    refused(capsys, tmp_path, ["synth", "--preset", "quick", "--out", mine, "--overwrite"],
            "notes.txt", "refusing to replace")


def test_overwrite_refuses_a_dataset_with_a_foreign_file(quick, tmp_path, capsys):
    ds = copy_dataset(quick, tmp_path / "ds")
    (ds / "results.csv").write_text("a,b\n")
    refused(capsys, tmp_path, ["synth", "--preset", "quick", "--out", ds, "--overwrite"],
            "results.csv")


def test_overwrite_replaces_a_dataset_btb_wrote(quick, tmp_path, capsys):
    ds = copy_dataset(quick, tmp_path / "ds")
    code, _, err = cli(capsys, "synth", "--preset", "quick", "--seed", "3", "--out", ds, "--overwrite")
    assert code == 0 and err == []
    assert json.loads((ds / "manifest.json").read_text())["seed"] == 3


_KILL_BETWEEN_RENAMES = """
import os, sys
from btb_core import fileio
real = os.replace
calls = []
def dying_replace(a, b):
    calls.append((a, b))
    real(a, b)
    if len(calls) == 1 and str(b).endswith("/old"):
        os._exit(9)  # killed between moving the old dataset aside and moving the new one in
fileio.os.replace = dying_replace
from btb_core.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_between_renames_is_recovered_and_temp_folders_cleaned(quick, tmp_path, capsys):
    ds = copy_dataset(quick, tmp_path / "ds")
    before = snapshot(ds)
    r = subprocess.run([sys.executable, "-c", _KILL_BETWEEN_RENAMES, "synth", "--preset", "quick",
                        "--seed", "7", "--out", str(ds), "--overwrite"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 9
    assert not ds.exists()  # the state a kill leaves: old and new only in hidden folders
    assert list(tmp_path.glob(".ds.old-*")) and list(tmp_path.glob(".ds.tmp-*"))
    # the next run restores the old dataset (nothing lost), removes the leftovers, then refuses
    code, _, err = cli(capsys, "synth", "--preset", "quick", "--out", ds)
    assert code == 2
    assert any("restored" in line for line in err) and "not empty" in err[-1]
    assert snapshot(ds) == before
    assert not list(tmp_path.glob(".ds.*"))


def test_killed_run_leaves_no_temp_folder_after_next_run(tmp_path, capsys):
    stale = tmp_path / ".ds.tmp-abc123"
    stale.mkdir()
    (stale / "train.parquet").write_bytes(b"x" * 1000)
    code, _, _ = cli(capsys, "synth", "--preset", "quick", "--out", tmp_path / "ds")
    assert code == 0 and not stale.exists()


# ------------------------------------------------------------------ hangs and blow-ups
def test_cache_aware_on_epoch_scale_clock_and_tiny_interval_finishes(tmp_path, capsys):
    rows = mooncake_rows(60)
    for r in rows:
        r["timestamp"] += 1_700_000_000_000  # epoch milliseconds: arrivals near 1.7e9 s
    trace = jsonl(tmp_path / "epoch.jsonl", rows)
    for policy, params in (("cache_aware", []), ("btb", []),
                           ("cache_aware", ["--router-param", "eviction_interval_s=1e-9"])):
        code, out, err = cli(capsys, "replay", "--trace", trace, "--policy", policy, "--json", *params)
        assert code == 0, err
        assert json.loads(out)["requests"] == 60


def test_next_tick_is_direct_and_matches_stepping():
    from btb_core.routers.cache_aware import next_tick

    for now, step in ((0.0, 120.0), (119.999, 120.0), (120.0, 120.0), (1.7e9, 120.0), (5.0, 0.1),
                      (1.7e9, 1e-9), (3.0, 1.0)):
        t = next_tick(now, step)
        assert t > now
        if now / step < 1e6:  # the old loop, for comparison
            s = step
            while s <= now:
                s += step
            assert t == pytest.approx(s, rel=1e-12)
    assert next_tick(240.0, 120.0) == 360.0


def test_prefix_tree_eviction_matches_a_full_rebuild():
    """The incremental leaf heap evicts exactly what a rebuild of all leaves would (distinct times)."""
    from btb_core.routers.prefix_tree import ApproxPrefixIndex

    rng = np.random.default_rng(0)
    tree = ApproxPrefixIndex(1)
    for step in range(400):
        tokens = tuple(rng.integers(0, 3, size=int(rng.integers(1, 7))))
        ids = tuple(tokens[: i + 1] for i in range(len(tokens)))
        tree.insert(0, ids, len(ids) * 16, 16, now_s=float(step))
        if step % 7 == 0:
            budget = int(rng.integers(0, 12)) * 16
            held = tree.access_times(0)   # the last access through every node
            children = {h: c for h, (_, _, c) in tree.block_table(0).items()}
            size = tree.size_tokens(0)
            expect = []  # reference: repeatedly remove the least recently used leaf
            while size > budget:
                leaf = min((t, h) for h, t in held.items() if children[h] == 0)[1]
                expect.append(leaf)
                del held[leaf]
                size -= 16
                p = leaf[:-1] if len(leaf) > 1 else None
                if p is not None:
                    children[p] -= 1
                del children[leaf]
            before = set(tree.access_times(0))
            assert tree.evict_to(0, budget) == len(expect)
            assert before - set(tree.access_times(0)) == set(expect)


def test_audit_epoch_ms_outlier_does_not_allocate_per_bin(tmp_path, capsys, monkeypatch):
    rows = mooncake_rows(30)
    rows.append({**rows[-1], "timestamp": 1_700_000_000_000})
    trace = jsonl(tmp_path / "outlier.jsonl", rows)
    code, out, err = cli(capsys, "audit", trace, "--json", "--burstiness")
    assert code == 0, err
    burst = json.loads(out)
    one = next(r for r in (burst if isinstance(burst, list) else burst["rows"]) if r["bin_s"] == 1.0)
    assert one["bins"] == 1_700_000_001 and one["zero_bins_frac"] > 0.999999
    # the sparse path gives the dense figures (forced on a small trace)
    from btb_core import audit
    from btb_core.trace import load_mooncake

    tr = load_mooncake(MOONCAKE).rows(0, 500)
    dense = audit.burstiness(tr)
    monkeypatch.setattr(audit, "MAX_DENSE_BINS", 0)
    sparse = audit.burstiness(tr)
    pd.testing.assert_frame_equal(dense, sparse, rtol=1e-9)
    with pytest.raises(ConfigError, match="bins"):
        audit.arrival_rate(tr, 1.0)


# ------------------------------------------------------------------ silent wrong results
def test_replaced_split_file_is_refused(quick, tmp_path, capsys):
    ds = copy_dataset(quick, tmp_path / "ds")
    (ds / "test.parquet").write_bytes((ds / "train.parquet").read_bytes())
    refused(capsys, tmp_path, ["replay", "--dataset", ds, "--max-windows", "1", "--json"],
            "test.parquet", "sha256")


def test_stray_split_file_is_refused(quick, tmp_path, capsys):
    ds = copy_dataset(quick, tmp_path / "ds")
    (ds / "test-extra.parquet").write_bytes((ds / "test.parquet").read_bytes())
    refused(capsys, tmp_path, ["replay", "--dataset", ds, "--max-windows", "1", "--json"],
            "test-extra.parquet", "not listed")


def test_split_column_and_row_count_are_checked(quick, tmp_path):
    from btb_core.manifest import verify_rows

    man = json.loads((quick / "manifest.json").read_text())
    with pytest.raises(TraceError, match="rows, the manifest says"):
        verify_rows(quick, man, quick / "test.parquet", "test", 1, None)
    with pytest.raises(TraceError, match="split 'train'"):
        verify_rows(quick, man, quick / "test.parquet", "test", man["files"]["test"]["rows"],
                    ["test", "train"])


def test_outputs_inside_a_dataset_are_refused(quick, tmp_path, capsys):
    ds = copy_dataset(quick, tmp_path / "ds")
    refused(capsys, tmp_path, ["synth", "--preset", "quick", "--out", ds / "inner"], "inside")
    grid = grid_file(tmp_path / "g.json", ds, ds)
    refused(capsys, tmp_path, ["sweep", "--grid", grid], "Bursted dataset")
    refused(capsys, tmp_path, ["sweep", "--grid", grid, "--out", ds / "results"], "inside")
    trace = jsonl(tmp_path / "t.jsonl", mooncake_rows(20))
    refused(capsys, tmp_path, ["replay", "--trace", trace, "--out", ds / "requests.parquet"], "inside")


@pytest.mark.parametrize("command", [["replay", "--trace", "TRACE"], ["suite", "--shapes", "p32k"],
                                     ["gateway-check", "--burst"]])
def test_negative_seed_is_one_line(command, tmp_path, capsys):
    trace = jsonl(tmp_path / "t.jsonl", mooncake_rows(20))
    argv = [str(trace) if a == "TRACE" else a for a in command]
    refused(capsys, tmp_path, [*argv, "--seed", "-1"], "--seed")


def test_gateway_with_cluster_events_is_one_line(tmp_path, capsys):
    trace = jsonl(tmp_path / "t.jsonl", mooncake_rows(20))
    events = tmp_path / "ev.yaml"
    events.write_text("- {t_s: 5, action: fail, replica: 1}\n")
    refused(capsys, tmp_path, ["replay", "--trace", trace, "--policy", "sglang_gateway",
                               "--events", events], "sglang_gateway")


def test_sweep_grid_change_limit_and_truncated_cells(quick, tmp_path, capsys):
    ds = copy_dataset(quick, tmp_path / "ds")
    out = tmp_path / "sw"
    grid = grid_file(tmp_path / "g.json", ds, out)
    code, stdout, err = cli(capsys, "sweep", "--grid", grid)
    assert code == 0 and stdout.startswith("2 of 2 cells done")
    edited = grid_file(tmp_path / "g2.json", ds, out, policies={"random": {}, "least_load": {}})
    code, stdout, err = cli(capsys, "sweep", "--grid", edited)  # cells of both grids never mix
    assert code == 0 and stdout.startswith("2 of 2 cells done"), err
    assert "round_robin" not in stdout and "random" in stdout
    other_seed = grid_file(tmp_path / "g3.json", ds, out, seed=1)
    refused(capsys, tmp_path, ["sweep", "--grid", other_seed], "another seed")
    refused(capsys, tmp_path, ["sweep", "--grid", grid, "--limit", "-1"], "--limit")
    cell = sorted(out.glob("cell-*.parquet"))[0]
    cell.write_bytes(b"")  # a crash or a full disk left an empty cell file
    code, stdout, err = cli(capsys, "sweep", "--grid", grid)
    assert code == 0 and stdout.startswith("2 of 2 cells done"), err
    assert cell.stat().st_size > 0


def test_times_beyond_float_precision_are_refused(tmp_path, capsys):
    rows = mooncake_rows(3)
    rows[-1]["timestamp"] = 1e19  # ms: 1e16 s, where float64 seconds are 2 s apart
    trace = jsonl(tmp_path / "far.jsonl", rows)
    refused(capsys, tmp_path, ["replay", "--trace", trace, "--policy", "round_robin"], "2^32 s")


def test_cost_api_refuses_bad_counts():
    from btb_core.cost import reference_cost_model

    cm = reference_cost_model()
    for bad in (-1, math.nan, math.inf, True, np.bool_(True), "5"):
        for call in (lambda v: cm.prefill_s(v), lambda v: cm.prefill_s(10, v),
                     lambda v: cm.decode_step_s(v, 100), lambda v: cm.load_s("rdma", v),
                     lambda v: cm.prefill_flops(v)):
            with pytest.raises(ConfigError):
                call(bad)
    with pytest.raises(ConfigError):
        cm.prefill_s(np.array([1.0, -2.0]))
    assert cm.prefill_s(0) == 0 and cm.prefill_s(np.array([1.0, 2.0])).shape == (2,)


def test_booleans_are_not_numbers(tmp_path, capsys):
    rows = mooncake_rows(3)
    rows[1]["hash_ids"] = [rows[1]["hash_ids"][0], True]
    trace = jsonl(tmp_path / "bool.jsonl", rows)
    refused(capsys, tmp_path, ["audit", trace], "line 2", "True")
    from btb_core.sim import ClusterConfig

    with pytest.raises(ConfigError, match="num_replicas"):
        ClusterConfig.from_setup("70b_h100x4", num_replicas=True)
    with pytest.raises(ConfigError, match="num_replicas"):
        ClusterConfig.from_setup("70b_h100x4", num_replicas=10 ** 20)


def test_infinite_router_weight_is_refused(tmp_path, capsys):
    trace = jsonl(tmp_path / "t.jsonl", mooncake_rows(5))
    for param in ("prefix_weight=inf", "queue_weight=1e999", "prefix_weight=nan"):
        refused(capsys, tmp_path, ["replay", "--trace", trace, "--policy", "llm_d",
                                   "--router-param", param], "llm_d")
    refused(capsys, tmp_path, ["replay", "--trace", trace, "--policy", "cache_aware",
                               "--router-param", f"max_tree_size={2 ** 70}"], "64-bit")


# ------------------------------------------------------------------ tracebacks -> one line
@pytest.mark.parametrize("case", ["synth", "replay", "sweep"])
def test_read_only_file_system(case, quick, ro_fs, tmp_path, capsys):
    _os_error_case(case, quick, ro_fs / "out", tmp_path, capsys, "read-only file system")


@pytest.mark.parametrize("case", ["synth", "replay", "sweep"])
def test_disk_full(case, quick, full_fs, tmp_path, capsys):
    fd = os.open(full_fs / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk to the last byte
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    before = snapshot(full_fs)
    _os_error_case(case, quick, full_fs / "out", tmp_path, capsys, "no space left on device")
    assert snapshot(full_fs) == before  # nothing partial left: the disk is no fuller than before


@pytest.mark.parametrize("case", ["synth", "replay", "sweep"])
def test_path_through_a_file(case, quick, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    _os_error_case(case, quick, tmp_path / "afile" / "out", tmp_path, capsys, "is a file")


@pytest.mark.parametrize("case", ["synth", "replay", "sweep"])
def test_name_too_long(case, quick, tmp_path, capsys):
    _os_error_case(case, quick, tmp_path / ("x" * 300), tmp_path, capsys, "file name too long")


def _os_error_case(case, quick, out, root, capsys, needle):
    if case == "synth":
        argv = ["synth", "--preset", "quick", "--out", out]
    elif case == "replay":
        trace = jsonl(root / "t.jsonl", mooncake_rows(5))
        argv = ["replay", "--trace", trace, "--policy", "round_robin",
                "--out", Path(str(out) + ".parquet") if "x" * 300 in str(out) else out / "r.parquet"]
    else:
        argv = ["sweep", "--grid", grid_file(root / "g.json", quick, out)]
    refused(capsys, root, argv, needle)


def test_huge_numbers_and_sizes(tmp_path, capsys):
    rows = mooncake_rows(3)
    rows[1]["input_length"] = 2 ** 70
    trace = jsonl(tmp_path / "big.jsonl", rows)
    refused(capsys, tmp_path, ["audit", trace], "line 2", "64-bit")
    out = tmp_path / "ds"
    refused(capsys, tmp_path, ["synth", "--out", out, "--job-gap-s", "1e300"], "--job-gap-s")
    refused(capsys, tmp_path, ["synth", "--out", out, "--job-size", "200000"], "fit in memory")
    refused(capsys, tmp_path, ["synth", "--out", out, "--jobs", str(2 ** 70)], "--jobs")
    refused(capsys, tmp_path, ["cost", "--tokens", str(10 ** 23)], "2^40")
    ok = jsonl(tmp_path / "ok.jsonl", mooncake_rows(3))
    refused(capsys, tmp_path, ["replay", "--trace", ok, "--replicas", str(10 ** 8)], "--replicas")
    assert not out.exists()


def test_mixed_timezone_azure_row(tmp_path, capsys):
    lines = AZURE.read_text().splitlines()[:4]
    lines.append(lines[-1].split(",")[0] + "+02:00," + ",".join(lines[-1].split(",")[1:]))
    bad = tmp_path / "tz.csv"
    bad.write_text("\n".join(lines) + "\n")
    refused(capsys, tmp_path, ["audit", bad], "line 5", "time-zone offset")


def test_non_utf8_file_names(tmp_path, capsys):
    name = os.fsdecode(b"\xfftrace.jsonl")
    jsonl(tmp_path / name, mooncake_rows(20))
    code, out, err = cli(capsys, "audit", tmp_path / name)
    assert code == 0 and err == [] and "\\xfftrace" in out
    refused(capsys, tmp_path, ["audit", tmp_path / os.fsdecode(b"\xffmissing.jsonl")],
            "\\xffmissing.jsonl", "no such file")


def test_scheduler_address_malformed_and_unreachable(quick, tmp_path, capsys):
    grid = grid_file(tmp_path / "g.json", quick, tmp_path / "sw")
    refused(capsys, tmp_path, ["sweep", "--grid", grid, "--scheduler-address", "bogus"],
            "tcp://HOST:PORT")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused(capsys, tmp_path, ["sweep", "--grid", grid, "--scheduler-address",
                               f"tcp://127.0.0.1:{port}"], "cannot connect")


def test_bad_value_in_a_dask_grid_is_one_line(quick, tmp_path, capsys):
    grid = grid_file(tmp_path / "g.json", quick, tmp_path / "sw",
                     policies={"btb": {"x_repeats": ["abc"]}})
    refused(capsys, tmp_path, ["sweep", "--grid", grid, "--executor", "dask"], "x_repeats")
    assert not (tmp_path / "sw").exists()


def test_missing_local_file_is_no_such_file(tmp_path, capsys):
    for missing in ("owner/trace.jsonl", tmp_path / "nope.parquet", "data/nope.csv"):
        refused(capsys, tmp_path, ["audit", missing], "no such file")
    refused(capsys, tmp_path, ["synth", "--out", tmp_path / "o", "--base", "someone/base.jsonl"],
            "no such file")


# ------------------------------------------------------------------ leaks
def _children(pid: int) -> set[int]:
    kids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.add(int(stat.parent.name))
    return kids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_killing_a_process_pool_sweep_leaves_no_workers(quick, tmp_path):
    grid = grid_file(tmp_path / "g.json", quick, tmp_path / "sw", max_windows=None,
                     policies={"cache_aware": {}, "least_load": {}, "round_robin": {}, "random": {}},
                     replicas=[2, 3, 4])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    err_path = tmp_path / "sweep.stderr"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([*BTB, "sweep", "--grid", str(grid), "--executor", "processes",
                                 "--workers", "2"], stdout=subprocess.DEVNULL, stderr=err, env=env)
    workers: set[int] = set()
    deadline = time.monotonic() + 120
    while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
        workers = _children(proc.pid)
    if len(workers) < 2:
        status = proc.poll()
        if status is None:          # still running past the deadline: leave nothing behind
            for w in _children(proc.pid):
                os.kill(w, signal.SIGKILL)
            proc.kill()
            proc.wait()
        pytest.fail(f"the pool never started (sweep exit status {status}); its stderr:\n"
                    f"{err_path.read_text(errors='replace')[-3000:]}")
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{w}").exists() and
                                              "Z" not in _state(w) for w in workers):
        time.sleep(0.2)
    alive = [w for w in workers if Path(f"/proc/{w}").exists() and "Z" not in _state(w)]
    for w in alive:  # clean up before failing
        os.kill(w, signal.SIGKILL)
    assert not alive, f"workers still running after the parent was killed: {alive}"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
