"""The Bursted dataset generator (issue 6; DESIGN.md section 2).

A Bursted dataset is a set of *windows*, each replayed on a fresh cluster, split whole into
``train`` and ``test``:

* **normal** windows: ``normal_rows`` consecutive rows cut from a base trace (default the shipped
  Mooncake conversation trace), arrivals re-based so the window's first row arrives at 0 s;
* **synthetic** windows: ``jobs`` jobs (data labeling, batch scoring, sub-agent fan-out) of
  ``job_size`` requests each. Job ``k`` starts at ``first_job_s + k * job_gap_s + U{0, jitter_s}``
  and spreads its requests uniformly over ``[start, start + span_s)``; every request of a job
  shares the job's ``prefix_tokens``-token prefix and has its own ``suffix_tokens``-token suffix
  and ``output_tokens`` output tokens. Plus ``decoys`` decoy jobs, each ``decoy_requests``
  requests within ``decoy_span_s`` sharing a prefix of their own (single-request decoys by
  default), first arrival uniform over the window, and optionally ``background_rows``
  consecutive base-trace rows (re-based to 0 s).

Hash ids: base rows keep the base trace's chained ids as interned by :mod:`btb_core.trace`
(``0 .. U-1``); synthetic blocks get fresh integers from ``U`` upwards, unique across the whole
dataset, so a synthetic prefix never collides with a base prefix and the chaining rule holds (a
job's requests share exactly their first ``prefix_tokens / block_tokens`` ids and differ after).
Block size follows the base trace (Mooncake 512, ART-Chat 256 tokens).

Times are drawn as integer microseconds, so arrivals are exact and a job's requests all fall in
one half-open ``span_s`` window (the deep-prefix fan-out at the prefix depth is exactly
``job_size``).

The reference build (DESIGN.md section 2) is :data:`PRESETS` ``["reference"]``: 10 train / 30
test windows, 25,600 / 76,800 rows, which needs a base trace of at least 20,000 rows (ART-Chat).
The ``default`` preset is the same with 600-row normal windows, so it fits the 12,031-row Mooncake
conversation trace.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import __version__
from .errors import ConfigError, TraceError
from .fileio import check_replaceable, jsonable, replace_dir, shown_path
from .manifest import enclosing_dataset, foreign_reason
from .paths import DATA_DIR, REPO_ROOT
from .trace import Trace, from_table

#: Version of the row layout and generation procedure; bump when either changes.
GENERATOR_VERSION = 1
#: Job kinds of synthetic windows, assigned round-robin (job ``k`` gets ``job_kinds[k % n]``).
#: The kinds come from DESIGN.md section 1 (data labeling, batch extraction/scoring, sub-agent
#: fan-out); they differ only in their label.
JOB_KINDS = ("data_labeling", "batch_scoring", "subagent_fanout")
#: Split names, in file order.
SPLITS = ("train", "test")
#: Columns of every split file, in order (DESIGN.md section 2 trace table).
COLUMNS = ("request_id", "arrival_s", "input_length", "output_length", "hash_ids", "session_id",
           "group_id", "source", "trace_id", "split", "metadata")
#: ``source`` value of generated (job and decoy) rows; base rows carry the base trace's name.
SYNTH_SOURCE = "bursted-synth"
#: Default base trace: the shipped Mooncake conversation trace (data/traces/mooncake/SOURCE.md).
DEFAULT_BASE = DATA_DIR / "traces" / "mooncake" / "conversation_trace.jsonl"

_US = 1_000_000  # microseconds per second


#: Largest count or token size a config field may hold (keeps every product inside int64).
MAX_FIELD = 2 ** 31 - 1
#: Longest time a config field or a synthetic window's job horizon may span, seconds (115 days;
#: arrivals are integer microseconds).
MAX_WINDOW_S = 1e7
#: Most rows a dataset may have: the generator holds the whole dataset in memory (about 1 KB per
#: row plus 8 bytes per block id); the reference build has 102,400.
MAX_ROWS = 3_000_000
#: Most block ids (rows x blocks per row) a dataset may hold (the reference build ~13 M).
MAX_BLOCK_IDS = 150_000_000


def _check_int(name: str, value: Any, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= MAX_FIELD:
        raise ConfigError(f"SynthConfig.{name} = {value!r}: must be an integer >= {lo} (and at "
                          f"most {MAX_FIELD:,})")


def _check_seconds(name: str, value: Any, positive: bool) -> None:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
        and math.isfinite(value) and (value > 0 if positive else value >= 0) and value <= MAX_WINDOW_S
    if not ok:
        raise ConfigError(f"SynthConfig.{name} = {value!r}: must be a finite number of seconds "
                          f"{'> 0' if positive else '>= 0'} and <= {MAX_WINDOW_S:g}")


@dataclass(frozen=True)
class SynthConfig:
    """Every size, span and count of a Bursted dataset (defaults = the ``default`` preset).

    Reference values are DESIGN.md section 2 ("Bursted-ART", the published reference build).

    Attributes
    ----------
    train_windows, test_windows : int
        Windows per split (reference 10 / 30); each >= 1.
    synthetic_fraction : float
        Share of each split's windows that are synthetic, rounded half up (reference 0.5).
    normal_rows : int
        Consecutive base-trace rows per normal window (reference 1,000; default 600 so that
        20 windows fit the 12,031-row Mooncake conversation trace).
    jobs : int
        Jobs per synthetic window (reference 8).
    job_size : int
        Requests per job (reference 500).
    prefix_tokens : int
        Tokens of the prefix shared by a job's requests (reference 65,536); a multiple of the base
        trace's block size (checked at generation).
    suffix_tokens : int
        Tokens of each request's own suffix (reference 256), >= 1.
    output_tokens : int
        Output tokens of every generated request (reference 1).
    span_s : float
        A job's requests arrive uniformly over ``[start, start + span_s)`` (reference 60 s).
    first_job_s, job_gap_s, jitter_s : float
        Job ``k`` starts at ``first_job_s + k * job_gap_s + U[0, jitter_s]`` (reference 20, 40,
        2 s).
    decoys : int
        Decoy jobs per synthetic window (reference 120).
    decoy_requests : int
        Requests per decoy job (reference 1; e.g. 3 for repeated short-lived decoys).
    decoy_span_s : float
        A decoy's requests arrive within ``[first, first + decoy_span_s)`` (e.g. 1 s).
    decoy_prefix_tokens : int or None
        Shared prefix of a decoy's requests; None = ``prefix_tokens``.
    background_rows : int
        Consecutive base-trace rows added to each synthetic window (reference 0).
    job_kinds : tuple of str
        Labels cycled over a window's jobs.

    Raises
    ------
    ConfigError
        A field out of range (the message names the field and the value).
    """

    train_windows: int = 10
    test_windows: int = 30
    synthetic_fraction: float = 0.5
    normal_rows: int = 600
    jobs: int = 8
    job_size: int = 500
    prefix_tokens: int = 65_536
    suffix_tokens: int = 256
    output_tokens: int = 1
    span_s: float = 60.0
    first_job_s: float = 20.0
    job_gap_s: float = 40.0
    jitter_s: float = 2.0
    decoys: int = 120
    decoy_requests: int = 1
    decoy_span_s: float = 1.0
    decoy_prefix_tokens: int | None = None
    background_rows: int = 0
    job_kinds: tuple[str, ...] = JOB_KINDS

    def __post_init__(self) -> None:
        for name in ("train_windows", "test_windows", "normal_rows", "job_size", "prefix_tokens",
                     "suffix_tokens", "decoy_requests"):
            _check_int(name, getattr(self, name), 1)
        for name in ("jobs", "output_tokens", "decoys", "background_rows"):
            _check_int(name, getattr(self, name), 0)
        if self.decoy_prefix_tokens is not None:
            _check_int("decoy_prefix_tokens", self.decoy_prefix_tokens, 1)
        f = self.synthetic_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
            raise ConfigError(f"SynthConfig.synthetic_fraction = {f!r}: must be in [0, 1]")
        _check_seconds("span_s", self.span_s, True)
        _check_seconds("decoy_span_s", self.decoy_span_s, True)
        for name in ("first_job_s", "job_gap_s", "jitter_s"):
            _check_seconds(name, getattr(self, name), False)
        if not isinstance(self.job_kinds, tuple) or not self.job_kinds \
                or not all(isinstance(k, str) and k for k in self.job_kinds):
            raise ConfigError(f"SynthConfig.job_kinds = {self.job_kinds!r}: must be a non-empty "
                              f"tuple of non-empty strings")
        if self.horizon_s() > MAX_WINDOW_S:
            raise ConfigError(f"SynthConfig: jobs end {self.horizon_s():g} s into a window (first_job_s "
                              f"+ (jobs - 1) x job_gap_s + jitter_s + span_s); at most {MAX_WINDOW_S:g}")
        total = self.rows("train") + self.rows("test")
        if total > MAX_ROWS:
            raise ConfigError(f"SynthConfig: {total:,} rows in all (train {self.rows('train'):,}, test "
                              f"{self.rows('test'):,}); at most {MAX_ROWS:,} fit in memory: lower "
                              f"job_size, jobs, decoys or the window counts")
        if self.jobs == 0 and self.decoys == 0 and self.background_rows == 0 \
                and self.synthetic_windows_total() > 0:
            raise ConfigError("SynthConfig: jobs = decoys = background_rows = 0 would make empty "
                              "synthetic windows; set synthetic_fraction = 0 or add requests")

    # ---- closed-form counts ----------------------------------------------------------------
    def synthetic_windows(self, split: str) -> int:
        """Synthetic windows of ``split``: ``floor(n * synthetic_fraction + 0.5)``."""
        n = self.windows(split)
        return int(math.floor(n * self.synthetic_fraction + 0.5))

    def windows(self, split: str) -> int:
        """Windows of ``split`` (``"train"`` or ``"test"``)."""
        if split not in SPLITS:
            raise ConfigError(f"split = {split!r}: must be one of {SPLITS}")
        return self.train_windows if split == "train" else self.test_windows

    def normal_windows(self, split: str) -> int:
        """Normal windows of ``split``."""
        return self.windows(split) - self.synthetic_windows(split)

    def synthetic_windows_total(self) -> int:
        """Synthetic windows over both splits."""
        return sum(self.synthetic_windows(s) for s in SPLITS)

    def normal_windows_total(self) -> int:
        """Normal windows over both splits."""
        return sum(self.normal_windows(s) for s in SPLITS)

    def synthetic_window_rows(self) -> int:
        """Rows of one synthetic window: ``jobs * job_size + decoys * decoy_requests + background``."""
        return self.jobs * self.job_size + self.decoys * self.decoy_requests + self.background_rows

    def rows(self, split: str) -> int:
        """Rows of ``split`` (closed form; the generator produces exactly this many)."""
        return (self.normal_windows(split) * self.normal_rows
                + self.synthetic_windows(split) * self.synthetic_window_rows())

    def base_rows_needed(self) -> int:
        """Base-trace rows the layout uses (normal windows plus background segments)."""
        return (self.normal_windows_total() * self.normal_rows
                + self.synthetic_windows_total() * self.background_rows)

    def horizon_s(self) -> float:
        """Latest possible end of a synthetic window's last job span (decoys fall before it), s."""
        return self.first_job_s + max(self.jobs - 1, 0) * self.job_gap_s + self.jitter_s + self.span_s

    def expected_counts(self) -> dict[str, dict[str, int]]:
        """Windows and rows per split: ``{split: {windows, normal_windows, synthetic_windows, rows}}``."""
        return {s: {"windows": self.windows(s), "normal_windows": self.normal_windows(s),
                    "synthetic_windows": self.synthetic_windows(s), "rows": self.rows(s)}
                for s in SPLITS}


#: Named presets. ``reference`` = DESIGN.md section 2 (needs >= 20,000 base rows, e.g. ART-Chat);
#: ``default`` fits the shipped Mooncake conversation trace (20 x 600 = 12,000 of 12,031 rows);
#: ``quick`` is for tests and the notebook's quick run (2 + 2 windows, 720 rows).
PRESETS: dict[str, SynthConfig] = {
    "default": SynthConfig(),
    "reference": SynthConfig(normal_rows=1_000),
    "quick": SynthConfig(train_windows=2, test_windows=2, normal_rows=200, jobs=3, job_size=50,
                         decoys=10),
}


def preset(name: str, **overrides: Any) -> SynthConfig:
    """The preset ``name`` with ``overrides`` (field -> value; None values are ignored).

    Raises
    ------
    ConfigError
        Unknown preset or field, or an invalid value.
    """
    if name not in PRESETS:
        raise ConfigError(f"preset = {name!r}: unknown (choose from {', '.join(PRESETS)})")
    fields = {f.name for f in dataclasses.fields(SynthConfig)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise ConfigError(f"SynthConfig has no field {bad[0]!r}")
    return dataclasses.replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


# --------------------------------------------------------------------------------------------
# the generated dataset
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class BurstedDataset:
    """A generated Bursted dataset held in memory.

    Attributes
    ----------
    splits : dict of str -> pandas.DataFrame
        ``"train"`` and ``"test"``: columns :data:`COLUMNS`; ``hash_ids`` holds int64 arrays;
        rows sorted by ``(trace_id, arrival_s)``; arrivals re-based to 0 at each window's start.
    windows : pandas.DataFrame
        One row per window: ``trace_id``, ``split``, ``kind`` (``normal`` / ``synthetic``),
        ``rows``, ``base_row_start``, ``base_row_stop`` (the base-trace rows used, -1 if none),
        ``duration_s`` (last arrival, s).
    config : SynthConfig
    block_tokens : int
        Tokens per hash block (the base trace's).
    base : dict
        ``name``, ``path``, ``format``, ``rows``, ``file_sha256`` (None for a Hub id),
        ``table_sha256`` (of the loaded table: arrivals, lengths, ids), ``id_count``.
    seed : int or None
        Seed of the generator, recorded in the manifest.
    preset : str or None
        Preset name the config came from, if any.
    """

    splits: dict
    windows: pd.DataFrame
    config: SynthConfig
    block_tokens: int
    base: dict
    seed: int | None = None
    preset: str | None = None
    extra: dict = field(default_factory=dict)

    def counts(self) -> dict[str, dict[str, int]]:
        """Observed windows and rows per split (same keys as :meth:`SynthConfig.expected_counts`)."""
        out = {}
        for s in SPLITS:
            w = self.windows[self.windows["split"] == s]
            out[s] = {"windows": int(len(w)), "normal_windows": int((w["kind"] == "normal").sum()),
                      "synthetic_windows": int((w["kind"] == "synthetic").sum()),
                      "rows": int(len(self.splits[s]))}
        return out

    def to_trace(self, split: str) -> Trace:
        """One split as a :class:`~btb_core.trace.Trace` grouped by ``trace_id``."""
        if split not in self.splits:
            raise ConfigError(f"split = {split!r}: must be one of {sorted(self.splits)}")
        return from_table(self.splits[split], block_tokens=self.block_tokens,
                          name=f"bursted/{split}", group_column="trace_id", strict=True)

    def manifest(self, files: dict[str, dict] | None = None) -> dict:
        """The ``manifest.json`` content (deterministic: no times, no absolute output paths)."""
        return {
            "format": "btb-bursted",
            "generator_version": GENERATOR_VERSION,
            "btb_core_version": __version__,
            "seed": self.seed,
            "preset": self.preset,
            "block_tokens": self.block_tokens,
            "parameters": jsonable(dataclasses.asdict(self.config)),
            "base": self.base,
            "counts": self.counts(),
            "columns": list(COLUMNS),
            "files": files or {},
            "windows": jsonable(self.windows.to_dict(orient="records")),
        }


# --------------------------------------------------------------------------------------------
# generation
# --------------------------------------------------------------------------------------------


def _check_base(base: Trace, config: SynthConfig) -> int:
    """Validate the base trace against the config; returns the prefix length in blocks."""
    if not isinstance(base, Trace):
        raise TraceError(f"base must be a btb_core.trace.Trace, got {type(base).__name__}")
    base.require_prefix_info("the Bursted generator")
    if base.group_column is not None:
        raise TraceError(f"{base.name}: the base trace holds several windows ({base.group_column!r}); "
                         f"pass one ordinary trace (e.g. one of its .groups())")
    bt = base.block_tokens
    for name in ("prefix_tokens", "decoy_prefix_tokens"):
        v = getattr(config, name)
        if v is not None and v % bt:
            lo = max(1, v // bt) * bt
            raise ConfigError(f"SynthConfig.{name} = {v}: must be a multiple of the base trace's "
                              f"block size {bt} tokens (e.g. {lo} or {lo + bt})")
    suffix_blocks = -(-config.suffix_tokens // bt)
    d_blocks = (config.decoy_prefix_tokens or config.prefix_tokens) // bt
    per_window = (config.jobs * (config.prefix_tokens // bt + config.job_size * suffix_blocks)
                  + config.decoys * (d_blocks + config.decoy_requests * suffix_blocks))
    row_ids = (config.jobs * config.job_size * (config.prefix_tokens // bt + suffix_blocks)
               + config.decoys * config.decoy_requests * (d_blocks + suffix_blocks))
    ids_total = config.synthetic_windows_total() * row_ids
    if ids_total > MAX_BLOCK_IDS:
        raise ConfigError(f"SynthConfig: the synthetic rows would hold {ids_total:,} block ids "
                          f"({per_window:,} distinct per window); at most {MAX_BLOCK_IDS:,} fit in "
                          f"memory: lower job_size, jobs, prefix_tokens or the window counts")
    need = config.base_rows_needed()
    if need > len(base):
        raise TraceError(_too_short_message(base, config, need))
    return config.prefix_tokens // bt


def _too_short_message(base: Trace, config: SynthConfig, need: int) -> str:
    n_norm, n_syn = config.normal_windows_total(), config.synthetic_windows_total()
    have = len(base)
    msg = (f"{base.name}: base trace too short: {have:,} rows, but {n_norm} normal windows x "
           f"{config.normal_rows:,} rows" + (f" + {n_syn} synthetic windows x {config.background_rows:,}"
                                             f" background rows" if config.background_rows else "")
           + f" need {need:,}. What fits:")
    room = have - n_syn * config.background_rows
    options = []
    if n_norm and room >= n_norm:
        options.append(f"normal_rows <= {room // n_norm:,} (--normal-rows {room // n_norm})")
    if n_norm and room >= config.normal_rows:
        options.append(f"at most {room // config.normal_rows} normal windows of "
                       f"{config.normal_rows:,} rows (fewer --train-windows/--test-windows, or a "
                       f"lower --synthetic-fraction keeps fewer normal windows)")
    if config.background_rows and n_syn:
        room_bg = have - n_norm * config.normal_rows
        options.append(f"background_rows <= {max(room_bg, 0) // n_syn:,}")
    options.append("or a longer base trace (ART-Chat-2.5M: --base alessiotoniolo/ART-Chat-2.5M or a "
                   "local parquet/JSONL)")
    return msg + " " + "; ".join(options)


def _layout(n_base: int, lengths: list[int], rng: np.random.Generator) -> list[int]:
    """Start rows of disjoint consecutive segments of ``lengths`` rows, spread over the base.

    The segments are placed in a random order with the unused rows split at random into the gaps
    before, between and after them (a multinomial over the gaps), so windows cover the whole trace.
    """
    k = len(lengths)
    if k == 0:
        return []
    slack = n_base - sum(lengths)
    order = rng.permutation(k)
    gaps = rng.multinomial(slack, np.full(k + 1, 1.0 / (k + 1)))
    starts = [0] * k
    pos = 0
    for j, seg in enumerate(order):
        pos += int(gaps[j])
        starts[int(seg)] = pos
        pos += lengths[int(seg)]
    return starts


def _base_rows(base: Trace, start: int, stop: int) -> dict[str, Any]:
    """Rows ``start:stop`` of the base, arrivals re-based to the first one (integer microseconds)."""
    t_us = np.round(base.arrival_s[start:stop] * _US).astype(np.int64)
    t_us = t_us - t_us[0]
    ids = [base.hash_flat[base.hash_offsets[i]:base.hash_offsets[i + 1]].astype(np.int64)
           for i in range(start, stop)]
    sess = base.table["session_id"].iloc[start:stop].tolist() if "session_id" in base.table.columns \
        else [None] * (stop - start)
    return {"t_us": t_us, "input": base.input_length[start:stop].astype(np.int64),
            "output": base.output_length[start:stop].astype(np.int64), "ids": ids,
            "session": [None if pd.isna(s) else str(s) for s in sess],
            "base_row": np.arange(start, stop, dtype=np.int64)}


class _IdCounter:
    """Hands out fresh hash ids from ``first`` upwards (disjoint from the base's interned ids)."""

    def __init__(self, first: int):
        self.next = int(first)

    def take(self, n: int) -> np.ndarray:
        out = np.arange(self.next, self.next + n, dtype=np.int64)
        self.next += n
        return out


def _shared_prefix_rows(prefix_ids: np.ndarray, n_req: int, suffix_blocks: int,
                        ids: _IdCounter) -> list[np.ndarray]:
    """Hash ids of ``n_req`` requests sharing ``prefix_ids``, each with fresh suffix blocks."""
    suffix = ids.take(n_req * suffix_blocks).reshape(n_req, suffix_blocks)
    return [np.concatenate([prefix_ids, suffix[r]]) for r in range(n_req)]


def _synthetic_rows(config: SynthConfig, block_tokens: int, trace_id: str,
                    rng: np.random.Generator, ids: _IdCounter) -> list[dict]:
    """Job and decoy rows of one synthetic window (unsorted), one dict per row."""
    us = lambda s: int(round(s * _US))  # noqa: E731 - local unit conversion
    suffix_blocks = -(-config.suffix_tokens // block_tokens)
    p_blocks = config.prefix_tokens // block_tokens
    input_len = config.prefix_tokens + config.suffix_tokens
    rows: list[dict] = []
    for k in range(config.jobs):
        jitter = int(rng.integers(0, us(config.jitter_s) + 1))
        start = us(config.first_job_s) + k * us(config.job_gap_s) + jitter
        t = start + np.sort(rng.integers(0, us(config.span_s), size=config.job_size))
        kind = config.job_kinds[k % len(config.job_kinds)]
        hids = _shared_prefix_rows(ids.take(p_blocks), config.job_size, suffix_blocks, ids)
        meta = {"row_kind": "job", "window_kind": "synthetic", "job_kind": kind, "job_index": k,
                "job_size": config.job_size, "prefix_tokens": config.prefix_tokens,
                "suffix_tokens": config.suffix_tokens, "job_start_s": start / _US}
        for r in range(config.job_size):
            rows.append({"t_us": int(t[r]), "input": input_len, "output": config.output_tokens,
                         "ids": hids[r], "group": f"{trace_id}/job{k}", "row_kind": "job",
                         "meta": {**meta, "request_index": r}})
    d_tokens = config.decoy_prefix_tokens or config.prefix_tokens
    d_blocks = d_tokens // block_tokens
    horizon_us = us(config.horizon_s())
    for d in range(config.decoys):
        first = int(rng.integers(0, horizon_us))
        offs = np.sort(rng.integers(0, us(config.decoy_span_s), size=config.decoy_requests - 1))
        t = np.concatenate([[first], first + offs])
        hids = _shared_prefix_rows(ids.take(d_blocks), config.decoy_requests, suffix_blocks, ids)
        meta = {"row_kind": "decoy", "window_kind": "synthetic", "job_kind": "decoy",
                "decoy_index": d, "job_size": config.decoy_requests, "prefix_tokens": d_tokens,
                "suffix_tokens": config.suffix_tokens}
        for r in range(config.decoy_requests):
            rows.append({"t_us": int(t[r]), "input": d_tokens + config.suffix_tokens,
                         "output": config.output_tokens, "ids": hids[r],
                         "group": f"{trace_id}/decoy{d}", "row_kind": "decoy",
                         "meta": {**meta, "request_index": r}})
    return rows


def _window_frame(trace_id: str, split: str, kind: str, base_part: dict | None, synth: list[dict],
                  source: str) -> pd.DataFrame:
    """Assemble one window's rows, sorted by arrival (stable: base rows, then jobs, then decoys)."""
    t, inp, out, ids, sess, group, src, meta = [], [], [], [], [], [], [], []
    if base_part is not None:
        row_kind = "base" if kind == "normal" else "background"
        n = len(base_part["t_us"])
        t += base_part["t_us"].tolist()
        inp += base_part["input"].tolist()
        out += base_part["output"].tolist()
        ids += base_part["ids"]
        sess += base_part["session"]
        group += [None] * n
        src += [source] * n
        meta += [{"row_kind": row_kind, "window_kind": kind, "base_row": int(b)}
                 for b in base_part["base_row"]]
    for r in synth:
        t.append(r["t_us"])
        inp.append(r["input"])
        out.append(r["output"])
        ids.append(r["ids"])
        sess.append(None)
        group.append(r["group"])
        src.append(SYNTH_SOURCE)
        meta.append(r["meta"])
    order = np.argsort(np.asarray(t, dtype=np.int64), kind="stable")
    t_arr = np.asarray(t, dtype=np.int64)[order]
    pick = lambda xs: [xs[i] for i in order]  # noqa: E731
    return pd.DataFrame({
        "arrival_s": t_arr / _US,
        "input_length": np.asarray(inp, dtype=np.int64)[order],
        "output_length": np.asarray(out, dtype=np.int64)[order],
        "hash_ids": pick(ids),
        "session_id": pick(sess),
        "group_id": pick(group),
        "source": pick(src),
        "trace_id": trace_id,
        "split": split,
        "metadata": [json.dumps(m, sort_keys=True, separators=(",", ":")) for m in pick(meta)],
    })


def generate(base: Trace, config: SynthConfig, rng: np.random.Generator, *,
             seed: int | None = None, preset_name: str | None = None,
             base_info: dict | None = None) -> BurstedDataset:
    """Build a Bursted dataset from ``base`` (deterministic for the state of ``rng``).

    Parameters
    ----------
    base : Trace
        An ordinary (ungrouped) trace with prefix ids, e.g. :func:`btb_core.trace.load_mooncake`.
        Its block size is the dataset's.
    config : SynthConfig
    rng : numpy.random.Generator
        The only source of randomness. Child generators are spawned from it for the layout, the
        split assignment and each window, in that order.
    seed : int, optional
        Recorded in the manifest (use :func:`build` to create ``rng`` from a seed).
    preset_name : str, optional
        Recorded in the manifest.
    base_info : dict, optional
        Provenance of the base (``path``, ``format``, ``file_sha256``); merged into
        :attr:`BurstedDataset.base`.

    Returns
    -------
    BurstedDataset
        Exactly ``config.expected_counts()`` windows and rows per split.

    Raises
    ------
    TraceError
        A base without prefix ids, a grouped base, or one too short for the requested windows
        (the message says what would fit).
    ConfigError
        ``prefix_tokens`` (or ``decoy_prefix_tokens``) not a multiple of the base's block size.
    """
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    _check_base(base, config)
    layout_rng, split_rng, windows_rng = rng.spawn(3)

    # Window kinds in canonical order, split assignment within each kind.
    n_norm, n_syn = config.normal_windows_total(), config.synthetic_windows_total()
    kinds = np.array(["normal"] * n_norm + ["synthetic"] * n_syn)[split_rng.permutation(n_norm + n_syn)]
    splits = np.empty(len(kinds), dtype=object)
    for kind, count in (("normal", config.normal_windows), ("synthetic", config.synthetic_windows)):
        idx = np.flatnonzero(kinds == kind)
        idx = idx[split_rng.permutation(len(idx))]
        n_train = count("train")
        splits[idx[:n_train]] = "train"
        splits[idx[n_train:]] = "test"

    # Base segments: one per normal window, one per synthetic window with background rows.
    seg_len = [config.normal_rows if k == "normal" else config.background_rows for k in kinds]
    seg_ids = [i for i, n in enumerate(seg_len) if n > 0]
    starts = _layout(len(base), [seg_len[i] for i in seg_ids], layout_rng)
    seg_start = dict(zip(seg_ids, starts))

    width = max(3, len(str(len(kinds) - 1)))
    ids = _IdCounter(int(base.hash_flat.max()) + 1 if len(base.hash_flat) else 0)
    win_rngs = windows_rng.spawn(len(kinds))
    frames, wins = [], []
    for i, kind in enumerate(kinds):
        trace_id = f"w{i:0{width}d}-{kind}"
        part = None
        a = b = -1
        if i in seg_start:
            a, b = seg_start[i], seg_start[i] + seg_len[i]
            part = _base_rows(base, a, b)
        synth = _synthetic_rows(config, base.block_tokens, trace_id, win_rngs[i], ids) \
            if kind == "synthetic" else []
        df = _window_frame(trace_id, str(splits[i]), str(kind), part, synth, base.name)
        frames.append(df)
        wins.append({"trace_id": trace_id, "split": str(splits[i]), "kind": str(kind),
                     "rows": len(df), "base_row_start": a, "base_row_stop": b,
                     "duration_s": float(df["arrival_s"].iloc[-1])})
    allrows = pd.concat(frames, ignore_index=True)
    allrows.insert(0, "request_id", np.arange(len(allrows), dtype=np.int64))
    out = {s: allrows[allrows["split"] == s].reset_index(drop=True)[list(COLUMNS)] for s in SPLITS}
    info = {"name": base.name, "rows": len(base), "table_sha256": trace_sha256(base),
            "id_count": int(ids.next), "synthetic_first_id":
                int(base.hash_flat.max()) + 1 if len(base.hash_flat) else 0}
    info.update(base_info or {})
    return BurstedDataset(out, pd.DataFrame(wins), config, base.block_tokens, info, seed, preset_name)


def trace_sha256(trace: Trace) -> str:
    """SHA-256 of a trace's content (arrivals, lengths, chained ids, offsets), hex."""
    h = hashlib.sha256()
    for arr in (trace.arrival_s.astype("<f8"), trace.input_length.astype("<i8"),
                trace.output_length.astype("<i8"), trace.hash_flat.astype("<i4"),
                trace.hash_offsets.astype("<i8")):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, or of a directory's files (relative name + bytes, name order)."""
    h = hashlib.sha256()
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _display_path(path: Path) -> str:
    """``path`` relative to the repository root when inside it (keeps manifests machine-independent);
    undecodable bytes of a file name are escaped (``\\xff``)."""
    try:
        text = Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        text = Path(path).name if Path(path).is_absolute() else str(path)
    return shown_path(text)


def load_base(path: str | Path | None = None, *, fmt: str | None = None,
              block_tokens: int | None = None, max_rows: int | None = None) -> tuple[Trace, dict]:
    """Load a base trace and describe its provenance.

    Parameters
    ----------
    path : path-like or str, optional
        A trace file (Mooncake/ART JSONL, ART parquet), a directory of ART files, or an ART-Chat
        Hugging Face id (``owner/name``). Default :data:`DEFAULT_BASE`.
    fmt, block_tokens : optional
        Passed to :func:`btb_core.trace.load_trace`.
    max_rows : int, optional
        ART only: keep the first ``max_rows`` rows.

    Returns
    -------
    (Trace, dict)
        The trace and ``{"path", "format", "file_sha256"}`` (sha256 None for a Hub id).

    Raises
    ------
    TraceError, FileNotFoundError
        From the loaders; a Bursted dataset as base.
    """
    from .trace import detect_format, load_trace

    path = DEFAULT_BASE if path is None else path
    fmt = fmt or detect_format(path)
    if fmt == "bursted":
        raise TraceError(f"{path}: is a Bursted dataset; the base must be an ordinary trace "
                         f"(Mooncake or ART-Chat)")
    kwargs = {"max_rows": max_rows} if max_rows is not None and fmt == "art" else {}
    trace = load_trace(path, fmt=fmt, block_tokens=block_tokens, strict=False, **kwargs)
    local = Path(path).exists()
    info = {"path": _display_path(Path(path)) if local else f"hf://{path}", "format": fmt,
            "file_sha256": file_sha256(Path(path)) if local else None}
    return trace, info


def build(base: Trace | str | Path | None = None, config: SynthConfig | str = "default",
          seed: int = 0, **load_kwargs: Any) -> BurstedDataset:
    """Convenience: load the base (if a path), create ``numpy.random.default_rng(seed)``, generate.

    Parameters
    ----------
    base : Trace or path-like or None
        Default :data:`DEFAULT_BASE`.
    config : SynthConfig or str
        A config or a preset name (:data:`PRESETS`).
    seed : int
    **load_kwargs
        Passed to :func:`load_base` (``fmt``, ``block_tokens``, ``max_rows``).
    """
    preset_name = config if isinstance(config, str) else None
    cfg = preset(config) if isinstance(config, str) else config
    if isinstance(base, Trace):
        trace, info = base, {"path": None, "format": None, "file_sha256": None}
    else:
        trace, info = load_base(base, **load_kwargs)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed = {seed!r}: must be a non-negative integer")
    return generate(trace, cfg, np.random.default_rng(int(seed)), seed=int(seed),
                    preset_name=preset_name, base_info=info)


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def _arrow_table(df: pd.DataFrame):
    """The split as a pyarrow table with a fixed schema (hash_ids list<int64>)."""
    import pyarrow as pa

    lengths = np.fromiter((len(h) for h in df["hash_ids"]), dtype=np.int64, count=len(df))
    offsets = np.zeros(len(df) + 1, dtype=np.int32 if lengths.sum() < 2**31 else np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([np.asarray(h, dtype=np.int64) for h in df["hash_ids"]]) if len(df) \
        else np.zeros(0, np.int64)
    list_type = pa.list_ if offsets.dtype == np.int32 else pa.large_list
    hash_ids = (pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray).from_arrays(
        pa.array(offsets), pa.array(flat, pa.int64()))
    cols = {
        "request_id": pa.array(df["request_id"].to_numpy(np.int64)),
        "arrival_s": pa.array(df["arrival_s"].to_numpy(np.float64)),
        "input_length": pa.array(df["input_length"].to_numpy(np.int64)),
        "output_length": pa.array(df["output_length"].to_numpy(np.int64)),
        "hash_ids": hash_ids,
    }
    for c in COLUMNS[5:]:
        vals = [None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
                for v in df[c].tolist()]  # pandas 3 string columns use NaN for missing
        cols[c] = pa.array(vals, pa.string())
    schema = pa.schema([(k, v.type) for k, v in cols.items()])
    assert schema.field("hash_ids").type == list_type(pa.int64())
    return pa.table(cols, schema=schema)


def to_datasetdict(ds: BurstedDataset):
    """The splits as a ``datasets.DatasetDict`` (``hash_ids`` as a sequence of int64)."""
    import datasets

    return datasets.DatasetDict({s: datasets.Dataset(_arrow_table(ds.splits[s]),
                                                     split=datasets.NamedSplit(s))
                                 for s in SPLITS})


def write(ds: BurstedDataset, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``ds`` as ``<out>/{train,test}.parquet`` + ``manifest.json`` + ``README.md``.

    Files are written into a temporary sibling directory which then replaces ``out_dir`` by
    rename, under a lock on the parent directory (:func:`btb_core.fileio.replace_dir`), so an
    interrupted run leaves ``out_dir`` untouched (or, killed between the two renames, restored by
    the next run) and two runs never both succeed. Same dataset -> byte-identical files (the
    parquet footer holds the writer version and the ``datasets`` features, no times).

    Parameters
    ----------
    ds : BurstedDataset
    out_dir : path-like
    overwrite : bool
        Replace an existing non-empty ``out_dir``; without it that is an error. Only an empty
        directory or a dataset this tool wrote (nothing but its manifest, card and listed split
        files) is ever replaced.

    Returns
    -------
    Path
        ``out_dir``.

    Raises
    ------
    ConfigError
        ``out_dir`` exists and is a non-empty directory (without ``overwrite``), holds files this
        tool did not write, is a file, or is inside a Bursted dataset directory.
    OutputError
        Disk full, read-only file system, a path component that is a file, a name too long (one
        line naming the path; the temporary folder is removed).
    """
    import datasets

    out = Path(out_dir)
    check_out(out, overwrite=overwrite)

    def fill(tmp: Path) -> None:
        bars_were_on = not datasets.are_progress_bars_disabled()
        try:
            datasets.disable_progress_bars()
            dd = to_datasetdict(ds)
            files = {}
            for s in SPLITS:
                name = f"{s}.parquet"
                dd[s].to_parquet(str(tmp / name))
                files[s] = {"path": name, "rows": len(dd[s]), "sha256": file_sha256(tmp / name)}
            manifest = ds.manifest(files)
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n",
                                               encoding="utf-8")
            (tmp / "README.md").write_text(dataset_card(ds, manifest), encoding="utf-8")
        finally:
            if bars_were_on:
                datasets.enable_progress_bars()

    return replace_dir(out, fill, overwrite=overwrite, owned=foreign_reason)


def check_out(out: str | Path, *, overwrite: bool = False) -> None:
    """Refuse an output directory :func:`write` would refuse, before any work is done.

    Raises
    ------
    ConfigError
        ``out`` is inside a Bursted dataset directory, is a file, is the current directory, is
        non-empty without ``overwrite``, or holds files ``btb synth`` did not write.
    """
    out = Path(out)
    inside = enclosing_dataset(out)
    if inside is not None:
        raise ConfigError(f"--out {shown_path(out)}: is inside the Bursted dataset {shown_path(inside)}; "
                          f"writing there would break it (choose a directory outside it)")
    check_replaceable(out, overwrite=overwrite, owned=foreign_reason)
    return out


def push_to_hub(out_dir: str | Path, repo_id: str, *, private: bool = False) -> str:
    """Upload a written dataset directory to the Hugging Face Hub as a dataset repo.

    Returns
    -------
    str
        The dataset URL.

    Raises
    ------
    ConfigError
        Offline (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set, or the Hub unreachable), no
        credentials, or any upload failure; the message says the local copy is complete.
    """
    out = Path(out_dir)
    if "/" not in repo_id or repo_id.count("/") != 1:
        raise ConfigError(f"--push-to-hub {repo_id!r}: must be a Hub dataset id 'owner/name'")
    local = f"the dataset is complete locally in {out}; push it later with --push-to-hub"
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            raise ConfigError(f"--push-to-hub {repo_id}: cannot push while offline ({var} is set); "
                              f"{local}")
    try:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(repo_id, repo_type="dataset", exist_ok=True, private=private)
        api.upload_folder(folder_path=str(out), repo_id=repo_id, repo_type="dataset",
                          commit_message="Bursted dataset (btb synth)")
    except Exception as exc:  # network, auth, permissions: one readable line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"--push-to-hub {repo_id}: upload failed ({type(exc).__name__}: "
                          f"{first[:200]}); are you online and logged in (`hf auth login`)? "
                          f"{local}") from None
    return f"https://huggingface.co/datasets/{repo_id}"


def override_flags(config: SynthConfig, preset_name: str = "default") -> list[str]:
    """``btb synth`` flags that turn preset ``preset_name`` into ``config`` (e.g. ``--jobs 4``)."""
    ref = PRESETS.get(preset_name, PRESETS["default"])
    flags = []
    for f in dataclasses.fields(SynthConfig):
        v = getattr(config, f.name)
        if v != getattr(ref, f.name) and f.name != "job_kinds":
            flags.append(f"--{f.name.replace('_', '-')} {v:g}" if isinstance(v, float)
                         else f"--{f.name.replace('_', '-')} {v}")
    return flags


# --------------------------------------------------------------------------------------------
# dataset card
# --------------------------------------------------------------------------------------------

_LICENSES = {"mooncake": ("apache-2.0", "Apache-2.0, from the Mooncake FAST'25 traces "
                                        "(kvcache-ai/Mooncake, data/traces/mooncake/SOURCE.md)")}


def dataset_card(ds: BurstedDataset, manifest: dict) -> str:
    """The dataset card (``README.md``): YAML header for the Hub, then structure and provenance."""
    c = ds.config
    path = str(ds.base.get("path") or "")
    lic, lic_text = next(((v[0], v[1]) for k, v in _LICENSES.items() if k in path.lower()),
                         ("other", f"inherits the licence of the base trace ({path or ds.base['name']})"))
    counts = ds.counts()
    lines = [
        "---",
        f"license: {lic}",
        "pretty_name: Bursted (BTB synthetic burst windows)",
        "tags:",
        "- llm-inference",
        "- kv-cache",
        "- request-trace",
        "configs:",
        "- config_name: default",
        "  data_files:",
        *[f"  - split: {s}\n    path: {s}.parquet" for s in SPLITS],
        "---",
        "",
        "# Bursted dataset",
        "",
        "Request traces for routing LLM inference under bursty same-prefix traffic, generated by "
        "`btb synth` (BTB, `btb_core/synth.py`). Each *window* is replayed on a fresh cluster; "
        "windows are split whole into train and test, never row by row.",
        "",
        "* **normal** windows: consecutive rows of the base trace, arrivals re-based to 0 s;",
        f"* **synthetic** windows: {c.jobs} jobs ({', '.join(c.job_kinds)}) of {c.job_size:,} "
        f"requests each, spread over {c.span_s:g} s and sharing a {c.prefix_tokens:,}-token prefix "
        f"while each keeps its own {c.suffix_tokens:,}-token suffix, {c.output_tokens} output "
        f"token(s); job starts {c.job_gap_s:g} s apart from {c.first_job_s:g} s with up to "
        f"{c.jitter_s:g} s of jitter; plus {c.decoys} decoy jobs of {c.decoy_requests} request(s) "
        f"within {c.decoy_span_s:g} s"
        + (f" and {c.background_rows:,} base-trace background rows" if c.background_rows else "")
        + ".",
        "",
        "## Counts",
        "",
        "| split | windows | normal | synthetic | rows |",
        "| --- | ---: | ---: | ---: | ---: |",
        *[f"| {s} | {counts[s]['windows']} | {counts[s]['normal_windows']} | "
          f"{counts[s]['synthetic_windows']} | {counts[s]['rows']:,} |" for s in SPLITS],
        "",
        f"Block size: {ds.block_tokens} tokens (the base trace's). Seed: {ds.seed}. "
        f"Preset: {ds.preset or 'custom'}. Generator version {GENERATOR_VERSION}, btb_core "
        f"{__version__}. Base trace: `{ds.base['name']}` ({path or 'in memory'}, {ds.base['rows']:,} "
        f"rows, sha256 `{ds.base.get('file_sha256') or ds.base['table_sha256']}`). "
        "All parameters are in `manifest.json`.",
        "",
        "## Columns",
        "",
        "| column | type | meaning |",
        "| --- | --- | --- |",
        "| request_id | int64 | unique over the dataset |",
        "| arrival_s | float64 | seconds from the window's start |",
        "| input_length | int64 | prompt tokens |",
        "| output_length | int64 | generated tokens |",
        f"| hash_ids | list<int64> | one chained id per {ds.block_tokens}-token block: equal id at "
        "position i means equal first (i+1) blocks; generated ids never collide with base ids |",
        "| session_id | string, nullable | the base trace's session, if it has one |",
        "| group_id | string, nullable | `<trace_id>/job<k>` or `<trace_id>/decoy<d>` for "
        "generated rows |",
        f"| source | string | base trace name, or `{SYNTH_SOURCE}` |",
        "| trace_id | string | window id `w<index>-<kind>` |",
        "| split | string | train / test |",
        "| metadata | string (JSON) | row_kind (base, background, job, decoy), window_kind, "
        "job_kind, job_index, job_size, prefix_tokens, base_row ... |",
        "",
        "Rows are sorted by (trace_id, arrival_s).",
        "",
        "## Loading",
        "",
        "```python",
        "import datasets",
        "dd = datasets.load_dataset(\"parquet\", data_files={\"train\": \"train.parquet\", "
        "\"test\": \"test.parquet\"})",
        "from btb_core.trace import load_bursted",
        "test = load_bursted(\".\", split=\"test\")   # grouped by trace_id; test.groups() = windows",
        "```",
        "",
        "## Reproduce",
        "",
        "```",
        f"btb synth --preset {ds.preset or 'default'} --seed {ds.seed}"
        + (f" --base {path.removeprefix('hf://')}" if path and path != _display_path(DEFAULT_BASE)
           else "")
        + "".join(f" {flag}" for flag in override_flags(ds.config, ds.preset or "default"))
        + " --out DIR",
        "```",
        "",
        "## Licence",
        "",
        f"{lic_text}. The synthetic rows are generated (no text, only lengths and block ids).",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# helpers for notebook 02
# --------------------------------------------------------------------------------------------


def row_kinds(table: pd.DataFrame) -> pd.Series:
    """``metadata.row_kind`` of every row (base, background, job, decoy; ``"unknown"`` where a row
    has none). ``metadata`` may hold JSON strings or dicts."""
    def kind(m):
        if isinstance(m, str):
            m = json.loads(m)
        return m.get("row_kind", "unknown") if isinstance(m, dict) else "unknown"

    return table["metadata"].map(kind)


def arrivals_per_second(table: pd.DataFrame, trace_ids: list[str], bin_s: float = 1.0) -> pd.DataFrame:
    """Requests per ``bin_s`` bin for some windows, by row kind (input of the arrivals chart).

    Returns
    -------
    pandas.DataFrame
        Columns ``trace_id``, ``second`` (bin start, s), ``row_kind``, ``requests``; empty bins
        are omitted.
    """
    if not bin_s > 0:
        raise ConfigError(f"bin_s = {bin_s!r}: must be > 0")
    sub = table[table["trace_id"].isin(trace_ids)]
    missing = sorted(set(trace_ids) - set(sub["trace_id"]))
    if missing:
        raise ConfigError(f"trace_id {missing[0]!r} is not in the table")
    df = pd.DataFrame({"trace_id": sub["trace_id"].to_numpy(),
                       "second": np.floor(sub["arrival_s"].to_numpy() / bin_s) * bin_s,
                       "row_kind": row_kinds(sub).to_numpy()})
    return df.groupby(["trace_id", "second", "row_kind"], as_index=False, sort=True).size() \
        .rename(columns={"size": "requests"})


def group_summary(table: pd.DataFrame, block_tokens: int) -> pd.DataFrame:
    """One row per job or decoy (``group_id``): size, timing and the prefix its requests share.

    Parameters
    ----------
    table : pandas.DataFrame
        Rows of a split (:attr:`BurstedDataset.splits` or a loaded trace's ``table``).
    block_tokens : int

    Returns
    -------
    pandas.DataFrame
        Columns ``trace_id``, ``group_id``, ``row_kind``, ``job_kind``, ``requests``, ``first_s``,
        ``span_s`` (last minus first arrival), ``shared_prefix_tokens`` (leading blocks common to
        all its requests x block_tokens), ``input_length`` (of the first request).
    """
    sub = table[table["group_id"].notna()]
    rows = []
    for gid, g in sub.groupby("group_id", sort=False):
        ids = g["hash_ids"].to_list()
        n = min(len(h) for h in ids)
        first = np.asarray(ids[0][:n])
        same = np.ones(n, bool)
        for h in ids[1:]:
            same &= np.asarray(h[:n]) == first
        shared = int(np.argmin(same)) if not same.all() else n
        m = json.loads(g["metadata"].iloc[0])
        t = g["arrival_s"].to_numpy()
        rows.append({"trace_id": g["trace_id"].iloc[0], "group_id": gid, "row_kind": m["row_kind"],
                     "job_kind": m.get("job_kind"), "requests": len(g), "first_s": float(t.min()),
                     "span_s": float(t.max() - t.min()),
                     "shared_prefix_tokens": shared * block_tokens if len(g) > 1 else None,
                     "input_length": int(g["input_length"].iloc[0])})
    out = pd.DataFrame(rows)
    if len(out):
        out["shared_prefix_tokens"] = out["shared_prefix_tokens"].astype("Int64")
    return out


def window_fanout(trace: Trace, depth_tokens: tuple[int, ...] = (1024, 8192, 65_536),
                  window_s: float = 60.0) -> pd.DataFrame:
    """Deep-prefix fan-out of every window of a Bursted split, with the window kind.

    Returns
    -------
    pandas.DataFrame
        One row per (window, depth): ``trace_id``, ``kind``, ``depth_tokens``, ``window_s``,
        ``max_fanout``, ``eligible_requests``.
    """
    from .audit import fanout_table

    fan = fanout_table(trace, depth_tokens, (window_s,), (False,))
    fan["trace_id"] = fan["trace"].str.split("/").str[-1]
    fan["kind"] = fan["trace_id"].str.split("-").str[-1]
    return fan[["trace_id", "kind", "depth_tokens", "window_s", "max_fanout", "eligible_requests"]]


__all__ = ["COLUMNS", "DEFAULT_BASE", "GENERATOR_VERSION", "JOB_KINDS", "PRESETS", "SPLITS",
           "SYNTH_SOURCE", "BurstedDataset", "SynthConfig", "arrivals_per_second", "build",
           "check_out", "dataset_card", "file_sha256", "generate", "group_summary", "load_base", "preset", "push_to_hub",
           "row_kinds", "to_datasetdict", "trace_sha256", "window_fanout", "write"]
