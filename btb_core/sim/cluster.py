"""Cluster configuration: replica count, node + model (through the cost model), scheduler, tiers."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ConfigError
from .schedulers import SCHEDULERS

#: KV admission rules: ``reserve`` (KV for prompt + output reserved at admission, no preemption) and
#: ``paged`` (blocks allocated as decode grows; recompute preemption when they run out).
KV_ADMISSIONS = ("reserve", "paged")
#: When a prefilled block becomes reusable by other requests (``ClusterConfig.reuse_on``).
REUSE_ON = ("prefill_done", "scheduled")

#: Default host-DRAM KV tier per replica, bytes. A DGX H100 node has 2 TB of system memory
#: (NVIDIA DGX H100 datasheet); we give half of it to the KV cache.
DEFAULT_DRAM_CAPACITY_BYTES = 1_000_000_000_000

#: Default token budget per iteration of the chunked scheduler (vLLM/SGLang-style chunked prefill;
#: SGLang ``--chunked-prefill-size`` defaults to 8,192 on large GPUs, sglang/srt/server_args.py).
DEFAULT_CHUNK_TOKENS = 8192

#: Default cap on running requests per replica (vLLM ``max_num_seqs`` = 256, vllm/config.py).
DEFAULT_MAX_RUNNING = 256


#: Largest replica count a cluster accepts (per-replica state is allocated up front; the largest
#: deployments the routers target run hundreds of replicas).
MAX_REPLICAS = 4096


#: Actions of a cluster event (``--events FILE``).
EVENT_ACTIONS = ("add", "fail", "drain")


@dataclass(frozen=True)
class ClusterEvent:
    """A change to the cluster during a run.

    Parameters
    ----------
    t_s : float
        Simulated time, seconds (finite, >= 0). Applied after replica operations ending at that
        instant and before arrivals at it.
    action : {"add", "fail", "drain"}
        ``add``: a new, cold replica (empty cache) that routers may use from ``t_s``; its index is
        the next one after the initial replicas and earlier additions. ``fail``: the replica stops;
        its cache (HBM, DRAM and its own disk) and its in-flight work are lost, and every request it
        held (queued or running) is routed again and retried from scratch (counted, never lost).
        ``drain``: routers stop sending it requests; queued and running ones finish there.
    replica : int
        The replica the event concerns.

    Raises
    ------
    ConfigError
        On a bad field (message names the field and value).
    """

    t_s: float
    action: str
    replica: int

    def __post_init__(self) -> None:
        t = self.t_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (0 <= t < float("inf")):
            raise ConfigError(f"ClusterEvent.t_s={t!r}: must be a finite number >= 0 (seconds)")
        if self.action not in EVENT_ACTIONS:
            raise ConfigError(f"ClusterEvent.action={self.action!r}: must be one of {EVENT_ACTIONS}")
        if isinstance(self.replica, bool) or not isinstance(self.replica, int) or self.replica < 0:
            raise ConfigError(f"ClusterEvent.replica={self.replica!r}: must be an integer >= 0")


def check_events(events, num_replicas: int) -> tuple:
    """Validate a run's events against a cluster of ``num_replicas`` initial replicas.

    Returns the events sorted by time (stable). Rules: ``add`` names the next new index
    (``num_replicas``, then ``num_replicas + 1``, ...); ``fail`` / ``drain`` name a replica present
    at that time that has not failed (a drained replica may still fail); after every event at
    least one replica accepts requests.

    Raises
    ------
    ConfigError
        Naming the event (its position in time order, time, action, replica) and the rule broken.
    """
    evs = sorted(events, key=lambda e: e.t_s)
    state = {r: "up" for r in range(num_replicas)}
    nxt = num_replicas
    for k, e in enumerate(evs):
        where = f"event {k} (t_s={e.t_s}, {e.action} replica {e.replica})"
        if e.action == "add":
            if e.replica != nxt:
                raise ConfigError(f"{where}: an added replica takes the next index, {nxt}")
            state[e.replica] = "up"
            nxt += 1
        else:
            st = state.get(e.replica)
            if st is None:
                raise ConfigError(f"{where}: no such replica at that time (replicas 0..{nxt - 1})")
            if st == "failed":
                raise ConfigError(f"{where}: replica {e.replica} has already failed")
            if e.action == "drain" and st == "draining":
                raise ConfigError(f"{where}: replica {e.replica} is already draining")
            state[e.replica] = "failed" if e.action == "fail" else "draining"
        if not any(v == "up" for v in state.values()):
            raise ConfigError(f"{where}: leaves no replica accepting requests")
    return tuple(evs)


def load_events(path) -> tuple:
    """Read cluster events from a YAML file: a list of ``{t_s, action, replica}`` mappings.

    Raises
    ------
    ConfigError
        Unreadable YAML, not a list, an item that is not a mapping, a missing or unknown key, or a
        bad value; the message names the file, the item (0-based) and the field.
    FileNotFoundError
        If ``path`` does not exist.
    """
    import yaml
    from pathlib import Path

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path}: expected a non-empty YAML list of {{t_s, action, replica}} items, "
                          f"got {type(data).__name__}")
    out = []
    keys = ("t_s", "action", "replica")
    for k, item in enumerate(data):
        if not isinstance(item, dict):
            raise ConfigError(f"{path}, item {k}: expected a mapping with {', '.join(keys)}, got {item!r}")
        for key in keys:
            if key not in item:
                raise ConfigError(f"{path}, item {k}: missing field {key!r}")
        extra = sorted(set(item) - set(keys))
        if extra:
            raise ConfigError(f"{path}, item {k}: unknown field {extra[0]!r} (fields: {', '.join(keys)})")
        try:
            out.append(ClusterEvent(item["t_s"], item["action"], item["replica"]))
        except ConfigError as exc:
            raise ConfigError(f"{path}, item {k}: {str(exc).replace('ClusterEvent.', 'field ')}") from None
    return tuple(out)


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
    reuse_on : {"prefill_done", "scheduled"}
        When a block a request prefills becomes reusable by other requests on the same replica.
        ``prefill_done`` (default, DESIGN section 4): when the iteration (``chunked``) or prefill
        (``prefill_first``) that computes it ends. ``scheduled``: as soon as the scheduler assigns
        the chunk that computes it, as vLLM v1 does (``KVCacheManager.allocate_slots`` caches
        the full blocks of the scheduled tokens before the step runs, so a request admitted later
        in the same or a following step hits them; the step computes their KV before any later
        step reads it). Routers' view (``cached_blocks``) follows the same rule.

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
    reuse_on: str = "prefill_done"
    setup_name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        def bad(name, value, why):
            raise ConfigError(f"ClusterConfig.{name}={value!r}: {why}")

        for name in ("prefill_s", "load_s", "kv_bytes_per_token", "kv_budget_bytes"):
            if not hasattr(self.cost, name):
                bad("cost", type(self.cost).__name__, f"must be a btb_core.cost.CostModel (no {name})")
        def integer(name, hi):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                bad(name, value, f"must be an integer in [1, {hi:,}]")

        integer("num_replicas", MAX_REPLICAS)
        if self.scheduler not in SCHEDULERS:
            bad("scheduler", self.scheduler, f"must be one of {tuple(SCHEDULERS)}")
        if self.kv_admission not in KV_ADMISSIONS:
            bad("kv_admission", self.kv_admission, f"must be one of {KV_ADMISSIONS}")
        if self.reuse_on not in REUSE_ON:
            bad("reuse_on", self.reuse_on, f"must be one of {REUSE_ON}")
        integer("chunk_tokens", 2 ** 31 - 1)
        integer("max_running", 2 ** 31 - 1)
        if isinstance(self.kv_reserve_fraction, bool) or not (0.0 <= self.kv_reserve_fraction < 1.0):
            bad("kv_reserve_fraction", self.kv_reserve_fraction, "must be in [0, 1)")
        if self.hbm_kv_capacity_bytes is not None and self.hbm_kv_capacity_bytes <= 0:
            bad("hbm_kv_capacity_bytes", self.hbm_kv_capacity_bytes, "must be > 0 or None")
        for name in ("dram_capacity_bytes", "disk_capacity_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not value >= 0:
                bad(name, value, "must be >= 0")
        if self.hbm_kv_capacity_bytes is None:
            self.cost.kv_budget_bytes(self.kv_reserve_fraction)  # raises if the model does not fit

    @classmethod
    def from_setup(cls, setup: str = "70b_h100x4", **kwargs) -> "ClusterConfig":
        """Build from a setup name of :data:`btb_core.specs.SETUPS` (e.g. ``"70b_h100x4"``).

        ``attention=False`` selects :func:`btb_core.cost.linear_cost_model` (on ``70b_h100x4`` the
        reference study's published constants); ``"70b_h100x4_reference"`` is always that linear
        model. ``mfu`` / ``mbu`` / ``attention`` are cost-model fields, every other keyword a
        ClusterConfig field.
        """
        from ..cost import REFERENCE_SETUP, cost_model_for_setup, linear_cost_model

        cost_overrides = {k: kwargs.pop(k) for k in ("mfu", "mbu", "attention") if k in kwargs}
        if setup == REFERENCE_SETUP:
            cost_overrides["attention"] = False  # the published linear table, by definition
        try:
            if cost_overrides.get("attention", True) is False:
                # the reference study's linear model (its rounded constants on 70b_h100x4)
                cost_overrides.pop("attention")
                cost = linear_cost_model(setup)
                cost = cost.replace(**cost_overrides) if cost_overrides else cost
            else:
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
