"""Measured anchors for the cost model: load the shipped profiles and fit an effective MFU.

Three measured sources ship in ``data/profiles/`` (see its README.md and each SOURCE.md):

* Splitwise (``splitwise-sim/perf_model.csv``, Patel et al., ISCA 2024): end-to-end prefill time
  of Llama-2-70B on DGX-H100 / DGX-A100 at TP 2/4/8, batch 1, 128-8,192 prompt tokens, ~5
  repeats. Includes attention, all-reduces, launch and framework overhead, so the MFU fitted to
  it is an *end-to-end* efficiency (~0.32 at TP4 and 8k tokens).
* Vidur (``vidur/compute/<gpu>/.../mlp.csv``, microsoft/vidur): per-layer, per-GPU kernel times
  of every non-attention op; its four GEMMs give the *kernel* efficiency (~0.7 above 2k tokens).
* Vidur (``vidur/network/h100_dgx/send_recv.csv``): NCCL GPU-to-GPU send/recv across two DGX-H100
  nodes over one 400 Gb/s NIC, an anchor for the RDMA tier's per-NIC bandwidth.

Llama-2-70B has the same per-layer shapes as Llama-3.3-70B (hidden 8192, 64 query / 8 KV heads,
FFN 28672); only the vocabulary differs (32,000 vs 128,256), which the prefill term leaves out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .cost import CostModel
from .errors import TraceError
from .paths import DATA_DIR
from .specs import GPUS, MODELS, ModelSpec, NodeSpec

PROFILES_DIR = DATA_DIR / "profiles"
#: Splitwise measured prefill/decode table (MIT, commit 3780881 of Mutinifni/splitwise-sim).
SPLITWISE_CSV = PROFILES_DIR / "splitwise-sim" / "perf_model.csv"
#: Vidur per-op kernel times, Llama-2-70B on H100 (MIT, commit 7d47513 of microsoft/vidur).
VIDUR_H100_MLP_CSV = PROFILES_DIR / "vidur/compute/h100/meta-llama/Llama-2-70b-hf/mlp.csv"
#: Vidur per-op kernel times, Llama-3-70B on A100.
VIDUR_A100_MLP_CSV = PROFILES_DIR / "vidur/compute/a100/meta-llama/Meta-Llama-3-70B/mlp.csv"
#: Vidur NCCL send/recv times on DGX-H100.
VIDUR_SEND_RECV_CSV = PROFILES_DIR / "vidur/network/h100_dgx/send_recv.csv"

#: Splitwise ``hardware`` value -> GPU preset key (the power-capped H100 has no preset).
SPLITWISE_GPU = {"h100-80gb": "h100", "a100-80gb": "a100"}
#: Vidur GEMM ops: QKV projection, attention output projection, gate+up, down.
VIDUR_GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def _read_csv(path: Path, required: tuple[str, ...]) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: profile not found (see data/profiles/README.md)")
    df = pd.read_csv(path)
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
    for col in required:
        values = pd.to_numeric(df[col], errors="coerce") if df[col].dtype == object else df[col]
        if df[col].dtype == object and col not in ("model", "hardware"):
            bad = values.isna()
            if bad.any():
                row = int(np.flatnonzero(bad.to_numpy())[0])
                raise TraceError(f"{path}: line {row + 2}, field {col}: not a number: "
                                 f"{df[col].iloc[row]!r}")
    return df


def _check_positive(df: pd.DataFrame, path: Path, cols: tuple[str, ...]) -> None:
    for col in cols:
        bad = ~(df[col].to_numpy(dtype=float) > 0)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise TraceError(f"{path}: line {row + 2}, field {col}: must be > 0, "
                             f"got {df[col].iloc[row]!r}")


def load_splitwise(path: Path = SPLITWISE_CSV, model: str = "llama2-70b",
                   hardware: str = "h100-80gb", batch_size: int = 1) -> pd.DataFrame:
    """Median measured prefill time per (TP degree, prompt length).

    Parameters
    ----------
    path : Path
        Splitwise ``perf_model.csv``.
    model, hardware : str
        Splitwise ``model`` / ``hardware`` values, e.g. ``"llama2-70b"``, ``"h100-80gb"``.
    batch_size : int
        Requests per prefill batch (1 = a single prompt).

    Returns
    -------
    DataFrame
        One row per (``tensor_parallel``, ``prompt_tokens``), sorted, with ``prefill_ms``
        (median ``prompt_time`` over repeats, ms), ``prefill_ms_min``, ``prefill_ms_max`` and
        ``repeats``.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    TraceError
        A column is missing or a time/size is not a positive number (names file, line, field and
        value), or no row matches ``model``/``hardware``/``batch_size``.
    """
    cols = ("model", "hardware", "prompt_size", "batch_size", "prompt_time", "tensor_parallel")
    df = _read_csv(path, cols)
    _check_positive(df, path, ("prompt_size", "batch_size", "prompt_time", "tensor_parallel"))
    sel = df[(df["model"] == model) & (df["hardware"] == hardware)
             & (df["batch_size"] == batch_size)]
    if sel.empty:
        raise TraceError(f"{path}: no rows with model={model!r}, hardware={hardware!r}, "
                         f"batch_size={batch_size}")
    out = (sel.groupby(["tensor_parallel", "prompt_size"])["prompt_time"]
           .agg(prefill_ms="median", prefill_ms_min="min", prefill_ms_max="max", repeats="size")
           .reset_index().rename(columns={"prompt_size": "prompt_tokens"}))
    out["tensor_parallel"] = out["tensor_parallel"].astype(int)
    out["prompt_tokens"] = out["prompt_tokens"].astype(int)
    return out.sort_values(["tensor_parallel", "prompt_tokens"], ignore_index=True)


def cost_model_for_anchor(gpu: str, tensor_parallel: int, model: str = "llama-2-70b",
                          mfu: float = 0.5) -> CostModel:
    """The :class:`CostModel` matching a measured configuration (attention term on)."""
    return CostModel(MODELS[model], NodeSpec(GPUS[gpu], int(tensor_parallel)), mfu=mfu)


def effective_mfu(measured: pd.DataFrame, gpu: str = "h100",
                  model: str = "llama-2-70b") -> pd.DataFrame:
    """Per measured point, the MFU at which the cost model reproduces it exactly.

    ``mfu_eff = prefill_flops(prompt_tokens) / (tp x peak_flops x prefill_s)``, with the attention
    term, for the rows of :func:`load_splitwise`.

    Returns
    -------
    DataFrame
        ``measured`` plus ``flops`` and ``mfu_eff`` columns.
    """
    out = measured.copy()
    peak = GPUS[gpu].peak_flops
    flops = np.array([cost_model_for_anchor(gpu, tp, model).prefill_flops(s)
                      for tp, s in zip(out["tensor_parallel"], out["prompt_tokens"])])
    out["flops"] = flops
    out["mfu_eff"] = flops / (out["tensor_parallel"].to_numpy() * peak
                              * out["prefill_ms"].to_numpy() * 1e-3)
    return out


def fit_mfu(measured: pd.DataFrame, gpu: str = "h100", model: str = "llama-2-70b",
            min_tokens: int = 1024) -> float:
    """One MFU for all points with ``prompt_tokens >= min_tokens``, least squares in log time.

    Minimises ``sum_i (log t_i - log t_model_i(mfu))^2``, whose solution is the geometric mean of
    the per-point effective MFUs (relative errors weigh short and long prompts alike). Short
    prompts are left out by default: below ~1k tokens the measured time is dominated by fixed
    overhead (~50 ms at 128 tokens), which a FLOP model does not describe.

    Raises
    ------
    ValueError
        No point has ``prompt_tokens >= min_tokens``.
    """
    pts = effective_mfu(measured, gpu, model)
    pts = pts[pts["prompt_tokens"] >= min_tokens]
    if pts.empty:
        raise ValueError(f"no measured point with prompt_tokens >= {min_tokens}")
    return float(np.exp(np.log(pts["mfu_eff"].to_numpy()).mean()))


def compare_prefill(measured: pd.DataFrame, mfu: float, gpu: str = "h100",
                    model: str = "llama-2-70b") -> pd.DataFrame:
    """Measured vs modelled prefill time at ``mfu``.

    Returns
    -------
    DataFrame
        ``measured`` plus ``model_ms`` and ``error_pct`` (``100 x (model - measured) /
        measured``).
    """
    out = measured.copy()
    out["model_ms"] = [1e3 * cost_model_for_anchor(gpu, tp, model, mfu).prefill_s(s)
                       for tp, s in zip(out["tensor_parallel"], out["prompt_tokens"])]
    out["error_pct"] = 100.0 * (out["model_ms"] - out["prefill_ms"]) / out["prefill_ms"]
    return out


def fit_mfu_per_tp(measured: pd.DataFrame, gpu: str = "h100", model: str = "llama-2-70b",
                   min_tokens: int = 1024) -> pd.DataFrame:
    """:func:`fit_mfu` per TP degree, with the fit's errors over the fitted points.

    Returns
    -------
    DataFrame
        ``tensor_parallel``, ``mfu_fit``, ``max_abs_error_pct`` (over points with
        ``prompt_tokens >= min_tokens`` at ``mfu_fit``), ``mfu_at_longest`` (effective MFU of the
        longest prompt) and ``longest_tokens``.
    """
    rows = []
    for tp, part in measured.groupby("tensor_parallel"):
        mfu = fit_mfu(part, gpu, model, min_tokens)
        cmp = compare_prefill(part, mfu, gpu, model)
        cmp = cmp[cmp["prompt_tokens"] >= min_tokens]
        last = effective_mfu(part.nlargest(1, "prompt_tokens"), gpu, model).iloc[0]
        rows.append({"tensor_parallel": int(tp), "mfu_fit": mfu,
                     "max_abs_error_pct": float(cmp["error_pct"].abs().max()),
                     "mfu_at_longest": float(last["mfu_eff"]),
                     "longest_tokens": int(last["prompt_tokens"])})
    return pd.DataFrame(rows)


def anchor_comparison(measured: pd.DataFrame, gpu: str = "h100", model: str = "llama-2-70b",
                      table_mfu: float = 0.5, min_tokens: int = 1024) -> pd.DataFrame:
    """Measured vs model at the table's MFU and at the MFU fitted per TP, stacked.

    Returns
    -------
    DataFrame
        :func:`compare_prefill` rows plus ``label`` (``"MFU 0.5 (table)"`` or
        ``"MFU fitted per TP"``) and ``mfu``; the input of
        :func:`btb_core.plots.cost.prefill_anchor_chart`.
    """
    fits = fit_mfu_per_tp(measured, gpu, model, min_tokens).set_index("tensor_parallel")
    parts = []
    for tp, part in measured.groupby("tensor_parallel"):
        for label, mfu in ((f"MFU {table_mfu:g} (table)", table_mfu),
                           ("MFU fitted per TP", float(fits.loc[tp, "mfu_fit"]))):
            cmp = compare_prefill(part, mfu, gpu, model)
            cmp["label"], cmp["mfu"] = label, mfu
            parts.append(cmp)
    return pd.concat(parts, ignore_index=True)


def gemm_flops_per_layer(spec: ModelSpec, tokens: np.ndarray,
                         tensor_parallel: np.ndarray) -> np.ndarray:
    """FLOPs of one layer's four GEMMs on one GPU: ``2 x tokens x (QKV + O + 3 x h x ffn) / TP``."""
    h, d = spec.hidden_size, spec.head_dim
    weights = (h * (spec.num_q_heads + 2 * spec.num_kv_heads) * d + spec.num_q_heads * d * h
               + 3 * h * spec.ffn_size)
    return 2.0 * np.asarray(tokens, dtype=float) * weights / np.asarray(tensor_parallel, float)


def load_vidur_gemm(path: Path = VIDUR_H100_MLP_CSV, gpu: str = "h100",
                    model: str = "llama-2-70b") -> pd.DataFrame:
    """Per-layer GEMM time and achieved MFU from a Vidur ``mlp.csv``.

    Returns
    -------
    DataFrame
        One row per (``tensor_parallel``, ``tokens``): ``gemm_ms`` (sum of the medians of the
        four GEMM ops, ms, one layer, one GPU), ``nonattn_ms`` (all profiled ops but the
        once-per-model embedding), ``gemm_flops`` and ``gemm_mfu`` (achieved / dense peak).

    Raises
    ------
    FileNotFoundError, TraceError
        Missing file, missing column or a non-positive time (names file, line, field, value).
    """
    ops = tuple(f"time_stats.{op}.median" for op in VIDUR_GEMM_OPS)
    df = _read_csv(path, ("num_tokens", "num_tensor_parallel_workers", *ops))
    _check_positive(df, path, ("num_tokens", "num_tensor_parallel_workers", *ops))
    nonattn = [c for c in df.columns if c.startswith("time_stats.") and c.endswith(".median")
               and ".emb." not in c]
    out = pd.DataFrame({
        "tensor_parallel": df["num_tensor_parallel_workers"].astype(int),
        "tokens": df["num_tokens"].astype(int),
        "gemm_ms": df[list(ops)].sum(axis=1),
        "nonattn_ms": df[nonattn].sum(axis=1),
    })
    out = out.groupby(["tensor_parallel", "tokens"], as_index=False).median()
    spec = MODELS[model]
    out["gemm_flops"] = gemm_flops_per_layer(spec, out["tokens"], out["tensor_parallel"])
    out["gemm_mfu"] = out["gemm_flops"] / (out["gemm_ms"] * 1e-3 * GPUS[gpu].peak_flops)
    return out.sort_values(["tensor_parallel", "tokens"], ignore_index=True)


def gemm_mfu_summary(gemm: pd.DataFrame, min_tokens: int = 2048) -> pd.DataFrame:
    """Median, min and max achieved GEMM MFU per TP degree over ``tokens >= min_tokens``."""
    sel = gemm[gemm["tokens"] >= min_tokens]
    return (sel.groupby("tensor_parallel")["gemm_mfu"]
            .agg(gemm_mfu_median="median", gemm_mfu_min="min", gemm_mfu_max="max", points="size")
            .reset_index())


def load_send_recv(path: Path = VIDUR_SEND_RECV_CSV, devices_per_node: int = 1) -> pd.DataFrame:
    """Median NCCL send/recv time per message size; ``devices_per_node=1`` = across nodes (NIC).

    Returns
    -------
    DataFrame
        ``size_bytes``, ``time_ms`` (median), ``bytes_per_s``, sorted by size.
    """
    cols = ("size", "devices_per_node", "time_stats.send_recv.median")
    df = _read_csv(path, cols)
    _check_positive(df, path, ("size", "time_stats.send_recv.median"))
    sel = df[df["devices_per_node"] == devices_per_node]
    if sel.empty:
        raise TraceError(f"{path}: no rows with devices_per_node={devices_per_node}")
    out = (sel.groupby("size")["time_stats.send_recv.median"].median().reset_index()
           .rename(columns={"size": "size_bytes", "time_stats.send_recv.median": "time_ms"}))
    out["bytes_per_s"] = out["size_bytes"] / (out["time_ms"] * 1e-3)
    return out.sort_values("size_bytes", ignore_index=True)


__all__ = ["SPLITWISE_CSV", "VIDUR_H100_MLP_CSV", "VIDUR_A100_MLP_CSV", "VIDUR_SEND_RECV_CSV",
           "load_splitwise", "effective_mfu", "fit_mfu", "compare_prefill", "load_vidur_gemm",
           "gemm_mfu_summary", "load_send_recv", "fit_mfu_per_tp", "anchor_comparison",
           "cost_model_for_anchor", "gemm_flops_per_layer"]
