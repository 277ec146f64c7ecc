"""The event loop of :func:`meshcast.simulate` (the model: :mod:`meshcast.estimate.simulate`).

Operations wait for their ranks' previous operation, pay their latency, then share their NICs
max-min fairly until their bytes are moved. An event only revisits the transfers that share a NIC
with the one that changed (local water-filling).

The heap holds ``(time, sequence, code)``: ``code = ~i`` ends the latency of operation ``i``,
``code = i`` ends ``i`` (stale unless ``sequence`` is the latest pushed for ``i``: its rate
changed since). Equal times go in push order. Every float is computed in one fixed order, so the
same model always gives the same times, to the bit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from heapq import heappop, heappush

__all__ = ["run_events"]

_TINY = 1e-300
"""The rate of a transfer left no capacity (it never finishes; it keeps the loop well-defined)."""


def run_events(
    ranks: Sequence[tuple[int, ...]],
    nbytes: Sequence[int],
    res: Sequence[tuple[int, ...]],
    cap: Sequence[float],
    lat: Sequence[float],
    caps: Sequence[float],
) -> tuple[list[float], list[float], list[float]]:
    """Per-operation start, transfer-begin and end times (seconds) of the operations given by
    columns: ranks, bytes, NIC resources, own cap (``inf``: none), latency; ``caps[r]``: the
    bandwidth of resource ``r``."""
    loop = _Loop(ranks, nbytes, res, cap, lat, caps)
    loop.run()
    return loop.start, loop.begin, loop.end


def _dependencies(ranks: Sequence[tuple[int, ...]]) -> tuple[list[int], list[list[int]]]:
    """Per op: how many distinct previous ops (the last of each of its ranks) it waits for, and
    the ops that wait for it (in plan order)."""
    n = len(ranks)
    last_of: dict[int, int] = {}
    get = last_of.get
    npred = [0] * n
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, rk in enumerate(ranks):
        if len(rk) == 2:  # a Send: the common case
            a, b = rk
            p = get(a)
            last_of[a] = i
            q = get(b)
            last_of[b] = i
            if p is not None:
                succs[p].append(i)
                npred[i] = 1
            if q is not None and q != p:
                succs[q].append(i)
                npred[i] += 1
            continue
        preds = set()
        for r in rk:
            p = get(r)
            if p is not None:
                preds.add(p)
            last_of[r] = i
        npred[i] = len(preds)
        for p in preds:
            succs[p].append(i)
    return npred, succs


class _Loop:
    """The simulator's state, one list per quantity, indexed by operation."""

    def __init__(self, ranks, nbytes, res, cap, lat, caps) -> None:
        n = len(res)
        self.nbytes, self.res, self.cap, self.lat, self.caps = nbytes, res, cap, lat, caps
        self.npred, self.succs = _dependencies(ranks)
        self.start = [0.0] * n
        self.begin = [0.0] * n
        self.end = [0.0] * n
        self.remaining = [0.0] * n
        self.rate = [0.0] * n
        self.stamp = [0.0] * n
        self.cur = [0] * n  # sequence number of each op's valid end event
        self.flows: list[dict[int, None]] = [{} for _ in caps]
        self.heap: list[tuple[float, int, int]] = []
        self.count = itertools.count(1)

    def run(self) -> None:
        """Run every operation."""
        launch, join, finish = self._launch, self._join, self._finish
        npred, heap, cur = self.npred, self.heap, self.cur
        for i in range(len(npred)):
            if not npred[i]:
                launch(i, 0.0)
        while heap:
            t, seq, i = heappop(heap)
            if i < 0:
                join(~i, t)
            elif cur[i] == seq:
                finish(i, t)

    def _launch(self, i: int, t: float) -> None:
        self.start[i] = t
        lt = self.lat[i]
        if self.res[i]:
            heappush(self.heap, (t + lt, next(self.count), ~i))
            return
        b = self.begin[i] = t + lt
        nb = self.nbytes[i]
        s = self.cur[i] = next(self.count)
        heappush(self.heap, (b + (nb / self.cap[i] if nb else 0.0), s, i))

    def _join(self, i: int, t: float) -> None:
        """The latency of ``i`` is over: its transfer joins its NICs."""
        self.begin[i] = t
        nb = self.nbytes[i]
        self.remaining[i] = float(nb)
        self.stamp[i] = t
        self.rate[i] = 0.0
        if not nb:
            s = self.cur[i] = next(self.count)
            heappush(self.heap, (t, s, i))
            return
        flows = self.flows
        touched: dict[int, None] = {}
        for r in self.res[i]:
            fl = flows[r]
            fl[i] = None
            touched.update(fl)
        self._refill(touched, t)

    def _finish(self, i: int, t: float) -> None:
        self.end[i] = t
        if self.res[i] and self.nbytes[i]:
            flows = self.flows
            touched: dict[int, None] = {}
            for r in self.res[i]:
                fl = flows[r]
                del fl[i]
                touched.update(fl)
            self.rate[i] = 0.0
            if touched:
                self._refill(touched, t)
        npred = self.npred
        for s in self.succs[i]:
            npred[s] -= 1
            if not npred[s]:
                self._launch(s, t)

    def _set_rate(self, f: int, new: float, t: float) -> None:
        """``f`` moves at ``new`` from ``t`` on: its end event is pushed anew."""
        old = self.rate[f]
        rem = self.remaining[f] - old * (t - self.stamp[f])
        if rem < 0.0:
            rem = 0.0
        self.remaining[f] = rem
        self.stamp[f] = t
        self.rate[f] = new
        s = self.cur[f] = next(self.count)
        heappush(self.heap, (t + rem / new, s, f))

    def _refill(self, touched: dict[int, None], t: float) -> None:
        """Max-min fair rates for the touched transfers; the others keep theirs (local
        water-filling: feasible, and exact when the touched set is a whole component).

        Resources are filled in order of their fair share (the first of equal shares first);
        a transfer whose own cap is below every share is fixed at its cap first."""
        if len(touched) == 1:
            self._refill_one(next(iter(touched)), t)
            return
        res_of, cap_of, caps, flows, rate = self.res, self.cap, self.caps, self.flows, self.rate
        resid: dict[int, float] = {}
        cnt: dict[int, int] = {}
        mincap = math.inf
        for f in touched:
            if cap_of[f] < mincap:
                mincap = cap_of[f]
            for r in res_of[f]:
                if r in cnt:
                    cnt[r] += 1
                else:
                    resid[r] = caps[r] - sum([rate[g] for g in flows[r] if g not in touched])
                    cnt[r] = 1
        todo = touched  # the caller's dict, emptied as transfers are fixed
        while todo:
            share, where = math.inf, -1
            for r, c in cnt.items():
                v = resid[r] / c
                if v < share:
                    share, where = v, r
            own = min(todo, key=cap_of.__getitem__) if mincap <= share else -1
            if own >= 0 and cap_of[own] <= share:
                fixed, share = [own], cap_of[own]
            else:
                fixed = [f for f in flows[where] if f in todo]
            if share <= 0.0:
                share = _TINY
            for f in fixed:
                del todo[f]
                if share != rate[f]:
                    self._set_rate(f, share, t)
                for r in res_of[f]:
                    c = cnt[r] - 1
                    if c:
                        cnt[r] = c
                        resid[r] -= share
                    else:
                        del cnt[r]

    def _refill_one(self, f: int, t: float) -> None:
        """:meth:`_refill` of one transfer: the least of its cap and its NICs' spare capacity."""
        caps, flows, rate = self.caps, self.flows, self.rate
        share = math.inf
        for r in self.res[f]:
            fl = flows[r]
            v = caps[r] - sum([rate[g] for g in fl if g != f]) if len(fl) > 1 else caps[r]
            if v < share:
                share = v
        if self.cap[f] <= share:
            share = self.cap[f]
        if share <= 0.0:
            share = _TINY
        if share != rate[f]:
            self._set_rate(f, share, t)
