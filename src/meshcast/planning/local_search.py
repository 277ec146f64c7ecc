"""The local search of ``"auto"`` (:mod:`meshcast.planning.auto`): the order and the senders of
the fastest candidate improved one move at a time, each kept when the simulated time drops.
Pure: seeded, bounded by counts.
"""

from __future__ import annotations

import numpy as np

from ..core.boxes import box_inside
from ..core.ops import AllGather, Broadcast, Op, Send
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..estimate.simulate import OrderSimulator
from .budgets import AUTO_SEARCH_BUDGET, AUTO_SEARCH_STEPS, SEED, seeded_rng
from .classes import SliceClasses

__all__ = ["local_search", "other_holders", "search_in_passes"]


def local_search(
    task: ReshardTask, topology: Topology, ops: tuple[Op, ...], label: str
) -> tuple[tuple[Op, ...], float]:
    """Improve ``ops`` one move at a time, keeping a move when the simulated time drops: an
    operation moved earlier (an all-gather stays after what it re-joins), or a send or broadcast
    given to another holder of its box.

    A move takes an operation that ends late in the current simulation (the k-th latest with k
    drawn from an exponential of mean n/8); where it has other holders, every other move gives it
    to one of them (uniformly drawn), else it goes before a uniformly drawn earlier operation.
    Seeded; at most :data:`AUTO_SEARCH_STEPS` moves and :data:`AUTO_SEARCH_BUDGET` simulated
    operations in all. Returns the best operations and their simulated time.
    """
    order, t, found = _search_order(task, topology, ops, label, other_holders(task, ops))
    return tuple(found[k] for k in order), t


def search_in_passes(task: ReshardTask, topology: Topology, classes: SliceClasses,
                      ops: list[Op], label: str) -> tuple[Op, ...]:
    """:func:`local_search` for the own method's ``ops`` on ``classes``: the order of their
    first pass (:meth:`~meshcast.planning.classes.SliceClasses.first_pass`, one operation per
    class part: the work of the one-box task's search) is searched and repeated in every pass.
    Returns the expanded operations."""
    kept, first = classes.first_pass(ops)
    order, _, _ = _search_order(task, topology, first, label, [()] * len(first))
    return classes.expand([ops[kept[k]] for k in order])


def _search_order(
    task: ReshardTask, topology: Topology, ops: tuple[Op, ...], label: str,
    holders: list[tuple[int, ...]],
) -> tuple[list[int], float, list[Op]]:
    """:func:`local_search`'s order (indices of the operations), its simulated time and the
    operations (``ops`` with the senders changed from ``holders[k]``, operation ``k``'s other
    holders). A move that would put an all-gather before an operation that delivers into its
    box on one of its members is not tried (the all-gather re-joins what those brought)."""
    n = len(ops)
    sim = OrderSimulator(Plan(task, ops, label, "auto", topology), topology)
    feeds = _feeds(ops)
    found = list(ops)
    cur = list(range(n))  # the order, as indices of ops
    end = sim.end_s(cur)
    t = max(end, default=0.0)
    if n < 2:
        return cur, t, found
    rng = seeded_rng(SEED, 7)
    for step in range(min(AUTO_SEARCH_STEPS, AUTO_SEARCH_BUDGET // n)):
        late = np.argsort(end, kind="stable")
        j = int(late[n - 1 - min(int(rng.exponential(n / 8)), n - 1)])
        k = cur[j]
        if step % 2 and holders[k]:
            old = found[k]
            found[k] = old._replace(src=holders[k][int(rng.integers(0, len(holders[k])))])
            sim.replace(k, found[k])
            new = sim.end_s(cur)
            if max(new) < t:
                holders[k] = tuple(r for r in (*holders[k], old.src) if r != found[k].src)
                end, t = new, max(new)
            else:
                found[k] = old
                sim.replace(k, old)
            continue
        if j == 0:
            continue
        i = int(rng.integers(0, j))
        if k in feeds and not feeds[k].isdisjoint(cur[i:j]):
            continue
        cand = [*cur[:i], k, *cur[i:j], *cur[j + 1 :]]
        new = sim.end_s(cand)
        if max(new) < t:
            cur, end, t = cand, new, max(new)
    return cur, t, found


def other_holders(task: ReshardTask, ops: tuple[Op, ...]) -> list[tuple[int, ...]]:
    """Per operation: the ranks other than its sender that could send it instead (a ``Send`` or
    ``Broadcast`` whose box lies in one unit slice: the slice's other holders, none of its
    receivers); none for the others."""
    dec = task.decomposition
    out: list[tuple[int, ...]] = [()] * len(ops)
    moved = [k for k, op in enumerate(ops) if isinstance(op, (Send, Broadcast)) and op.box]
    if not moved:
        return out
    cells = []  # per dimension, the unit slice interval holding each moved box's start
    inside = np.ones(len(moved), dtype=bool)
    for d, (lo, hi) in enumerate(zip(dec.starts, dec.stops)):
        start = np.array([ops[k].box[d].start for k in moved])
        stop = np.array([ops[k].box[d].stop for k in moved])
        cell = np.searchsorted(lo, start, side="right") - 1
        inside &= stop <= hi[cell]
        cells.append(cell)
    tiles = dec.src_tile[np.ravel_multi_index(tuple(cells), tuple(map(len, dec.starts)))]
    for k, tile, ok in zip(moved, tiles.tolist(), inside.tolist()):
        if ok:
            op = ops[k]
            skip = {op.src, *(op.dsts if isinstance(op, Broadcast) else (op.dst,))}
            out[k] = tuple(r for r in dec.holders_of_tile[tile] if r not in skip)
    return out


def _feeds(ops: tuple[Op, ...]) -> dict[int, set[int]]:
    """Per all-gather of ``ops`` (its index): the operations before it that take part with one
    of its members in a box inside its box (those that deliver what it re-joins, and more)."""
    out: dict[int, set[int]] = {}
    seen: dict[int, list[int]] = {}  # rank -> the operations so far that it takes part in
    for g, op in enumerate(ops):
        if isinstance(op, AllGather):
            out[g] = {k for r in op.group for k in seen.get(r, ())
                      if box_inside(ops[k].box, op.box)}
        for r in op.ranks():
            seen.setdefault(r, []).append(g)
    return out
