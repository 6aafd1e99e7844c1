"""Cache-aware routing as in the SGLang Model Gateway.

Reference: ``sgl-model-gateway/src/policies/cache_aware.rs`` (sgl-project/sglang @ b93974f1) and its
tree ``sgl-model-gateway/src/policies/tree.rs`` (@ 24ce7f6c). Defaults are the ones the gateway
ships to users, ``sgl-model-gateway/bindings/python/src/sglang_router/router_args.py``
(@ 6614f984): ``cache_threshold=0.3``, ``balance_abs_threshold=64``, ``balance_rel_threshold=1.5``,
``eviction_interval_secs=120``, ``max_tree_size=2**26``. (The Rust ``CacheAwareConfig::default()``
in ``policies/mod.rs`` @ 0edb07a1 differs: 0.5 / 32 / 1.1 / 30 s / 10,000; pass those to compare.)

Token-usage thresholds: the gateway's continuation (smg-project/smg
``model_gateway/src/policies/mod.rs`` ``CacheAwareConfig`` and ``cache_aware.rs``
``is_imbalanced`` @ 56ad2018) adds two triggers on the KV-cache utilisation the engines report
(``token_usage``, here ``view.kv_usage``, the fraction of the HBM KV budget held by running
requests): **overload**, the hottest replica's usage is above ``overload_token_usage_threshold``;
**KV spread**, hottest minus coldest usage is above ``balance_token_usage_threshold``. Either one
makes the pool imbalanced, OR'd with the request-count test below. Both default to 1.0 there,
which disables them (usage never exceeds 1), so the default decision is unchanged.

The decision per request, with ``load`` = in-flight requests this router dispatched:

1. imbalanced iff a token-usage trigger fires, or ``max_load - min_load > balance_abs_threshold``
   **and** ``max_load > balance_rel_threshold * min_load``: route to the least-loaded replica;
2. otherwise find the replica whose tree shares the longest prefix with the prompt; if
   ``match_rate = matched_tokens / prompt_tokens`` is strictly greater than ``cache_threshold``
   route there, else to the least-loaded replica (``miss_policy="least_load"``, current
   releases) or to the replica with the smallest tree (``miss_policy="smallest_tree"``, older
   releases, as the file's header comment still describes);
3. in every case insert the prompt into the chosen replica's tree.

Ties (checked against the real gateway, sglang-router 0.3.2, by ``btb gateway-check``): among
replicas with the same longest match the gateway returns the tenant cached on the tree node where
the match ends, which is the tenant that *created* that node, i.e. the replica that was first sent
a prompt containing the deepest matched block (``Node::last_tenant`` in
``sgl-model-gateway/src/policies/tree.rs``, sgl-project/sglang @ 03744dbe; older trees returned the
first tenant of a concurrent hash map). ``tie_break="first_holder"`` does the same; if that replica
no longer holds the block (evicted) the lower load, then the lower index, wins.
``tie_break="least_load"`` (the default, kept so that published results do not move) sends the
tie to the lower load, then the lower index; README "Real gateway" gives the agreement of both.
Least-load ties go to the lowest index (``min_by_key`` returns the first minimum; the
``sglang_gateway`` adapter numbers replicas in the gateway's worker order so this matches). Trees are trimmed every
``eviction_interval_s`` of simulated time to ``max_tree_size`` tokens per replica by LRU leaf
eviction (the gateway runs the same loop in a background thread).

``match_mode="kv_events"`` (an extension asked for by issue 5) keeps the same skeleton but matches
against the replicas' true cache contents (``view.cached_blocks``, the KV-event view: only completed
blocks) instead of the router's tree; the best replica is the one with most overlapping blocks, then
lower load, then lower index.
"""

from __future__ import annotations

import math

from ..errors import ConfigError
from .base import IndexSyncLog, cached_blocks_all
from .least_load import InFlightRouter, SpreadLoad
from .params import RouterParam, check_range
from .prefix_tree import ApproxPrefixIndex, PiecePath, mask_replicas

_TIERS = ("hbm", "dram", "disk")


def next_tick(now_s: float, interval_s: float) -> float:
    """The first multiple of ``interval_s`` strictly after ``now_s`` (trims run at ``k x interval``,
    k >= 1), computed directly: a late first trim (epoch-scale clocks) or a tiny interval costs
    one step, not ``now / interval`` of them. Equal to adding ``interval_s`` until past ``now_s``
    whenever the multiples are exact in float64 (e.g. the default 120 s)."""
    q = now_s / interval_s
    if not q < 2.0 ** 52:  # the multiples are denser than float64 here: the next float will do
        return math.nextafter(now_s, math.inf)
    k = math.floor(q) + 1
    t = k * interval_s
    while t <= now_s:  # floor() of a rounded quotient can fall one short
        k += 1
        t = k * interval_s
    return t


def parse_tiers(text: str, policy: str, field: str) -> tuple[str, ...]:
    """``"hbm,dram"`` -> ``("hbm", "dram")``; raises ``ConfigError`` on an unknown or empty list."""
    tiers = tuple(t.strip() for t in str(text).split(",") if t.strip())
    bad = [t for t in tiers if t not in _TIERS]
    if not tiers or bad:
        raise ConfigError(f"{policy}: {field}={text!r} must be a comma list of {list(_TIERS)}")
    return tiers


class CacheAwareRouter(IndexSyncLog, InFlightRouter):
    """SGLang Model Gateway ``cache_aware`` policy (see the module docstring for the rule).

    Parameters
    ----------
    cache_threshold : float in [0, 1]
        Minimum match rate, exclusive, for cache routing (0.3, ``router_args.py``).
    balance_abs_threshold : int >= 0
        Imbalance needs ``max_load - min_load`` strictly above this (64, ``router_args.py``).
    balance_rel_threshold : float >= 0
        ...and ``max_load`` strictly above this times ``min_load`` (1.5, ``router_args.py``).
    eviction_interval_s : float >= 0
        Simulated seconds between tree trims; 0 disables eviction (120, ``router_args.py``).
    max_tree_size : int >= 1
        Tokens kept per replica tree after a trim (2**26, ``router_args.py``; SGLang counts chars).
    balance_token_usage_threshold : float >= 0
        Imbalanced when max - min engine KV usage is strictly above this (1.0 = off, smg
        ``CacheAwareConfig`` @ 56ad2018).
    overload_token_usage_threshold : float >= 0
        Imbalanced when any engine's KV usage is strictly above this (1.0 = off, same source).
    miss_policy : {"least_load", "smallest_tree"}
        Where a cache miss goes (current releases / older releases).
    match_mode : {"tree", "kv_events"}
        Match against the router's own tree (SGLang) or the true cache contents.
    kv_event_tiers : str
        Comma list of tiers counted in ``kv_events`` mode (default all: ``"hbm,dram,disk"``).
    tie_break : {"first_holder", "least_load"}
        Among replicas that share the longest match: the one that first held the deepest matched
        block (the gateway, see the module docstring), or the lower load then lower index
        (default).

    Raises
    ------
    ConfigError
        On any value outside the ranges above; the message names the field and the value.
    """

    name = "cache_aware"
    PARAMS = (
        RouterParam("cache_threshold", float, 0.3, "min prefix match rate (exclusive) to follow "
                    "the cache"),
        RouterParam("balance_abs_threshold", int, 64, "imbalance: max-min load must exceed this"),
        RouterParam("balance_rel_threshold", float, 1.5, "imbalance: max load must exceed this x "
                    "min load"),
        RouterParam("eviction_interval_s", float, 120.0, "seconds between tree trims (0 = never)"),
        RouterParam("max_tree_size", int, 2 ** 26, "tokens kept per replica tree"),
        RouterParam("balance_token_usage_threshold", float, 1.0, "imbalance: max - min engine KV "
                    "usage must exceed this (>= 1 = off)"),
        RouterParam("overload_token_usage_threshold", float, 1.0, "imbalance: some engine's KV "
                    "usage exceeds this (>= 1 = off)"),
        RouterParam("miss_policy", str, "least_load", "where a cache miss goes",
                    ("least_load", "smallest_tree")),
        RouterParam("match_mode", str, "tree", "match against own tree or true cache (KV events)",
                    ("tree", "kv_events")),
        RouterParam("kv_event_tiers", str, "hbm,dram,disk", "tiers counted in kv_events mode"),
        RouterParam("tie_break", str, "least_load", "among replicas with the longest match: the "
                    "first to hold the deepest block (gateway) or the least loaded",
                    ("first_holder", "least_load")),
    )

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5, eviction_interval_s: float = 120.0,
                 max_tree_size: int = 2 ** 26, balance_token_usage_threshold: float = 1.0,
                 overload_token_usage_threshold: float = 1.0, miss_policy: str = "least_load",
                 match_mode: str = "tree", kv_event_tiers: str = "hbm,dram,disk",
                 tie_break: str = "least_load") -> None:
        p = self.name
        check_range(p, "cache_threshold", cache_threshold, 0.0, 1.0)
        check_range(p, "balance_abs_threshold", balance_abs_threshold, 0, integer=True)
        check_range(p, "balance_rel_threshold", balance_rel_threshold, 0.0)
        check_range(p, "eviction_interval_s", eviction_interval_s, 0.0)
        check_range(p, "max_tree_size", max_tree_size, 1, integer=True)
        check_range(p, "balance_token_usage_threshold", balance_token_usage_threshold, 0.0)
        check_range(p, "overload_token_usage_threshold", overload_token_usage_threshold, 0.0)
        if miss_policy not in ("least_load", "smallest_tree"):
            raise ConfigError(f"{p}: miss_policy={miss_policy!r} must be 'least_load' or "
                              "'smallest_tree'")
        if match_mode not in ("tree", "kv_events"):
            raise ConfigError(f"{p}: match_mode={match_mode!r} must be 'tree' or 'kv_events'")
        if tie_break not in ("first_holder", "least_load"):
            raise ConfigError(f"{p}: tie_break={tie_break!r} must be 'first_holder' or 'least_load'")
        self.tie_break = tie_break
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = int(balance_abs_threshold)
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.eviction_interval_s = float(eviction_interval_s)
        self.max_tree_size = int(max_tree_size)
        self.balance_token_usage_threshold = float(balance_token_usage_threshold)
        self.overload_token_usage_threshold = float(overload_token_usage_threshold)
        # usage is a fraction in [0, 1]: thresholds >= 1 can never fire, so skip reading it
        self._usage_triggers = (self.balance_token_usage_threshold < 1.0
                                or self.overload_token_usage_threshold < 1.0)
        self.miss_policy = miss_policy
        self.match_mode = match_mode
        self.kv_event_tiers = parse_tiers(kv_event_tiers, p, "kv_event_tiers")

    def reset(self, view) -> None:
        super().reset(view)
        self.load = SpreadLoad(view.num_replicas)
        # the finish hook is the load's own (what on_request_finished below does, one call less)
        self.on_request_finished = self.load.finish
        self.tree = ApproxPrefixIndex(view.num_replicas)
        self._next_evict_s = self.eviction_interval_s
        self._sync_log = None       # prompts inserted since the last index exchange, if syncing
        # the view's request pieces (the simulator's views), so the tree walks a request's pieces
        # of runs instead of a tuple of its ids; the last request's path (match, then insert)
        self._request_pieces = getattr(view, "request_pieces", None)
        self._path_req = self._path = None
        #: Decision counts by branch: "imbalanced", "hit", "miss" (for tests and notebooks).
        self.decisions = {"imbalanced": 0, "hit": 0, "miss": 0}

    # -- the rule ------------------------------------------------------------------------------
    def is_imbalanced(self) -> bool:
        """SGLang's imbalance test: an engine KV-usage trigger (overload or spread), or the
        request-count spread of the router's in-flight loads (both strict inequalities)."""
        cands = self._restricted()
        if self._usage_triggers:
            v = self.view
            usage = [v.kv_usage(r) for r in (range(v.num_replicas) if cands is None else cands)]
            hi_u = max(usage)
            if hi_u > self.overload_token_usage_threshold:
                return True
            if hi_u - min(usage) > self.balance_token_usage_threshold:
                return True
        if cands is None:
            hi, lo = self.load.spread()   # (kept as loads change: no scan of the fleet)
        else:
            loads = self.load.loads
            loads = [loads[r] for r in cands]
            hi, lo = max(loads), min(loads)
        return (hi - lo) > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo

    def best_match(self, request) -> tuple[int, int]:
        """``(replica, matched_tokens)`` of the longest prefix match (ties: lower load, index)."""
        matched, pick = self._match(request)
        return pick(), matched

    def _match(self, request):
        """``(matched_tokens, pick)``: the longest match's tokens, and a function returning the
        replica :meth:`best_match` picks (evaluated only when the rule needs it).

        Tree mode walks the router's tree once along the prompt's nodes (``deepest_match``; runs
        of blocks, :mod:`~btb_core.routers.prefix_tree`), so the cost follows the number of
        nodes on the path and the replicas tied at the longest match, not the fleet size or the
        prompt length; ``kv_events`` mode uses the view's
        holder index (``cached_blocks_all``). Both give what matching every replica in turn gave.
        """
        n = self.view.num_replicas
        bt = request.block_tokens
        isl = int(request.input_length)
        cands = self._restricted()
        loads = self.load.loads

        def least_loaded():  # nothing matched: the least loaded, ties to the lowest index
            return (loads.index(self.load.spread()[1]) if cands is None
                    else min(cands, key=lambda r: (loads[r], r)))

        if self.match_mode == "tree":
            ids = self.tree_path(request)
            tree = self.tree
            allowed = -1
            if cands is not None:
                allowed = 0
                for r in cands:
                    allowed |= 1 << r
            k = tree.deepest_match(ids, allowed)
            matched = min(k * bt, isl)
            if matched <= 0:
                return 0, least_loaded
            # every replica holding the first k0 blocks matches the same tokens as the deepest
            k0 = k if k * bt <= isl else max(1, -(-isl // bt))

            def pick():
                top = mask_replicas(tree.holder_mask_at(ids, k0) & allowed)
                best = min(top, key=lambda r: (loads[r], r))
                if self.tie_break == "first_holder":
                    d = tree.match_blocks(best, ids)
                    first = tree.first_holder_at(ids, d)
                    if first is not None and first in top:
                        best = first
                return best
            return matched, pick
        ids = request.hash_ids
        found = cached_blocks_all(self.view, ids, self.kv_event_tiers)
        if cands is not None:
            allowed_set = set(cands)
            found = {r: m for r, m in found.items() if r in allowed_set}
        matched = max((min(m * bt, isl) for m in found.values()), default=0)
        if matched <= 0:
            return 0, least_loaded

        def pick():
            top = [r for r, m in found.items() if min(m * bt, isl) == matched]
            return min(top, key=lambda r: (loads[r], r))
        return matched, pick

    def choose(self, request) -> int:
        """The replica the rule picks for ``request``, without recording the decision."""
        if self.is_imbalanced():
            self.decisions["imbalanced"] += 1
            return self.load.argmin(self._restricted())
        matched, pick = self._match(request)
        isl = int(request.input_length)
        rate = matched / isl if isl > 0 else 0.0
        if rate > self.cache_threshold:
            self.decisions["hit"] += 1
            return pick()
        self.decisions["miss"] += 1
        cands = self._restricted()
        if self.miss_policy == "smallest_tree":
            return min(range(self.view.num_replicas) if cands is None else cands,
                       key=lambda r: (self.tree.size_tokens(r), r))
        return self.load.argmin(cands)

    def _restricted(self):
        """``view.routable_replicas`` when some replica is not routable, else None (all)."""
        cands = self.candidates()
        return None if len(cands) == self.view.num_replicas else cands

    def record(self, request, replica: int) -> None:
        """Insert the prompt into ``replica``'s tree and count it in flight there.

        Called for every routed request, including ones a wrapping router (BTB) placed itself, so
        the tree and loads stay those of the requests actually dispatched.
        """
        now = self.view.now_s
        if now >= self._next_evict_s:     # (_maybe_evict's own test, checked here first)
            self._maybe_evict()
        path = self._path if request is self._path_req else self.tree_path(request)
        self.tree.insert(replica, path, request.input_length, request.block_tokens, now)
        if self._sync_log is not None:
            self._sync_log.append((replica, request.hash_ids, request.input_length,
                                   request.block_tokens))
        self.load.add(request, replica)

    def tree_path(self, request):
        """``request``'s block path for the tree: a :class:`~btb_core.routers.prefix_tree.PiecePath`
        of its pieces of runs when the view gives them (no id tuple built), else its
        ``hash_ids``; the same object for consecutive calls about one request (the tree's walk
        cache keys on it)."""
        if request is self._path_req:
            return self._path
        rp = self._request_pieces
        pieces = rp(request) if rp is not None else None
        path = request.hash_ids if pieces is None else PiecePath(pieces[0], pieces[1])
        self._path_req = request
        self._path = path
        return path

    def _maybe_evict(self) -> None:
        if self.eviction_interval_s <= 0:
            return
        now = self.view.now_s
        if now < self._next_evict_s:
            return
        for r in range(self.view.num_replicas):
            self.tree.evict_to(r, self.max_tree_size)
        self._next_evict_s = next_tick(now, self.eviction_interval_s)

    # -- Router interface ----------------------------------------------------------------------
    def route(self, request) -> int:
        replica = self.choose(request)
        self.record(request, replica)
        return replica

    def on_replica_removed(self, replica: int, failed: bool) -> None:
        """A failed replica's tree and in-flight count are dropped (its requests are routed
        again); a draining one keeps them until its requests finish."""
        super().on_replica_removed(replica, failed)
        if failed:
            self.tree.evict_to(replica, 0)

    # -- index exchange between instances (SGLang's mesh tree sync; IndexSyncLog records) --------
    def apply_index_updates(self, updates: list) -> None:
        """Insert other instances' routed prompts into this tree (stamped now); loads untouched."""
        now = self.view.now_s
        for replica, hash_ids, input_length, block_tokens in updates:
            self.tree.insert(replica, hash_ids, input_length, block_tokens, now)


__all__ = ["CacheAwareRouter", "next_tick", "parse_tiers"]
