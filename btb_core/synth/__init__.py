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

Modules: :mod:`~btb_core.synth.config` (parameters and presets), :mod:`~btb_core.synth.generator`
(generation), :mod:`~btb_core.synth.writer` (files, manifest, card, Hub upload),
:mod:`~btb_core.synth.explore` (notebook helpers). Everything public is importable from
``btb_core.synth`` as before.
"""

from .config import COLUMNS, DEFAULT_BASE, GENERATOR_VERSION, JOB_KINDS, MAX_BLOCK_IDS, MAX_FIELD, \
    MAX_ROWS, MAX_WINDOW_S, PRESETS, SPLITS, SYNTH_SOURCE, SynthConfig, preset
from .explore import arrivals_per_second, group_summary, row_kinds, window_fanout
from .generator import BurstedDataset, build, file_sha256, generate, load_base, trace_sha256
from .writer import check_out, dataset_card, override_flags, push_to_hub, to_datasetdict, write

__all__ = ["COLUMNS", "DEFAULT_BASE", "GENERATOR_VERSION", "JOB_KINDS", "MAX_BLOCK_IDS", "MAX_FIELD",
           "MAX_ROWS", "MAX_WINDOW_S", "PRESETS", "SPLITS", "SYNTH_SOURCE", "BurstedDataset",
           "SynthConfig", "arrivals_per_second", "build", "check_out", "dataset_card", "file_sha256",
           "generate", "group_summary", "load_base", "override_flags", "preset", "push_to_hub",
           "row_kinds", "to_datasetdict", "trace_sha256", "window_fanout", "write"]
