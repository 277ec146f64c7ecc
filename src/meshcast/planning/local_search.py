"""The local search of ``"auto"`` (:mod:`meshcast.planning.auto`): the order of the fastest
candidate improved one move at a time, each kept when the simulated time drops. Pure: seeded,
bounded by counts.
"""

from __future__ import annotations

import numpy as np

from ..core.boxes import box_inside
from ..core.ops import AllGather, Op
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..estimate.simulate import OrderSimulator
from .budgets import AUTO_SEARCH_BUDGET, AUTO_SEARCH_STEPS, SEED, seeded_rng
from .classes import SliceClasses

__all__ = ["local_search", "search_in_passes"]


def local_search(
    task: ReshardTask, topology: Topology, ops: tuple[Op, ...], label: str
) -> tuple[tuple[Op, ...], float]:
    """Improve the order of ``ops`` by moving one operation earlier at a time, keeping a move
    when the simulated time drops (an all-gather stays after what it re-joins).

    A move takes an operation that ends late in the current simulation (the k-th latest with k
    drawn from an exponential of mean n/8) and puts it before a uniformly drawn earlier one.
    Seeded; at most :data:`AUTO_SEARCH_STEPS` moves and :data:`AUTO_SEARCH_BUDGET` simulated
    operations in all. Returns the best order and its simulated time.
    """
    order, t = _search_order(task, topology, ops, label)
    return tuple(ops[k] for k in order), t


def search_in_passes(task: ReshardTask, topology: Topology, classes: SliceClasses,
                      ops: list[Op], label: str) -> tuple[Op, ...]:
    """:func:`local_search` for the own method's ``ops`` on ``classes``: the order of their
    first pass (:meth:`~meshcast.planning.classes.SliceClasses.first_pass`, one operation per
    class part: the work of the one-box task's search) is searched and repeated in every pass.
    Returns the expanded operations."""
    kept, first = classes.first_pass(ops)
    order, _ = _search_order(task, topology, first, label)
    return classes.expand([ops[kept[k]] for k in order])


def _search_order(
    task: ReshardTask, topology: Topology, ops: tuple[Op, ...], label: str
) -> tuple[list[int], float]:
    """:func:`local_search`'s order (indices of ``ops``) and its simulated time. A move that
    would put an all-gather before an operation that delivers into its box on one of its members
    is not tried (the all-gather re-joins what those brought)."""
    n = len(ops)
    sim = OrderSimulator(Plan(task, ops, label, "auto", topology), topology)
    feeds = _feeds(ops)
    cur = list(range(n))  # the order, as indices of ops
    end = sim.end_s(cur)
    t = max(end, default=0.0)
    if n < 2:
        return cur, t
    rng = seeded_rng(SEED, 7)
    for _ in range(min(AUTO_SEARCH_STEPS, AUTO_SEARCH_BUDGET // n)):
        late = np.argsort(end, kind="stable")
        j = int(late[n - 1 - min(int(rng.exponential(n / 8)), n - 1)])
        if j == 0:
            continue
        i = int(rng.integers(0, j))
        if cur[j] in feeds and not feeds[cur[j]].isdisjoint(cur[i:j]):
            continue
        cand = [*cur[:i], cur[j], *cur[i:j], *cur[j + 1 :]]
        new = sim.end_s(cand)
        if max(new) < t:
            cur, end, t = cand, new, max(new)
    return cur, t


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
