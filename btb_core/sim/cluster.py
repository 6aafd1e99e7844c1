"""Cluster configuration: replica count, node + model (through the cost model), scheduler, tiers."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ConfigError
from .schedulers import SCHEDULERS

#: KV admission rules: ``reserve`` (KV for prompt + output reserved at admission, no preemption) and
#: ``paged`` (blocks allocated as decode grows; recompute preemption when they run out).
KV_ADMISSIONS = ("reserve", "paged")

#: Default host-DRAM KV tier per replica, bytes. A DGX H100 node has 2 TB of system memory
#: (NVIDIA DGX H100 datasheet); we give half of it to the KV cache.
DEFAULT_DRAM_CAPACITY_BYTES = 1_000_000_000_000

#: Default token budget per iteration of the chunked scheduler (vLLM/SGLang-style chunked prefill;
#: SGLang ``--chunked-prefill-size`` defaults to 8,192 on large GPUs, sglang/srt/server_args.py).
DEFAULT_CHUNK_TOKENS = 8192

#: Default cap on running requests per replica (vLLM ``max_num_seqs`` = 256, vllm/config.py).
DEFAULT_MAX_RUNNING = 256


@dataclass(frozen=True)
class ClusterConfig:
    """A routed cluster of identical replicas (one replica = one tensor-parallel node).

    Parameters
    ----------
    cost : btb_core.cost.CostModel
        Model x node x efficiencies; gives prefill, decode-step and tier-load times and the KV budget.
    num_replicas : int
        Replicas behind the router (``>= 1``).
    scheduler : str
        A name of :data:`btb_core.sim.schedulers.SCHEDULERS`: ``prefill_first`` (FIFO admission
        while KV fits, each admission's load + prefill runs alone and pauses decode) or ``chunked``
        (default; iterations with a shared token budget for prefill chunks and decode tokens, vLLM /
        SGLang default behaviour).
    chunk_tokens : int
        Token budget per iteration for ``chunked`` (default 8,192).
    max_running : int
        Maximum requests admitted at once per replica (default 256, vLLM ``max_num_seqs``).
    kv_reserve_fraction : float
        Fraction of node HBM kept free for activations (default 0.1), in [0, 1).
    hbm_kv_capacity_bytes : int or None
        Override of the HBM KV budget per replica (default: from the cost model).
    dram_capacity_bytes : float
        Host-DRAM KV tier per replica, bytes (0 disables it). Default 1e12 (half a DGX H100's 2 TB).
    disk_capacity_bytes : float
        Disk (NVMe) KV tier, bytes per replica or in total when ``disk_shared`` (0 disables it).
    disk_shared : bool
        One disk tier shared by every replica (e.g. a shared NVMe-oF pool) instead of one each.
    kv_admission : {"reserve", "paged"}
        ``reserve`` (default): admission reserves KV for prompt + output, so nothing is ever
        preempted. ``paged``: admission allocates the prompt's blocks only, decode allocates a block
        whenever a request's context crosses a block boundary, and when the budget runs out the most
        recently admitted running request is preempted: its blocks are freed (complete prefix blocks
        stay cached as evictable) and it is put back at the head of the waiting queue, to be
        recomputed (prompt + tokens generated so far) when admitted again, as vLLM's recompute
        preemption does (``vllm/v1/core/sched/scheduler.py`` at commit ``00024d31``:
        ``Scheduler.schedule`` pops ``self.running`` (the last admitted) when ``allocate_slots``
        fails, and ``_preempt_request`` frees its blocks, resets its computed tokens to 0 and
        prepends it to ``self.waiting``).

    Raises
    ------
    ConfigError
        On any invalid field; the message names the field and the value.
    """

    cost: object
    num_replicas: int = 4
    scheduler: str = "chunked"
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    max_running: int = DEFAULT_MAX_RUNNING
    kv_reserve_fraction: float = 0.1
    hbm_kv_capacity_bytes: int | None = None
    dram_capacity_bytes: float = DEFAULT_DRAM_CAPACITY_BYTES
    disk_capacity_bytes: float = 0
    disk_shared: bool = False
    kv_admission: str = "reserve"
    setup_name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        def bad(name, value, why):
            raise ConfigError(f"ClusterConfig.{name}={value!r}: {why}")

        for name in ("prefill_s", "load_s", "kv_bytes_per_token", "kv_budget_bytes"):
            if not hasattr(self.cost, name):
                bad("cost", type(self.cost).__name__, f"must be a btb_core.cost.CostModel (no {name})")
        if not isinstance(self.num_replicas, int) or self.num_replicas < 1:
            bad("num_replicas", self.num_replicas, "must be an integer >= 1")
        if self.scheduler not in SCHEDULERS:
            bad("scheduler", self.scheduler, f"must be one of {tuple(SCHEDULERS)}")
        if self.kv_admission not in KV_ADMISSIONS:
            bad("kv_admission", self.kv_admission, f"must be one of {KV_ADMISSIONS}")
        if not isinstance(self.chunk_tokens, int) or self.chunk_tokens < 1:
            bad("chunk_tokens", self.chunk_tokens, "must be an integer >= 1")
        if not isinstance(self.max_running, int) or self.max_running < 1:
            bad("max_running", self.max_running, "must be an integer >= 1")
        if not (0.0 <= self.kv_reserve_fraction < 1.0):
            bad("kv_reserve_fraction", self.kv_reserve_fraction, "must be in [0, 1)")
        if self.hbm_kv_capacity_bytes is not None and self.hbm_kv_capacity_bytes <= 0:
            bad("hbm_kv_capacity_bytes", self.hbm_kv_capacity_bytes, "must be > 0 or None")
        for name in ("dram_capacity_bytes", "disk_capacity_bytes"):
            value = getattr(self, name)
            if not value >= 0:
                bad(name, value, "must be >= 0")
        if self.hbm_kv_capacity_bytes is None:
            self.cost.kv_budget_bytes(self.kv_reserve_fraction)  # raises if the model does not fit

    @classmethod
    def from_setup(cls, setup: str = "70b_h100x4", **kwargs) -> "ClusterConfig":
        """Build from a setup name of :data:`btb_core.specs.SETUPS` (e.g. ``"70b_h100x4"``)."""
        from ..cost import cost_model_for_setup

        cost_overrides = {k: kwargs.pop(k) for k in ("mfu", "mbu", "attention") if k in kwargs}
        try:
            cost = cost_model_for_setup(setup, **cost_overrides)
        except KeyError as exc:
            raise ConfigError(str(exc.args[0]) if exc.args else str(exc)) from None
        return cls(cost=cost, setup_name=setup, **kwargs)

    def with_(self, **changes) -> "ClusterConfig":
        """A copy with ``changes`` applied (validated)."""
        return replace(self, **changes)

    def hbm_capacity_blocks(self, block_tokens: int) -> int:
        """HBM KV budget per replica in blocks of ``block_tokens`` tokens."""
        budget = (self.hbm_kv_capacity_bytes if self.hbm_kv_capacity_bytes is not None
                  else self.cost.kv_budget_bytes(self.kv_reserve_fraction))
        blocks = int(budget // (self.cost.kv_bytes_per_token * block_tokens))
        if blocks < 1:
            raise ConfigError(f"ClusterConfig: HBM KV budget {budget:.3g} B holds no "
                              f"{block_tokens}-token block")
        return blocks

    def tier_capacity_blocks(self, capacity_bytes: float, block_tokens: int) -> int:
        return int(capacity_bytes // (self.cost.kv_bytes_per_token * block_tokens))
