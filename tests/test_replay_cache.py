"""The run's replay cache (btb_core.replay_cache): a hit returns what a replay returns, bit for bit;
any input that changes a replay misses it; off unless $BTB_REPLAY_CACHE is set."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from btb_core import experiment, replay_cache
from btb_core.experiment import Cell, run_experiment

BT = 512
PREFIX_BLOCKS = 16
BTB_PARAMS = {"y_tokens": PREFIX_BLOCKS * BT}
POLICIES = ("cache_aware", "btb")


def _write_dataset(d, shift_s: float = 0.0):
    """Two windows (normal: 8 unrelated prompts; synthetic: 16 requests sharing a 16-block prefix
    within 3 s); ``shift_s`` moves the burst's last arrival (same ids, other content)."""
    rng = np.random.default_rng(1)
    rows = []
    for i, t in enumerate(np.sort(rng.uniform(0, 10, 8))):
        rows.append({"arrival_s": float(t), "input_length": 2000, "output_length": 20,
                     "hash_ids": [f"n{i}-{b}" for b in range(4)], "source": "base",
                     "trace_id": "w0-normal", "split": "test",
                     "metadata": json.dumps({"window_kind": "normal"})})
    burst = np.sort(rng.uniform(0, 3, 16))
    burst[-1] += shift_s
    for i, t in enumerate(burst):
        rows.append({"arrival_s": 0.5 + float(t), "input_length": PREFIX_BLOCKS * BT + 200,
                     "output_length": 1, "hash_ids": [f"p{b}" for b in range(PREFIX_BLOCKS)] + [f"s{i}"],
                     "source": "synthetic", "trace_id": "w1-synthetic", "split": "test",
                     "metadata": json.dumps({"window_kind": "synthetic"})})
    df = pd.DataFrame(rows)
    df.insert(0, "request_id", np.arange(len(df)))
    d.mkdir(parents=True, exist_ok=True)
    df.to_parquet(d / "test.parquet", index=False)
    (d / "manifest.json").write_text(json.dumps({"block_tokens": BT}))
    return d


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return _write_dataset(tmp_path_factory.mktemp("cached") / "ds")


def _run(dataset, **kw):
    args = dict(policies=POLICIES, setups=("70b_h100x4",), schedulers=("prefill_first", "chunked"),
                router_params={"btb": BTB_PARAMS}, progress=False, workers=1)
    args.update(kw)
    return run_experiment(dataset, "test", **args)


class _Counting:
    """Wraps experiment.run_cell to count the replays actually run."""

    def __init__(self):
        self.calls = 0
        self._run = experiment.run_cell

    def __call__(self, *a, **kw):
        self.calls += 1
        return self._run(*a, **kw)


def _same(a, b):
    pd.testing.assert_frame_equal(a.results, b.results, check_exact=True)
    pd.testing.assert_frame_equal(a.windows, b.windows, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)


def test_off_unless_the_variable_is_set(dataset, tmp_path, monkeypatch):
    monkeypatch.delenv(replay_cache.ENV, raising=False)
    assert replay_cache.cache_dir() is None
    count = _Counting()
    monkeypatch.setattr(experiment, "run_cell", count)
    _run(dataset)
    _run(dataset)
    assert count.calls == 2 * 2 * len(POLICIES) * 2   # every cell replayed both times


@pytest.mark.parametrize("workers", [1, 2])
def test_a_hit_returns_exactly_the_replay(dataset, tmp_path, monkeypatch, workers):
    monkeypatch.delenv(replay_cache.ENV, raising=False)
    uncached = _run(dataset)
    monkeypatch.setenv(replay_cache.ENV, str(tmp_path / "cache"))
    first = _run(dataset, workers=workers)          # fills the cache (in the pool's parent for 2)
    assert len(list((tmp_path / "cache").rglob("*.pkl"))) == 8
    count = _Counting()
    monkeypatch.setattr(experiment, "run_cell", count)
    second = _run(dataset)
    assert count.calls == 0                          # nothing replayed: every cell a hit
    _same(first, uncached)
    _same(second, uncached)
    # the cached frames are not the caller's: adding columns to one result leaves the cache as is
    third = _run(dataset)
    _same(third, uncached)


def test_a_partly_cached_replay_runs_only_the_new_cells(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv(replay_cache.ENV, str(tmp_path / "cache"))
    _run(dataset, policies=("cache_aware",))
    count = _Counting()
    monkeypatch.setattr(experiment, "run_cell", count)
    both = _run(dataset)
    assert count.calls == 2 * 2                      # btb on 2 windows x 2 schedulers
    monkeypatch.delenv(replay_cache.ENV)
    _same(both, _run(dataset))


CHANGES = {
    "policy parameter": dict(router_params={"btb": {**BTB_PARAMS, "x_repeats": 3}}),
    "seed": dict(seed=1),
    "replicas": dict(replicas=3),
    "cost model": dict(attention=False),
    "setup": dict(setups=("qwen3_8b_h100x4",)),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_input_misses(dataset, tmp_path, monkeypatch, change):
    monkeypatch.setenv(replay_cache.ENV, str(tmp_path / "cache"))
    _run(dataset)
    count = _Counting()
    monkeypatch.setattr(experiment, "run_cell", count)
    kw = CHANGES[change]
    changed = _run(dataset, **kw)
    changed_policies = 1 if change == "policy parameter" else len(POLICIES)
    assert count.calls == changed_policies * 2 * 2   # every changed cell replayed
    monkeypatch.delenv(replay_cache.ENV)
    _same(changed, _run(dataset, **kw))


def test_changed_dataset_content_misses(tmp_path, monkeypatch):
    a = _write_dataset(tmp_path / "a")
    monkeypatch.setenv(replay_cache.ENV, str(tmp_path / "cache"))
    _run(a)
    b = _write_dataset(tmp_path / "b", shift_s=0.25)   # same window ids, one arrival moved
    count = _Counting()
    monkeypatch.setattr(experiment, "run_cell", count)
    _run(b)
    assert count.calls == 8
    # the same content at another path is the same dataset: hits
    c = _write_dataset(tmp_path / "c")
    count.calls = 0
    _run(c)
    assert count.calls == 0


def test_changed_code_misses(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv(replay_cache.ENV, str(tmp_path / "cache"))
    _run(dataset)
    monkeypatch.setattr(replay_cache, "code_digest", lambda: "another version of btb_core")
    count = _Counting()
    monkeypatch.setattr(experiment, "run_cell", count)
    _run(dataset)
    assert count.calls == 8


def test_every_cell_field_that_changes_a_replay_is_in_the_key():
    cell = Cell("70b_h100x4", "chunked", "btb", "w1", 4, (("x_repeats", 2),), 0, "", True)
    other = {"setup": "qwen3_8b_h100x4", "scheduler": "prefill_first", "policy": "cache_aware",
             "window": "w2", "replicas": 8, "params": (("x_repeats", 3),), "seed": 1, "attention": False}
    key = replay_cache.cell_key(cell, "test", "d" * 64)
    for f in dataclasses.fields(Cell):
        if f.name == "label":       # a display name: run_cell never reads it
            continue
        changed = dataclasses.replace(cell, **{f.name: other[f.name]})
        assert replay_cache.cell_key(changed, "test", "d" * 64) != key, f.name
    assert replay_cache.cell_key(cell, "train", "d" * 64) != key
    assert replay_cache.cell_key(cell, "test", "e" * 64) != key
    assert replay_cache.cell_key(cell, "test", "d" * 64, with_requests=False) != key


def test_a_corrupt_entry_is_a_miss(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv(replay_cache.ENV, str(tmp_path / "cache"))
    reference = _run(dataset)
    for entry in (tmp_path / "cache").rglob("*.pkl"):
        entry.write_bytes(b"not a pickle")
    count = _Counting()
    monkeypatch.setattr(experiment, "run_cell", count)
    again = _run(dataset)
    assert count.calls == 8
    _same(again, reference)


def test_code_digest_covers_the_package_sources():
    d = replay_cache.code_digest()
    assert len(d) == 64 and d == replay_cache.code_digest()


def test_parallel_runner_prefixes_every_line(capsys):
    """Notebooks run side by side (`make reproduce --jobs 2`): every line of a notebook's output,
    progress-bar redraws (carriage returns) included, starts with its number."""
    import io

    from btb_core.notebooks import _pump

    raw = io.BufferedReader(io.BytesIO(b"first\nbar  0%\rbar 50%\rbar 100%\nlast"))
    _pump(raw, "[04] ")
    assert capsys.readouterr().out == "[04] first\n[04] bar  0%\r[04] bar 50%\r[04] bar 100%\n[04] last"


def test_parallel_runner_never_runs_two_notebooks_lines_together():
    import io

    from btb_core.notebooks import _Console, _pump

    out = io.StringIO()
    console = _Console(out)
    _pump(io.BufferedReader(io.BytesIO(b"bar 10%\rbar 20%")), "[04] ", console)   # no line end
    _pump(io.BufferedReader(io.BytesIO(b"done\n")), "[03] ", console)
    console.say("[btb] (4/8) 03 done")
    assert out.getvalue() == "[04] bar 10%\r[04] bar 20%\n[03] done\n[btb] (4/8) 03 done\n"


def test_experiments_are_counted_for_the_notebook_runner(tmp_path, monkeypatch, dataset):
    # run_experiment records each finished experiment of the notebook named by $BTB_NOTEBOOK, so
    # the runner can start a notebook reusing its cells before the notebook itself ends
    from btb_core.notebooks import REUSES, reuses_met

    cache = tmp_path / "cache"
    monkeypatch.setenv(replay_cache.ENV, str(cache))
    monkeypatch.setenv(replay_cache.NOTEBOOK_ENV, "04_btb_replay")
    waits = REUSES["06_beyond_the_rule"]
    assert waits == (("04_btb_replay", 1),)
    assert not reuses_met(waits, set(), {"04_btb_replay"}, cache)
    assert replay_cache.experiments_done(cache, "04_btb_replay") == 0
    experiment.run_experiment(dataset, policies=("least_load",), progress=False, workers=1)
    assert replay_cache.experiments_done(cache, "04_btb_replay") == 1
    assert reuses_met(waits, set(), {"04_btb_replay"}, cache)
    assert not reuses_met((("04_btb_replay", 2),), set(), {"04_btb_replay"}, cache)
    experiment.run_experiment(dataset, policies=("least_load",), progress=False, workers=1)  # all hits
    assert replay_cache.experiments_done(cache, "04_btb_replay") == 2
    # a notebook not started yet (a count left from elsewhere does not count), or no cache:
    # only its end releases the waiting one
    assert not reuses_met(waits, set(), set(), cache)
    assert not reuses_met(waits, set(), {"04_btb_replay"}, None)
    assert reuses_met(waits, {"04_btb_replay"}, {"04_btb_replay"}, None)
    # no notebook named, or the cache off: nothing is written
    monkeypatch.delenv(replay_cache.NOTEBOOK_ENV)
    experiment.run_experiment(dataset, policies=("least_load",), progress=False, workers=1)
    assert replay_cache.experiments_done(cache, "04_btb_replay") == 2
    assert sorted(p.name for p in (cache / "progress").iterdir()) == ["04_btb_replay"]
