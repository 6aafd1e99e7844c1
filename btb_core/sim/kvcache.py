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
"""

from __future__ import annotations

from collections import OrderedDict


class DiskTier:
    """An LRU block store on NVMe; one per replica, or one shared by all replicas of a cluster.

    Parameters
    ----------
    capacity_blocks : int
        Blocks the tier holds (``>= 0``).
    """

    __slots__ = ("capacity_blocks", "blocks", "peak_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.capacity_blocks = int(capacity_blocks)
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.peak_blocks = 0

    def put(self, block: int) -> None:
        blocks = self.blocks
        if block in blocks:
            del blocks[block]
        elif len(blocks) >= self.capacity_blocks:
            if self.capacity_blocks == 0:
                return
            blocks.popitem(last=False)
        blocks[block] = None
        if len(blocks) > self.peak_blocks:
            self.peak_blocks = len(blocks)


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

    __slots__ = ("capacity_blocks", "dram_capacity_blocks", "refcount", "lru", "dram", "disk",
                 "used_slots", "peak_hbm_blocks", "peak_dram_blocks", "evicted_blocks")

    def __init__(self, capacity_blocks: int, dram_capacity_blocks: int = 0,
                 disk: DiskTier | None = None) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        if dram_capacity_blocks < 0:
            raise ValueError(f"dram_capacity_blocks must be >= 0, got {dram_capacity_blocks}")
        self.capacity_blocks = int(capacity_blocks)
        self.dram_capacity_blocks = int(dram_capacity_blocks)
        self.refcount: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.dram: OrderedDict[int, None] = OrderedDict()
        self.disk = disk
        self.used_slots = 0
        self.peak_hbm_blocks = 0
        self.peak_dram_blocks = 0
        self.evicted_blocks = 0

    # ------------------------------------------------------------------ queries
    def in_hbm(self, block: int) -> bool:
        return block in self.refcount or block in self.lru

    def hbm_blocks(self) -> int:
        """HBM slots in use (pinned + private + LRU)."""
        return self.used_slots + len(self.lru)

    def match(self, hash_ids, limit: int) -> tuple[int, int, int]:
        """Longest run of the first ``limit`` ids present as complete blocks, by tier.

        Returns
        -------
        (hbm, dram, disk) : tuple of int
            Blocks of the run found in HBM, DRAM and disk; their sum is the run length.
        """
        refcount, lru, dram = self.refcount, self.lru, self.dram
        disk = self.disk.blocks if self.disk is not None else None
        n_hbm = n_dram = n_disk = 0
        for i in range(limit):
            b = hash_ids[i]
            if b in refcount or b in lru:
                n_hbm += 1
            elif b in dram:
                n_dram += 1
            elif disk is not None and b in disk:
                n_disk += 1
            else:
                break
        return n_hbm, n_dram, n_disk

    def matched_blocks(self, hash_ids, tiers=("hbm", "dram", "disk")) -> int:
        """Length of the leading run of ``hash_ids`` complete in any of ``tiers``."""
        use_hbm = "hbm" in tiers
        dram = self.dram if "dram" in tiers else None
        disk = self.disk.blocks if ("disk" in tiers and self.disk is not None) else None
        refcount, lru = self.refcount, self.lru
        n = 0
        for b in hash_ids:
            if use_hbm and (b in refcount or b in lru):
                n += 1
            elif dram is not None and b in dram:
                n += 1
            elif disk is not None and b in disk:
                n += 1
            else:
                break
        return n

    # ------------------------------------------------------------------ HBM slot management
    def free_slots(self) -> int:
        """Slots obtainable now (free + evictable)."""
        return self.capacity_blocks - self.used_slots

    def _evict_one(self) -> None:
        block = self.lru.popitem(last=False)[0]
        self.evicted_blocks += 1
        if self.dram_capacity_blocks > 0:
            self._dram_put(block)
        elif self.disk is not None:
            self.disk.put(block)

    def _dram_put(self, block: int) -> None:
        dram = self.dram
        if block in dram:
            del dram[block]
        elif len(dram) >= self.dram_capacity_blocks:
            old = dram.popitem(last=False)[0]
            if self.disk is not None:
                self.disk.put(old)
        dram[block] = None
        if len(dram) > self.peak_dram_blocks:
            self.peak_dram_blocks = len(dram)

    def make_room(self, slots: int) -> bool:
        """Evict LRU blocks until ``slots`` more slots are free; False if impossible (no change)."""
        if slots > self.capacity_blocks - self.used_slots:
            return False
        excess = self.used_slots + len(self.lru) + slots - self.capacity_blocks
        for _ in range(excess):
            self._evict_one()
        return True

    def _note_peak(self) -> None:
        h = self.used_slots + len(self.lru)
        if h > self.peak_hbm_blocks:
            self.peak_hbm_blocks = h

    # ------------------------------------------------------------------ request lifecycle
    def pin_prefix(self, hash_ids, n_hbm: int, n_lower: int) -> None:
        """Pin the first ``n_hbm + n_lower`` blocks for a request being admitted.

        The first ``n_hbm`` are in HBM (pinned or LRU); the next ``n_lower`` are loaded from DRAM or
        disk into HBM. The caller must have checked :meth:`admit_need` fits.
        """
        refcount, lru = self.refcount, self.lru
        for i in range(n_hbm):
            b = hash_ids[i]
            c = refcount.get(b)
            if c is not None:
                refcount[b] = c + 1
            else:
                del lru[b]
                refcount[b] = 1
                self.used_slots += 1
        if n_lower:
            dram = self.dram
            for i in range(n_hbm, n_hbm + n_lower):
                b = hash_ids[i]
                if b in dram:
                    del dram[b]
            self.make_room(n_lower)  # checked by the caller
            for i in range(n_hbm, n_hbm + n_lower):
                refcount[hash_ids[i]] = 1
            self.used_slots += n_lower
        self._note_peak()

    def reserve_private(self, slots: int) -> None:
        self.make_room(slots)
        self.used_slots += slots
        self._note_peak()

    def complete_blocks(self, hash_ids, start: int, stop: int) -> int:
        """Blocks ``start..stop-1`` of a running request finished prefill: make them reusable.

        Each was held as a private slot; it becomes a pinned shared block (if another copy is
        already cached, the request shares it and its duplicate slot is freed).
        Returns the number of private slots converted or freed (``stop - start``).
        """
        refcount, lru, dram = self.refcount, self.lru, self.dram
        for i in range(start, stop):
            b = hash_ids[i]
            c = refcount.get(b)
            if c is not None:
                refcount[b] = c + 1
                self.used_slots -= 1
            else:
                if b in lru:
                    del lru[b]
                elif b in dram:
                    del dram[b]
                refcount[b] = 1
        return stop - start

    def release(self, hash_ids, pinned: int, private: int) -> None:
        """A request finished: unpin its first ``pinned`` blocks (deepest first into the LRU) and
        free its ``private`` slots."""
        refcount, lru = self.refcount, self.lru
        for i in range(pinned - 1, -1, -1):
            b = hash_ids[i]
            c = refcount[b]
            if c == 1:
                del refcount[b]
                self.used_slots -= 1
                lru[b] = None
            else:
                refcount[b] = c - 1
        self.used_slots -= private

    def pin_existing(self, hash_ids, n: int) -> None:
        """Pin ``n`` leading blocks already in HBM (the source side of an outgoing transfer)."""
        refcount, lru = self.refcount, self.lru
        for i in range(n):
            b = hash_ids[i]
            c = refcount.get(b)
            if c is not None:
                refcount[b] = c + 1
            elif b in lru:
                del lru[b]
                refcount[b] = 1
                self.used_slots += 1

    def unpin(self, hash_ids, n: int) -> None:
        """Undo :meth:`pin_existing` for blocks that were pinned (deepest first into the LRU)."""
        refcount, lru = self.refcount, self.lru
        for i in range(n - 1, -1, -1):
            b = hash_ids[i]
            c = refcount.get(b)
            if c is None:
                continue
            if c == 1:
                del refcount[b]
                self.used_slots -= 1
                lru[b] = None
            else:
                refcount[b] = c - 1

    def land(self, hash_ids) -> int:
        """A warm copy landed: insert its blocks into HBM as evictable (LRU most-recent).

        Blocks already in HBM are kept; missing ones take free slots, evicting LRU blocks. Lands as
        many leading blocks as fit; returns the number of leading blocks present afterwards.
        """
        refcount, lru, dram = self.refcount, self.lru, self.dram
        n = len(hash_ids)
        missing = sum(1 for b in hash_ids if b not in refcount and b not in lru)
        room = self.capacity_blocks - self.used_slots - len(lru)
        evictable = len(lru)
        # Landed blocks are themselves evictable, so only pinned/private slots limit the copy.
        fit = min(n, self.capacity_blocks - self.used_slots)
        if missing > room:
            # evict old LRU blocks (never the ones we are about to touch)
            touch = set(hash_ids[:fit])
            need = missing - room
            for b in list(lru):
                if need <= 0:
                    break
                if b in touch:
                    continue
                del lru[b]
                self.evicted_blocks += 1
                if self.dram_capacity_blocks > 0:
                    self._dram_put(b)
                elif self.disk is not None:
                    self.disk.put(b)
                need -= 1
            evictable = len(lru)
        del evictable
        landed = 0
        slots_left = self.capacity_blocks - self.used_slots - len(lru)
        # insert deepest first so children are evicted before parents
        present = []
        for i in range(fit):
            b = hash_ids[i]
            if b in refcount or b in lru:
                present.append(True)
            elif slots_left > 0:
                present.append(False)
                slots_left -= 1
            else:
                break
            landed = i + 1
        for i in range(landed - 1, -1, -1):
            b = hash_ids[i]
            if b in refcount:
                continue
            if b in lru:
                del lru[b]
            elif b in dram:
                del dram[b]
            lru[b] = None
        self._note_peak()
        return landed
