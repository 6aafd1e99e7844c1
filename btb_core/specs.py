"""Model, GPU and node specs, with cited presets.

A :class:`ModelSpec` holds the architecture numbers of a published model config (Hugging Face
``config.json`` fields), a :class:`GPUSpec` the datasheet numbers of one accelerator, and a
:class:`NodeSpec` one tensor-parallel replica (``num_gpus`` GPUs of one kind). The cost model
(:mod:`btb_core.cost`) turns them into times.

Every preset cites its source next to it. Two conventions hold throughout:

* bytes and FLOP/s are SI (1 GB = 1e9 B, 1 TB/s = 1e12 B/s), as datasheets use them;
* GPU ``peak_flops`` is the *dense* (no 2:4 sparsity) BF16/FP16 tensor-core rate. Models whose
  weights ship in FP8 are still costed at the BF16 rate (a conservative choice; the FP8 rate is 2x).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ConfigError


def _positive(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ConfigError(f"{type(obj).__name__} {getattr(obj, 'name', '')!r}: field {name} "
                              f"must be a positive number, got {value!r}")


def _positive_int(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{type(obj).__name__} {getattr(obj, 'name', '')!r}: field {name} "
                              f"must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one transformer model.

    Parameters
    ----------
    name : str
        Display name, e.g. ``"Llama-3.3-70B"``.
    num_layers : int
        Transformer blocks (HF ``num_hidden_layers``).
    hidden_size : int
        Residual width (HF ``hidden_size``).
    num_q_heads : int
        Query heads (HF ``num_attention_heads``).
    num_kv_heads : int
        Key/value heads (HF ``num_key_value_heads``); equal to ``num_q_heads`` without GQA.
    head_dim : int
        Per-head width used for the attention FLOPs term, ``4 x layers x q_heads x head_dim``
        multiply-adds per (query, key) pair: QK^T and PV each cost ``2 x head_dim`` FLOPs. For MLA
        models (query/key width differs from value width) it is their mean, see ``kv_latent_dim``.
    ffn_size : int
        Dense FFN width (HF ``intermediate_size``); for MoE models the dense layers' width.
    vocab_size : int
        Vocabulary (HF ``vocab_size``).
    params_total : int
        All parameters (what must sit in HBM).
    params_active : int
        Parameters used per token (``== params_total`` for dense models, less for MoE).
    dtype_bytes : int
        Bytes per element of activations and the KV cache (2 for BF16).
    embedding_params : int, default 0
        Parameters of the input embedding table plus an untied output head. They are part of
        ``params_active`` but cost no prefill FLOPs per token: the embedding is a table lookup, and
        serving engines compute logits only for each sequence's last position (vLLM/SGLang
        ``logits_processor``). The prefill linear term therefore uses
        ``params_active - embedding_params``. Set it to 0 to count every parameter, as the
        published linear reference table does.
    weight_dtype_bytes : float, optional
        Bytes per weight element if it differs from ``dtype_bytes`` (1 for FP8 checkpoints).
    kv_latent_dim : int, optional
        For multi-head latent attention (MLA, DeepSeek-V3 / Kimi-K2) the width of the one vector
        cached per token and layer (``kv_lora_rank + qk_rope_head_dim``). When set,
        ``kv_bytes_per_token = num_layers x kv_latent_dim x dtype_bytes``, since MLA caches the
        compressed latent (as SGLang and vLLM do), not per-head K and V.
    source : str
        Where the numbers come from (URL).

    Raises
    ------
    ConfigError
        A count is not a positive integer, ``params_active > params_total``, or
        ``embedding_params >= params_active``; the message names the field and value.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    params_total: int
    params_active: int
    dtype_bytes: int
    embedding_params: int = 0
    weight_dtype_bytes: float | None = None
    kv_latent_dim: int | None = None
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _positive_int(self, ("num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim",
                             "ffn_size", "vocab_size", "params_total", "params_active",
                             "dtype_bytes"))
        if self.params_active > self.params_total:
            raise ConfigError(f"ModelSpec {self.name!r}: params_active ({self.params_active}) "
                              f"exceeds params_total ({self.params_total})")
        if (not isinstance(self.embedding_params, int) or self.embedding_params < 0
                or self.embedding_params >= self.params_active):
            raise ConfigError(f"ModelSpec {self.name!r}: field embedding_params must be an integer "
                              f"in [0, params_active={self.params_active}), "
                              f"got {self.embedding_params!r}")
        if self.weight_dtype_bytes is not None:
            _positive(self, ("weight_dtype_bytes",))
        if self.kv_latent_dim is not None:
            _positive_int(self, ("kv_latent_dim",))

    @property
    def is_moe(self) -> bool:
        """True when fewer parameters are active per token than stored."""
        return self.params_active < self.params_total

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token over all layers.

        ``2 x num_layers x num_kv_heads x head_dim x dtype_bytes`` (K and V), or for MLA
        ``num_layers x kv_latent_dim x dtype_bytes``. 327,680 B for Llama-3.3-70B in BF16.
        """
        if self.kv_latent_dim is not None:
            return self.num_layers * self.kv_latent_dim * self.dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_weight(self) -> float:
        """Bytes per stored weight: ``weight_dtype_bytes`` if set, else ``dtype_bytes``."""
        return self.dtype_bytes if self.weight_dtype_bytes is None else self.weight_dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights, ``params_total x bytes_per_weight``."""
        return int(round(self.params_total * self.bytes_per_weight))

    @property
    def active_weight_bytes(self) -> int:
        """Bytes of the weights one token reads, ``params_active x bytes_per_weight``."""
        return int(round(self.params_active * self.bytes_per_weight))

    @property
    def matmul_params_active(self) -> int:
        """Active parameters costing 2 FLOPs per prefill token (``params_active - embedding_params``)."""
        return self.params_active - self.embedding_params


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator, datasheet numbers (SI units).

    Parameters
    ----------
    name : str
    peak_flops : float
        Dense BF16/FP16 tensor-core FLOP/s per GPU (no sparsity).
    hbm_bytes_per_s : float
        HBM bandwidth per GPU, B/s.
    hbm_capacity_bytes : float
        HBM capacity per GPU, B.
    pcie_bytes_per_s : float
        Achievable host DRAM <-> GPU copy bandwidth per GPU (one x16 link, one direction), B/s.
    nic_bytes_per_s : float
        RDMA NIC bandwidth per GPU (one NIC per GPU, one direction), B/s.
    nvme_bytes_per_s : float
        Sequential read bandwidth of one NVMe drive, B/s.
    source : str
        Datasheet URL(s).

    Raises
    ------
    ConfigError
        Any number is zero, negative or not a number; the message names the field and value.
    """

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    hbm_capacity_bytes: float
    pcie_bytes_per_s: float
    nic_bytes_per_s: float
    nvme_bytes_per_s: float
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _positive(self, ("peak_flops", "hbm_bytes_per_s", "hbm_capacity_bytes",
                         "pcie_bytes_per_s", "nic_bytes_per_s", "nvme_bytes_per_s"))


@dataclass(frozen=True)
class NodeSpec:
    """One replica: ``num_gpus`` GPUs in one tensor-parallel group.

    Bandwidths and capacities are node aggregates: per-GPU figure x ``num_gpus`` (each GPU has its
    own PCIe link and NIC, and under tensor parallelism each holds 1/num_gpus of every layer's KV).
    A shared disk (``disk_shared=True``, one drive read by the whole node) is not multiplied.

    Parameters
    ----------
    gpu : GPUSpec
    num_gpus : int
        GPUs in the node = tensor-parallel degree, >= 1.
    disk_shared : bool, default True
        One NVMe drive for the node (True, the reference setup) or one per GPU (False).

    Raises
    ------
    ConfigError
        ``num_gpus`` is not an integer >= 1.
    """

    gpu: GPUSpec
    num_gpus: int
    disk_shared: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, GPUSpec):
            raise ConfigError(f"NodeSpec: field gpu must be a GPUSpec, got {self.gpu!r}")
        _positive_int(self, ("num_gpus",))

    @property
    def name(self) -> str:
        """E.g. ``"4x H100-SXM"``."""
        return f"{self.num_gpus}x {self.gpu.name}"

    @property
    def peak_flops(self) -> float:
        """Node dense FLOP/s."""
        return self.gpu.peak_flops * self.num_gpus

    @property
    def hbm_capacity_bytes(self) -> float:
        """Node HBM, B."""
        return self.gpu.hbm_capacity_bytes * self.num_gpus

    @property
    def hbm_bytes_per_s(self) -> float:
        """Node HBM bandwidth, B/s."""
        return self.gpu.hbm_bytes_per_s * self.num_gpus

    @property
    def dram_bytes_per_s(self) -> float:
        """Host DRAM -> HBM bandwidth over all PCIe links, B/s."""
        return self.gpu.pcie_bytes_per_s * self.num_gpus

    @property
    def rdma_bytes_per_s(self) -> float:
        """RDMA bandwidth over all NICs, one direction, B/s."""
        return self.gpu.nic_bytes_per_s * self.num_gpus

    @property
    def nvme_bytes_per_s(self) -> float:
        """NVMe read bandwidth: one drive if shared, else one per GPU, B/s."""
        return self.gpu.nvme_bytes_per_s * (1 if self.disk_shared else self.num_gpus)


# ---------------------------------------------------------------------------------------------
# Parameter counts from config fields (so presets are derived, not typed in).

def dense_params(num_layers: int, hidden_size: int, num_q_heads: int, num_kv_heads: int,
                 head_dim: int, ffn_size: int, vocab_size: int, tied_embeddings: bool = False,
                 qk_norm: bool = False, attn_bias: bool = False) -> tuple[int, int]:
    """Parameter count of a Llama-style dense decoder (GQA attention, SwiGLU FFN, RMSNorm).

    Returns
    -------
    (total, embedding) : tuple of int
        All parameters, and those in the embedding table plus an untied LM head.
    """
    q = hidden_size * num_q_heads * head_dim
    kv = 2 * hidden_size * num_kv_heads * head_dim
    o = num_q_heads * head_dim * hidden_size
    bias = (num_q_heads + 2 * num_kv_heads) * head_dim if attn_bias else 0
    norms = 2 * hidden_size + (2 * head_dim if qk_norm else 0)
    layer = q + kv + o + bias + 3 * hidden_size * ffn_size + norms
    embedding = vocab_size * hidden_size * (1 if tied_embeddings else 2)
    return num_layers * layer + hidden_size + embedding, embedding


def moe_params(num_layers: int, num_dense_layers: int, attn_params_per_layer: int,
               hidden_size: int, ffn_size: int, moe_ffn_size: int, num_routed_experts: int,
               num_shared_experts: int, experts_per_token: int, vocab_size: int,
               tied_embeddings: bool = False) -> tuple[int, int, int]:
    """Parameter count of a DeepSeek-style MoE decoder (GLM-4.5, Kimi-K2).

    The first ``num_dense_layers`` blocks have a SwiGLU FFN of width ``ffn_size``; the rest have
    ``num_routed_experts`` routed plus ``num_shared_experts`` shared SwiGLU experts of width
    ``moe_ffn_size`` and a router (weight + score-correction bias). Multi-token-prediction layers
    (HF ``num_nextn_predict_layers``) are not counted: serving without speculative decoding never
    runs them.

    Parameters
    ----------
    attn_params_per_layer : int
        Attention weights, biases and norms of one block, plus its two RMSNorms.

    Returns
    -------
    (total, active, embedding) : tuple of int
        All parameters, those one token uses (``experts_per_token`` routed experts), and the
        embedding table plus untied LM head.
    """
    expert = 3 * hidden_size * moe_ffn_size
    router = num_routed_experts * hidden_size + num_routed_experts
    moe_layers = num_layers - num_dense_layers
    common = (num_layers * attn_params_per_layer + num_dense_layers * 3 * hidden_size * ffn_size
              + moe_layers * (num_shared_experts * expert + router))
    embedding = vocab_size * hidden_size * (1 if tied_embeddings else 2)
    total = common + moe_layers * num_routed_experts * expert + embedding + hidden_size
    active = common + moe_layers * experts_per_token * expert + embedding + hidden_size
    return total, active, embedding


# Llama-3.3-70B: https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct/blob/main/config.json
# (num_hidden_layers 80, hidden_size 8192, num_attention_heads 64, num_key_value_heads 8,
# head_dim 8192/64 = 128, intermediate_size 28672, vocab_size 128256, tie_word_embeddings false).
# Count = 70,553,706,496 (the model page rounds it to "70.6B params").
_LLAMA70_TOTAL, _LLAMA70_EMB = dense_params(80, 8192, 64, 8, 128, 28672, 128256)

# Qwen3-8B: https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (num_hidden_layers 36,
# hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, head_dim 128,
# intermediate_size 12288, vocab_size 151936, tie_word_embeddings false, q/k RMSNorm).
# Count = 8,190,735,360 (model card: "8.2B, non-embedding 6.95B").
_QWEN3_8B_TOTAL, _QWEN3_8B_EMB = dense_params(36, 4096, 32, 8, 128, 12288, 151936, qk_norm=True)

# Llama-2-70B (for the measured anchors, same per-layer shapes as Llama-3.3-70B):
# https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json (num_hidden_layers 80,
# hidden_size 8192, num_attention_heads 64, num_key_value_heads 8, intermediate_size 28672,
# vocab_size 32000, untied). Count = 68,976,648,192 ("69B").
_LLAMA2_70_TOTAL, _LLAMA2_70_EMB = dense_params(80, 8192, 64, 8, 128, 28672, 32000)

# Hypothetical dense 1T: Llama-3.1-405B's shape (https://huggingface.co/meta-llama/
# Llama-3.1-405B/blob/main/config.json: 126 layers, hidden 16384, 128 heads, 8 KV heads,
# FFN 53248) widened to hidden 24576 / 192 heads / FFN 79872 (same 3.25x ratio) over 136 layers.
# No such model is published; it stands for "a dense ~1T model". Count ~1.01e12.
_DENSE1T_TOTAL, _DENSE1T_EMB = dense_params(136, 24576, 192, 16, 128, 79872, 128256)


# GLM-4.5: https://huggingface.co/zai-org/GLM-4.5/blob/main/config.json (num_hidden_layers 92,
# hidden_size 5120, num_attention_heads 96, num_key_value_heads 8, head_dim 128,
# attention_bias true, use_qk_norm true, first_k_dense_replace 3, intermediate_size 12288,
# moe_intermediate_size 1536, n_routed_experts 160, n_shared_experts 1, num_experts_per_tok 8,
# vocab_size 151552, tie_word_embeddings false). Count = 352.8e9 total / 33.6e9 active without
# the MTP layer; the model card says "355 billion total parameters and 32 billion active"
# (https://huggingface.co/zai-org/GLM-4.5), which includes the MTP layer and rounds.
_GLM45_ATTN = (5120 * 96 * 128 + 96 * 128 + 2 * (5120 * 8 * 128 + 8 * 128) + 96 * 128 * 5120
               + 2 * 128 + 2 * 5120)
_GLM45_TOTAL, _GLM45_ACTIVE, _GLM45_EMB = moe_params(92, 3, _GLM45_ATTN, 5120, 12288, 1536, 160,
                                                     1, 8, 151552)

# Kimi-K2: https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json
# (DeepseekV3 architecture: num_hidden_layers 61, hidden_size 7168, num_attention_heads 64,
# q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128,
# first_k_dense_replace 1, intermediate_size 18432, moe_intermediate_size 2048,
# n_routed_experts 384, n_shared_experts 1, num_experts_per_tok 8, vocab_size 163840, untied).
# Count = 1.026e12 total / 32.9e9 active (model card: "1 trillion total parameters,
# 32 billion activated", https://huggingface.co/moonshotai/Kimi-K2-Instruct).
_KIMI_ATTN = (7168 * 1536 + 1536 + 1536 * 64 * (128 + 64) + 7168 * (512 + 64) + 512
              + 512 * 64 * (128 + 128) + 64 * 128 * 7168 + 2 * 7168)
_KIMI_TOTAL, _KIMI_ACTIVE, _KIMI_EMB = moe_params(61, 1, _KIMI_ATTN, 7168, 18432, 2048, 384, 1, 8,
                                                  163840)


MODELS: dict[str, ModelSpec] = {
    "llama-3.3-70b": ModelSpec(
        name="Llama-3.3-70B", num_layers=80, hidden_size=8192, num_q_heads=64, num_kv_heads=8,
        head_dim=128, ffn_size=28672, vocab_size=128256, params_total=_LLAMA70_TOTAL,
        params_active=_LLAMA70_TOTAL, dtype_bytes=2, embedding_params=_LLAMA70_EMB,
        source="https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct/blob/main/config.json"),
    "llama-2-70b": ModelSpec(
        name="Llama-2-70B", num_layers=80, hidden_size=8192, num_q_heads=64, num_kv_heads=8,
        head_dim=128, ffn_size=28672, vocab_size=32000, params_total=_LLAMA2_70_TOTAL,
        params_active=_LLAMA2_70_TOTAL, dtype_bytes=2, embedding_params=_LLAMA2_70_EMB,
        source="https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json"),
    "qwen3-8b": ModelSpec(
        name="Qwen3-8B", num_layers=36, hidden_size=4096, num_q_heads=32, num_kv_heads=8,
        head_dim=128, ffn_size=12288, vocab_size=151936, params_total=_QWEN3_8B_TOTAL,
        params_active=_QWEN3_8B_TOTAL, dtype_bytes=2, embedding_params=_QWEN3_8B_EMB,
        source="https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json"),
    # GLM-4.5 (config fields above). Weights in FP8, the official GLM-4.5-FP8 checkpoint
    # (https://huggingface.co/zai-org/GLM-4.5-FP8); KV cache in BF16: 2 x 92 x 8 x 128 x 2 B.
    "glm-4.5": ModelSpec(
        name="GLM-4.5", num_layers=92, hidden_size=5120, num_q_heads=96, num_kv_heads=8,
        head_dim=128, ffn_size=12288, vocab_size=151552, params_total=_GLM45_TOTAL,
        params_active=_GLM45_ACTIVE, dtype_bytes=2, embedding_params=_GLM45_EMB,
        weight_dtype_bytes=1,
        source="https://huggingface.co/zai-org/GLM-4.5/blob/main/config.json"),
    # Kimi-K2 (config fields above). KV bytes, honestly for MLA: engines (SGLang, vLLM) cache
    # the compressed latent, kv_lora_rank + qk_rope_head_dim = 576 values per token and layer,
    # so 61 x 576 x 2 B = 70,272 B/token in BF16 (not 2 x 61 x 64 heads x 192 x 2 B = 3.0 MB that
    # HF's num_key_value_heads 64 would suggest). num_kv_heads is 1 (one shared latent).
    # head_dim = (qk 192 + v 128) / 2 = 160 so that 4 x layers x heads x head_dim equals the
    # QK^T (2 x 192) + PV (2 x 128) FLOPs per (query, key) pair of the non-absorbed form engines
    # run for prefill. Weights ship in block FP8 (1 B/param).
    "kimi-k2": ModelSpec(
        name="Kimi-K2", num_layers=61, hidden_size=7168, num_q_heads=64, num_kv_heads=1,
        head_dim=160, ffn_size=18432, vocab_size=163840, params_total=_KIMI_TOTAL,
        params_active=_KIMI_ACTIVE, dtype_bytes=2, embedding_params=_KIMI_EMB,
        weight_dtype_bytes=1, kv_latent_dim=512 + 64,
        source="https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json"),
    "dense-1t": ModelSpec(
        name="Dense-1T (hypothetical)", num_layers=136, hidden_size=24576, num_q_heads=192,
        num_kv_heads=16, head_dim=128, ffn_size=79872, vocab_size=128256,
        params_total=_DENSE1T_TOTAL, params_active=_DENSE1T_TOTAL, dtype_bytes=2,
        embedding_params=_DENSE1T_EMB, weight_dtype_bytes=1,
        source="hypothetical: Llama-3.1-405B shape scaled to ~1T, FP8 weights"),
    # Dense-1T is HYPOTHETICAL (no such open model); FP8 weights (1 B/param) so it fits
    # 4x B300 (1,152 GB), as a 2 TB BF16 copy would not.
}

_GB = 1e9
_TB = 1e12

GPUS: dict[str, GPUSpec] = {
    # H100 SXM5 80GB: 989.4 TFLOP/s dense BF16 (datasheet lists 1,979 with sparsity), 3.35 TB/s
    # HBM3, 80 GB. https://www.nvidia.com/en-us/data-center/h100/ ; PCIe Gen5 x16 (64 GB/s raw,
    # ~55 GB/s achieved host->device copies); ConnectX-7 400 Gb/s per GPU = 50 GB/s (DGX H100,
    # https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html); one PCIe Gen4
    # U.2 NVMe drive ~7 GB/s sequential read.
    "h100": GPUSpec("H100-SXM", 989.4e12, 3.35 * _TB, 80 * _GB, 55 * _GB, 50 * _GB, 7 * _GB,
                    source="https://www.nvidia.com/en-us/data-center/h100/"),
    # H200 SXM 141GB: same compute as H100, 4.8 TB/s HBM3e, 141 GB.
    # https://www.nvidia.com/en-us/data-center/h200/ ; host/NIC/disk as DGX H200 (= DGX H100).
    "h200": GPUSpec("H200-SXM", 989.4e12, 4.8 * _TB, 141 * _GB, 55 * _GB, 50 * _GB, 7 * _GB,
                    source="https://www.nvidia.com/en-us/data-center/h200/"),
    # B200 (HGX/DGX B200): 2.25 PFLOP/s dense BF16 per GPU (HGX B200: 36 PFLOPS FP16/BF16 with
    # sparsity over 8 GPUs), 8 TB/s HBM3e, 180 GB per GPU (1,440 GB per 8-GPU system).
    # https://www.nvidia.com/en-us/data-center/hgx/ ; DGX B200 has ConnectX-7 400 Gb/s per GPU,
    # Gen5 PCIe, Gen5 NVMe (~14 GB/s read).
    "b200": GPUSpec("B200", 2.25e15, 8 * _TB, 180 * _GB, 55 * _GB, 50 * _GB, 14 * _GB,
                    source="https://www.nvidia.com/en-us/data-center/hgx/"),
    # B300 (HGX B300, Blackwell Ultra): 2.25 PFLOP/s dense BF16 per GPU (HGX B300: 36 PFLOPS
    # FP16/BF16 with sparsity over 8 GPUs), 8 TB/s HBM3e, 288 GB per GPU (2.3 TB per system),
    # ConnectX-8 800 Gb/s per GPU = 100 GB/s. https://www.nvidia.com/en-us/data-center/hgx/ ;
    # host copies still over PCIe Gen5 (~55 GB/s); Gen5 NVMe ~14 GB/s.
    "b300": GPUSpec("B300", 2.25e15, 8 * _TB, 288 * _GB, 55 * _GB, 100 * _GB, 14 * _GB,
                    source="https://www.nvidia.com/en-us/data-center/hgx/"),
    # A100 SXM4 80GB: 312 TFLOP/s dense BF16, 2,039 GB/s HBM2e, 80 GB.
    # https://www.nvidia.com/en-us/data-center/a100/ ; PCIe Gen4 x16 (32 GB/s raw, ~25 achieved);
    # DGX A100 ConnectX-6 200 Gb/s per GPU = 25 GB/s; Gen4 NVMe ~7 GB/s.
    "a100": GPUSpec("A100-SXM-80GB", 312e12, 2.039 * _TB, 80 * _GB, 25 * _GB, 25 * _GB, 7 * _GB,
                    source="https://www.nvidia.com/en-us/data-center/a100/"),
    # AMD Instinct MI300X: 1,307.4 TFLOP/s dense BF16, 5.3 TB/s HBM3, 192 GB.
    # https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html ; PCIe Gen5 x16
    # (~55 GB/s achieved), one 400 Gb/s NIC per GPU (50 GB/s), Gen4 NVMe ~7 GB/s.
    "mi300x": GPUSpec("MI300X", 1307.4e12, 5.3 * _TB, 192 * _GB, 55 * _GB, 50 * _GB, 7 * _GB,
                      source=("https://www.amd.com/en/products/accelerators/instinct/mi300/"
                              "mi300x.html")),
}

#: Setup name -> (model key, GPU key, GPUs per node). "70b_h100x4" is the standard setup.
#: Two named setups do NOT fit their node with the released FP8 weights and a 10 % reserve, so
#: ``CostModel.kv_budget_bytes`` / ``check_fits`` raise ConfigError for them (their prefill and
#: transfer times are still well defined): "glm45_h100x4" (353 GB of weights on 320 GB; Z.ai
#: lists 8x H100 for GLM-4.5-FP8) and "kimi_k2_h100x8" (1,026 GB on 640 GB; Moonshot's smallest
#: FP8 unit is 16 GPUs). The "_h100x8" / "_b200x8" / "_h200x8" entries below are nodes they fit.
SETUPS: dict[str, tuple[str, str, int]] = {
    "70b_h100x4": ("llama-3.3-70b", "h100", 4),
    "qwen3_8b_h100x4": ("qwen3-8b", "h100", 4),
    "glm45_h100x4": ("glm-4.5", "h100", 4),
    "kimi_k2_h100x8": ("kimi-k2", "h100", 8),
    "dense1t_b300x4": ("dense-1t", "b300", 4),
    "glm45_h100x8": ("glm-4.5", "h100", 8),
    "kimi_k2_b200x8": ("kimi-k2", "b200", 8),
    # dense1t_b300x4 holds the 1T weights but leaves ~40 GB of HBM for KV: under 90 blocks of 512
    # tokens, less than one 65,536-token prompt. A full 8-GPU HGX B300 node serves the Bursted jobs.
    "dense1t_b300x8": ("dense-1t", "b300", 8),
    "70b_h200x4": ("llama-3.3-70b", "h200", 4),
    "70b_b200x4": ("llama-3.3-70b", "b200", 4),
    "70b_a100x4": ("llama-3.3-70b", "a100", 4),
    "70b_mi300x4": ("llama-3.3-70b", "mi300x", 4),
}

#: The standard setup of the study (DESIGN.md section 1).
STANDARD_SETUP = "70b_h100x4"


def node_for(gpu: str, num_gpus: int, disk_shared: bool = True) -> NodeSpec:
    """A :class:`NodeSpec` from a GPU preset key; KeyError lists the valid keys."""
    try:
        spec = GPUS[gpu]
    except KeyError:
        raise KeyError(f"unknown GPU {gpu!r}; valid: {', '.join(sorted(GPUS))}") from None
    return NodeSpec(spec, num_gpus, disk_shared)


def model_for(model: str) -> ModelSpec:
    """A :class:`ModelSpec` preset by key; KeyError lists the valid keys."""
    try:
        return MODELS[model]
    except KeyError:
        raise KeyError(f"unknown model {model!r}; valid: {', '.join(sorted(MODELS))}") from None
