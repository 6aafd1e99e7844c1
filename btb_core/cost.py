"""Cost model: prefill, decode step and KV-load times for one replica (DESIGN.md section 3).

The quantities, for a replica of ``n`` GPUs (node aggregates):

========================  ==================================================================
prefill FLOPs             ``2 x P x S + 4 x layers x q_heads x head_dim x (S x C + S^2 / 2)``
                          for ``S`` new tokens after ``C`` cached ones; ``P`` = active
                          parameters that are matmul weights (embeddings excluded, see
                          :attr:`btb_core.specs.ModelSpec.embedding_params`); the second
                          (causal attention) term is dropped when ``attention=False``.
prefill time              ``FLOPs / (n x peak_flops x MFU)``
decode step               ``max((active weight bytes + T x kv_bytes) / (n x hbm_bw x MBU),
                          2 x P_active x b / (n x peak_flops x MFU))``
load from a tier          ``setup_latency + tokens x kv_bytes / tier bandwidth``
========================  ==================================================================

:func:`reference_cost_model` is the published linear reference table (4x H100 at 989e12 FLOP/s,
MFU 0.5, 70.6e9 parameters, no attention term, no setup latency): 71.4 us of prefill per token.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping

import numpy as np

from .errors import ConfigError
from .specs import (GPUS, MODELS, SETUPS, STANDARD_SETUP, ModelSpec, NodeSpec, model_for,
                    node_for)

#: KV tiers a prefix can be loaded from, fastest first.
TIERS: tuple[str, ...] = ("hbm", "dram", "rdma", "nvme")

#: Default fixed latency per transfer, seconds. Assumed orders of magnitude, not measurements:
#: HBM 0 (already resident; an on-device copy is bandwidth-bound); DRAM 10 us (a
#: ``cudaMemcpyAsync`` launch plus DMA setup, a few us per call in the CUDA C++ Best Practices
#: Guide, https://docs.nvidia.com/cuda/cuda-c-best-practices-guide/); RDMA 50 us (one-sided verbs
#: take ~2 us on ConnectX-7, plus transfer-engine bookkeeping such as NIXL/Mooncake descriptor
#: exchange); NVMe 100 us (random-read latency of data-centre Gen4/Gen5 drives, e.g. Samsung
#: PM1743 datasheet ~ 80-100 us). They are negligible next to bandwidth time for prefixes of
#: thousands of tokens; override them with ``setup_latency_s``.
DEFAULT_SETUP_LATENCY_S: Mapping[str, float] = MappingProxyType(
    {"hbm": 0.0, "dram": 10e-6, "rdma": 50e-6, "nvme": 100e-6})

#: No setup latency (the published linear table).
ZERO_SETUP_LATENCY_S: Mapping[str, float] = MappingProxyType({t: 0.0 for t in TIERS})

#: Token counts of the published table (``btb cost`` default rows).
DEFAULT_TOKENS: tuple[int, ...] = (500, 1_000, 2_000, 8_000, 16_000, 32_000, 64_000, 128_000)

#: Name of the published linear reference setup accepted by :func:`cost_model_for_setup`.
REFERENCE_SETUP = "70b_h100x4_reference"


_INF = float("inf")
_BOOLS = (bool, np.bool_)


def _tokens(name: str, value):
    """``value`` if it is a finite count >= 0 (a number or a numeric array), else ``ConfigError``.

    Guards the public cost API at its boundary: a negative, NaN or infinite count would give a
    negative or NaN time, and a bool is not a count. Scalars take a fast path (the simulator calls
    these methods per event).
    """
    try:
        if value.__class__ not in _BOOLS and 0 <= value < _INF:
            return value
    except (TypeError, ValueError):  # not comparable, or an array with several elements
        pass
    arr = np.asarray(value) if not isinstance(value, (str, bytes)) else None
    if arr is not None and arr.dtype.kind in "iuf" and arr.size and bool(
            np.all(np.isfinite(arr)) and np.all(arr >= 0)):
        return value
    if arr is not None and arr.dtype.kind in "iuf" and not arr.size:
        return value
    raise ConfigError(f"{name} = {value!r}: must be a finite number >= 0 (not a bool)")


@dataclass(frozen=True)
class CostModel:
    """Times for one replica running ``model`` on ``node``.

    Parameters
    ----------
    model : ModelSpec
    node : NodeSpec
    mfu : float, default 0.5
        Prefill model-FLOPs utilisation, in (0, 1]. 0.5 is the published table's value; the
        Splitwise DGX-H100 measurements fit ~0.32 end to end (see :mod:`btb_core.anchors`).
    mbu : float, default 0.8
        Decode memory-bandwidth utilisation, in (0, 1].
    attention : bool, default True
        Include the causal attention FLOPs term. ``False`` gives the linear table.
    setup_latency_s : Mapping[str, float]
        Fixed seconds per transfer by tier; keys a subset of :data:`TIERS` (missing tiers take
        :data:`DEFAULT_SETUP_LATENCY_S`), values >= 0.
    attention_mfu : float or None, default None
        Utilisation of the attention term, in (0, 1], when it differs from ``mfu`` (None: same as
        ``mfu``). Attention kernels and GEMMs rarely reach the same fraction of peak; on a CPU the
        gap is large (fitted by :func:`btb_core.engine.calibrate.fit_cost`). With it set,
        :meth:`prefill_flops` counts the attention term at ``mfu / attention_mfu`` times its FLOPs
        (equivalent FLOPs at ``mfu``), so that every time is still ``flops / (peak x mfu)``.
    step_overhead_s : float, default 0.0
        Fixed seconds per engine step (scheduling, kernel launches, sampling), >= 0. The
        simulator adds it once to every ``chunked`` iteration, ``prefill_first`` prefill and decode
        step; :meth:`prefill_s` and :meth:`decode_step_s` exclude it. 0 on the GPU presets
        (negligible next to 70B-model steps); fitted on the CPU engine, where it dominates.
    context_s_per_token : float, default 0.0
        Seconds per token of context already in the KV cache when a prefill chunk starts, per
        chunk, >= 0: per-sequence work that grows with the cached context and that the FLOP terms
        miss (on the CPU engine, the attention kernel's reads of the cached KV and the front end's
        handling of the whole prompt on the same core; see
        ``benchmarks/engine_context_cost.py``). The simulator adds ``context_s_per_token x C`` to a
        ``chunked`` iteration for each of its prefill chunks (``C`` = that request's tokens
        already computed or cached) and to a ``prefill_first`` prefill (``C`` = its cached
        tokens); :meth:`prefill_s` excludes it (:meth:`context_s` gives it). 0 on the GPU presets
        (no measurement); fitted on the CPU engine (:func:`btb_core.engine.calibrate.fit_cost`).
    arrival_overhead_s : float, default 0.0
        Seconds that one request arriving at a replica takes from the operation the replica is
        computing at that moment, >= 0: front-end work (HTTP, tokenising, handing the request to
        the engine) done on the same cores as the engine's step. The simulator pushes the end of
        a running ``chunked`` iteration, ``prefill_first`` prefill or decode stretch back by it
        for every request routed to the replica while it runs (not while it is idle or paused for
        a copy: a lone request's own front-end time is in its TTFT already). 0 on the GPU presets
        (the front end runs on host cores of its own); on the CPU engine, measured by
        :func:`btb_core.engine.calibrate.measure` (4.5-5.4 ms per request in
        ``benchmarks/engine_arrival_cost.py``).

    Raises
    ------
    ConfigError
        ``mfu``/``mbu`` outside (0, 1]; ``step_overhead_s``, ``context_s_per_token`` or
        ``arrival_overhead_s`` negative, NaN, infinite or not a number (a bool or a string);
        an unknown tier or a negative latency; from every
        method, a token count, batch or FLOP count that is negative, NaN, infinite or a bool
        (scalars or arrays).

    Notes
    -----
    Every method is a few float operations on constants precomputed at construction, since the
    simulator calls them per request and per step.
    """

    model: ModelSpec
    node: NodeSpec
    mfu: float = 0.5
    mbu: float = 0.8
    attention: bool = True
    setup_latency_s: Mapping[str, float] = field(default_factory=lambda: DEFAULT_SETUP_LATENCY_S,
                                                 hash=False)
    attention_mfu: float | None = None
    step_overhead_s: float = 0.0
    context_s_per_token: float = 0.0
    arrival_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelSpec):
            raise ConfigError(f"CostModel: field model must be a ModelSpec, got {self.model!r}")
        if not isinstance(self.node, NodeSpec):
            raise ConfigError(f"CostModel: field node must be a NodeSpec, got {self.node!r}")
        setattr_ = object.__setattr__
        for name in ("mfu", "mbu", "attention_mfu", "step_overhead_s", "context_s_per_token",
                     "arrival_overhead_s"):
            value = getattr(self, name)
            if value is None and name == "attention_mfu":
                continue
            if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
                raise ConfigError(f"CostModel: field {name} must be a number, got {value!r}")
            value = float(value)          # numpy scalars welcome; stored as float
            setattr_(self, name, value)
            if name in ("mfu", "mbu", "attention_mfu"):
                if not 0.0 < value <= 1.0:
                    raise ConfigError(f"CostModel: field {name} must be in (0, 1]"
                                      f"{' or None' if name == 'attention_mfu' else ''}, got {value!r}")
            elif not 0.0 <= value < float("inf"):
                raise ConfigError(f"CostModel: field {name} must be finite and >= 0 seconds, "
                                  f"got {value!r}")
        am = self.attention_mfu
        latency = dict(DEFAULT_SETUP_LATENCY_S)
        for tier, value in dict(self.setup_latency_s).items():
            if tier not in TIERS:
                raise ConfigError(f"CostModel: setup_latency_s has unknown tier {tier!r}; "
                                  f"valid: {', '.join(TIERS)}")
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ConfigError(f"CostModel: setup_latency_s[{tier!r}] must be >= 0 seconds, "
                                  f"got {value!r}")
            latency[tier] = float(value)
        setattr_(self, "setup_latency_s", MappingProxyType(latency))
        m, n = self.model, self.node
        kv = m.kv_bytes_per_token
        setattr_(self, "_kv", kv)
        setattr_(self, "_lin_flops_per_token", 2.0 * m.matmul_params_active)
        attn = 4.0 * m.num_layers * m.num_q_heads * m.head_dim if self.attention else 0.0
        if am is not None:
            attn *= self.mfu / am              # equivalent FLOPs at mfu
        setattr_(self, "_attn_coeff", attn)
        setattr_(self, "_inv_flops_per_s", 1.0 / (n.peak_flops * self.mfu))
        setattr_(self, "_inv_hbm_per_s", 1.0 / (n.hbm_bytes_per_s * self.mbu))
        setattr_(self, "_decode_flops_per_seq", 2.0 * m.params_active)
        setattr_(self, "_active_weight_bytes", float(m.active_weight_bytes))
        bandwidth = {"hbm": n.hbm_bytes_per_s, "dram": n.dram_bytes_per_s,
                     "rdma": n.rdma_bytes_per_s, "nvme": n.nvme_bytes_per_s}
        setattr_(self, "_tier", {t: (latency[t], kv / bandwidth[t]) for t in TIERS})

    # -- sizes -------------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token (:attr:`ModelSpec.kv_bytes_per_token`)."""
        return self._kv

    # -- compute -----------------------------------------------------------------------------
    def prefill_flops(self, new_tokens: float, cached_tokens: float = 0) -> float:
        """FLOPs to prefill ``new_tokens`` after ``cached_tokens`` already in the KV cache.

        ``2 x P x S + 4 x layers x q_heads x head_dim x (S x C + S^2 / 2)``; the second term only
        if ``attention`` (times ``mfu / attention_mfu`` when ``attention_mfu`` is set). Returns 0
        for ``new_tokens == 0``.
        """
        s = _tokens("new_tokens", new_tokens)
        cached_tokens = _tokens("cached_tokens", cached_tokens)
        return self._lin_flops_per_token * s + self._attn_coeff * (s * cached_tokens + 0.5 * s * s)

    def attention_share(self, new_tokens: float, cached_tokens: float = 0) -> float:
        """Fraction of prefill FLOPs in the attention term (0 when ``attention`` is off)."""
        total = self.prefill_flops(new_tokens, cached_tokens)
        if total <= 0:
            return 0.0
        s = new_tokens
        return self._attn_coeff * (s * cached_tokens + 0.5 * s * s) / total

    def compute_s(self, flops: float) -> float:
        """Seconds for ``flops`` at ``node.peak_flops x mfu``."""
        return _tokens("flops", flops) * self._inv_flops_per_s

    def prefill_s(self, new_tokens: float, cached_tokens: float = 0) -> float:
        """Seconds to prefill ``new_tokens`` after ``cached_tokens`` cached ones."""
        s = _tokens("new_tokens", new_tokens)
        cached_tokens = _tokens("cached_tokens", cached_tokens)
        return (self._lin_flops_per_token * s
                + self._attn_coeff * (s * cached_tokens + 0.5 * s * s)) * self._inv_flops_per_s

    def context_s(self, cached_tokens: float) -> float:
        """Seconds of a prefill chunk's context term: ``context_s_per_token x cached_tokens``
        (see the class docstring; 0 unless the field is set)."""
        return _tokens("cached_tokens", cached_tokens) * self.context_s_per_token

    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        """Seconds for one decode step of ``batch`` sequences holding ``context_tokens`` in total.

        Memory time ``(active weight bytes + context_tokens x kv_bytes) / (hbm_bw x mbu)`` (weights
        read once per step, every sequence's KV read once), or, if larger, the compute time of
        ``2 x params_active x batch`` FLOPs at ``peak x mfu`` (large batches turn compute-bound).
        For MoE models the weight bytes are the active experts' only, a lower bound once a batch
        touches more experts than one token does.
        """
        batch = _tokens("batch", batch)
        context_tokens = _tokens("context_tokens", context_tokens)
        mem = (self._active_weight_bytes + context_tokens * self._kv) * self._inv_hbm_per_s
        comp = self._decode_flops_per_seq * batch * self._inv_flops_per_s
        return mem if mem >= comp else comp

    # -- transfers ---------------------------------------------------------------------------
    def load_s(self, tier: str, tokens: float) -> float:
        """Seconds to make ``tokens`` tokens of KV usable from ``tier``.

        ``setup_latency_s[tier] + tokens x kv_bytes / tier bandwidth``; tiers :data:`TIERS`.

        Raises
        ------
        ValueError (ConfigError)
            Unknown tier.
        """
        try:
            latency, s_per_token = self._tier[tier]
        except KeyError:
            raise ConfigError(f"unknown KV tier {tier!r}; valid: {', '.join(TIERS)}") from None
        return latency + _tokens("tokens", tokens) * s_per_token

    # -- memory ------------------------------------------------------------------------------
    def kv_budget_bytes(self, reserve_fraction: float = 0.1) -> int:
        """HBM left for KV: node HBM - weights - ``reserve_fraction`` x node HBM.

        The reserve stands for activations, CUDA graphs and fragmentation (vLLM's default
        ``gpu_memory_utilization=0.9`` leaves the same 10 %).

        Raises
        ------
        ConfigError
            ``reserve_fraction`` outside [0, 1), or the weights plus reserve do not fit (message
            names model, node, bytes needed and available).
        """
        if not isinstance(reserve_fraction, (int, float)) or not 0.0 <= reserve_fraction < 1.0:
            raise ConfigError(f"reserve_fraction must be in [0, 1), got {reserve_fraction!r}")
        hbm = self.node.hbm_capacity_bytes
        weights = self.model.weight_bytes
        budget = int(hbm - weights - reserve_fraction * hbm)
        if budget <= 0:
            raise ConfigError(
                f"model {self.model.name} does not fit node {self.node.name}: needs "
                f"{weights:,} B of weights + {reserve_fraction:g} x {hbm:,.0f} B reserve = "
                f"{weights + reserve_fraction * hbm:,.0f} B, node HBM is {hbm:,.0f} B")
        return budget

    def check_fits(self, reserve_fraction: float = 0.1) -> None:
        """Raise ConfigError unless the weights fit (see :meth:`kv_budget_bytes`)."""
        self.kv_budget_bytes(reserve_fraction)

    def kv_capacity_tokens(self, reserve_fraction: float = 0.1) -> int:
        """Tokens of KV the budget holds: ``kv_budget_bytes // kv_bytes_per_token``."""
        return self.kv_budget_bytes(reserve_fraction) // self._kv

    def replace(self, **changes) -> "CostModel":
        """A copy with fields changed (re-validated)."""
        return dataclasses.replace(self, **changes)

    # -- tables ------------------------------------------------------------------------------
    def table_rows(self, tokens: Iterable[int] = DEFAULT_TOKENS) -> list[dict]:
        """One dict per token count: ``tokens``, ``prefill_ms``, ``hbm_ms``, ``dram_ms``,
        ``rdma_ms``, ``nvme_ms`` (milliseconds, a cold prefix of that length)."""
        rows = []
        for n in tokens:
            row = {"tokens": int(n), "prefill_ms": 1e3 * self.prefill_s(n)}
            for tier in TIERS:
                row[f"{tier}_ms"] = 1e3 * self.load_s(tier, n)
            rows.append(row)
        return rows

    def describe(self) -> dict:
        """The setup as a JSON-able dict (what ``btb cost --json`` prints under ``setup``)."""
        m, n = self.model, self.node
        return {
            "model": m.name, "gpu": n.gpu.name, "num_gpus": n.num_gpus,
            "disk_shared": n.disk_shared, "mfu": self.mfu, "mbu": self.mbu,
            "attention": self.attention, "params_total": m.params_total,
            "params_active": m.params_active, "matmul_params_active": m.matmul_params_active,
            "kv_bytes_per_token": self._kv, "node_peak_flops": n.peak_flops,
            "node_bytes_per_s": {"hbm": n.hbm_bytes_per_s, "dram": n.dram_bytes_per_s,
                                 "rdma": n.rdma_bytes_per_s, "nvme": n.nvme_bytes_per_s},
            "setup_latency_s": dict(self.setup_latency_s),
            "prefill_us_per_token_linear": 1e6 * self._lin_flops_per_token * self._inv_flops_per_s,
            **({"attention_mfu": self.attention_mfu} if self.attention_mfu is not None else {}),
            **({"step_overhead_s": self.step_overhead_s} if self.step_overhead_s else {}),
            **({"context_s_per_token": self.context_s_per_token}
               if self.context_s_per_token else {}),
            **({"arrival_overhead_s": self.arrival_overhead_s}
               if self.arrival_overhead_s else {}),
        }


def ratios(rows: list[dict]) -> dict[str, list[float]]:
    """Prefill time over each tier's load time, per row: ``{"prefill_over_<tier>": [...]}``."""
    return {f"prefill_over_{tier}": [r["prefill_ms"] / r[f"{tier}_ms"] if r[f"{tier}_ms"] > 0
                                     else float("inf") for r in rows] for tier in TIERS}


def reference_cost_model() -> CostModel:
    """The published linear reference table's setup, exactly.

    Node = 4x H100 at 989e12 FLOP/s per GPU, MFU 0.5, 70.6e9 parameters all counted in
    ``2 x P x S`` (no embedding exclusion), no attention term; node bandwidths HBM 13.4 TB/s,
    DRAM 220 GB/s, RDMA 200 GB/s, NVMe 7 GB/s (one shared drive); no setup latency. Gives
    71.4 us/token and, at 8,000 tokens, prefill 571 ms, RDMA 13.1 ms, DRAM 11.9 ms,
    NVMe 374 ms, HBM 0.196 ms.

    It differs from the ``70b_h100x4`` preset only in the rounded constants: the preset counts
    70,553,706,496 parameters from the HF config and leaves out the 2.1e9 embedding/LM-head
    parameters of the per-token term, and uses the datasheet 989.4e12 FLOP/s.
    """
    model = dataclasses.replace(MODELS["llama-3.3-70b"], name="Llama-3.3-70B (published 70.6B)",
                                params_total=70_600_000_000, params_active=70_600_000_000,
                                embedding_params=0)
    gpu = dataclasses.replace(GPUS["h100"], name="H100-SXM (989e12)", peak_flops=989e12)
    return CostModel(model, NodeSpec(gpu, 4, disk_shared=True), mfu=0.5, attention=False,
                     setup_latency_s=ZERO_SETUP_LATENCY_S)


def linear_cost_model(name: str = STANDARD_SETUP) -> CostModel:
    """The linear (no attention term) cost model of a named setup, as the reference study used it.

    ``70b_h100x4`` (and :data:`REFERENCE_SETUP`) give :func:`reference_cost_model` exactly: the
    study's rounded constants (70.6e9 parameters at 989e12 FLOP/s per GPU, 71.4 us/token), so a
    single 65,792-token cold prefill takes 4.697 s, the study's p95. Any other setup keeps its own
    model and node with every parameter counted in ``2 x P x S`` (no embedding exclusion), no
    attention term and no setup latency, as ``btb cost --linear`` prints it.

    Raises
    ------
    KeyError
        Unknown setup; the message lists the valid names.
    """
    if name in (STANDARD_SETUP, REFERENCE_SETUP):
        return reference_cost_model()
    cm = cost_model_for_setup(name)
    return CostModel(dataclasses.replace(cm.model, embedding_params=0), cm.node, attention=False,
                     setup_latency_s=ZERO_SETUP_LATENCY_S)


def cost_model_for_setup(name: str = STANDARD_SETUP, **overrides) -> CostModel:
    """The :class:`CostModel` of a named setup (:data:`btb_core.specs.SETUPS`).

    Parameters
    ----------
    name : str
        A key of ``SETUPS`` or :data:`REFERENCE_SETUP`.
    **overrides
        CostModel fields (``mfu``, ``mbu``, ``attention``, ``setup_latency_s``).

    Raises
    ------
    KeyError
        Unknown setup; the message lists the valid names.
    ConfigError
        An override is invalid.
    """
    if name == REFERENCE_SETUP:
        return reference_cost_model().replace(**overrides) if overrides else reference_cost_model()
    try:
        model_key, gpu_key, num_gpus = SETUPS[name]
    except KeyError:
        valid = ", ".join(sorted([*SETUPS, REFERENCE_SETUP]))
        raise KeyError(f"unknown setup {name!r}; valid: {valid}") from None
    return CostModel(model_for(model_key), node_for(gpu_key, num_gpus), **overrides)


def cost_table(cm: CostModel, tokens: Iterable[int] = DEFAULT_TOKENS):
    """The cost table as a DataFrame, with and without the attention term.

    Returns
    -------
    pandas.DataFrame
        One row per token count: ``tokens``; ``prefill_ms`` (with the attention term, as ``cm``
        is configured) and ``prefill_linear_ms`` (same model, attention term off);
        ``attention_share`` of prefill FLOPs; ``hbm_ms``, ``dram_ms``, ``rdma_ms``, ``nvme_ms``;
        and ``prefill_over_<tier>`` ratios (prefill with attention over load time).
    """
    import pandas as pd

    att = cm if cm.attention else cm.replace(attention=True)
    lin = cm.replace(attention=False)
    rows = att.table_rows(tokens)
    for row in rows:
        row["prefill_linear_ms"] = 1e3 * lin.prefill_s(row["tokens"])
        row["attention_share"] = att.attention_share(row["tokens"])
    df = pd.DataFrame(rows)
    for tier in TIERS:
        df[f"prefill_over_{tier}"] = df["prefill_ms"] / df[f"{tier}_ms"]
    cols = ["tokens", "prefill_ms", "prefill_linear_ms", "attention_share",
            *(f"{t}_ms" for t in TIERS), *(f"prefill_over_{t}" for t in TIERS)]
    return df[cols]


#: Display names of the time sources in long tables and charts.
SOURCE_LABELS: Mapping[str, str] = MappingProxyType({
    "prefill": "prefill (with attention)", "prefill_linear": "prefill (linear, no attention)",
    "hbm": "load from HBM", "dram": "load from host DRAM", "rdma": "copy over RDMA",
    "nvme": "load from NVMe"})


def time_vs_tokens(cm: CostModel, tokens: Iterable[int]):
    """Long table for a log-log chart: ``tokens``, ``source`` (a :data:`SOURCE_LABELS` value),
    ``ms``; prefill with and without the attention term and the four tier loads."""
    import pandas as pd

    df = cost_table(cm, tokens)
    parts = []
    for key, label in SOURCE_LABELS.items():
        parts.append(pd.DataFrame({"tokens": df["tokens"], "source": label,
                                   "ms": df[f"{key}_ms"]}))
    return pd.concat(parts, ignore_index=True)


def attention_share_table(model_keys: Iterable[str], tokens: Iterable[int]):
    """Attention share of prefill FLOPs (cold prefix) per model and length: ``model``,
    ``tokens``, ``attention_share``. The share depends on the model only, not the node."""
    import pandas as pd

    rows = []
    for key in model_keys:
        cm = CostModel(model_for(key), NodeSpec(GPUS["h100"], 1))
        for n in tokens:
            rows.append({"model": cm.model.name, "tokens": int(n),
                         "attention_share": cm.attention_share(n)})
    return pd.DataFrame(rows)


def setups_table(names: Iterable[str], tokens: int = 65_536):
    """One row per named setup at ``tokens``: prefill (with attention) and RDMA copy times, their
    ratio, KV bytes/token and the KV budget (NaN and ``fits=False`` when the weights do not fit).
    """
    import pandas as pd

    rows = []
    for name in names:
        cm = cost_model_for_setup(name)
        try:
            budget, fits = cm.kv_budget_bytes() / 1e9, True
        except ConfigError:
            budget, fits = float("nan"), False
        rows.append({"setup": name, "model": cm.model.name, "node": cm.node.name,
                     "tokens": tokens, "prefill_ms": 1e3 * cm.prefill_s(tokens),
                     "rdma_ms": 1e3 * cm.load_s("rdma", tokens),
                     "prefill_over_rdma": cm.prefill_s(tokens) / cm.load_s("rdma", tokens),
                     "kv_bytes_per_token": cm.kv_bytes_per_token, "fits": fits,
                     "kv_budget_gb": budget})
    return pd.DataFrame(rows)


__all__ = ["CostModel", "TIERS", "DEFAULT_TOKENS", "DEFAULT_SETUP_LATENCY_S",
           "ZERO_SETUP_LATENCY_S", "REFERENCE_SETUP", "reference_cost_model", "linear_cost_model",
           "cost_model_for_setup", "ratios", "cost_table", "time_vs_tokens",
           "attention_share_table", "setups_table", "SOURCE_LABELS"]
