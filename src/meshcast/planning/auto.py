"""``balance="auto"``: our method. Candidates are simulated and the fastest kept.

Candidates: the plans of our own method (:mod:`.items`: senders from the outbound LP of the
lower bound, optional striping and chunking, per-slice broadcast or point-to-point) in every
order of :data:`~meshcast.planning.dispatch.ORDERS` plus seeded dispatch trials (on classes
of slices with equal holders and receivers, :mod:`.classes`), the vectorised plans of
:mod:`.large`, every fixed strategy x balance plan (so ``"auto"`` is never slower than any of
them, up to float rounding), and the fastest rewritten (tiles gathered, :mod:`.gathered`;
sends cut into sender-balanced pieces, :mod:`.balanced`; starts staggered, :mod:`.stagger`,
also the fastest of our own variants); then a seeded local
search over the order and the senders when the best is far above the lower bound. They are
built in stages, and planning stops when the rest cannot matter: the best meets the lower
bound, or is close to it and no fixed plan can be faster (:mod:`.floors`,
:mod:`.fixed_stage`). Above :data:`~meshcast.planning.budgets.AUTO_SIM_LIMIT` unit slices one
vectorised plan is built; it is kept when its exact time meets the lower bound, and otherwise
compared with the fixed combinations, skipping each one whose quick time floor shows it cannot
be faster. Pure: seeded, bounded by counts. See ``docs/scheduling.md``.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from ..core.ops import AllGather
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..estimate.lower_bound import LowerBound, lower_bound_details
from ..estimate.simulate import simulated_time, time_floor
from .balanced import balanced
from .budgets import (
    AUTO_GOOD_ENOUGH,
    AUTO_SEARCH_GAP,
    AUTO_SIM_LIMIT,
    CERTIFY_TOL,
    NEAR_BOUND,
)
from .dispatch import dispatched, phase_rounds
from .fixed_stage import FixedStage
from .gathered import Group, gathered, tile_groups
from .large import large_plan
from .local_search import local_search, search_in_passes
from .own import OWN_VARIANTS, Candidate, OwnMethod
from .pool import CandidatePool
from .stagger import STAGGERS, staggered

__all__ = ["OWN_VARIANTS", "auto_plan", "collector_paused"]


def auto_plan(
    task: ReshardTask, topology: Topology, strategy: str | None, *, sim_limit: int = AUTO_SIM_LIMIT
) -> Plan:
    """Our method (module doc) on a resolved ``topology``. ``strategy=None``: choose per slice
    among the strategies; a given strategy restricts the candidates to it. ``sim_limit``
    (default :data:`~meshcast.planning.budgets.AUTO_SIM_LIMIT`): above this many unit slices
    (or transfers, for the own method's variants) build one plan instead of simulating all.

    Work stops as soon as the rest cannot matter. The candidates come in stages: the vectorised
    plans, our own variants (after the first, the fastest so far staggered where that meets the
    bound), the fastest so far staggered, the seeded trials; the fixed combinations once the
    best is within :data:`~meshcast.planning.budgets.AUTO_GOOD_ENOUGH` of the bound (else last).
    A stage's candidates keep their place in the tie order whenever they are built. Planning
    stops when the best meets the lower bound (within
    :data:`~meshcast.planning.budgets.CERTIFY_TOL`: no plan is faster), or is within
    ``AUTO_GOOD_ENOUGH`` of it (after the last own variant; ``NEAR_BOUND`` after any stage)
    and no fixed plan can be faster (built and simulated, or ruled out by its strategy's floor,
    :func:`~meshcast.planning.floors.strategy_floors`). A strategy's fixed plans are built only
    when its floor is below the best time so far.
    """
    if strategy in (None, "broadcast") and len(task.decomposition) > sim_limit:
        with collector_paused():
            return _checked_large_plan(task, topology, strategy)
    lbd = lower_bound_details(task, topology)
    pool = CandidatePool(task, topology)
    fixed = FixedStage(task, topology, lbd, strategy, pool)
    own = None
    if strategy in (None, "broadcast"):
        own = OwnMethod(task, topology, lbd, strategy, sim_limit)
        good = lbd.unmargined_s * (1 + AUTO_GOOD_ENOUGH)
        near = lbd.unmargined_s * (1 + NEAR_BOUND)
        # (stage, whether "close enough" may end the work after it): the own variants one at a
        # time, so that one at the lower bound ends the work, but close enough only after all;
        # after the first, the fastest so far staggered where that meets the bound at once
        variants = own.variant_stages()
        stages = [(v, k == len(variants) - 1) for k, v in enumerate(variants)]
        stages.insert(1, (lambda: _staggered_at_bound(pool, fixed, lbd), False))
        # then, unless close enough already, the fastest so far with its starts staggered
        stages.append((lambda: [] if pool.best_time() <= good else
                       _staggered(pool, pool.best(), 6), True))
        stages += [(t, True) for t in own.trial_stages()]
        pool.add(_large_candidates(task, topology))
        checkpoint = True
        while True:
            if pool.best_time() <= lbd.unmargined_s * (1 + CERTIFY_TOL):
                return pool.plan(pool.best())  # at the lower bound: no plan is faster
            if pool.best_time() <= near and fixed.settled():
                return pool.plan(pool.best())  # no plan is faster by more than NEAR_BOUND
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


def _finished(pool: CandidatePool, own: OwnMethod | None, lbd: LowerBound) -> Plan:
    """The plan when the stages did not stop the work: above ``AUTO_GOOD_ENOUGH`` over the
    bound, the fastest candidate without all-gathers with its tiles gathered, then the fastest
    of all with its sends in sender-balanced pieces, then the fastest of all with its starts
    staggered, as candidates; then, above ``AUTO_SEARCH_GAP``, the local
    search; the fastest of all."""
    best = pool.best()
    if pool.times[best] > lbd.unmargined_s * (1 + AUTO_GOOD_ENOUGH):
        groups = tile_groups(pool.task, pool.topology)
        free = _without_allgathers(pool)
        if groups and free:
            pool.add(_gathered(pool, pool.fastest(free), groups))
        pool.add(_balanced(pool, pool.best()))
        pool.add(_staggered(pool, pool.best()))
        best = pool.best()
    if pool.times[best] > AUTO_SEARCH_GAP * lbd.unmargined_s:
        searched = _searched(pool, own)
        if searched is not None and searched[1] < pool.times[best]:
            return searched[0]
    return pool.plan(best)


def _staggered_at_bound(pool: CandidatePool, fixed: FixedStage, lbd: LowerBound
                        ) -> list[Candidate]:
    """The fastest so far with its starts staggered (:func:`_staggered`), put in the pool with
    its simulated time where that meets the lower bound, or comes within ``NEAR_BOUND`` of it
    with no fixed plan faster (``auto`` then keeps it at once); nothing otherwise, and nothing
    tried where the fastest is more than ``AUTO_SEARCH_GAP`` above the bound (more than
    start-ups that collide holds it back). Returns no candidates to simulate again."""
    bound = lbd.unmargined_s
    near = bound * (1 + NEAR_BOUND)
    if pool.best_time() > AUTO_SEARCH_GAP * bound:
        return []
    for c in _staggered(pool, pool.best(), 6):
        plan = pool.plan(-1, c)
        if time_floor(plan, pool.topology) > near:
            continue  # cannot come within near of the bound
        t = simulated_time(plan, pool.topology, until=near)
        if t <= bound * (1 + CERTIFY_TOL) or (t <= near and fixed.settled()):
            pool.add([c], t)  # t is exact: the simulation stops early only above near
            break
    return []


def _without_allgathers(pool: CandidatePool) -> list[int]:
    """The candidates without an ``AllGather`` (any order of their copies, sends and broadcasts
    moves the same data; an all-gather must follow its parts)."""
    return [i for i, c in enumerate(pool.candidates)
            if not any(isinstance(op, AllGather) for op in c[3])]


def _gathered(pool: CandidatePool, i: int, groups: list[Group]) -> list[Candidate]:
    """Candidate ``i`` (no all-gathers) with the tile groups ``groups`` gathered (a part per
    receiver, then cells replicated: :func:`~meshcast.planning.gathered.gathered`), each in its
    order, in phase rounds and dispatched again (:mod:`~meshcast.planning.dispatch`), at
    positions ``(4, j)``: they win only where strictly faster."""
    _, label, _, ops, fallbacks = pool.candidates[i]
    cuts = [c for c in (gathered(ops, groups, replicate=r) for r in (False, True)) if c]
    orders = [o for c in cuts
              for o in (c, phase_rounds(c), dispatched(c, pool.topology, pool.task.itemsize))]
    return [((4, j), label, "gathered", o, fallbacks) for j, o in enumerate(orders)]


def _balanced(pool: CandidatePool, best: int) -> list[Candidate]:
    """Candidate ``best`` with its sends cut into sender-balanced pieces
    (:func:`~meshcast.planning.balanced.balanced`), in its order and dispatched again
    (:func:`~meshcast.planning.dispatch.dispatched`: the pieces move the NICs' turns), at
    positions ``(7, j)``: they win only where strictly faster."""
    _, label, _, ops, fallbacks = pool.candidates[best]
    cut = balanced(ops, pool.task, pool.topology)
    if cut is None:
        return []
    orders = (cut, dispatched(cut, pool.topology, pool.task.itemsize))
    return [((7, j), label, "balanced", o, fallbacks) for j, o in enumerate(orders)]


def _staggered(pool: CandidatePool, best: int, first: int = 5) -> list[Candidate]:
    """Candidate ``best`` with the ranks of each NIC staggered, in each way of
    :data:`~meshcast.planning.stagger.STAGGERS` that cuts something, at positions
    ``(first, k)`` (5: the fastest of all, at the end; 6: the fastest after our own variants):
    they win only where strictly faster."""
    _, label, _, ops, fallbacks = pool.candidates[best]
    out: list[Candidate] = []
    for k, (side, groups) in enumerate(STAGGERS):
        cut = staggered(ops, pool.topology, side, groups)
        if cut is not None:
            out.append(((first, k), label, "stagger", cut, fallbacks))
    return out


def _searched(pool: CandidatePool, own: OwnMethod | None) -> tuple[Plan, float] | None:
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


def _large_candidates(task: ReshardTask, topology: Topology) -> list[Candidate]:
    """The vectorised plans of :func:`~meshcast.planning.large.large_plan` (rank-disjoint
    rounds; phased on shared NICs)."""
    rounds_plan, _, phased_plan = large_plan(task, topology)
    return [((2, j), "broadcast", "own", p.ops, ())
            for j, p in enumerate((rounds_plan, phased_plan)) if p is not None]


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
    pool = CandidatePool(task, topology)
    if large is not None:
        pool.add([((2, 0), "broadcast", "own", large.ops, ())], exact)
    if phased is not None:
        pool.add([((2, 1), "broadcast", "own", phased.ops, ())])
    lbd = lower_bound_details(task, topology)
    if pool.best_time() > lbd.unmargined_s * (1 + CERTIFY_TOL):  # else no plan is faster
        pool.add(FixedStage(task, topology, lbd, strategy, pool, use_floors=False,
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

