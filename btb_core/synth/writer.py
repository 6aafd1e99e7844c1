"""Writing a Bursted dataset: parquet splits, ``manifest.json`` and the dataset card, swapped into
place atomically (:func:`write`, :func:`check_out`); :func:`push_to_hub`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from .. import __version__
from ..errors import ConfigError
from ..fileio import check_replaceable, replace_dir, shown_path
from ..manifest import enclosing_dataset, foreign_reason

from .config import COLUMNS, DEFAULT_BASE, GENERATOR_VERSION, PRESETS, SPLITS, SYNTH_SOURCE, \
    SynthConfig
from .generator import BurstedDataset, _display_path, file_sha256

# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------

#: Rows per parquet row group of a written split: about one synthetic window of the default build
#: (4,120 rows), so a reader streaming the split (``btb_core.trace.stream``) decodes a few MB at a
#: time instead of a whole-split row group (``datasets`` would otherwise aim at 100 MB groups).
ROW_GROUP_ROWS = 4096


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
                dd[s].to_parquet(str(tmp / name), batch_size=ROW_GROUP_ROWS)
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
