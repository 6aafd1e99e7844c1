"""Block-granular tiered prefix KV cache of one replica: HBM, host DRAM, optional disk.

Blocks are identified by their chained hash id (equal id at position i means equal first
``(i + 1) x block_tokens`` tokens), so a prefix is a run of leading ids.

HBM accounting, in block slots (``capacity_blocks`` = the replica's KV budget / bytes per block):

- *pinned* blocks: complete prefix blocks used by at least one running request or an outgoing
  transfer, reference-counted (shared blocks are held once, as paged attention does);
- *private* slots: a running request's blocks that are not (yet) reusable: prompt blocks whose
  prefill has not completed, the partial last prompt block, and its output tokens' blocks;
- *LRU* blocks: complete, unused, evictable blocks; on eviction they spill to DRAM (LRU, its own
  capacity), and from DRAM to the disk tier if there is one, else they are dropped.

Invariant: ``used_slots + len(lru) <= capacity_blocks`` where ``used_slots`` counts pinned blocks
plus private slots. Only complete blocks are ever visible to lookups (a prefill still running is
invisible), so a request or a copy can never reuse KV that does not exist yet.

Eviction order: when a request releases its prefix blocks they enter the LRU deepest-first, so a
child block is always evicted before its parent (as in SGLang's radix cache, which evicts leaves).

Representation (the semantics above are block by block; the storage is compressed)
-----------------------------------------------------------------------------------
Every operation touches a leading part of a root path, and the LRU evicts children before parents,
so the HBM blocks of any run (:mod:`btb_core.sim.blocks`) are always a leading part of it:
``hbm_len[run]`` blocks, of which the first ``pin_len[run]`` are pinned and the rest sit in the LRU.
A holder (a running request or an outgoing copy) pins a leading part ``[0, l)`` of each run on its
path, so a block's reference count is the number of holders with ``l`` above its offset; ``holders
[run]`` counts holders by ``l``. The LRU, DRAM and disk orders are kept as :class:`SpanList` s:
sequences of spans ``(run, lo, hi)``, each standing for the blocks ``hi - 1, hi - 2, ..., lo`` of
the run in that order (every insertion is deepest first). Each operation therefore costs
O(pieces of the path x spans per run) instead of O(blocks), and gives exactly the block-by-block
result: the same blocks in the same tier, in the same LRU order, evicted in the same order. The
invariants this relies on are checked where they are used (a violation raises ``RuntimeError``).

Paths are passed as ``(starts, lens)``: the run start ids and lengths of the path's pieces
(:meth:`btb_core.sim.blocks.BlockIndex.row_pieces`).
"""

from __future__ import annotations

from .blocks import path_spans, piece_at


class _Span:
    __slots__ = ("run", "lo", "hi", "prev", "next")

    def __init__(self, run, lo, hi):
        self.run = run
        self.lo = lo
        self.hi = hi


class SpanList:
    """An LRU order of blocks stored as spans ``(run, lo, hi)`` (blocks ``hi-1 .. lo`` of ``run``).

    The front (least recently inserted) is evicted first. ``size`` is the number of blocks;
    ``index`` maps a run to its spans (to answer membership and remove ranges): to the one span
    itself when the run has one (the common case; a DRAM tier holds ~10^4 runs per replica), else
    to a list of them (in no meaningful order).
    """

    __slots__ = ("head", "size", "index", "ix", "rep")

    def __init__(self) -> None:
        head = _Span(None, 0, 0)
        head.prev = head.next = head
        self.head = head
        self.size = 0
        self.index: dict[int, _Span | list[_Span]] = {}
        #: A :class:`~btb_core.sim.holders.HolderIndex` told when a run enters or leaves this list
        #: (set on a replica's DRAM tier only), and the replica it reports.
        self.ix = None
        self.rep = -1

    def __len__(self) -> int:
        return self.size

    def spans_of(self, run: int) -> tuple | list:
        """The spans of ``run`` present (empty if none)."""
        v = self.index.get(run)
        if v is None:
            return ()
        return (v,) if type(v) is _Span else v

    def append_desc(self, run: int, lo: int, hi: int) -> None:
        """Insert blocks ``hi-1, ..., lo`` of ``run`` at the most-recent end (none present)."""
        if hi <= lo:
            return
        head = self.head
        tail = head.prev
        self.size += hi - lo
        if tail.run == run and tail.lo == hi and tail is not head:
            tail.lo = lo
            return
        sp = _Span(run, lo, hi)
        sp.prev = tail
        sp.next = head
        tail.next = sp
        head.prev = sp
        index = self.index
        v = index.get(run)
        if v is None:
            index[run] = sp
            if self.ix is not None:
                self.ix.dram_add(run, self.rep)
        elif type(v) is _Span:
            index[run] = [v, sp]
        else:
            v.append(sp)

    def _unlink(self, sp: _Span) -> None:
        sp.prev.next = sp.next
        sp.next.prev = sp.prev
        index = self.index
        v = index[sp.run]
        if type(v) is _Span:
            del index[sp.run]
            if self.ix is not None:
                self.ix.dram_del(sp.run, self.rep)
        else:
            v.remove(sp)
            if len(v) == 1:
                index[sp.run] = v[0]

    def pop_front(self, k: int) -> list[tuple[int, int, int]]:
        """Remove the ``k`` least recent blocks; returns them as spans in eviction order."""
        out = []
        head = self.head
        self.size -= k
        index = self.index
        ix = self.ix
        while k > 0:
            sp = head.next
            if sp is head:
                raise RuntimeError("SpanList.pop_front: fewer blocks than requested")
            run, lo, hi = sp.run, sp.lo, sp.hi
            if hi - lo <= k:
                nxt = sp.next                     # (SpanList._unlink, inlined: sp.prev is head)
                head.next = nxt
                nxt.prev = head
                v = index[run]
                if type(v) is _Span:
                    del index[run]
                    if ix is not None:
                        ix.dram_del(run, self.rep)
                else:
                    v.remove(sp)
                    if len(v) == 1:
                        index[run] = v[0]
                out.append((run, lo, hi))
                k -= hi - lo
            else:
                out.append((run, hi - k, hi))
                sp.hi = hi - k
                k = 0
        return out

    def remove_range(self, run: int, lo: int, hi: int) -> int:
        """Remove the blocks of ``run`` with offsets in ``[lo, hi)`` that are present; returns how
        many were removed. The others keep their order."""
        v = self.index.get(run)
        if v is None or hi <= lo:
            return 0
        removed = 0
        # (spans of a run are disjoint: each is cut on its own, so their order here is irrelevant)
        for sp in ((v,) if type(v) is _Span else list(v)):
            a, b = sp.lo, sp.hi
            if b <= lo or a >= hi:
                continue
            if lo <= a and b <= hi:
                self._unlink(sp)
                removed += b - a
            elif a < lo and hi < b:              # split: (hi, b) stays first, then (a, lo)
                new = _Span(run, a, lo)
                new.prev = sp
                new.next = sp.next
                sp.next.prev = new
                sp.next = new
                sp.lo = hi
                cur = self.index[run]
                if type(cur) is _Span:
                    self.index[run] = [cur, new]
                else:
                    cur.append(new)
                removed += hi - lo
            elif a < lo:
                sp.hi = lo
                removed += b - lo
            else:
                sp.lo = hi
                removed += hi - a
        self.size -= removed
        return removed

    def cover(self, run: int, o: int) -> int:
        """Largest ``x`` with every offset in ``[o, x)`` of ``run`` present (``o`` if absent)."""
        v = self.index.get(run)
        if v is None:
            return o
        if type(v) is _Span:
            return v.hi if v.lo <= o < v.hi else o
        x = o
        grown = True
        while grown:
            grown = False
            for sp in v:
                if sp.lo <= x < sp.hi:
                    x = sp.hi
                    grown = True
        return x

    def next_start(self, run: int, o: int) -> float:
        """Smallest span start above ``o`` for ``run`` (inf if none)."""
        best = float("inf")
        for sp in self.spans_of(run):
            if o < sp.lo < best:
                best = sp.lo
        return best

    def contains(self, run: int, o: int) -> bool:
        for sp in self.spans_of(run):
            if sp.lo <= o < sp.hi:
                return True
        return False


class DiskTier:
    """An LRU block store on NVMe; one per replica, or one shared by all replicas of a cluster.

    Parameters
    ----------
    capacity_blocks : int
        Blocks the tier holds (``>= 0``).
    """

    __slots__ = ("capacity_blocks", "blocks")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.capacity_blocks = int(capacity_blocks)
        self.blocks = SpanList()

    def put_spans(self, spans) -> None:
        """Put blocks (spans in order) as most recent; a block already held moves to the end.

        Equal to putting the blocks one by one into an LRU of ``capacity_blocks``: the result holds
        the most recently put distinct blocks in recency order.
        """
        cap = self.capacity_blocks
        if cap == 0:
            return
        blocks = self.blocks
        for run, lo, hi in spans:
            if run in blocks.index:
                blocks.remove_range(run, lo, hi)
            blocks.append_desc(run, lo, hi)
        if blocks.size > cap:
            blocks.pop_front(blocks.size - cap)


class KVCache:
    """The tiered prefix cache of one replica (see the module docstring for the accounting).

    Parameters
    ----------
    capacity_blocks : int
        HBM KV budget in blocks (node HBM minus weights minus reserve, over bytes per block).
    dram_capacity_blocks : int
        Host-DRAM tier capacity in blocks (0 disables the tier).
    disk : DiskTier or None
        Disk tier (possibly shared with other replicas), or None.
    """

    __slots__ = ("capacity_blocks", "dram_capacity_blocks", "pin_len", "holders", "hbm_len", "lru",
                 "dram", "disk", "used_slots", "peak_hbm_blocks", "peak_dram_blocks", "hbm_blocks",
                 "ix", "rep")

    def __init__(self, capacity_blocks: int, dram_capacity_blocks: int = 0,
                 disk: DiskTier | None = None) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        if dram_capacity_blocks < 0:
            raise ValueError(f"dram_capacity_blocks must be >= 0, got {dram_capacity_blocks}")
        self.capacity_blocks = int(capacity_blocks)
        self.dram_capacity_blocks = int(dram_capacity_blocks)
        self.pin_len: dict[int, int] = {}
        self.holders: dict[int, dict[int, int]] = {}
        self.hbm_len: dict[int, int] = {}
        self.lru = SpanList()
        self.dram = SpanList()
        self.disk = disk
        self.used_slots = 0
        self.peak_hbm_blocks = 0
        self.peak_dram_blocks = 0
        #: Complete blocks in HBM, pinned or not (``sum(hbm_len.values())``, kept up to date).
        self.hbm_blocks = 0
        #: The :class:`~btb_core.sim.holders.HolderIndex` this cache reports to (None: none), and
        #: the replica number it reports as (:meth:`attach_index`).
        self.ix = None
        self.rep = -1

    def attach_index(self, index, replica: int) -> None:
        """Report every later change of this cache's HBM and DRAM contents to ``index`` (a
        :class:`~btb_core.sim.holders.HolderIndex`) as replica ``replica``; the current contents
        are reported now."""
        self.ix = index
        self.rep = replica
        self.dram.ix = index
        self.dram.rep = replica
        for run, h in self.hbm_len.items():
            index.set_hbm(run, replica, h)
        for run in self.dram.index:
            index.dram_add(run, replica)

    # ------------------------------------------------------------------ invariants
    def check_invariants(self, idle: bool = False) -> None:
        """Check the accounting of the module docstring; raise ``AssertionError`` naming the
        first violation.

        Always: every tier within its capacity (``used_slots + lru.size <= capacity_blocks``,
        DRAM and disk within theirs); per run, the pinned part is the longest holder's part and
        lies within its HBM part; the LRU holds exactly the HBM blocks nobody pins; no block is in
        HBM and DRAM at once; pinned blocks never exceed ``used_slots`` (the rest are private
        slots). With ``idle=True`` (no request
        running and no copy in flight, e.g. after a run): no pins, holders or private slots left
        (no leaked pins).
        """
        def fail(what):
            raise AssertionError(f"KVCache invariant: {what}")

        if self.used_slots < 0 or self.used_slots + self.lru.size > self.capacity_blocks:
            fail(f"used_slots {self.used_slots} + LRU {self.lru.size} blocks exceed HBM capacity "
                 f"{self.capacity_blocks}")
        if self.dram_capacity_blocks and self.dram.size > self.dram_capacity_blocks:
            fail(f"DRAM holds {self.dram.size} blocks, capacity {self.dram_capacity_blocks}")
        if not self.dram_capacity_blocks and self.dram.size:
            fail(f"DRAM tier disabled but holds {self.dram.size} blocks")
        if self.disk is not None and self.disk.blocks.size > self.disk.capacity_blocks:
            fail(f"disk holds {self.disk.blocks.size} blocks, capacity {self.disk.capacity_blocks}")
        pinned = 0
        for run, p in self.pin_len.items():
            cnt = self.holders.get(run)
            if p <= 0 or not cnt or max(cnt) != p or min(cnt.values()) < 1:
                fail(f"run {run}: pinned {p} blocks but holders {cnt}")
            if p > self.hbm_len.get(run, 0):
                fail(f"run {run}: pinned {p} blocks, only {self.hbm_len.get(run, 0)} in HBM")
            pinned += p
        for run in self.holders:
            if run not in self.pin_len:
                fail(f"run {run}: holders {self.holders[run]} but nothing pinned")
        unpinned = sum(h - self.pin_len.get(run, 0) for run, h in self.hbm_len.items())
        if unpinned != self.lru.size:
            fail(f"{unpinned} HBM blocks are unpinned but the LRU holds {self.lru.size}")
        if pinned > self.used_slots:
            fail(f"{pinned} pinned blocks exceed used_slots {self.used_slots}")
        for run, h in self.hbm_len.items():
            for sp in self.dram.spans_of(run):
                if sp.lo < h:
                    fail(f"run {run}: blocks {sp.lo}..{min(h, sp.hi) - 1} are in HBM and in DRAM")
        total = sum(self.hbm_len.values())
        if total != self.hbm_blocks:
            fail(f"hbm_blocks {self.hbm_blocks} but the runs hold {total} blocks in HBM")
        ix = self.ix
        if ix is not None:   # the holder index agrees with this cache (btb_core.sim.holders)
            for run, h in self.hbm_len.items():
                if ix.hbm.get(run, {}).get(self.rep) != h:
                    fail(f"run {run}: {h} blocks in HBM, holder index says "
                         f"{ix.hbm.get(run, {}).get(self.rep)}")
            for run, d in ix.hbm.items():
                if self.rep in d and run not in self.hbm_len:
                    fail(f"run {run}: holder index lists {d[self.rep]} HBM blocks, cache has none")
            runs = {run for run, d in ix.dram.items() if self.rep in ix.dram_replicas(d)}
            if runs != set(self.dram.index):
                fail(f"holder index DRAM runs {sorted(runs)} != cache DRAM runs "
                     f"{sorted(self.dram.index)}")
        if idle and (self.used_slots or self.pin_len or self.holders):
            fail(f"idle cache still holds {self.used_slots} slots ({pinned} pinned blocks in "
                 f"{len(self.pin_len)} runs): leaked pins or private slots")

    def clear(self, drop_disk: bool) -> None:
        """The replica failed: every block is gone (HBM, DRAM, and its disk tier if
        ``drop_disk``; a shared disk survives). Peaks and eviction counts are kept."""
        ix = self.ix
        if ix is not None:
            for run in self.hbm_len:
                ix.set_hbm(run, self.rep, 0)
            for run in self.dram.index:
                ix.dram_del(run, self.rep)
        self.pin_len = {}
        self.holders = {}
        self.hbm_len = {}
        self.hbm_blocks = 0
        self.lru = SpanList()
        self.dram = SpanList()
        self.dram.ix = ix
        self.dram.rep = self.rep
        self.used_slots = 0
        if drop_disk and self.disk is not None:
            self.disk.blocks = SpanList()

    # ------------------------------------------------------------------ queries
    def hbm_prefix(self, starts, lens, limit: int) -> int:
        """Leading blocks of the path (at most ``limit``) in HBM (pinned or LRU)."""
        hbm = self.hbm_len
        n = 0
        for k in range(len(starts)):
            if n >= limit:
                return limit
            ln = lens[k]
            c = limit - n if ln > limit - n else ln
            h = hbm.get(starts[k], 0)
            if h < c:
                return n + h
            n += c
        return n if n < limit else limit

    def _lower(self, starts, lens, k, o, rem, use_dram, use_disk):
        """From piece ``k`` offset ``o``, blocks found in DRAM and (disk, not DRAM), up to
        ``rem`` blocks, stopping at the first block in neither selected tier."""
        dram = self.dram if use_dram else None
        disk = self.disk.blocks if (use_disk and self.disk is not None) else None
        n_d = n_k = 0
        npieces = len(starts)
        while rem > 0 and k < npieces:
            run = starts[k]
            end = lens[k]
            if end - o > rem:
                end = o + rem
            while o < end:
                x = dram.cover(run, o) if dram is not None else o
                if x > o:
                    take = (x if x < end else end) - o
                    n_d += take
                    o += take
                    rem -= take
                    continue
                y = disk.cover(run, o) if disk is not None else o
                if y <= o:
                    return n_d, n_k
                stop = dram.next_start(run, o) if dram is not None else end
                if y < stop:
                    stop = y
                if end < stop:
                    stop = end
                n_k += stop - o
                rem -= stop - o
                o = stop
            if o < lens[k]:
                return n_d, n_k
            k += 1
            o = 0
        return n_d, n_k

    def match(self, starts, lens, limit: int) -> tuple[int, int, int]:
        """Longest run of the first ``limit`` blocks of the path present, by tier.

        Returns
        -------
        (hbm, dram, disk) : tuple of int
            Blocks of the run found in HBM, DRAM and disk; their sum is the run length.
        """
        n_h = self.hbm_prefix(starts, lens, limit)
        if n_h >= limit or (not self.dram.size and (self.disk is None or not self.disk.blocks.size)):
            return n_h, 0, 0
        k, o = piece_at(lens, n_h)
        n_d, n_k = self._lower(starts, lens, k, o, limit - n_h, True, True)
        return n_h, n_d, n_k

    def admit_lookup(self, starts, lens, limit: int) -> tuple[int, int, int, int]:
        """:meth:`match` of the first ``limit`` (>= 1) blocks and :meth:`lru_hits` of its HBM part,
        in one walk over the path (what admitting a request asks).

        Returns
        -------
        (hbm, dram, disk, lru_hits) : tuple of int
            ``match(starts, lens, limit)`` and ``lru_hits(starts, lens, hbm)``.
        """
        hbm, pin = self.hbm_len, self.pin_len
        n = hits = 0
        k = o = -1                               # where the HBM part stops inside the path
        for i in range(len(starts)):
            if n >= limit:
                n = limit
                break
            ln = lens[i]
            c = limit - n if ln > limit - n else ln
            run = starts[i]
            h = hbm.get(run, 0)
            if h < c:                            # HBM holds the first h blocks of this piece
                if h:
                    p = pin.get(run, 0)
                    if h > p:
                        hits += h - p
                n += h
                k, o = i, h
                break
            p = pin.get(run, 0)
            if c > p:
                hits += c - p
            n += c
        else:
            if n > limit:
                n = limit
        if n >= limit or (not self.dram.size and (self.disk is None or not self.disk.blocks.size)):
            return n, 0, 0, hits
        if k < 0:
            k, o = piece_at(lens, n)
        n_d, n_k = self._lower(starts, lens, k, o, limit - n, True, True)
        return n, n_d, n_k, hits

    def matched_blocks(self, starts, lens, n, tiers=("hbm", "dram", "disk")) -> int:
        """Length of the leading run of the path's first ``n`` blocks complete in any of ``tiers``."""
        h = self.hbm_prefix(starts, lens, n) if "hbm" in tiers else 0
        if h >= n:
            return h
        use_dram, use_disk = "dram" in tiers, "disk" in tiers
        if not (use_dram or use_disk):
            return h
        k, o = piece_at(lens, h)
        n_d, n_k = self._lower(starts, lens, k, o, n - h, use_dram, use_disk)
        return h + n_d + n_k

    def block_tiers(self, run: int, o: int) -> tuple[bool, bool, bool]:
        """(in HBM, in DRAM, on disk) of one block (offset ``o`` of ``run``)."""
        disk = self.disk.blocks if self.disk is not None else None
        return (o < self.hbm_len.get(run, 0), self.dram.contains(run, o),
                disk is not None and disk.contains(run, o))

    def lru_hits(self, starts, lens, n: int) -> int:
        """Blocks among the path's first ``n`` (all in HBM) that are unpinned (in the LRU)."""
        pin = self.pin_len
        hits = 0
        for k in range(len(starts)):
            if n <= 0:
                break
            c = lens[k] if lens[k] < n else n
            p = pin.get(starts[k], 0)
            if c > p:
                hits += c - p
            n -= c
        return hits

    # ------------------------------------------------------------------ HBM slot management
    def _spill(self, spans, count: int) -> None:
        """Evicted HBM blocks (spans in eviction order) go to DRAM, else disk, else nowhere."""
        if self.dram_capacity_blocks > 0:
            dram = self.dram
            index = dram.index
            head = dram.head
            ix = dram.ix
            for run, lo, hi in spans:
                v = index.get(run)
                if v is not None:
                    dram.remove_range(run, lo, hi)
                    v = index.get(run)
                # (SpanList.append_desc, inlined; an evicted span is never empty)
                tail = head.prev
                dram.size += hi - lo
                if tail.run == run and tail.lo == hi and tail is not head:
                    tail.lo = lo
                    continue
                sp = _Span(run, lo, hi)
                sp.prev = tail
                sp.next = head
                tail.next = sp
                head.prev = sp
                if v is None:
                    index[run] = sp
                    if ix is not None:
                        ix.dram_add(run, dram.rep)
                elif type(v) is _Span:
                    index[run] = [v, sp]
                else:
                    v.append(sp)
            over = dram.size - self.dram_capacity_blocks
            if over > 0:
                old = dram.pop_front(over)
                if self.disk is not None:
                    self.disk.put_spans(old)
            if dram.size > self.peak_dram_blocks:
                self.peak_dram_blocks = dram.size
        elif self.disk is not None:
            self.disk.put_spans(spans)

    def _evict(self, count: int) -> None:
        """Evict the ``count`` least recent LRU blocks from HBM and spill them (:meth:`_spill`).

        With a DRAM tier each evicted span goes to DRAM as it leaves the LRU (the span object
        itself moves when it leaves whole): the same operations as evicting all, then spilling
        all in order, since the two touch disjoint state (HBM and LRU vs DRAM); DRAM's overflow is
        cut after the last one, as :meth:`_spill` does.
        """
        lru = self.lru
        head = lru.head
        lindex = lru.index
        hbm = self.hbm_len
        ix = self.ix
        rep = self.rep
        if ix is not None:    # (HolderIndex.set_hbm / dram_add / dram_del, inlined below)
            ixhbm = ix.hbm
            ixtot = ix.hbm_total
        lru.size -= count
        self.hbm_blocks -= count
        to_dram = self.dram_capacity_blocks > 0
        if to_dram:
            dram = self.dram
            dindex = dram.index
            dhead = dram.head
            dix = dram.ix
            drep = dram.rep
            if dix is not None:
                dixdram = dix.dram
        spans = []
        k = count
        while k > 0:          # (SpanList.pop_front, inlined; the LRU reports to no index)
            sp = head.next
            if sp is head:
                raise RuntimeError("SpanList.pop_front: fewer blocks than requested")
            run, lo, hi = sp.run, sp.lo, sp.hi
            if hi - lo <= k:
                nxt = sp.next
                head.next = nxt
                nxt.prev = head
                v = lindex[run]
                if type(v) is _Span:
                    del lindex[run]
                else:
                    v.remove(sp)
                    if len(v) == 1:
                        lindex[run] = v[0]
                k -= hi - lo
            else:
                lo = hi - k
                sp.hi = lo
                sp = None                        # (it stays in the LRU)
                k = 0
            h = hbm.get(run) if lo else hbm.pop(run, None)
            if h != hi:
                raise RuntimeError(f"KVCache invariant: evicting blocks {lo}..{hi - 1} of run {run} "
                                   f"but its HBM part ends at {h}")
            if lo:
                hbm[run] = lo
            if ix is not None:
                d = ixhbm.get(run)
                if d is not None and rep in d:   # (always: the index follows this cache)
                    old = d[rep]
                    if lo:
                        d[rep] = lo
                    else:
                        del d[rep]
                        if not d:
                            del ixhbm[run]
                    ixtot[rep] += lo - old
                else:
                    ix.set_hbm(run, rep, lo)
            if not to_dram:
                spans.append((run, lo, hi))
                continue
            # to DRAM (KVCache._spill and SpanList.append_desc, inlined). A block is never in HBM
            # and DRAM at once (check_invariants), so DRAM holds none of these: nothing to remove
            v = dindex.get(run)
            tail = dhead.prev
            dram.size += hi - lo
            if tail.run == run and tail.lo == hi and tail is not dhead:
                tail.lo = lo
                continue
            if sp is None:
                sp = _Span(run, lo, hi)
            sp.prev = tail
            sp.next = dhead
            tail.next = sp
            dhead.prev = sp
            if v is None:
                dindex[run] = sp
                if dix is not None:
                    dd = dixdram.get(run)
                    if dd is None:
                        dixdram[run] = drep
                    elif type(dd) is int:
                        if dd != drep:
                            dixdram[run] = {dd: None, drep: None}
                    else:
                        dd[drep] = None
            elif type(v) is _Span:
                dindex[run] = [v, sp]
            else:
                v.append(sp)
        if not to_dram:
            self._spill(spans, count)
            return
        over = dram.size - self.dram_capacity_blocks
        if over > 0:
            if self.disk is not None:
                self.disk.put_spans(dram.pop_front(over))
            else:             # (SpanList.pop_front, inlined: the blocks are dropped)
                dram.size -= over
                while over > 0:
                    sp = dhead.next
                    if sp is dhead:
                        raise RuntimeError("SpanList.pop_front: fewer blocks than requested")
                    n = sp.hi - sp.lo
                    if n <= over:
                        nxt = sp.next
                        dhead.next = nxt
                        nxt.prev = dhead
                        run = sp.run
                        v = dindex[run]
                        if type(v) is _Span:
                            del dindex[run]
                            if dix is not None:
                                dd = dixdram[run]
                                if type(dd) is int:
                                    if dd != drep:
                                        raise KeyError(drep)
                                    del dixdram[run]
                                else:
                                    del dd[drep]
                                    if len(dd) == 1:
                                        dixdram[run] = next(iter(dd))
                        else:
                            v.remove(sp)
                            if len(v) == 1:
                                dindex[run] = v[0]
                        over -= n
                    else:
                        sp.hi -= over
                        over = 0
        if dram.size > self.peak_dram_blocks:
            self.peak_dram_blocks = dram.size

    def make_room(self, slots: int) -> bool:
        """Evict LRU blocks until ``slots`` more slots are free; False if impossible (no change)."""
        if slots > self.capacity_blocks - self.used_slots:
            return False
        excess = self.used_slots + self.lru.size + slots - self.capacity_blocks
        if excess > 0:
            self._evict(excess)
        return True

    def _note_peak(self) -> None:
        h = self.used_slots + self.lru.size
        if h > self.peak_hbm_blocks:
            self.peak_hbm_blocks = h

    # ------------------------------------------------------------------ holders
    def _hold(self, run: int, old: int, new: int) -> None:
        """A holder's leading part of ``run`` grows from ``old`` to ``new`` blocks (counts only)."""
        cnt = self.holders.get(run)
        if cnt is None:
            self.holders[run] = {new: 1}
            return
        if old:
            c = cnt[old]
            if c == 1:
                del cnt[old]
            else:
                cnt[old] = c - 1
        cnt[new] = cnt.get(new, 0) + 1

    def _pin_hbm(self, starts, lens, a: int, b: int) -> None:
        """A holder that holds path blocks ``[0, a)`` also pins ``[a, b)``, all in HBM."""
        pin, lru, holders = self.pin_len, self.lru, self.holders
        for run, old, new in (((starts[0], a, b),) if b <= lens[0] else path_spans(starts, lens, a, b)):
            if old >= new:
                continue
            cnt = holders.get(run)             # (KVCache._hold, inlined)
            if cnt is None:
                holders[run] = {new: 1}
            else:
                if old:
                    c = cnt[old]
                    if c == 1:
                        del cnt[old]
                    else:
                        cnt[old] = c - 1
                cnt[new] = cnt.get(new, 0) + 1
            p = pin.get(run, 0)
            if new > p:
                lo = old if old > p else p
                lru.remove_range(run, lo, new)
                self.used_slots += new - lo
                pin[run] = new

    # ------------------------------------------------------------------ request lifecycle
    def pin_prefix(self, starts, lens, n_hbm: int, n_lower: int) -> None:
        """Pin the first ``n_hbm + n_lower`` blocks of the path for a request being admitted.

        The first ``n_hbm`` are in HBM (pinned or LRU); the next ``n_lower`` are loaded from DRAM or
        disk into HBM. The caller must have checked that the slots fit.
        """
        if n_hbm:                     # (KVCache._pin_hbm(starts, lens, 0, n_hbm), inlined)
            pin, lru, holders = self.pin_len, self.lru, self.holders
            rest = n_hbm
            k = 0
            while rest > 0:
                run = starts[k]
                new = lens[k]
                if new > rest:
                    new = rest
                rest -= new
                k += 1
                cnt = holders.get(run)           # (KVCache._hold(run, 0, new), inlined)
                if cnt is None:
                    holders[run] = {new: 1}
                else:
                    cnt[new] = cnt.get(new, 0) + 1
                p = pin.get(run, 0)
                if new > p:
                    lru.remove_range(run, p, new)
                    self.used_slots += new - p
                    pin[run] = new
        if n_lower:
            pieces = path_spans(starts, lens, n_hbm, n_hbm + n_lower)
            dram = self.dram
            if dram.size:
                for run, old, new in pieces:
                    dram.remove_range(run, old, new)
            self.make_room(n_lower)  # checked by the caller
            pin, hbm = self.pin_len, self.hbm_len
            for run, old, new in pieces:
                if hbm.get(run, 0) != old:
                    raise RuntimeError(f"KVCache invariant: loading blocks {old}..{new - 1} of run "
                                       f"{run} whose HBM part ends at {hbm.get(run, 0)}")
                self._hold(run, old, new)
                pin[run] = new
                hbm[run] = new
                self.hbm_blocks += new - old
                if self.ix is not None:
                    self.ix.set_hbm(run, self.rep, new)
            self.used_slots += n_lower
        h = self.used_slots + self.lru.size      # (KVCache._note_peak, inlined)
        if h > self.peak_hbm_blocks:
            self.peak_hbm_blocks = h

    def reserve_private(self, slots: int) -> None:
        """Take ``slots`` private slots, evicting LRU blocks as needed (the caller checked they fit)."""
        used = self.used_slots                   # (KVCache.make_room, inlined)
        if slots <= self.capacity_blocks - used:
            excess = used + self.lru.size + slots - self.capacity_blocks
            if excess > 0:
                self._evict(excess)
        h = self.used_slots = self.used_slots + slots
        h += self.lru.size
        if h > self.peak_hbm_blocks:
            self.peak_hbm_blocks = h

    def complete_blocks(self, starts, lens, start: int, stop: int) -> int:
        """Blocks ``start..stop-1`` of a running request's path finished prefill: make them reusable.

        Each was held as a private slot; it becomes a pinned shared block (if another copy is
        already cached, the request shares it and its duplicate slot is freed).
        Returns the number of private slots converted or freed (``stop - start``).
        """
        pin, hbm, lru, dram, holders = self.pin_len, self.hbm_len, self.lru, self.dram, self.holders
        ix = self.ix
        pos = 0
        for k in range(len(starts)):           # the path's blocks [start, stop), piece by piece
            ln = lens[k]                       # (blocks.path_spans, inlined)
            if pos + ln <= start:
                pos += ln
                continue
            if pos >= stop:
                break
            run = starts[k]
            old = start - pos if start > pos else 0
            new = stop - pos if stop - pos < ln else ln
            pos += ln
            cnt = holders.get(run)             # the holder's length on this run: old -> new
            if cnt is None:                    # (KVCache._hold, inlined)
                holders[run] = {new: 1}
            else:
                if old:
                    c = cnt[old]
                    if c == 1:
                        del cnt[old]
                    else:
                        cnt[old] = c - 1
                cnt[new] = cnt.get(new, 0) + 1
            p = pin.get(run, 0)
            if p > old:                        # [old, min(new, p)) was pinned by others: share it
                self.used_slots -= (new if new < p else p) - old
            if new > p:                        # [max(old, p), new) is now pinned by this request
                lo = old if old > p else p
                h = hbm.get(run, 0)
                if h > lo:
                    lru.remove_range(run, lo, new if new < h else h)
                if new > h and run in dram.index:
                    dram.remove_range(run, lo if lo > h else h, new)
                pin[run] = new
                if new > h:
                    hbm[run] = new
                    self.hbm_blocks += new - h
                    if ix is not None:        # (HolderIndex.set_hbm, inlined)
                        rep = self.rep
                        ixhbm = ix.hbm
                        d = ixhbm.get(run)
                        if d is None:
                            ixhbm[run] = {rep: new}
                            old = 0
                        else:
                            old = d.get(rep, 0)
                            d[rep] = new
                        tot = ix.hbm_total
                        if rep < len(tot):
                            tot[rep] += new - old
                        else:
                            tot.extend([0] * (rep + 1 - len(tot)))
                            tot[rep] = new - old
        return stop - start

    def release(self, starts, lens, pinned: int, private: int) -> None:
        """A request finished: unpin its first ``pinned`` blocks (deepest first into the LRU) and
        free its ``private`` slots."""
        if pinned:
            self.unpin(starts, lens, pinned)
        self.used_slots -= private

    def pin_existing(self, starts, lens, n: int) -> None:
        """Pin the path's first ``n`` blocks, all in HBM (the source side of an outgoing copy)."""
        if n:
            self._pin_hbm(starts, lens, 0, n)

    def unpin(self, starts, lens, n: int) -> None:
        """Undo a holder's pin of the path's first ``n`` blocks (deepest first into the LRU)."""
        if n <= 0:
            return
        k = 0                                    # piece k holds the path's block n - 1
        length = n                               # (blocks.piece_at, inlined)
        while length > lens[k]:
            length -= lens[k]
            k += 1
        holders, pin = self.holders, self.pin_len
        lru = self.lru
        head = lru.head
        while True:                              # (KVCache._unhold, inlined) deepest piece first
            run = starts[k]
            cnt = holders[run]
            c = cnt[length]
            if c > 1:
                cnt[length] = c - 1
            else:
                del cnt[length]
                if length >= pin[run]:           # nobody else holds [new_p, length): to the LRU
                    if cnt:
                        new_p = max(cnt)
                        pin[run] = new_p
                    else:
                        new_p = 0
                        del holders[run]
                        del pin[run]
                    self.used_slots -= length - new_p
                    if length > new_p:           # (SpanList.append_desc; the LRU reports to no index)
                        lru.size += length - new_p
                        tail = head.prev
                        if tail.run == run and tail.lo == length and tail is not head:
                            tail.lo = new_p
                        else:
                            sp = _Span(run, new_p, length)
                            sp.prev = tail
                            sp.next = head
                            tail.next = sp
                            head.prev = sp
                            lindex = lru.index
                            v = lindex.get(run)
                            if v is None:
                                lindex[run] = sp
                            elif type(v) is _Span:
                                lindex[run] = [v, sp]
                            else:
                                v.append(sp)
            k -= 1
            if k < 0:
                return
            length = lens[k]

    def land(self, starts, lens, n: int) -> int:
        """A warm copy of the path's first ``n`` blocks landed: insert them into HBM as evictable
        (LRU most-recent).

        Blocks already in HBM are kept; missing ones take free slots, evicting LRU blocks. Lands as
        many leading blocks as fit; returns the number of leading blocks present afterwards.
        """
        h = self.hbm_prefix(starts, lens, n)
        missing = n - h
        room = self.capacity_blocks - self.used_slots - self.lru.size
        # Landed blocks are themselves evictable, so only pinned/private slots limit the copy.
        fit = min(n, self.capacity_blocks - self.used_slots)
        if missing > room:
            # evict old LRU blocks (never the ones we are about to touch)
            touch = {run: hi for run, _, hi in path_spans(starts, lens, 0, fit)}
            self._evict_untouched(missing - room, touch)
        slots_left = self.capacity_blocks - self.used_slots - self.lru.size
        landed = fit if fit <= h else min(fit, h + slots_left)
        pin, hbm, lru, dram = self.pin_len, self.hbm_len, self.lru, self.dram
        # insert deepest first so children are evicted before parents
        for run, _, c in reversed(path_spans(starts, lens, 0, landed)):
            p = pin.get(run, 0)
            if c <= p:
                continue
            hh = hbm.get(run, 0)
            if hh > p:
                lru.remove_range(run, p, c if c < hh else hh)
            if c > hh:
                if dram.size:
                    dram.remove_range(run, hh, c)
                hbm[run] = c
                self.hbm_blocks += c - hh
                if self.ix is not None:
                    self.ix.set_hbm(run, self.rep, c)
            lru.append_desc(run, p, c)
        self._note_peak()
        return landed

    def _evict_untouched(self, need: int, touch: dict) -> None:
        """Evict up to ``need`` LRU blocks in LRU order, skipping the leading ``touch[run]`` blocks
        of the runs in ``touch``."""
        lru, hbm = self.lru, self.hbm_len
        head = lru.head
        sp = head.next
        spans = []
        count = 0
        while need > 0 and sp is not head:
            nxt = sp.next
            t = touch.get(sp.run, 0)
            lo = sp.lo if sp.lo > t else t
            avail = sp.hi - lo
            if avail > 0:
                e = avail if avail < need else need
                run, hi = sp.run, sp.hi
                if hbm.get(run) != hi:
                    raise RuntimeError(f"KVCache invariant: evicting blocks of run {run} up to {hi} "
                                       f"but its HBM part ends at {hbm.get(run)}")
                if e == sp.hi - sp.lo:
                    lru._unlink(sp)
                else:
                    sp.hi -= e
                lru.size -= e
                if hi - e:
                    hbm[run] = hi - e
                else:
                    del hbm[run]
                self.hbm_blocks -= e
                if self.ix is not None:
                    self.ix.set_hbm(run, self.rep, hi - e)
                spans.append((run, hi - e, hi))
                count += e
                need -= e
            sp = nxt
        if count:
            self._spill(spans, count)
