"""The event loop of :func:`meshcast.simulate` (the model: :mod:`meshcast.estimate.simulate`).

Operations wait for their ranks' previous operation, pay their latency, then share their NICs
max-min fairly until their bytes are moved. An event only revisits the transfers that share a NIC
with the one that changed (local water-filling).

Events are ``(time, sequence, code)``: ``code = ~i`` ends the latency of operation ``i``,
``code = i`` ends ``i`` (stale unless ``sequence`` is the latest given to ``i``: its rate changed
since). They run in (time, sequence) order: equal times in the order they were made. New events
wait in ``pending`` (by code: an end event made again at the same instant replaces the stale one,
which never reaches the heap) until the heap holds no more events at the current time: none
pending is earlier, and those of the current time were made after every event on the heap, so the
order is the same as with every event pushed at once. Every float is computed in one fixed order,
so the same model always gives the same times, to the bit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from heapq import heapify, heappop, heappush

__all__ = ["run_events", "run_makespan"]

_TINY = 1e-300
"""The rate of a transfer left no capacity (it all but stops until a later event refills it)."""


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


def run_makespan(
    ranks: Sequence[tuple[int, ...]],
    nbytes: Sequence[int],
    res: Sequence[tuple[int, ...]],
    cap: Sequence[float],
    lat: Sequence[float],
    caps: Sequence[float],
    until: float = math.inf,
) -> float:
    """The latest end time of :func:`run_events` (the same float; 0.0 for no operations); or,
    as soon as an operation is known to end after ``until``, a time above ``until`` at which the
    loop stops (a lower bound on the latest end)."""
    return _Loop(ranks, nbytes, res, cap, lat, caps).run(until)


def _bottleneck(cnt: dict[int, int], resid: dict[int, float]) -> tuple[float, int]:
    """The water-filling's next level: the least spare capacity per unfixed transfer over the
    resources ``cnt`` still counts (the first of equals), and that resource (-1: none)."""
    share, where = math.inf, -1
    for r, c in cnt.items():
        v = resid[r] / c
        if v < share:
            share, where = v, r
    return share, where


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
        self.pending: dict[int, tuple[float, int, int]] = {}
        self.count = itertools.count(1)
        # every transfer on the NICs loads two of them, has no cap of its own (Sends), and the
        # NICs have finite capacities: the fast paths _fill_sends and _refill_sends hold
        sends = all(len(rs) == 2 and c == math.inf for rs, c in zip(res, cap) if rs)
        self.fill = self._fill_sends if sends and max(caps, default=0.0) < math.inf else \
            self._refill

    def run(self, until: float = math.inf) -> float:
        """Run every operation: pop events in (time, sequence) order; the latest end time (or
        the time of the first event after ``until``, where the loop stops)."""
        npred, succs, heap, cur, nbytes, res = (
            self.npred, self.succs, self.heap, self.cur, self.nbytes, self.res)
        begin, end, remaining, stamp, rate, flows = (
            self.begin, self.end, self.remaining, self.stamp, self.rate, self.flows)
        launch, fill = self._launch, self.fill
        for i in range(len(npred)):
            if not npred[i]:
                launch(i, 0.0)
        pending, t = self.pending, 0.0
        while True:
            if pending and (not heap or heap[0][0] > t):
                if heap:
                    for e in pending.values():
                        heappush(heap, e)
                else:
                    heap += pending.values()
                    heapify(heap)
                pending.clear()
            if not heap:
                break
            t, seq, i = heappop(heap)
            if i >= 0 and cur[i] != seq:
                continue  # stale: its rate changed since
            if t > until:
                return t  # operation i ends at t, or its transfer begins then
            if i >= 0:
                end[i] = t
                if res[i] and nbytes[i]:
                    touched: dict[int, None] = {}
                    for r in res[i]:
                        fl = flows[r]
                        del fl[i]
                        touched.update(fl)
                    rate[i] = 0.0
                    if touched:
                        fill(touched, res[i], t)
                for s in succs[i]:
                    npred[s] -= 1
                    if not npred[s]:
                        launch(s, t)
                continue
            i = ~i  # the latency of i is over: its transfer joins its NICs
            begin[i] = stamp[i] = t
            nb = nbytes[i]
            remaining[i] = float(nb)
            rate[i] = 0.0
            if not nb:
                s = cur[i] = next(self.count)
                pending[i] = (t, s, i)
                continue
            touched = {}
            for r in res[i]:
                fl = flows[r]
                fl[i] = None
                touched.update(fl)
            fill(touched, res[i], t)
        return max(end, default=0.0)

    def _launch(self, i: int, t: float) -> None:
        self.start[i] = t
        lt = self.lat[i]
        if self.res[i]:
            self.pending[~i] = (t + lt, next(self.count), ~i)
            return
        b = self.begin[i] = t + lt
        nb = self.nbytes[i]
        s = self.cur[i] = next(self.count)
        self.pending[i] = (b + (nb / self.cap[i] if nb else 0.0), s, i)

    def _refill(self, touched: dict[int, None], nics: tuple[int, ...], t: float) -> None:
        """Max-min fair rates for the touched transfers (those sharing ``nics``, which one
        transfer joined or left); the others keep theirs (local water-filling: feasible, and exact
        when the touched set is a whole component).

        Resources are filled in order of their fair share (the first of equal shares first);
        a transfer whose own cap is below every share is fixed at its cap first."""
        if len(touched) == 1:
            self._refill_one(touched, t)
            return
        res_of, cap_of, caps, flows, rate = self.res, self.cap, self.caps, self.flows, self.rate
        resid: dict[int, float] = {}
        for r in nics:
            resid[r] = caps[r]  # every transfer on them is touched
        cnt: dict[int, int] = {}  # transfers to fix on each resource, by first appearance
        mincap = math.inf
        for f in touched:
            if cap_of[f] < mincap:
                mincap = cap_of[f]
            for r in res_of[f]:
                if r in cnt:
                    cnt[r] += 1
                    continue
                cnt[r] = 1
                if r not in resid:
                    resid[r] = self._spare(r, touched)
        todo, set_rate = touched, self._set_rate  # todo: the caller's dict, emptied here
        while todo:
            share, where = _bottleneck(cnt, resid)
            batch: Iterable[int] = flows[where] if where >= 0 else ()  # unchanged here
            if mincap <= share:
                own = min(todo, key=cap_of.__getitem__)
                if cap_of[own] <= share:
                    batch, share = (own,), cap_of[own]
            if share <= 0.0:
                share = _TINY
            for f in batch:
                if f not in todo:
                    continue
                del todo[f]
                if share != rate[f]:
                    set_rate(f, share, t)
                if todo:  # else nothing reads them again
                    for r in res_of[f]:
                        c = cnt[r] - 1
                        if c:
                            cnt[r] = c
                            resid[r] -= share
                        else:
                            del cnt[r]

    def _refill_one(self, touched: dict[int, None], t: float) -> None:
        """:meth:`_refill` of one transfer: the least of its cap and its NICs' spare capacity."""
        f = next(iter(touched))
        share = math.inf
        for r in self.res[f]:
            v = self._spare(r, touched)
            if v < share:
                share = v
        if self.cap[f] <= share:
            share = self.cap[f]
        if share <= 0.0:
            share = _TINY
        if share != self.rate[f]:
            self._set_rate(f, share, t)

    def _fill_sends(self, touched: dict[int, None], nics: tuple[int, int], t: float) -> None:
        """:meth:`_refill` of Sends. Where the ``k`` touched transfers all load both ``nics``
        (and nothing else) each gets the smaller NIC's ``1/k``; else :meth:`_refill_sends`."""
        a, b = nics
        k = len(touched)
        flows = self.flows
        if len(flows[a]) != k or len(flows[b]) != k:
            self._refill_sends(touched, nics, t)
            return
        caps = self.caps
        a, b = self.res[next(iter(touched))]  # the order _refill scans them in
        share = caps[a] / k
        v = caps[b] / k
        if v < share:
            share = v
        if share <= 0.0:
            share = _TINY
        rate, set_rate = self.rate, self._set_rate
        for f in touched:
            if share != rate[f]:
                set_rate(f, share, t)

    def _refill_sends(self, touched: dict[int, None], nics: tuple[int, int], t: float) -> None:
        """:meth:`_refill` of Sends: two resources per transfer, no own cap, finite shares."""
        if len(touched) == 1:
            self._refill_one(touched, t)
            return
        res_of, caps, flows, rate, set_rate = (
            self.res, self.caps, self.flows, self.rate, self._set_rate)
        cnt: dict[int, int] = {}  # transfers to fix on each resource, by first appearance
        get = cnt.get
        for f in touched:
            a, b = res_of[f]
            cnt[a] = get(a, 0) + 1
            cnt[b] = get(b, 0) + 1
        a, b = nics
        resid = {a: caps[a], b: caps[b]}  # every transfer on them is touched
        for r in cnt:
            if r not in resid:
                used = 0  # as sum() adds: from int 0, in order (_spare, inlined)
                for g in flows[r]:
                    if g not in touched:
                        used += rate[g]
                resid[r] = caps[r] - used
        todo = touched
        while todo:
            share, where = _bottleneck(cnt, resid)
            if share <= 0.0:
                share = _TINY
            final = cnt.pop(where) == len(todo)  # nothing left to fix after this batch
            for f in flows[where]:
                if f not in todo:
                    continue
                del todo[f]
                if share != rate[f]:
                    set_rate(f, share, t)
                if not final:
                    a, b = res_of[f]
                    o = b if a == where else a
                    c = cnt[o] - 1
                    if c:
                        cnt[o] = c
                        resid[o] -= share
                    else:
                        del cnt[o]

    def _spare(self, r: int, touched: dict[int, None]) -> float:
        """Capacity of resource ``r`` that the transfers not touched leave."""
        rate = self.rate
        used = 0  # as sum() adds: from int 0, in order
        for g in self.flows[r]:
            if g not in touched:
                used += rate[g]
        return self.caps[r] - used

    def _set_rate(self, f: int, new: float, t: float) -> None:
        """``f`` moves at ``new`` from ``t`` on: its end event is made anew."""
        old = self.rate[f]
        rem = self.remaining[f] - old * (t - self.stamp[f])
        if rem < 0.0:
            rem = 0.0
        self.remaining[f] = rem
        self.stamp[f] = t
        self.rate[f] = new
        s = self.cur[f] = next(self.count)
        self.pending[f] = (t + rem / new, s, f)
