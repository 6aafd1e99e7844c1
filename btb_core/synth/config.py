"""Bursted dataset parameters: :class:`SynthConfig` (every size, span and count, validated), the
named :data:`PRESETS`, and the constants of the row layout.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..paths import DATA_DIR

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
