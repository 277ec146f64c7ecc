"""``balance="auto"``: our method. Candidates are simulated and the fastest kept.

Candidates: the plans of our own method (:mod:`.items`: senders from the outbound LP of the
lower bound, optional striping and chunking, per-slice broadcast or point-to-point) in every
order of :data:`~meshcast.planning.dispatch.ORDERS` plus seeded dispatch trials (on classes
of slices with equal holders and receivers, :mod:`.classes`), the vectorised plans of
:mod:`.large`, every fixed strategy x balance plan (so ``"auto"`` is never slower than any of
them, up to float rounding), and the fastest rewritten (tiles gathered, :mod:`.gathered`;
starts staggered, :mod:`.stagger`); then a seeded local search over the order and the senders
when the best is far above the lower bound. They are built in stages, and planning stops when
the rest cannot matter: the best meets the lower bound, or is close to it and no fixed plan
can be faster (:mod:`.floors`). Above :data:`~meshcast.planning.budgets.AUTO_SIM_LIMIT` unit
slices one vectorised plan is built; it is kept when its exact time meets the lower bound, and
otherwise compared with the fixed combinations, skipping each one whose quick time floor shows
it cannot be faster. Pure: seeded, bounded by counts. See ``docs/scheduling.md``.
"""
from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator

import numpy as np

from ..core.ops import AllGather, Op
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..estimate.lower_bound import LowerBound, lower_bound_details
from ..estimate.simulate import simulated_time, time_floor
from .budgets import (
    AUTO_GOOD_ENOUGH,
    AUTO_SEARCH_GAP,
    AUTO_SIM_LIMIT,
    CERTIFY_TOL,
    FLOOR_TOL,
)
from .dispatch import dispatched, phase_rounds
from .fixed import STRATEGIES, fixed_plan
from .floors import first_holder_floor, strategy_floors
from .gathered import Group, gathered, tile_groups
from .large import large_plan
from .local_search import local_search, search_in_passes
from .order import order_floor, order_plan
from .own import OWN_VARIANTS, Candidate, OwnMethod
from .stagger import STAGGERS, staggered

__all__ = [
    "FIXED_BALANCES", "OWN_VARIANTS", "auto_plan", "collector_paused",
    "one_remote_receiver",
]

FIXED_BALANCES = ("none", "size", "order")
"""The balances of the fixed combinations ``"auto"`` compares itself with."""


def _fixed(task: ReshardTask, topology: Topology, strategy: str, balance: str,
           memo: list) -> Plan:
    if balance == "order":
        return order_plan(task, topology, strategy, memo=memo)
    return fixed_plan(task, topology, strategy, balance)


def auto_plan(
    task: ReshardTask, topology: Topology, strategy: str | None, *, sim_limit: int = AUTO_SIM_LIMIT
) -> Plan:
    """Our method (module doc) on a resolved ``topology``. ``strategy=None``: choose per slice
    among the strategies; a given strategy restricts the candidates to it. ``sim_limit``
    (default :data:`~meshcast.planning.budgets.AUTO_SIM_LIMIT`): above this many unit slices
    (or transfers, for the own method's variants) build one plan instead of simulating all.

    Work stops as soon as the rest cannot matter. The candidates come in stages: the vectorised
    plans, our own variants, the seeded trials; the fixed combinations as soon as the best is
    within :data:`~meshcast.planning.budgets.AUTO_GOOD_ENOUGH` of the lower bound (else last).
    A stage's candidates keep their place in the tie order whenever they are built. Planning
    stops when the best meets the lower bound (within
    :data:`~meshcast.planning.budgets.CERTIFY_TOL`: no plan is faster), or is within
    ``AUTO_GOOD_ENOUGH`` of it and no fixed plan can be faster (built and simulated, or ruled
    out by its strategy's floor, :func:`~meshcast.planning.floors.strategy_floors`). A
    strategy's fixed plans are built only when its floor is below the best time so far.
    """
    if strategy in (None, "broadcast") and len(task.decomposition) > sim_limit:
        with collector_paused():
            return _checked_large_plan(task, topology, strategy)
    lbd = lower_bound_details(task, topology)
    pool = _Pool(task, topology)
    fixed = _FixedStage(task, topology, lbd, strategy, pool)
    own = None
    if strategy in (None, "broadcast"):
        own = OwnMethod(task, topology, lbd, strategy, sim_limit)
        good = lbd.unmargined_s * (1 + AUTO_GOOD_ENOUGH)
        # (stage, whether "close enough" may end the work after it): the own variants one at a
        # time, so that one at the lower bound ends the work, but close enough only after all
        variants = own.variant_stages()
        stages = [(v, k == len(variants) - 1) for k, v in enumerate(variants)]
        stages += [(t, True) for t in own.trial_stages()]
        pool.add(_large_candidates(task, topology))
        checkpoint = True
        while True:
            if pool.best_time() <= lbd.unmargined_s * (1 + CERTIFY_TOL):
                return pool.plan(pool.best())  # at the lower bound: no plan is faster
            if checkpoint and pool.best_time() <= good:
                if fixed.settled():
                    return pool.plan(pool.best())
                pool.add(fixed())  # all that is left to settle
            elif stages:
                stage, checkpoint = stages.pop(0)
                pool.add(stage())
            else:
                break
    if not fixed.built:
        pool.add(fixed())
    return _finished(pool, own, lbd)


def _finished(pool: _Pool, own: OwnMethod | None, lbd: LowerBound) -> Plan:
    """The plan when the stages did not stop the work: above ``AUTO_GOOD_ENOUGH`` over the
    bound, the fastest candidate without all-gathers with its tiles gathered, and the fastest of
    all with its starts staggered, as candidates; then, above ``AUTO_SEARCH_GAP``, the local
    search; the fastest of all."""
    best = pool.best()
    if pool.times[best] > lbd.unmargined_s * (1 + AUTO_GOOD_ENOUGH):
        groups = tile_groups(pool.task, pool.topology)
        free = _without_allgathers(pool)
        if groups and free:
            pool.add(_gathered(pool, pool.fastest(free), groups))
        pool.add(_staggered(pool, pool.best()))
        best = pool.best()
    if pool.times[best] > AUTO_SEARCH_GAP * lbd.unmargined_s:
        searched = _searched(pool, own)
        if searched is not None and searched[1] < pool.times[best]:
            return searched[0]
    return pool.plan(best)


def _without_allgathers(pool: _Pool) -> list[int]:
    """The candidates without an ``AllGather`` (any order of their copies, sends and broadcasts
    moves the same data; an all-gather must follow its parts)."""
    return [i for i, c in enumerate(pool.candidates)
            if not any(isinstance(op, AllGather) for op in c[3])]


def _gathered(pool: _Pool, i: int, groups: list[Group]) -> list[Candidate]:
    """Candidate ``i`` (no all-gathers) with the tile groups ``groups`` gathered (a part per
    receiver, then cells replicated: :func:`~meshcast.planning.gathered.gathered`), each in its
    order, in phase rounds and dispatched again (:mod:`~meshcast.planning.dispatch`), at
    positions ``(4, j)``: they win only where strictly faster."""
    _, label, _, ops, fallbacks = pool.candidates[i]
    cuts = [c for c in (gathered(ops, groups, replicate=r) for r in (False, True)) if c]
    orders = [o for c in cuts
              for o in (c, phase_rounds(c), dispatched(c, pool.topology, pool.task.itemsize))]
    return [((4, j), label, "gathered", o, fallbacks) for j, o in enumerate(orders)]


def _staggered(pool: _Pool, best: int) -> list[Candidate]:
    """Candidate ``best`` with the ranks of each NIC staggered, in each way of
    :data:`~meshcast.planning.stagger.STAGGERS` that cuts something (positions ``(5, k)``: they
    win only where strictly faster)."""
    _, label, _, ops, fallbacks = pool.candidates[best]
    out: list[Candidate] = []
    for k, (side, groups) in enumerate(STAGGERS):
        cut = staggered(ops, pool.topology, side, groups)
        if cut is not None:
            out.append(((5, k), label, "stagger", cut, fallbacks))
    return out


def _searched(pool: _Pool, own: OwnMethod | None) -> tuple[Plan, float] | None:
    """The faster of the local searches from the fastest candidate and from the fastest with
    other operations (where a search ends depends on where it starts); for our own method's
    plans on classes, the search of one pass's order. The plan and its time (None: none)."""
    if not pool.candidates:
        return None
    task, topology, best = pool.task, pool.topology, pool.best()
    virtual = None if own is None else own.virtual_ops(pool.candidates[best][0])
    if virtual is not None:
        _, label, _, _, fallbacks = pool.candidates[best]
        ops = search_in_passes(task, topology, own.classes, virtual, label)
        found = Plan(task, ops, label, "auto", topology, fallbacks)
        return found, simulated_time(found, topology)
    others = [i for i, c in enumerate(pool.candidates) if c[3] != pool.candidates[best][3]]
    runs = [(local_search(task, topology, pool.candidates[i][3], pool.candidates[i][1]), i)
            for i in (best, *([pool.fastest(others)] if others else ()))]
    (ops, t), i = min(runs, key=lambda run: run[0][1])  # ties: the fastest candidate's
    _, label, _, _, fallbacks = pool.candidates[i]
    return Plan(task, ops, label, "auto", topology, fallbacks), t


class _FixedStage:
    """The fixed combinations as a stage of ``"auto"``: calling it builds the fixed plans of
    every strategy whose floor (:func:`~meshcast.planning.floors.strategy_floors`) the best
    candidate so far does not beat (the three strategies build the same operations when every
    slice has one receiver to reach: then one stands for all; ``"size"`` builds ``"none"``'s
    when every slice has one holder: then it is not built), with the ``"none"`` and ``"size"``
    plans of ``"allgather"`` also in :func:`~meshcast.planning.dispatch.phase_rounds` order
    (their parts in rounds, then the re-joins), and keeps those whose
    :func:`meshcast.time_floor` is below the best so far (the others cannot be faster);
    :meth:`settled` says whether no fixed plan can be faster than the best so far."""

    def __init__(self, task: ReshardTask, topology: Topology, lbd: LowerBound,
                 strategy: str | None, pool: _Pool, *, use_floors: bool = True,
                 direct_floor: bool = False) -> None:
        self.task, self.topology, self.lbd, self.pool = task, topology, lbd, pool
        self.strategies = STRATEGIES if strategy is None else (strategy,)
        self._floors: dict[str, float] | None = None if use_floors else {}
        self.direct_floor = direct_floor
        self.built = False

    def floors(self) -> dict[str, float]:
        """The strategies' floors (computed once; none with ``use_floors=False``, for tasks too
        large for their per-slice walk)."""
        if self._floors is None:
            self._floors = strategy_floors(self.task, self.topology, self.lbd)
        return self._floors

    def settled(self) -> bool:
        """Whether the fixed plans are in the pool, or none could beat its best."""
        floors = self.floors()
        return self.built or all(s in floors and self.pool.beats(floors[s])
                                 for s in self.strategies)

    def __call__(self) -> list[Candidate]:
        out: list[Candidate] = []
        memo: list = []  # order_plan's: strategies with the same network jobs plan once
        strategies = self.strategies
        if len(strategies) > 1 and one_remote_receiver(self.task):
            strategies = strategies[:1]
        balances = FIXED_BALANCES
        if all(len(h) == 1 for h in self.task.decomposition.holders_of_tile):
            balances = tuple(b for b in balances if b != "size")  # "none"'s plan: one holder
        for k, s in enumerate(strategies):
            if self.pool.times and s in self.floors() and self.pool.beats(self.floors()[s]):
                continue  # no fixed plan of s can be faster than the best so far
            for b in balances:
                j = FIXED_BALANCES.index(b)
                if self._ruled_out_unbuilt(s, b, len(strategies) < len(self.strategies)):
                    continue
                p = _fixed(self.task, self.topology, s, b, memo)
                plans = [((3, k, j), p)]
                if s == "allgather" and b != "order":  # also its parts, then re-joins, in rounds
                    plans.append(((3, k, j, 1), Plan(self.task, phase_rounds(p.ops), s, b,
                                                     self.topology, p.fallbacks)))
                for position, q in plans:
                    if not self.pool.beats(time_floor(q, self.topology)):  # else not faster
                        out.append((position, s, b, q.ops, q.fallbacks))
        self.built = True
        return out


    def _ruled_out_unbuilt(self, strategy: str, balance: str, one_for_all: bool) -> bool:
        """With ``direct_floor``: whether the fixed plan is ruled out by its
        :func:`meshcast.time_floor` computed without building it: the ``"none"`` plan of
        ``strategy`` (the same operations as ``send_recv``'s when it is ``send_recv`` or stands
        for all strategies: :func:`~meshcast.planning.floors.first_holder_floor`), or an
        ``"order"`` plan whose jobs are sends (:func:`~meshcast.planning.order.order_floor`)."""
        if not (self.direct_floor and self.pool.times):
            return False
        if balance == "order":
            floor = order_floor(self.task, self.topology, strategy)
            return floor is not None and self.pool.beats(floor)
        if balance == "none" and (strategy == "send_recv" or one_for_all):
            return self.pool.beats(first_holder_floor(self.task, self.topology))
        return False


class _Pool:
    """The candidates simulated so far and their times (each distinct op list simulated once);
    the best is the fastest, ties to the earliest position. A candidate's simulation stops once
    it is slower than the best so far: its time is then only a lower bound above that best
    (``bounded``; :meth:`fastest` makes such times exact where they could decide)."""

    def __init__(self, task: ReshardTask, topology: Topology) -> None:
        self.task, self.topology = task, topology
        self.candidates: list[Candidate] = []
        self.times: list[float] = []
        self.bounded: set[int] = set()
        self._seen: dict[tuple, list[tuple[tuple[Op, ...], float, bool]]] = {}

    def add(self, candidates: list[Candidate], time_s: float | None = None) -> None:
        """Simulate and keep ``candidates`` (``time_s``: the known simulated time of the one
        candidate given)."""
        for c in candidates:
            ops = c[3]
            same = self._seen.setdefault(_fingerprint(ops), [])
            t, bounded = next(((t, b) for other, t, b in same if other == ops), (time_s, False))
            if t is None:
                best = self.best_time()
                t = simulated_time(self.plan(-1, c), self.topology, until=best)
                bounded = t > best
            same.append((ops, t, bounded))
            if bounded:
                self.bounded.add(len(self.candidates))
            self.candidates.append(c)
            self.times.append(t)

    def fastest(self, among: list[int]) -> int:
        """The fastest of candidates ``among`` (the earliest position of equals), their times
        made exact where they were lower bounds and could decide it."""
        while True:
            i = min(among, key=self.rank)
            if i not in self.bounded:
                return i
            self.times[i] = simulated_time(self.plan(i), self.topology)
            self.bounded.discard(i)

    def rank(self, i: int) -> tuple[float, tuple]:
        """Sort key of candidate ``i``: its time, then its position."""
        return self.times[i], self.candidates[i][0]

    def best(self) -> int:
        """Index of the fastest candidate (the earliest position of equals)."""
        return min(range(len(self.times)), key=self.rank)

    def best_time(self) -> float:
        """The fastest candidate's time (infinite with none)."""
        return min(self.times, default=math.inf)

    def beats(self, floor: float) -> bool:
        """Whether the best so far is no slower than ``floor`` (up to a relative
        :data:`~meshcast.planning.budgets.FLOOR_TOL` for float rounding), so no plan above that
        floor can be faster by more than that."""
        return bool(self.times) and self.best_time() <= floor * (1 + FLOOR_TOL)

    def plan(self, i: int, candidate: Candidate | None = None) -> Plan:
        """Candidate ``i`` (or ``candidate``, not kept yet) as an ``"auto"`` plan."""
        _, label, _, ops, fallbacks = candidate or self.candidates[i]
        return Plan(self.task, ops, label, "auto", self.topology, fallbacks)


def _large_candidates(task: ReshardTask, topology: Topology) -> list[Candidate]:
    """The vectorised plans of :func:`~meshcast.planning.large.large_plan` (rank-disjoint
    rounds; phased on shared NICs)."""
    rounds_plan, _, phased_plan = large_plan(task, topology)
    return [((2, j), "broadcast", "own", p.ops, ())
            for j, p in enumerate((rounds_plan, phased_plan)) if p is not None]


def _op_key(op: Op) -> tuple:
    """A hashable form of an operation (slices are not hashable before Python 3.12)."""
    return op.kind, op.ranks(), tuple((b.start, b.stop) for b in op.box)


def _fingerprint(ops: tuple[Op, ...]) -> tuple:
    """A cheap hashable digest of an op list (its length and end operations): equal lists have
    equal fingerprints; lists with equal fingerprints are compared whole."""
    return (len(ops), _op_key(ops[0]), _op_key(ops[-1])) if ops else (0,)


def _checked_large_plan(task: ReshardTask, topology: Topology, strategy: str | None) -> Plan:
    """Above :data:`AUTO_SIM_LIMIT` slices: the vectorised plan (or its phased order, if that
    simulates faster; only the one the cost model predicts faster where it predicts a clear
    gap), kept if it meets the lower bound; otherwise the fastest of it and the fixed
    combinations (ties: the vectorised plan), built as the fixed stage of the smaller tasks
    builds them (a fixed plan simulated only when its :func:`meshcast.time_floor` is below the
    best so far; one strategy for all when every slice has one receiver to reach; the floors
    of the ``"none"`` plan and of ``"order"`` plans of sends computed without building them),
    without the strategy floors (a walk over every slice)."""
    large, exact, phased = large_plan(task, topology, prune=True)
    pool = _Pool(task, topology)
    if large is not None:
        pool.add([((2, 0), "broadcast", "own", large.ops, ())], exact)
    if phased is not None:
        pool.add([((2, 1), "broadcast", "own", phased.ops, ())])
    lbd = lower_bound_details(task, topology)
    if pool.best_time() > lbd.unmargined_s * (1 + CERTIFY_TOL):  # else no plan is faster
        pool.add(_FixedStage(task, topology, lbd, strategy, pool, use_floors=False,
                             direct_floor=True)())
    return pool.plan(pool.best())


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused inside the block (as it was, after): the large
    path allocates hundreds of thousands of objects without cycles (operations, boxes, the
    simulator's rows), and the collector's repeated passes over them took about 30 % of its
    time (the 64x8 task with shared NICs: 5.4 s, 3.9 s paused). Reference counting still frees
    everything; cycles made meanwhile wait for the next collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def one_remote_receiver(task: ReshardTask) -> bool:
    """Whether every unit slice has at most one receiver that does not hold it (then the three
    strategies build the same operations for each fixed balance)."""
    dec = task.decomposition
    if set(task.src.mesh.devices).isdisjoint(task.dst.mesh.devices):  # no receiver holds any
        return all(len(dec.receivers_of_tile[t]) <= 1 for t in np.unique(dec.dst_tile).tolist())
    holders = [set(h) for h in dec.holders_of_tile]
    n_dst = len(dec.receivers_of_tile)
    pairs = np.unique(dec.src_tile * n_dst + dec.dst_tile)
    return all(
        sum(r not in holders[s] for r in dec.receivers_of_tile[t]) <= 1
        for s, t in zip((pairs // n_dst).tolist(), (pairs % n_dst).tolist())
    )
