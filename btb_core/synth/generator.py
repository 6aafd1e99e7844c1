"""Generating a Bursted dataset in memory: :class:`BurstedDataset`, :func:`generate` (normal and
synthetic windows from a base trace and a seeded generator), :func:`load_base` and :func:`build`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .. import __version__
from ..errors import ConfigError, TraceError
from ..fileio import jsonable, shown_path
from ..paths import REPO_ROOT
from ..trace import Trace, from_table

from .config import COLUMNS, DEFAULT_BASE, GENERATOR_VERSION, MAX_BLOCK_IDS, SPLITS, SYNTH_SOURCE, \
    SynthConfig, _US, preset

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
    from ..trace import detect_format, load_trace

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
          seed: int = 0, preset_name: str | None = None, **load_kwargs: Any) -> BurstedDataset:
    """Convenience: load the base (if a path), create ``numpy.random.default_rng(seed)``, generate.

    Parameters
    ----------
    base : Trace or path-like or None
        Default :data:`DEFAULT_BASE`.
    config : SynthConfig or str
        A config or a preset name (:data:`PRESETS`).
    seed : int
    preset_name : str, optional
        The preset a :class:`SynthConfig` ``config`` was made from (``preset(name, **overrides)``),
        recorded in the manifest and named on the dataset card with the flags that reproduce
        the overrides; default: ``config`` when it is a preset name, else none ("custom").
    **load_kwargs
        Passed to :func:`load_base` (``fmt``, ``block_tokens``, ``max_rows``).
    """
    if preset_name is None and isinstance(config, str):
        preset_name = config
    cfg = preset(config) if isinstance(config, str) else config
    if isinstance(base, Trace):
        trace, info = base, {"path": None, "format": None, "file_sha256": None}
    else:
        trace, info = load_base(base, **load_kwargs)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed = {seed!r}: must be a non-negative integer")
    return generate(trace, cfg, np.random.default_rng(int(seed)), seed=int(seed),
                    preset_name=preset_name, base_info=info)
