"""The fair-share dispatcher: an order for ``"auto"``'s own items (:mod:`.items`) built by running
them forward in time, as the runtime would, with NICs shared fairly.

The runtime starts an operation as soon as all its ranks have finished their previous one, and
transfers that meet on a NIC share it; neither the list schedules nor the dispatchers of
:mod:`.dispatch` model that sharing (they hold a NIC for a whole transfer, or queue behind it),
so where many transfers meet on few NICs their orders collide in ways they do not see (e.g. 8
one-rank senders to 7 shared NICs: 1.65-1.87 x the lower bound; this order 1.2).

Here time advances event by event in a fluid model: a transfer on NIC directions ``nics`` moves
at ``min(1 / count)`` of its full rate, ``count`` being the transfers on each direction now.
Whenever ranks finish, each of them (the one with the most work left first) picks its next item
among those whose ranks are all idle: the one whose NICs will carry the fewest other transfers
when its start-up ends, then the one whose busiest resource (rank or NIC direction) has the
most work left (with ``rng``: scaled by a random factor in [1, 1.5), for seeded trials). A rank
with no such item waits for the next event. Every item is picked at the instant its last rank
became free, so the runtime would start it at the same instant: the order keeps the timing the
model saw, up to the model's rates (``"auto"`` simulates the plan like any other candidate).
Pure: seeded.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from ..core.ops import Op
from .items import Item

__all__ = ["fair_share_dispatch"]

NOISE = 0.5
"""Seeded trials scale the work priority by a random factor in [1, 1 + NOISE). Set once, as
:data:`~meshcast.planning.order.LOAD_NOISE`; not derived."""


class _Fluid:
    """Transfers in flight and their NIC directions' counts; each transfer's predicted end at
    its current rate (a heap with lazy deletion: an entry is current while its version is)."""

    def __init__(self, n: int, nics: list[tuple[int, ...]], work: list[float]) -> None:
        self.nics, self.work = nics, work
        self.count: dict[int, int] = {}  # moving transfers on each NIC direction
        self.on: dict[int, dict[int, None]] = {}  # the items on each NIC direction
        self.moving: dict[int, None] = {}  # items whose bytes move (start-up over)
        self.left = [0.0] * n  # work left at ``since``
        self.since = [0.0] * n
        self.rate = [1.0] * n
        self.end = [math.inf] * n
        self.version = [0] * n
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, item, version)

    def start(self, i: int, t: float, lat: float) -> None:
        """Item ``i`` starts at ``t``: its start-up ends at ``t + lat`` (an event)."""
        for k in self.nics[i]:
            self.on.setdefault(k, {})[i] = None
        heapq.heappush(self.events, (t + lat, 0, i, 0))

    def _recount(self, touched: set[int], t: float) -> None:
        """New rates for the moving items on NIC directions ``touched`` (settled at ``t``)."""
        seen: set[int] = set()
        for k in sorted(touched):
            for j in self.on.get(k, ()):
                if j in seen or j not in self.moving:
                    continue
                seen.add(j)
                self.left[j] -= self.rate[j] * (t - self.since[j])
                self.since[j] = t
                self.rate[j] = min((1.0 / self.count[q] for q in self.nics[j]), default=1.0)
                self.end[j] = t + max(self.left[j], 0.0) / self.rate[j]
                self.version[j] += 1
                heapq.heappush(self.events, (self.end[j], 1, j, self.version[j]))

    def next_event(self) -> tuple[float, int, int] | None:
        """Pop the next current event: (time, 0 = start-up over / 1 = transfer over, item)."""
        while self.events:
            t, kind, i, v = heapq.heappop(self.events)
            if kind == 0:
                self.moving[i] = None
                self.left[i], self.since[i] = self.work[i], t
                for k in self.nics[i]:
                    self.count[k] = self.count.get(k, 0) + 1
                self._recount(set(self.nics[i]), t)
                if not self.nics[i]:  # no NIC: its own rate
                    self.end[i] = t + self.work[i]
                    heapq.heappush(self.events, (self.end[i], 1, i, self.version[i]))
                return t, 0, i
            if v == self.version[i]:
                del self.moving[i]
                for k in self.nics[i]:
                    self.count[k] -= 1
                    del self.on[k][i]
                self._recount(set(self.nics[i]), t)
                return t, 1, i
        return None

    def crowd(self, k: int, at: float) -> int:
        """How many transfers NIC direction ``k`` will carry at ``at`` (those in their start-up
        count; moving ones by their predicted end)."""
        moving, end = self.moving, self.end
        return sum(1 for j in self.on.get(k, ()) if j not in moving or end[j] > at)


def fair_share_dispatch(items: list[Item], lat: float,
                        rng: np.random.Generator | None = None) -> list[Op]:
    """The operations of ``items`` in the fair-share order (module doc); ``lat``: the start-up
    latency in seconds; ``rng``: seeded noise on the work priority (None: none)."""
    n = len(items)
    ranks = [it.ranks for it in items]
    nics = [it.nics for it in items]
    work = [max(it.dur - lat, 0.0) for it in items]
    left_rank: dict[int, float] = {}
    left_nic: dict[int, float] = {}
    pending: dict[int, dict[int, None]] = {}
    for i, it in enumerate(items):
        for r in it.ranks:
            left_rank[r] = left_rank.get(r, 0.0) + it.dur
            pending.setdefault(r, {})[i] = None
        for k in it.nics:
            left_nic[k] = left_nic.get(k, 0.0) + work[i]
    scale = [1.0] * n if rng is None else (1.0 + NOISE * rng.random(n)).tolist()
    fluid = _Fluid(n, nics, work)
    idle = set(pending)
    out: list[Op] = []
    freed = sorted(pending)
    t = 0.0
    while True:
        for r in sorted(freed, key=lambda r: (-left_rank[r], r)):
            if r not in idle:
                continue
            ready = [i for i in pending[r] if idle.issuperset(ranks[i])]
            if not ready:
                continue
            i = _pick(ready, fluid, t + lat, ranks, nics, scale, left_rank, left_nic, items)
            out.append(items[i].op)
            for q in ranks[i]:
                idle.discard(q)
                del pending[q][i]
                left_rank[q] -= items[i].dur
            for k in nics[i]:
                left_nic[k] -= work[i]
            fluid.start(i, t, lat)
        event = fluid.next_event()
        if event is None:
            break
        t, kind, i = event
        freed = list(ranks[i]) if kind == 1 else []
        idle.update(freed)
    return out


def _pick(ready: list[int], fluid: _Fluid, at: float, ranks: list[tuple[int, ...]],
          nics: list[tuple[int, ...]], scale: list[float], left_rank: dict[int, float],
          left_nic: dict[int, float], items: list[Item]) -> int:
    """The item of ``ready`` whose busiest NIC direction carries the fewest transfers at ``at``,
    then whose busiest resource has the most work left (scaled), then whose resources have the
    most work left in all, then the first in order."""
    crowd: dict[int, int] = {}
    best, best_key = -1, (math.inf,)
    for i in ready:
        most = 0
        for k in nics[i]:
            c = crowd.get(k)
            if c is None:
                c = crowd[k] = fluid.crowd(k, at)
            if c > most:
                most = c
        if most > best_key[0]:
            continue
        work = total = 0.0
        for k in nics[i]:
            total += left_nic[k]
            if left_nic[k] > work:
                work = left_nic[k]
        for q in ranks[i]:
            total += left_rank[q]
            if left_rank[q] > work:
                work = left_rank[q]
        key = (most, -scale[i] * work, -total, items[i].order, i)
        if key < best_key:
            best, best_key = i, key
    return best
