"""Which replicas hold which blocks: an index kept from KV-cache events, for one-walk prefix matches.

A router that asks "how many leading blocks of this prompt does each replica hold?" used to ask
every replica in turn (:meth:`btb_core.sim.view.ClusterView.cached_blocks`), so its work per request
grew with the fleet. :class:`HolderIndex` keeps, for every block run (:mod:`btb_core.sim.blocks`),
the replicas that hold part of it, updated by the replicas' :class:`~btb_core.sim.kvcache.KVCache`
whenever their contents change (the simulator's KV events: a block stored in HBM by a completed
prefill, a load or a landed copy; evicted from HBM; entering or leaving host DRAM). One walk over
the request's pieces then answers for every replica at once, visiting only replicas that still
match (SGLang's radix tree keeps the same per-node tenant sets,
``sgl-model-gateway/src/policies/tree.rs``, sgl-project/sglang @ 24ce7f6c).

What it stores (all exact, never approximate):

- ``hbm[run]``: ``{replica: blocks}``, the leading part of ``run`` in that replica's HBM (the cache
  keeps every run's HBM blocks as a leading part, so one length per replica says everything);
  replicas with none are absent;
- ``dram[run]``: the replicas whose host-DRAM tier holds at least one block of ``run``, in the order
  they got it (DRAM may hold any subset of a run, so it names the candidates, and the replica's own
  cache answers how far the run continues there): one replica as a plain int (the common case:
  a run evicted from one replica's HBM; ~10^6 such runs in a 1,000,000-request fleet replay),
  several as a ``{replica: None}`` dict (:meth:`HolderIndex.dram_replicas` reads either).

:meth:`HolderIndex.matched` gives the same numbers as calling ``KVCache.matched_blocks`` on every
replica (tests/test_holders.py checks it against that scan on random operation sequences), for
the tiers HBM and DRAM. The disk tier is not indexed: a query that counts it on a cluster with a
disk tier scans every replica (:meth:`btb_core.sim.view.ClusterView.cached_blocks_all`).
"""

from __future__ import annotations

#: Alive replicas up to which :meth:`HolderIndex.matched` splits them in a plain loop (past it,
#: by C-level steps where they are cheaper; the same answer, in the same order).
_FEW = 8


class HolderIndex:
    """Block run -> replicas holding it, by tier (see the module docstring).

    Attributes
    ----------
    hbm : dict[int, dict[int, int]]
        Run start id -> {replica: leading blocks of the run in its HBM (>= 1)}.
    dram : dict[int, int | dict[int, None]]
        Run start id -> replicas whose DRAM tier holds at least one block of the run (one as an
        int, several as an insertion-ordered dict; see :meth:`dram_replicas`).
    """

    __slots__ = ("hbm", "dram", "hbm_total")

    def __init__(self) -> None:
        self.hbm: dict[int, dict[int, int]] = {}
        self.dram: dict[int, int | dict[int, None]] = {}
        #: Blocks in HBM per replica (the sum of its ``hbm`` lengths, i.e. its cache's
        #: ``hbm_blocks``), indexed by replica; replicas past its end hold none.
        self.hbm_total: list[int] = []

    # -- updates (called by KVCache / SpanList) ------------------------------------------------
    def set_hbm(self, run: int, replica: int, blocks: int) -> None:
        """``replica`` now holds the leading ``blocks`` (>= 0) of ``run`` in HBM."""
        d = self.hbm.get(run)
        if blocks:
            if d is None:
                self.hbm[run] = {replica: blocks}
                old = 0
            else:
                old = d.get(replica, 0)
                d[replica] = blocks
        elif d is not None and replica in d:
            old = d.pop(replica)
            if not d:
                del self.hbm[run]
        else:
            return
        try:
            self.hbm_total[replica] += blocks - old
        except IndexError:
            tot = self.hbm_total
            tot.extend([0] * (replica + 1 - len(tot)))
            tot[replica] = blocks - old

    def hbm_totals(self, n: int) -> list[int]:
        """Blocks in HBM of replicas ``0 .. n - 1`` (a new list)."""
        tot = self.hbm_total
        if len(tot) < n:
            tot.extend([0] * (n - len(tot)))
        return tot[:n]

    def dram_add(self, run: int, replica: int) -> None:
        """``replica``'s DRAM tier now holds a block of ``run`` (it held none)."""
        dram = self.dram
        d = dram.get(run)
        if d is None:
            dram[run] = replica
        elif type(d) is int:
            if d != replica:
                dram[run] = {d: None, replica: None}
        else:
            d[replica] = None

    def dram_del(self, run: int, replica: int) -> None:
        """``replica``'s DRAM tier no longer holds any block of ``run``."""
        dram = self.dram
        d = dram[run]
        if type(d) is int:
            if d != replica:
                raise KeyError(replica)
            del dram[run]
            return
        del d[replica]
        if len(d) == 1:
            dram[run] = next(iter(d))

    @staticmethod
    def dram_replicas(d) -> tuple | dict:
        """The replicas of a ``dram`` value, in the order they got the run (iterable, ``in``)."""
        return (d,) if type(d) is int else d

    # -- queries -------------------------------------------------------------------------------
    def matched(self, caches, starts, lens, n: int, use_hbm: bool = True,
                use_dram: bool = False, hbm_too: bool = False):
        """Leading blocks of a path present on each replica, for replicas where that is >= 1.

        Parameters
        ----------
        caches : sequence of KVCache
            The replicas' caches that feed this index (indexed by replica).
        starts, lens : list of int
            The path's pieces (:meth:`btb_core.sim.blocks.BlockIndex.path_pieces`).
        n : int
            Blocks of the path to consider (its first ``n``).
        use_hbm, use_dram : bool
            Tiers counted (a block counts if it sits in any counted tier).
        hbm_too : bool
            With ``use_hbm`` and ``use_dram``: also return the HBM-only answer (same walk).

        Returns
        -------
        dict[int, int]
            ``{replica: blocks in [1, n]}``: equal to ``caches[r].matched_blocks(starts, lens, n,
            tiers)`` for every replica it names, and that value is 0 for every replica it omits.
            With ``hbm_too``, a pair ``(HBM only, HBM and DRAM)`` of such dicts.

        Notes
        -----
        Cost: one walk over the path's pieces, visiting at each piece only the replicas that held
        every earlier piece whole, plus an exact per-replica continuation in DRAM for replicas
        whose HBM part stops where DRAM holds something of that run.
        """
        out: dict[int, int] = {}
        if n <= 0 or not starts:
            return ({}, out) if hbm_too else out
        hbm = self.hbm
        drops = []            # (piece k, replicas whose HBM part stops inside piece k)
        if use_hbm:
            d = hbm.get(starts[0])
            if d:
                c = lens[0] if lens[0] < n else n
                if len(d) > _FEW and min(d.values()) >= c:
                    alive = list(d)              # every holder has the whole piece
                else:
                    alive = []
                    stop = []
                    for r, h in d.items():
                        if h >= c:
                            alive.append(r)
                        else:
                            out[r] = h
                            stop.append(r)
                    if stop:
                        drops.append((0, stop, None))
                pos = c
                k = 1
                npieces = len(starts)
                while alive and pos < n and k < npieces:
                    d = hbm.get(starts[k])
                    if not d:
                        out.update(dict.fromkeys(alive, pos))
                        drops.append((k, alive, None))
                        alive = []
                        break
                    ln = lens[k]
                    c = ln if ln < n - pos else n - pos
                    if len(alive) <= _FEW or len(d) >= len(alive):
                        nxt = []
                        stop = []
                        for r in alive:
                            h = d.get(r, 0)
                            if h >= c:
                                nxt.append(r)
                            else:
                                out[r] = pos + h
                                stop.append(r)
                        if stop:
                            drops.append((k, stop, None))
                    else:
                        # few holders of this piece among many alive replicas: every alive one
                        # stops here at pos (entered in alive's order, as the loop above does),
                        # then the holders are corrected: a partial one to pos + its blocks, a
                        # whole one taken out again (it continues, entered later). An alive
                        # replica is one whose entry is pos (earlier stops are below pos).
                        out.update(dict.fromkeys(alive, pos))
                        get = out.get
                        nxt = []
                        for r, h in d.items():
                            if get(r) == pos:
                                if h >= c:
                                    del out[r]
                                    nxt.append(r)
                                else:
                                    out[r] = pos + h
                        if len(nxt) > 1:
                            nxt.sort(key=alive.index)
                        drops.append((k, alive, set(nxt) if nxt else None))
                    alive = nxt
                    pos += c
                    k += 1
                if alive:
                    out.update(dict.fromkeys(alive, pos))
        if not use_dram or not self.dram:
            return (out, dict(out)) if hbm_too else out
        hbm_only = dict(out) if hbm_too else None
        # DRAM: a replica continues past its HBM part only if its DRAM holds the next block; ask
        # its cache exactly where its DRAM holds some block of the run at that position
        dram = self.dram
        tiers = ("hbm", "dram") if use_hbm else ("dram",)
        for k, stop, went_on in drops:     # (replicas of stop in went_on did not stop there)
            dr = dram.get(starts[k])
            if dr is not None:
                if type(dr) is int:
                    dr = (dr,)
                for r in (dr if len(dr) < len(stop) else stop):   # (out's order is kept)
                    if (r in dr and r in stop) and (went_on is None or r not in went_on):
                        out[r] = caches[r].matched_blocks(starts, lens, n, tiers)
        d0 = dram.get(starts[0])
        if d0 is not None:
            for r in ((d0,) if type(d0) is int else d0):
                if r not in out:
                    m = caches[r].matched_blocks(starts, lens, n, tiers)
                    if m:
                        out[r] = m
        return (hbm_only, out) if hbm_too else out

    def holding_all(self, caches, starts, lens, n: int, use_dram: bool = False) -> list[int]:
        """Replicas holding all of a path's first ``n`` (>= 1) blocks in HBM (``use_dram``: in
        HBM or DRAM), ascending: the replicas :meth:`matched` (HBM counted) maps to ``n``.

        When the ``n`` blocks lie in the path's first piece (a burst's shared prefix), one pass
        over that run's holders, plus the exact per-replica continuation in DRAM for replicas
        whose DRAM holds part of the run; otherwise from :meth:`matched`.
        """
        if n > lens[0]:
            return sorted([r for r, m in self.matched(caches, starts, lens, n, True,
                                                      use_dram).items() if m >= n])
        d = self.hbm.get(starts[0])
        out = [r for r, h in d.items() if h >= n] if d else []
        if use_dram:
            d0 = self.dram.get(starts[0])
            if d0 is not None:
                for r in ((d0,) if type(d0) is int else d0):
                    if (d is None or d.get(r, 0) < n) and \
                            caches[r].matched_blocks(starts, lens, n, ("hbm", "dram")) >= n:
                        out.append(r)
        out.sort()
        return out


__all__ = ["HolderIndex"]
