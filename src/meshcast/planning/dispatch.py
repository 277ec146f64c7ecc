"""Orders for ``"auto"``'s own items (:class:`~meshcast.planning.items.Item`): round colourings,
list schedules and dispatchers, each a pure function of the items (and a seeded generator).

:data:`ORDERS` names them; :func:`order_items` runs one by name.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import numpy as np

from ..core.boxes import box_size
from ..core.ops import AllGather, Copy, Op
from ..core.topology import Topology
from .fair_share import fair_share_dispatch
from .items import Item, op_items

__all__ = [
    "ORDERS", "busiest_resource_work", "dispatch", "dispatched", "first_fit_rounds", "order_items",
    "phase_rounds",
]

ORDERS = (
    "rank_rounds",
    "busiest_nic_first",
    "longest_first",
    "earliest_start",
    "nondelay",
    "rank_nic_rounds",
    "fair_share",
)
"""The orders :func:`order_items` knows: ``"rank_rounds"`` colours items into rounds in which
no rank appears twice (largest first) and lists the rounds in turn; ``"rank_nic_rounds"`` the
same with no NIC direction twice either; ``"busiest_nic_first"`` and ``"longest_first"`` place
items greedily at the time their ranks and NICs are free, items on the most loaded NIC first or
longest first, and list them by start; ``"earliest_start"`` and ``"nondelay"`` are the two
:func:`dispatch` models; ``"fair_share"`` runs the items forward with NICs shared fairly
(:func:`~meshcast.planning.fair_share.fair_share_dispatch`)."""


def first_fit_rounds(resources: Sequence[Iterable[int]], visit: Iterable[int]) -> list[int]:
    """First-fit colouring: each item (visited in the order ``visit``) goes into the first round
    in which none of its ``resources[i]`` is taken (bit masks per resource). Returns the round of
    every item, so that the items of one round share no resource."""
    used: dict[int, int] = {}
    rounds = [0] * len(resources)
    for i in visit:
        mine = tuple(resources[i])
        u = 0
        for x in mine:
            u |= used.get(x, 0)
        bit = ~u & (u + 1)
        for x in mine:
            used[x] = used.get(x, 0) | bit
        rounds[i] = bit.bit_length() - 1
    return rounds


def _largest_first(items: list[Item]) -> list[int]:
    return sorted(range(len(items)), key=lambda i: (-items[i].dur, items[i].order))


def _in_rounds(items: list[Item], resources: Sequence[Iterable[int]]) -> list[Op]:
    """Items coloured by :func:`first_fit_rounds` largest first; the plan lists the rounds in
    turn (within a round: largest first)."""
    slot = first_fit_rounds(resources, _largest_first(items))
    return [
        items[i].op
        for i in sorted(range(len(items)), key=lambda i: (slot[i], -items[i].dur, items[i].order))
    ]


def phase_rounds(ops: Sequence[Op]) -> tuple[Op, ...]:
    """``ops`` in three phases: the copies, then the sends and broadcasts, then the all-gathers
    (so every all-gather follows the parts it re-joins), each phase coloured by
    :func:`first_fit_rounds` over the operations' ranks (largest box first) and listed round by
    round. For the ``"allgather"`` strategy on hosts with a NIC per GPU: the parts cross in
    rank-disjoint rounds, each receiver taking its parts over its own NIC while the holders send
    in parallel, and then the hosts re-join the slices inside (paper case 7 on two ``h100x8``
    hosts: 1.09 x the bound, against 3.3 x in slice order)."""
    out: list[Op] = []
    for phase in (
        [op for op in ops if isinstance(op, Copy)],
        [op for op in ops if not isinstance(op, (Copy, AllGather))],
        [op for op in ops if isinstance(op, AllGather)],
    ):
        size = [box_size(op.box) for op in phase]
        slot = first_fit_rounds([op.ranks() for op in phase],
                                sorted(range(len(phase)), key=lambda i: (-size[i], i)))
        out += [phase[i] for i in sorted(range(len(phase)), key=lambda i: (slot[i], -size[i], i))]
    return tuple(out)


def dispatched(ops: Sequence[Op], topology: Topology, itemsize: int) -> tuple[Op, ...]:
    """``ops`` in three phases, as :func:`phase_rounds` has them, the sends and broadcasts in the
    order of the non-delay :func:`dispatch` of their items
    (:func:`~meshcast.planning.items.op_items`): for plans whose operations a rewrite changed
    (``"auto"``'s gathered tiles), scheduled again as ``"auto"`` schedules its own."""
    items = op_items(ops, topology, itemsize)
    lat = topology.latency_us * 1e-6
    return (*(op for op in ops if isinstance(op, Copy)), *dispatch(items, lat, queue_on_nic=True),
            *(op for op in ops if isinstance(op, AllGather)))


def order_items(items: list[Item], order: str, lat: float = 0.0) -> list[Op]:
    """The operations of ``items`` in the order named ``order`` (one of :data:`ORDERS`);
    ``lat`` is the topology's start-up latency in seconds."""
    if order == "earliest_start":
        return dispatch(items, lat, queue_on_nic=False)
    if order == "nondelay":
        return dispatch(items, lat, queue_on_nic=True)
    if order == "fair_share":
        return fair_share_dispatch(items, lat)
    if order == "rank_nic_rounds":
        # ranks as themselves, NIC directions as negative numbers: one space of resources
        return _in_rounds(items, [(*it.ranks, *(-1 - k for k in it.nics)) for it in items])
    if order == "rank_rounds":
        return _in_rounds(items, [it.ranks for it in items])
    if order == "longest_first":
        return _list_schedule(items, _largest_first(items))
    if order == "busiest_nic_first":
        load: dict[int, float] = {}
        for it in items:
            for k in it.nics:
                load[k] = load.get(k, 0.0) + it.dur
        keys = sorted(
            range(len(items)),
            key=lambda i: (-max((load[k] for k in items[i].nics), default=0.0), -items[i].dur,
                           items[i].order),
        )
        return _list_schedule(items, keys)
    raise ValueError(f"order={order!r} is unknown; choose one of {', '.join(ORDERS)}")


def _list_schedule(items: list[Item], keys: list[int]) -> list[Op]:
    """Place items greedily in the priority order ``keys``, each at the time all its ranks and
    NICs are free (held for its whole duration); the plan lists them by that start time."""
    free_rank: dict[int, float] = {}
    free_nic: dict[int, float] = {}
    start = [0.0] * len(items)
    for i in keys:
        it = items[i]
        s = 0.0
        for r in it.ranks:
            v = free_rank.get(r, 0.0)
            if v > s:
                s = v
        for k in it.nics:
            v = free_nic.get(k, 0.0)
            if v > s:
                s = v
        e = s + it.dur
        for r in it.ranks:
            free_rank[r] = e
        for k in it.nics:
            free_nic[k] = e
        start[i] = s
    rank_of = {i: pos for pos, i in enumerate(keys)}
    return [items[i].op for i in sorted(range(len(items)), key=lambda i: (start[i], rank_of[i]))]


def dispatch(
    items: list[Item], lat: float, *, queue_on_nic: bool, rng: np.random.Generator | None = None,
    crit: list[float] | None = None,
) -> list[Op]:
    """Repeatedly start the item that can start first; the plan lists items by start time.

    An item holds its ranks for its whole duration (``lat`` + transfer). Two models of its NIC
    directions:

    * ``queue_on_nic=False`` (earliest start): a NIC is held only while bytes move (from ``lat``
      after the start), so one rank's start-up overlaps another's transfer on the same NIC; an
      item starts when its ranks are free and its NICs will be by the time its bytes move.
    * ``queue_on_nic=True`` (non-delay, as the runtime runs): an item starts as soon as its
      ranks are free and its transfer queues behind the NICs' (the wait is part of its key).

    Ties go to the item whose busiest resource (rank or NIC direction) has the most work in
    total (``crit``: :func:`busiest_resource_work` of the items, computed when not given); with
    ``rng`` that work is scaled by a random factor in [1, 2) (seeded trials). A lazy heap keeps
    this O(n log n): an item's key only grows."""
    crit = busiest_resource_work(items, lat) if crit is None else crit
    if rng is not None:
        crit = [c * (1.0 + u) for c, u in zip(crit, rng.random(len(crit)).tolist())]
    ranks, nics = [it.ranks for it in items], [it.nics for it in items]
    free_rank = [0.0] * (max((r for rs in ranks for r in rs), default=-1) + 1)
    free_nic = [0.0] * (max((k for ks in nics for k in ks), default=-1) + 1)
    tol = 0.0 if queue_on_nic else 1e-15  # float slack of the earliest-start comparison
    # heap entries (start, wait, rank in the tie order): all keys 0 at first, ranks in turn
    prio = sorted(range(len(items)), key=lambda i: (-crit[i], items[i].order, i))
    heap = [(0.0, 0.0, p) for p in range(len(prio))]
    pop, push = heapq.heappop, heapq.heappush
    out: list[Op] = []
    while heap:
        s0, w0, p = pop(heap)
        i = prio[p]
        s = 0.0  # the key of item i now: when its ranks are free, and its NIC wait
        for r in ranks[i]:
            if free_rank[r] > s:
                s = free_rank[r]
        w = 0.0
        if queue_on_nic:
            for k in nics[i]:
                v = free_nic[k] - s - lat
                if v > w:
                    w = v
        else:  # bytes move from s + lat on
            for k in nics[i]:
                v = free_nic[k] - lat
                if v > s:
                    s = v
        if s > s0 + tol or w > w0:
            push(heap, (s, w, p))
            continue
        e = s + w + items[i].dur
        for r in ranks[i]:
            free_rank[r] = e
        for k in nics[i]:
            free_nic[k] = e
        out.append(items[i].op)
    return out


def busiest_resource_work(items: list[Item], lat: float) -> list[float]:
    """Per item: the total work of its busiest resource (rank, or NIC direction): the priority
    of :func:`dispatch`."""
    load: dict[tuple[int, int], float] = {}
    for it in items:
        for r in it.ranks:
            load[(0, r)] = load.get((0, r), 0.0) + it.dur
        for k in it.nics:
            load[(1, k)] = load.get((1, k), 0.0) + it.dur - lat
    return [
        max(
            max((load[(0, r)] for r in it.ranks), default=0.0),
            max((load[(1, k)] for k in it.nics), default=0.0),
        )
        for it in items
    ]
