"""KV-aware routing as in the NVIDIA Dynamo KV router.

Reference: ``lib/llm/src/kv_router/scheduler.rs`` (ai-dynamo/dynamo @ db19bd2a),
``DefaultWorkerSelector::select_worker`` and ``softmax_sample``. For each worker ``w`` and a request
of ``isl`` tokens in ``ceil(isl / block)`` blocks:

- ``overlap_w`` = leading request blocks cached on ``w`` (the KV-event indexer; here
  ``view.cached_blocks`` over ``overlap_tiers``, default device HBM only, as the default indexer
  sees GPU blocks);
- ``prefill_blocks_w = (active prefill tokens on w + isl - overlap_w * block) / block``, where the
  active prefill tokens are the router's own book, as in Dynamo's ``ActiveSequences``: each request
  it dispatched adds ``isl - overlap * block`` for the worker it went to (``add_request`` with its
  ``overlap_blocks``) and removes it when its prefill completes (``mark_prefill_completed``), so a
  queued request that will hit a cached prefix costs only its uncached tokens
  (``lib/llm/src/kv_router/sequence.rs``, ``scheduler.rs``);
- ``decode_blocks_w`` = the blocks active on ``w`` plus the request's blocks not already active
  there. With ``active_blocks="router"`` (default, Dynamo's ``router_track_active_blocks=true``)
  "active" is the router's own book, as Dynamo's ``ActiveSequences`` keeps it
  (``lib/llm/src/kv_router/sequence.rs`` @ 581ee33e): when it **selects** a worker it adds the
  request's full-block hashes to that worker's set of unique active blocks (shared prefix blocks
  counted once) and removes them when the request finishes, so a request routed but still waiting
  in the engine's queue already counts. ``active_blocks="engine"`` is this project's earlier rule:
  the engine's blocks held by running requests (booked only at admission) plus
  ``ceil(isl / block) - overlap_w``;
- ``logit_w = overlap_score_weight * prefill_blocks_w + decode_blocks_w`` (lower is better;
  ``overlap_score_weight`` default 1.0, ``--kv-overlap-score-weight`` in the Dynamo docs).

Temperature 0 (``--router-temperature`` default 0.0) takes the minimum logit. Ties
(``tie_break="tree_size"``, the default, as ``DefaultWorkerSelector::select_worker`` in
``lib/kv-router/src/scheduling/selector.rs`` @ ccd1706e): the tied worker whose indexer tree is
smallest (``view.cached_block_count``, the complete blocks in its HBM cache), and uniformly at random
when all tied trees are equal (here also among several smallest trees); ``tie_break="random"`` is
this project's earlier rule (uniform among all tied). ``T > 0`` samples from
``softmax(-logit / ((max - min) * T))`` (logits normalised by their range; uniform when all are
equal). Random draws come from ``view.rng``.

Router queue (``router_queue_threshold``, ``KvRouterConfig`` in
``lib/kv-router/src/scheduling/config.rs`` @ c2f2e1aa, default ``None`` = off): when set, a request
is held in the router while **every** worker's booked prefill tokens exceed ``threshold x
max_num_batched_tokens`` (here the cluster's ``chunk_tokens``), and released first come, first
served, each re-scored at release, when a prefill completes and some worker drops below it.
"""

from __future__ import annotations

import math
from itertools import compress

import numpy as np

from ..errors import ConfigError
from .base import Router, cached_block_count_all, cached_blocks_all
from .holder_sets import RunBook, leading_pieces
from .id_runs import runs_of_ids
from .cache_aware import parse_tiers
from .params import RouterParam, check_range


#: Up to this many replicas the logits are computed in list operations (the same values as numpy's;
#: faster up to ~100 replicas, measured on the Bursted-shaped trace).
_SCALAR_MAX = 96

#: More tied replicas than this read every replica's tree size in one view call.
_FEW_TIED = 8

#: Integer keys (:class:`LogitKeys`) stay below this bound, so that every logit they stand for is
#: an exact double (with a margin for the request's own terms, checked per request).
_KEY_LIMIT = 1 << 52


class LogitKeys:
    """Per-replica integer keys ``prefill_tokens[r] + block_tokens * active_blocks[r]``, kept as
    ``kv_aware``'s books change, that order the replicas as its logits do.

    With ``overlap_score_weight == 1.0`` and ``block_tokens`` a power of two, replica ``r``'s logit
    ``(P_r + u_r) / bt + (A_r + nfull - b_r)`` (``P_r`` booked prefill tokens, ``u_r`` the request's
    uncached tokens there, ``A_r`` booked active blocks, ``b_r`` of them the request's, ``nfull``
    its full blocks; module docstring) is ``K_r / bt`` exactly, ``K_r = P_r + u_r + bt * (A_r +
    nfull - b_r)`` an integer of magnitude below 2**53 (keys and ``isl + bt * nfull`` below
    2**52): the product by 1.0, a quotient by a power of two of an integer below 2**53 and its sum
    with such an integer are exact doubles. Logits then compare (and tie) as the integers
    ``K_r - isl - bt * nfull = key_r - (isl - u_r) - bt * b_r`` do, where only the replicas the
    request touches (cached overlap or booked blocks) differ from ``key_r``.

    Parameters
    ----------
    num_replicas : int

    Attributes
    ----------
    keys : list[int]
        ``keys[r] = prefill[r] + bt * sizes[r]`` for the lists last seen (:meth:`sync`).
    bt : int or None
        The block tokens of the keys; None = keys not valid (not synced, or a key reached
        :data:`_KEY_LIMIT`).
    """

    __slots__ = ("keys", "bt", "_prefill", "_sizes")

    def __init__(self, num_replicas: int) -> None:
        self.keys = [0] * num_replicas
        self.bt: int | None = None
        self._prefill = [0] * num_replicas
        self._sizes = [0] * num_replicas

    def sync(self, prefill: list, sizes: list, bt: int) -> bool:
        """Make the keys those of ``prefill``, ``sizes`` and ``bt`` (rebuilt only when ``bt``
        changed or the lists differ from the copies of the last update, as when something else
        rewrote them); False when they are not exact (``bt`` not a power of two, a key at or
        above :data:`_KEY_LIMIT`)."""
        if bt == self.bt and prefill == self._prefill and sizes == self._sizes:
            return True
        self._prefill = list(prefill)
        self._sizes = list(sizes)
        self.keys = [p + bt * a for p, a in zip(prefill, sizes)]
        ok = bt > 0 and not bt & (bt - 1) and (not self.keys or max(self.keys) < _KEY_LIMIT)
        self.bt = bt if ok else None
        return ok

    def update(self, replica: int, prefill: int, size: int) -> None:
        """``replica``'s booked prefill tokens and active blocks are now ``prefill`` and ``size``."""
        bt = self.bt
        if bt is None:
            return
        k = prefill + bt * size
        self.keys[replica] = k
        self._prefill[replica] = prefill
        self._sizes[replica] = size
        if k >= _KEY_LIMIT:
            self.bt = None

    def ties(self, isl: int, bt: int, req_blocks: int, found: dict, book: dict) -> list[int]:
        """The replicas of minimum logit, ascending: the argmin set of ``key_r - min(isl,
        min(found[r], req_blocks) * bt) - bt * book[r]`` (absent entries 0), built from a copy of
        the keys changed at the touched replicas only. Requires :meth:`sync` with this ``bt``."""
        keys = self.keys[:]
        for r, ov in found.items():
            m = (ov if ov < req_blocks else req_blocks) * bt
            keys[r] -= m if m < isl else isl
        for r, k in book.items():
            keys[r] -= bt * k
        lo = min(keys)
        c = keys.count(lo)
        if c == 1:
            return [keys.index(lo)]
        if c <= _FEW_TIED:            # few: find them one by one
            find = keys.index
            tied = []
            i = -1
            for _ in range(c):
                i = find(lo, i + 1)
                tied.append(i)
            return tied
        return [r for r, k in enumerate(keys) if k == lo]


class KvAwareRouter(Router):
    """NVIDIA Dynamo KV router cost function (see the module docstring).

    Parameters
    ----------
    overlap_score_weight : float >= 0
        Weight of the prefill term (1.0, Dynamo ``KvRouterConfig`` default).
    router_temperature : float >= 0
        0 = argmin; > 0 = softmax sampling (0.0, Dynamo default).
    overlap_tiers : str
        Comma list of cache tiers whose blocks count as overlap (default ``"hbm"``).
    active_blocks : {"router", "engine"}
        Decode load from the router's own book of selected requests (Dynamo, default) or from the
        engine's running requests (earlier releases of this project).
    tie_break : {"tree_size", "random"}
        Ties at temperature 0: smaller indexer tree, then random (Dynamo, default); or random.
    router_queue_threshold : float >= 0 or None
        Hold requests in the router while every replica's booked prefill tokens exceed this
        fraction of the cluster's ``chunk_tokens`` (None = off, Dynamo default).

    Raises
    ------
    ConfigError
        On a negative weight, temperature or threshold, an unknown tier or choice.
    """

    name = "kv_aware"
    PARAMS = (
        RouterParam("overlap_score_weight", float, 1.0, "weight of the prefill-blocks term"),
        RouterParam("router_temperature", float, 0.0, "0 = argmin, > 0 = softmax sampling"),
        RouterParam("overlap_tiers", str, "hbm", "cache tiers counted as overlap"),
        RouterParam("active_blocks", str, "router", "decode load: router's book (booked at "
                    "selection) or engine (at admission)", ("router", "engine")),
        RouterParam("tie_break", str, "tree_size", "ties: smaller tree then random, or random",
                    ("tree_size", "random")),
        RouterParam("router_queue_threshold", float, None, "hold requests while every replica's "
                    "booked prefill tokens exceed this x chunk_tokens (none = off)"),
    )

    def __init__(self, overlap_score_weight: float = 1.0, router_temperature: float = 0.0,
                 overlap_tiers: str = "hbm", active_blocks: str = "router",
                 tie_break: str = "tree_size", router_queue_threshold: float | None = None) -> None:
        check_range(self.name, "overlap_score_weight", overlap_score_weight, 0.0)
        check_range(self.name, "router_temperature", router_temperature, 0.0)
        if active_blocks not in ("router", "engine"):
            raise ConfigError(f"kv_aware: active_blocks={active_blocks!r} must be 'router' or "
                              "'engine'")
        if tie_break not in ("tree_size", "random"):
            raise ConfigError(f"kv_aware: tie_break={tie_break!r} must be 'tree_size' or 'random'")
        if router_queue_threshold is not None:
            check_range(self.name, "router_queue_threshold", router_queue_threshold, 0.0)
        self.overlap_score_weight = float(overlap_score_weight)
        self.router_temperature = float(router_temperature)
        self.overlap_tiers = parse_tiers(overlap_tiers, self.name, "overlap_tiers")
        self.active_blocks = active_blocks
        self.tie_break = tie_break
        self.router_queue_threshold = (None if router_queue_threshold is None
                                       else float(router_queue_threshold))

    def reset(self, view) -> None:
        super().reset(view)
        n = view.num_replicas
        self._prefill_tokens = [0] * n   # the router's book of uncached prompt tokens
        self._prefill_arr = np.zeros(n, np.int64)         # the same, as an array
        self._booked: dict[int, tuple[int, int]] = {}     # request index -> (replica, tokens booked)
        # the active blocks booked per replica, kept per block run with run -> replicas holding
        # it (one walk over a request's pieces finds every replica's match, routers/holder_sets.py)
        self._book = RunBook(n)
        self._active_len = np.zeros(n, np.int64)          # self._book.sizes, as an array
        # integer keys ordering the logits (exact shortcut, see LogitKeys)
        self._keys = LogitKeys(n)
        self._keyed = self.overlap_score_weight == 1.0 and self.active_blocks == "router"
        # request index -> (replica, pieces of its full blocks)
        self._active_booked: dict[int, tuple[int, list, list]] = {}
        # the simulator's view hands over a request's pieces; other views: the runs of its ids
        self._request_pieces = getattr(view, "request_pieces", None)
        self._cached_pieces = getattr(view, "cached_blocks_all_pieces", None)
        #: Requests held in the router queue (FCFS), when ``router_queue_threshold`` is set.
        self.queue: list = []
        self.queued_total = 0

    # -- the cost function ---------------------------------------------------------------------
    def _pieces(self, request) -> tuple[list, list]:
        """``(run starts, lengths)`` of the request's ids."""
        f = self._request_pieces
        if f is not None:
            pieces = f(request)
            if pieces is not None:
                return pieces
        return runs_of_ids(request.hash_ids)

    def _inputs(self, request) -> tuple:
        """What the logits of one request depend on: ``(isl, block tokens, ceil(isl / block),
        overlaps, book matches, full blocks, pieces of the full blocks)``.

        The overlaps (``{replica: blocks}``) come from one walk of the view's holder index and the
        router-book matches from one walk of its own book over the request's pieces (book
        matches and pieces None with ``active_blocks="engine"``); omitted replicas hold 0.
        """
        bt = request.block_tokens
        isl = int(request.input_length)
        starts, lens = self._pieces(request)
        nids = sum(lens)
        if self._cached_pieces is not None:
            found = self._cached_pieces(starts, lens, nids, self.overlap_tiers)
        else:
            found = cached_blocks_all(self.view, request.hash_ids, self.overlap_tiers)
        nfull, full, book = 0, None, None
        if self.active_blocks == "router":
            nfull = min(request.full_blocks, nids)
            full = (starts, lens) if nfull == nids else leading_pieces(starts, lens, nfull)
            book = self._book.depths(*full)
        return isl, bt, math.ceil(isl / bt), found, book, nfull, full

    def _logit(self, r: int, isl, bt, req_blocks, found, book, nfull) -> tuple[float, int]:
        """Replica ``r``'s logit and uncached prompt tokens: the formula of the module
        docstring, one replica at a time."""
        overlap = min(found.get(r, 0), req_blocks)
        u = max(0, isl - overlap * bt)
        prefill_blocks = (self._prefill_tokens[r] + u) / bt
        if book is not None:
            decode_blocks = self._book.sizes[r] + nfull - book.get(r, 0)
        else:
            decode_blocks = self.view.active_blocks(r) + (req_blocks - overlap)
        return self.overlap_score_weight * prefill_blocks + decode_blocks, u

    def _logits(self, request) -> tuple:
        """``(logits, inputs)``: the logits as a list (few replicas) or a float64 array, and
        :meth:`_inputs`.

        With the router's book, the overlaps and book matches are scattered from their dicts into
        per-replica lists (up to :data:`_SCALAR_MAX` replicas) or int64 arrays (beyond) and the
        logits computed for all replicas in one pass: every operation is the same IEEE-754
        double operation, in the same order, as the scalar formula (:meth:`_logit`; integer terms
        are exact), so the logits are bit-identical to it.
        """
        return self._logits_of(self._inputs(request))

    def _logits_of(self, x: tuple) -> tuple:
        """:meth:`_logits` from the request's :meth:`_inputs` ``x``."""
        args = x[:-1]
        n = self.view.num_replicas
        isl, bt, req_blocks, found, book, nfull = args
        if book is None:       # the engine's active blocks: asked replica by replica
            logits = [self._logit(r, *args)[0] for r in range(n)]
            return (logits if n <= _SCALAR_MAX else np.array(logits)), x
        if n <= _SCALAR_MAX:   # the scalar formula in list operations beats numpy's call overhead
            uncached = [isl] * n           # isl where nothing is cached
            for r, ov in found.items():
                u = isl - (ov if ov < req_blocks else req_blocks) * bt
                uncached[r] = u if u > 0 else 0
            matched = [0] * n
            for r, k in book.items():
                matched[r] = k
            w = self.overlap_score_weight
            return [w * ((p + u) / bt) + (a + nfull - b) for p, u, a, b in
                    zip(self._prefill_tokens, uncached, self._book.sizes, matched)], x
        if found:             # uncached tokens: isl where nothing is cached
            k = len(found)
            uncached = np.full(n, isl, np.int64)
            uncached[np.fromiter(found, np.int64, k)] = np.maximum(0, isl - np.minimum(
                np.fromiter(found.values(), np.int64, k), req_blocks) * bt)
            prefill_blocks = (self._prefill_arr + uncached) / bt
        else:
            prefill_blocks = (self._prefill_arr + isl) / bt
        decode_blocks = self._active_len + nfull
        if book:
            k = len(book)
            decode_blocks[np.fromiter(book, np.int64, k)] -= np.fromiter(book.values(), np.int64, k)
        return self.overlap_score_weight * prefill_blocks + decode_blocks, x

    def _costs(self, request) -> tuple[np.ndarray, np.ndarray]:
        """Per-replica logits (blocks, lower is better; float64, shape ``(num_replicas,)``) and
        uncached prompt tokens (int64, same shape), replica by replica."""
        args = self._inputs(request)[:-1]
        both = [self._logit(r, *args) for r in range(self.view.num_replicas)]
        return np.array([b[0] for b in both]), np.array([b[1] for b in both], np.int64)

    def logits(self, request) -> np.ndarray:
        """Per-replica cost, shape ``(num_replicas,)``, in blocks (lower is better)."""
        return self._costs(request)[0]

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """Dynamo's softmax over range-normalised negated logits at ``router_temperature > 0``."""
        lo, hi = float(logits.min()), float(logits.max())
        if hi == lo:
            return np.full(len(logits), 1.0 / len(logits))
        scaled = -(logits - lo) / ((hi - lo) * self.router_temperature)
        p = np.exp(scaled - scaled.max())
        return p / p.sum()

    def _break_tie(self, tied: list[int]) -> int:
        rng = self.view.rng
        if self.tie_break == "tree_size":
            if len(tied) > _FEW_TIED:     # many tied: one call for every replica's tree size
                sizes = list(map(cached_block_count_all(self.view).__getitem__, tied))
            else:
                sizes = [self.view.cached_block_count(r) for r in tied]
            low = min(sizes)
            k = sizes.count(low)
            if k == 1:
                return tied[sizes.index(low)]
            if k < len(tied):
                tied = list(compress(tied, map(low.__eq__, sizes)))
        return tied[int(rng.integers(len(tied)))]

    def _keyed_ties(self, x: tuple) -> list[int] | None:
        """The tied minimum-logit replicas (ascending) from the integer keys (:class:`LogitKeys`),
        or None when that shortcut is not exact for request inputs ``x`` (weight != 1, engine
        active blocks, block tokens not a power of two, keys too large)."""
        if not self._keyed:
            return None
        isl, bt, req_blocks, found, book, nfull, _ = x
        if isl + bt * nfull >= _KEY_LIMIT or not self._keys.sync(self._prefill_tokens,
                                                                 self._book.sizes, bt):
            return None
        return self._keys.ties(isl, bt, req_blocks, found, book)

    def select(self, request) -> int:
        """Score the replicas, pick one and book the request there (prefill tokens, blocks).

        At temperature 0 over every replica the minimum-logit set comes from the integer keys
        (:meth:`_keyed_ties`) when they are exact: the same set, in the same order, as the logits
        give, so the same pick and random draws."""
        x = self._inputs(request)
        cands = self.candidates()
        n = self.view.num_replicas
        restricted = len(cands) != n
        tied = None
        if self.router_temperature == 0.0 and not restricted:
            tied = self._keyed_ties(x)
        if tied is not None:
            pick = tied[0] if len(tied) == 1 else self._break_tie(tied)
        elif self.router_temperature == 0.0:
            logits = self._logits_of(x)[0]
            if type(logits) is list:
                if restricted:
                    lo = min([logits[r] for r in cands])
                    tied = [r for r in cands if logits[r] == lo]
                else:
                    lo = min(logits)
                    tied = [r for r in range(n) if logits[r] == lo]
            elif restricted:
                idx = np.array(cands, np.int64)
                sub = logits[idx]
                tied = idx[sub == sub.min()].tolist()
            else:
                tied = np.flatnonzero(logits == logits.min()).tolist()
            pick = tied[0] if len(tied) == 1 else self._break_tie(tied)
        else:
            logits = np.asarray(self._logits_of(x)[0])
            sub = logits[np.array(cands, np.int64)] if restricted else logits
            p = self.probabilities(sub)
            u = self.view.rng.random()
            pick = int(min(np.searchsorted(np.cumsum(p), u, side="left"), len(p) - 1))
            if restricted:
                pick = cands[pick]
        # book the request's uncached tokens on its worker until its prefill completes
        u = self._logit(pick, *x[:-1])[1]
        self._prefill_tokens[pick] += u
        self._prefill_arr[pick] += u
        self._booked[request.index] = (pick, u)
        full = x[-1]
        if full is not None:
            self._active_len[pick] += self._book.add(pick, full[0], full[1])
            self._active_booked[request.index] = (pick, full[0], full[1])
        self._keys.update(pick, self._prefill_tokens[pick], self._book.sizes[pick])
        return pick

    # -- router queue --------------------------------------------------------------------------
    def _all_busy(self) -> bool:
        limit = self.router_queue_threshold * self.view.chunk_tokens
        return all(t > limit for t in self._prefill_tokens)

    def _release_queue(self) -> None:
        while self.queue and not self._all_busy():
            request = self.queue.pop(0)
            self.view.dispatch(request, self.select(request))

    # -- Router interface ----------------------------------------------------------------------
    def route(self, request) -> int | None:
        if self.router_queue_threshold is not None and (self.queue or self._all_busy()):
            self.queue.append(request)
            self.queued_total += 1
            return None
        return self.select(request)

    def on_replica_removed(self, replica: int, failed: bool) -> None:
        """A failed replica's booked prefill tokens and active blocks are dropped."""
        if failed:
            self._prefill_tokens[replica] = 0
            self._prefill_arr[replica] = 0
            self._book.drop_replica(replica)
            self._active_len[replica] = 0
            self._keys.update(replica, 0, 0)
            self._booked = {k: v for k, v in self._booked.items() if v[0] != replica}
            self._active_booked = {k: v for k, v in self._active_booked.items() if v[0] != replica}

    def on_prefill_done(self, request, replica: int) -> None:
        booked = self._booked.pop(request.index, None)
        if booked is not None:
            self._prefill_tokens[booked[0]] -= booked[1]
            self._prefill_arr[booked[0]] -= booked[1]
            r = booked[0]
            self._keys.update(r, self._prefill_tokens[r], self._book.sizes[r])
        if self.queue:
            self._release_queue()

    def on_request_finished(self, request, replica: int) -> None:
        entry = self._active_booked.pop(request.index, None)
        if entry is not None:
            r = entry[0]
            self._active_len[r] -= self._book.remove(r, entry[1], entry[2])
            self._keys.update(r, self._prefill_tokens[r], self._book.sizes[r])


__all__ = ["KvAwareRouter", "LogitKeys"]
