"""The Bursted generator: counts, whole-window splits, burst/decoy structure, determinism, errors."""

import filecmp
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btb_core import synth
from btb_core.audit import fanout
from btb_core.errors import ConfigError, TraceError
from btb_core.synth import PRESETS, SynthConfig, generate
from btb_core.trace import load_bursted, load_mooncake, load_trace, make_trace


def small_base(n=400, block_tokens=512, seed=0):
    """A chained toy trace: every row starts with shared block 0, then 1-4 private blocks."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.integers(0, 700, size=n)) / 1000.0
    blocks = rng.integers(2, 6, size=n)
    ids, nxt = [], 1
    for b in blocks:
        ids.append([0, *range(nxt, nxt + b - 1)])
        nxt += b - 1
    inp = blocks * block_tokens - 100
    return make_trace(t, inp, np.full(n, 7), ids, block_tokens=block_tokens, name="toy")


TOY = SynthConfig(train_windows=2, test_windows=4, normal_rows=50, jobs=3, job_size=20,
                  decoys=5, prefix_tokens=4096, suffix_tokens=256)


def gen(config=TOY, base=None, seed=0):
    return generate(base or small_base(), config, np.random.default_rng(seed), seed=seed)


def meta(df):
    return df["metadata"].map(json.loads)


# ---- counts ---------------------------------------------------------------------------------


def test_reference_preset_counts_closed_form():
    ref = PRESETS["reference"]
    assert ref.synthetic_window_rows() == 8 * 500 + 120 == 4_120
    assert ref.expected_counts() == {
        "train": {"windows": 10, "normal_windows": 5, "synthetic_windows": 5, "rows": 25_600},
        "test": {"windows": 30, "normal_windows": 15, "synthetic_windows": 15, "rows": 76_800}}
    assert ref.base_rows_needed() == 20_000


def test_default_preset_on_shipped_mooncake(default_dataset):
    ds = default_dataset
    assert ds.counts() == {
        "train": {"windows": 10, "normal_windows": 5, "synthetic_windows": 5, "rows": 23_600},
        "test": {"windows": 30, "normal_windows": 15, "synthetic_windows": 15, "rows": 70_800}}
    assert ds.block_tokens == 512 and ds.base["rows"] == 12_031
    assert ds.base["path"] == "data/traces/mooncake/conversation_trace.jsonl"
    # every synthetic window reaches the job size at 65,536 tokens in 60 s; normal ones stay low
    te = ds.to_trace("test")
    fans = {g.name.split("/")[-1]: fanout(g, 65_536, 60.0).max_fanout for g in te.groups()}
    assert {v for k, v in fans.items() if k.endswith("synthetic")} == {500}
    assert max(v for k, v in fans.items() if k.endswith("normal")) <= 2


def test_exact_counts_and_window_sizes():
    ds = gen()
    assert ds.counts() == TOY.expected_counts()
    assert ds.counts()["train"] == {"windows": 2, "normal_windows": 1, "synthetic_windows": 1,
                                    "rows": 50 + 65}
    assert ds.counts()["test"]["rows"] == 2 * 50 + 2 * (3 * 20 + 5)
    sizes = ds.windows.set_index("trace_id")["rows"]
    for tid, rows in sizes.items():
        assert rows == (50 if tid.endswith("normal") else 65)


def test_odd_window_counts_round_half_up():
    c = SynthConfig(train_windows=3, test_windows=1, synthetic_fraction=0.5)
    assert (c.synthetic_windows("train"), c.normal_windows("train")) == (2, 1)
    assert (c.synthetic_windows("test"), c.normal_windows("test")) == (1, 0)


# ---- splits and layout ----------------------------------------------------------------------


def test_no_window_in_both_splits_and_rows_sorted():
    ds = gen()
    tr, te = ds.splits["train"], ds.splits["test"]
    assert set(tr["trace_id"]).isdisjoint(te["trace_id"])
    assert set(tr["split"]) == {"train"} and set(te["split"]) == {"test"}
    assert not set(tr["request_id"]) & set(te["request_id"])
    for df in (tr, te):
        assert list(df.columns) == list(synth.COLUMNS)
        keys = list(zip(df["trace_id"], df["arrival_s"]))
        assert keys == sorted(keys)
        # each window starts at 0 s (normal) or holds only generated rows (synthetic)
        for tid, g in df.groupby("trace_id"):
            if tid.endswith("normal"):
                assert g["arrival_s"].iloc[0] == 0.0


def test_normal_windows_are_disjoint_consecutive_base_rows():
    base = small_base()
    ds = gen(base=base)
    used = []
    for df in ds.splits.values():
        for tid, g in df.groupby("trace_id", sort=False):
            if not tid.endswith("normal"):
                continue
            rows = meta(g).map(lambda m: m["base_row"]).to_numpy()
            assert np.array_equal(rows, np.arange(rows[0], rows[0] + 50))
            expect = base.arrival_s[rows] - base.arrival_s[rows[0]]
            assert np.allclose(g["arrival_s"].to_numpy(), expect, atol=1e-6)
            assert g["input_length"].tolist() == base.input_length[rows].tolist()
            used.extend(rows.tolist())
    assert len(used) == len(set(used)) == 3 * 50


def test_split_assignment_depends_on_seed_only():
    a, b, c = gen(seed=1), gen(seed=1), gen(seed=2)
    assert a.windows.equals(b.windows)
    assert not a.windows.equals(c.windows)


# ---- burst and decoy structure --------------------------------------------------------------


def test_burst_rows_share_exactly_the_prefix_blocks():
    base = small_base()
    ds = gen(base=base)
    p_blocks = 4096 // 512
    base_ids = set(base.hash_flat.tolist())
    df = pd.concat(ds.splits.values())
    jobs = df[df["group_id"].fillna("").str.contains("/job")]
    assert len(jobs) == 3 * 20 * 3  # 3 synthetic windows
    seen_prefixes, seen_suffix = set(), set()
    for gid, g in jobs.groupby("group_id"):
        ids = np.stack(g["hash_ids"].to_list())
        assert ids.shape == (20, p_blocks + 1)  # 256-token suffix = one partial block
        assert (ids[:, :p_blocks] == ids[0, :p_blocks]).all()  # shared prefix
        assert len(set(ids[:, p_blocks])) == 20  # differ right after it
        assert seen_prefixes.isdisjoint(ids[0, :p_blocks].tolist())
        seen_prefixes.update(ids[0, :p_blocks].tolist())
        assert seen_suffix.isdisjoint(ids[:, p_blocks].tolist())
        seen_suffix.update(ids[:, p_blocks].tolist())
        assert base_ids.isdisjoint(ids.ravel().tolist())
        assert set(g["input_length"]) == {4096 + 256} and set(g["output_length"]) == {1}
    assert min(seen_prefixes) == ds.base["synthetic_first_id"] == int(base.hash_flat.max()) + 1


def test_job_timing_start_gap_jitter_span():
    ds = gen()
    df = pd.concat(ds.splits.values())
    jobs = df[df["group_id"].fillna("").str.contains("/job")]
    for gid, g in jobs.groupby("group_id"):
        m = json.loads(g["metadata"].iloc[0])
        k, start = m["job_index"], m["job_start_s"]
        assert 20 + 40 * k <= start <= 20 + 40 * k + 2
        assert g["arrival_s"].min() >= start and g["arrival_s"].max() < start + 60
        assert m["job_kind"] == synth.JOB_KINDS[k % 3] and m["job_size"] == 20


def test_single_request_decoys_by_default():
    ds = gen()
    df = pd.concat(ds.splits.values())
    decoys = df[df["group_id"].fillna("").str.contains("/decoy")]
    assert len(decoys) == 5 * 3 and decoys["group_id"].nunique() == 15
    firsts = {int(h[7]) for h in decoys["hash_ids"]}  # depth-8 (4,096-token) prefix ids
    assert len(firsts) == 15  # no decoy shares its prefix with anyone
    assert (decoys["arrival_s"] < TOY.horizon_s()).all()


def test_repeated_decoys_within_span():
    cfg = SynthConfig(**{**TOY.__dict__, "decoy_requests": 3, "decoy_span_s": 1.0})
    ds = gen(cfg)
    df = pd.concat(ds.splits.values())
    decoys = df[df["group_id"].fillna("").str.contains("/decoy")]
    assert len(decoys) == 3 * 5 * 3
    for gid, g in decoys.groupby("group_id"):
        assert len(g) == 3
        assert g["arrival_s"].max() - g["arrival_s"].min() < 1.0
        ids = np.stack(g["hash_ids"].to_list())
        assert (ids[:, :8] == ids[0, :8]).all() and len(set(ids[:, 8])) == 3
        assert json.loads(g["metadata"].iloc[0])["job_size"] == 3
    # a repeated decoy reaches 3 at its prefix depth, the jobs still reach 20
    te = ds.to_trace("test")
    for g in te.groups():
        if g.name.endswith("synthetic"):
            assert fanout(g, 4096, 60.0).max_fanout == 20
            assert fanout(g, 4096, 1.0).max_fanout >= 3


def test_background_rows_in_synthetic_windows():
    cfg = SynthConfig(**{**TOY.__dict__, "background_rows": 30})
    ds = gen(cfg)
    assert ds.counts()["test"]["rows"] == 2 * 50 + 2 * (3 * 20 + 5 + 30)
    for df in ds.splits.values():
        for tid, g in df.groupby("trace_id"):
            kinds = synth.row_kinds(g).value_counts().to_dict()
            if tid.endswith("synthetic"):
                assert kinds == {"job": 60, "decoy": 5, "background": 30}
            else:
                assert kinds == {"base": 50}


def test_block_size_follows_the_base():
    base = small_base(block_tokens=256)
    cfg = SynthConfig(train_windows=1, test_windows=1, synthetic_fraction=1.0, jobs=1, job_size=4,
                      decoys=0)
    ds = gen(cfg, base=base)
    assert ds.block_tokens == 256
    row = ds.splits["train"].iloc[0]
    assert row["input_length"] == 65_792 and len(row["hash_ids"]) == 256 + 1


# ---- property: invariants over random small configs ----------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(train=st.integers(1, 3), test=st.integers(1, 3), frac=st.sampled_from([0.0, 0.5, 1.0]),
       normal_rows=st.integers(1, 20), jobs=st.integers(0, 3), job_size=st.integers(1, 5),
       decoys=st.integers(0, 3), decoy_requests=st.integers(1, 3), background=st.integers(0, 5),
       seed=st.integers(0, 2**32 - 1))
def test_property_counts_splits_chaining(train, test, frac, normal_rows, jobs, job_size, decoys,
                                         decoy_requests, background, seed):
    if jobs == 0 and decoys == 0 and background == 0:
        background = 1
    cfg = SynthConfig(train_windows=train, test_windows=test, synthetic_fraction=frac,
                      normal_rows=normal_rows, jobs=jobs, job_size=job_size, decoys=decoys,
                      decoy_requests=decoy_requests, background_rows=background,
                      prefix_tokens=1024, suffix_tokens=100)
    ds = generate(BASE_200, cfg, np.random.default_rng(seed))
    assert ds.counts() == cfg.expected_counts()
    assert set(ds.splits["train"]["trace_id"]).isdisjoint(ds.splits["test"]["trace_id"])
    for s in synth.SPLITS:
        tr = ds.to_trace(s)  # strict: sorted within windows, ids chained, block counts right
        assert len(tr) == cfg.rows(s)
        assert (tr.arrival_s >= 0).all()


BASE_200 = small_base(200)


# ---- writing, loading, determinism ----------------------------------------------------------


def test_write_load_roundtrip(tmp_path, monkeypatch):
    ds = gen()
    out = synth.write(ds, tmp_path / "bd")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "manifest.json", "test.parquet",
                                                     "train.parquet"]
    man = json.loads((out / "manifest.json").read_text())
    assert man["block_tokens"] == 512 and man["seed"] == 0
    assert man["counts"] == TOY.expected_counts()
    assert man["parameters"]["job_size"] == 20 and len(man["windows"]) == 6
    assert man["files"]["train"]["sha256"] == synth.file_sha256(out / "train.parquet")
    assert man["base"]["table_sha256"] == synth.trace_sha256(small_base())
    # btb_core loaders
    tr = load_bursted(out, split="test")
    assert len(tr) == TOY.rows("test") and tr.group_column == "trace_id"
    assert len(tr.groups()) == 4
    both = load_trace(out)
    assert len(both) == TOY.rows("train") + TOY.rows("test") and both.block_tokens == 512
    # Hugging Face datasets, offline
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    dd = datasets.load_dataset("parquet", data_files={s: str(out / f"{s}.parquet")
                                                      for s in synth.SPLITS},
                               cache_dir=str(tmp_path / "hf"))
    assert dd["train"].num_rows == TOY.rows("train")
    assert dd["test"].column_names == list(synth.COLUMNS)
    first = dd["train"][0]
    assert first["hash_ids"] == ds.splits["train"]["hash_ids"].iloc[0].tolist()
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlicense: other") and "| train | 2 | 1 | 1 | 115 |" in card


def test_same_seed_byte_identical_files(tmp_path):
    a = synth.write(gen(seed=3), tmp_path / "a")
    b = synth.write(gen(seed=3), tmp_path / "b")
    c = synth.write(gen(seed=4), tmp_path / "c")
    names = ["train.parquet", "test.parquet", "manifest.json", "README.md"]
    assert all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)
    assert not filecmp.cmp(a / "test.parquet", c / "test.parquet", shallow=False)
    import pyarrow.parquet as pq

    md = pq.read_metadata(a / "train.parquet").metadata
    assert set(md) == {b"ARROW:schema", b"huggingface", b"content_defined_chunking"}


def test_refuses_non_empty_dir_and_overwrites(tmp_path):
    out = tmp_path / "bd"
    out.mkdir()
    synth.write(gen(), out)  # empty dir is fine
    with pytest.raises(ConfigError, match="not empty; pass --overwrite"):
        synth.write(gen(seed=1), out)
    (out / "stale.txt").write_text("x")  # a file btb did not write: never deleted (issue 17)
    with pytest.raises(ConfigError, match="'stale.txt', which is not part of the dataset"):
        synth.write(gen(seed=1), out, overwrite=True)
    assert (out / "stale.txt").read_text() == "x"
    (out / "stale.txt").unlink()
    synth.write(gen(seed=1), out, overwrite=True)
    assert json.loads((out / "manifest.json").read_text())["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bd"]  # no temp dirs left


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(synth.writer, "dataset_card", boom)
    with pytest.raises(KeyboardInterrupt):
        synth.write(gen(), tmp_path / "bd")
    assert list(tmp_path.iterdir()) == []


def test_push_to_hub_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="cannot push while offline .HF_HUB_OFFLINE is set.; "
                                          "the dataset is complete locally"):
        synth.push_to_hub(tmp_path, "me/bursted")
    with pytest.raises(ConfigError, match="owner/name"):
        synth.push_to_hub(tmp_path, "bursted")


# ---- errors ---------------------------------------------------------------------------------


def test_too_short_base_says_what_fits():
    base = small_base(100)
    cfg = SynthConfig(train_windows=2, test_windows=2, normal_rows=60, jobs=1, job_size=2,
                      decoys=0, prefix_tokens=1024)
    with pytest.raises(TraceError) as e:
        gen(cfg, base=base)
    msg = str(e.value)
    assert "toy: base trace too short: 100 rows, but 2 normal windows x 60 rows need 120" in msg
    assert "normal_rows <= 50 (--normal-rows 50)" in msg and "at most 1 normal windows" in msg


def test_reference_preset_on_mooncake_is_too_short():
    base = load_mooncake(synth.DEFAULT_BASE)
    with pytest.raises(TraceError, match=r"12,031 rows, but 20 normal windows x 1,000 rows need "
                                          r"20,000\. What fits: normal_rows <= 601"):
        generate(base, PRESETS["reference"], np.random.default_rng(0))


def test_prefix_must_be_a_multiple_of_the_block():
    with pytest.raises(ConfigError, match="prefix_tokens = 1000: must be a multiple of the base "
                                          "trace's block size 512 tokens .e.g. 512 or 1024."):
        gen(SynthConfig(**{**TOY.__dict__, "prefix_tokens": 1000}))


@pytest.mark.parametrize("field,value,match", [
    ("jobs", -1, "SynthConfig.jobs = -1: must be an integer >= 0"),
    ("job_size", 0, "SynthConfig.job_size = 0: must be an integer >= 1"),
    ("span_s", 0.0, "SynthConfig.span_s = 0.0: must be a finite number of seconds > 0"),
    ("jitter_s", float("nan"), "SynthConfig.jitter_s = nan"),
    ("synthetic_fraction", 1.5, r"synthetic_fraction = 1.5: must be in \[0, 1\]"),
    ("suffix_tokens", 0, "SynthConfig.suffix_tokens = 0"),
    ("job_kinds", ("a", ""), "job_kinds"),
])
def test_config_validation_names_field_and_value(field, value, match):
    with pytest.raises(ConfigError, match=match):
        SynthConfig(**{field: value})


def test_bad_bases_and_rng():
    no_prefix = make_trace([0.0, 1.0], [10, 10], [1, 1], None, block_tokens=512, name="az")
    with pytest.raises(TraceError, match="az: the Bursted generator needs prefix hash ids"):
        gen(base=no_prefix)
    with pytest.raises(ConfigError, match="numpy.random.Generator"):
        generate(small_base(), TOY, 0)
    with pytest.raises(ConfigError, match="unknown"):
        synth.preset("nope")
    with pytest.raises(ConfigError, match="no field 'jobz'"):
        synth.preset("quick", jobz=3)


def test_bursted_dataset_as_base_is_refused(tmp_path):
    out = synth.write(gen(), tmp_path / "bd")
    with pytest.raises(TraceError, match="is a Bursted dataset; the base must be an ordinary"):
        synth.load_base(out)
    grouped = load_bursted(out, split="test")
    with pytest.raises(TraceError, match="holds several windows"):
        gen(base=grouped)


def test_arrivals_per_second_table():
    ds = gen()
    df = ds.splits["test"]
    tid = df["trace_id"].iloc[-1]
    per = synth.arrivals_per_second(df, [tid])
    assert per["requests"].sum() == (df["trace_id"] == tid).sum()
    assert set(per.columns) == {"trace_id", "second", "row_kind", "requests"}
    with pytest.raises(ConfigError, match="not in the table"):
        synth.arrivals_per_second(df, ["w999-normal"])



def test_group_summary_of_jobs_and_repeated_decoys():
    cfg = SynthConfig(**{**TOY.__dict__, "decoy_requests": 3})
    ds = gen(cfg)
    summ = synth.group_summary(ds.splits["train"], 512)
    jobs = summ[summ["row_kind"] == "job"]
    decoys = summ[summ["row_kind"] == "decoy"]
    assert len(jobs) == 3 and set(jobs["requests"]) == {20}
    assert set(jobs["shared_prefix_tokens"]) == {4096} and (jobs["span_s"] < 60).all()
    assert len(decoys) == 5 and set(decoys["requests"]) == {3}
    assert set(decoys["shared_prefix_tokens"]) == {4096} and (decoys["span_s"] < 1).all()


def test_ensure_dataset_card_names_its_preset_and_overrides(tmp_path):
    # the notebooks' cached datasets are built from a preset with overrides: the card names the
    # preset and gives the flags that rebuild it (it said "Preset: custom" and "--preset default")
    from btb_core.experiment import ensure_dataset

    out = ensure_dataset("quick", seed=2, out_dir=tmp_path / "q", test_windows=3)
    man = json.loads((out / "manifest.json").read_text())
    assert man["preset"] == "quick" and man["parameters"]["test_windows"] == 3
    card = (out / "README.md").read_text()
    assert "Preset: quick." in card
    assert "btb synth --preset quick --seed 2 --test-windows 3" in card
