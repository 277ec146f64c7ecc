"""``balance="auto"``: our method. Every candidate is simulated and the fastest kept.

Candidates: the plans of our own method (:mod:`.items`: senders from the outbound LP of the
lower bound, optional striping and chunking, per-slice broadcast or point-to-point) in every
order of :data:`~meshcast.planning.dispatch.ORDERS` plus seeded non-delay trials, the
vectorised plans of :mod:`.large`, and every fixed strategy x balance plan (so ``"auto"`` is
never slower than any of them); the fastest is then improved by a seeded local search over the
order when it is far above the lower bound. Above
:data:`~meshcast.planning.budgets.AUTO_SIM_LIMIT` unit slices one vectorised plan is built; it
is kept when its exact time meets the lower bound, and otherwise compared with the fixed
combinations, skipping each one whose quick time floor shows it cannot be faster. Pure: seeded,
bounded by counts. See ``docs/scheduling.md``.
"""

from __future__ import annotations

import numpy as np

from ..core.ops import AllGather, Op
from ..core.plan import Plan
from ..core.task import ReshardTask, iter_slices
from ..core.topology import Topology
from ..estimate.lower_bound import LowerBound, lower_bound_details
from ..estimate.simulate import simulate, time_floor
from .budgets import (
    AUTO_SEARCH_BUDGET,
    AUTO_SEARCH_GAP,
    AUTO_SEARCH_STEPS,
    AUTO_SIM_LIMIT,
    AUTO_TRIAL_BUDGET,
    AUTO_TRIALS,
    CERTIFY_TOL,
    FLOOR_TOL,
    SEED,
)
from .dispatch import dispatch, order_items
from .fixed import STRATEGIES, fixed_plan
from .items import Item, own_items
from .large import large_plan
from .order import order_plan

__all__ = ["FIXED_BALANCES", "OWN_VARIANTS", "auto_plan", "local_search", "one_remote_receiver"]

FIXED_BALANCES = ("none", "size", "order")
"""The balances of the fixed combinations ``"auto"`` compares itself with."""

OWN_VARIANTS: tuple[tuple[bool, bool, str], ...] = tuple(
    (stripe, chunk, order)
    for order in ("rank_rounds", "busiest_nic_first", "longest_first", "earliest_start",
                  "nondelay", "rank_nic_rounds")
    for stripe, chunk in ((True, False), (True, True), (False, False))
)
"""(stripe, chunk, order) of the plans of our own method that ``"auto"`` tries, in this order
(the order of the candidates decides ties)."""

Candidate = tuple[str, str, tuple[Op, ...], tuple]
"""(strategy label, where it comes from, operations, fallbacks)."""


def _fixed(task: ReshardTask, topology: Topology, strategy: str, balance: str) -> Plan:
    if balance == "order":
        return order_plan(task, topology, strategy)
    return fixed_plan(task, topology, strategy, balance)


def auto_plan(
    task: ReshardTask, topology: Topology, strategy: str | None, *, sim_limit: int = AUTO_SIM_LIMIT
) -> Plan:
    """Our method (module doc) on a resolved ``topology``. ``strategy=None``: choose per slice
    among the strategies; a given strategy restricts the candidates to it. ``sim_limit``
    (default :data:`~meshcast.planning.budgets.AUTO_SIM_LIMIT`): above this many unit slices
    (or transfers, for the own method's variants) build one plan instead of simulating all."""
    if strategy in (None, "broadcast") and len(task.decomposition) > sim_limit:
        return _checked_large_plan(task, topology, strategy)
    lbd = lower_bound_details(task, topology)
    candidates: list[Candidate] = []
    if strategy in (None, "broadcast"):
        candidates += _own_candidates(task, topology, lbd, strategy, sim_limit)
    # the nine fixed combinations are always candidates: auto is never slower than any of them
    for s in STRATEGIES if strategy is None else (strategy,):
        for b in FIXED_BALANCES:
            p = _fixed(task, topology, s, b)
            candidates.append((s, b, p.ops, p.fallbacks))
    times = _simulate_all(task, topology, candidates)
    best = min(range(len(candidates)), key=lambda i: (times[i], i))
    if times[best] > AUTO_SEARCH_GAP * lbd.unmargined_s:
        # local search from the fastest candidate without all-gathers (any order of copies,
        # sends and broadcasts moves the same data; an all-gather must follow its parts)
        free = [i for i in range(len(candidates))
                if not any(isinstance(op, AllGather) for op in candidates[i][2])]
        if free:
            start = min(free, key=lambda i: (times[i], i))
            label, _, ops, fallbacks = candidates[start]
            ops, t = local_search(task, topology, ops, label)
            if t < times[best]:
                return Plan(task, ops, label, "auto", topology, fallbacks)
    label, _, ops, fallbacks = candidates[best]
    return Plan(task, ops, label, "auto", topology, fallbacks)


def _own_candidates(
    task: ReshardTask, topology: Topology, lbd: LowerBound, strategy: str | None, sim_limit: int
) -> list[Candidate]:
    """The plans of our own method: every variant of :data:`OWN_VARIANTS` (only the first above
    ``sim_limit`` transfers), seeded non-delay trials, and the vectorised plans of
    :func:`~meshcast.planning.large.large_plan`."""
    slices = list(iter_slices(task))
    transfers = sum(len(s.remote) for s in slices)
    lat = topology.latency_us * 1e-6
    out: list[Candidate] = []
    variants = OWN_VARIANTS if transfers <= sim_limit else OWN_VARIANTS[:1]
    built: dict[tuple[bool, bool], tuple[list[Item], str]] = {}
    for stripe, chunk, order in variants:
        if (stripe, chunk) not in built:
            items, used_p2p = own_items(
                task, topology, slices, lbd, stripe=stripe, chunk=chunk, p2p=strategy is None
            )
            built[(stripe, chunk)] = (items, "auto" if used_p2p else "broadcast")
        items, label = built[(stripe, chunk)]
        out.append((label, "own", tuple(order_items(items, order, lat)), ()))
    if transfers <= sim_limit:
        # seeded non-delay trials with perturbed priorities, within a budget of items
        for c, (items, label) in enumerate(built.values()):
            trials = min(AUTO_TRIALS, AUTO_TRIAL_BUDGET // (len(built) * max(len(items), 1)))
            for k in range(trials):
                rng = np.random.default_rng([SEED, c, k])
                ops = dispatch(items, lat, queue_on_nic=True, rng=rng)
                out.append((label, "own", tuple(ops), ()))
    # the vectorised plans of larger tasks (rank-disjoint rounds; phased on shared NICs)
    rounds_plan, _, phased_plan = large_plan(task, topology)
    for large in (rounds_plan, phased_plan):
        if large is not None:
            out.append(("broadcast", "own", large.ops, ()))
    return out


def _ops_key(ops: tuple[Op, ...]) -> tuple:
    """A hashable form of an op list (slices are not hashable before Python 3.12)."""
    return tuple(
        (op.kind, op.ranks(), tuple((b.start, b.stop) for b in op.box)) for op in ops
    )


def _checked_large_plan(task: ReshardTask, topology: Topology, strategy: str | None) -> Plan:
    """Above :data:`AUTO_SIM_LIMIT` slices: the vectorised plan (or its phased order, if that
    simulates faster), kept if it meets the lower bound; otherwise the fastest of it and the
    fixed combinations (ties: the vectorised plan).

    A fixed plan is simulated only when its :func:`meshcast.time_floor` is below the
    best time so far and its operations differ from every plan simulated before; when every
    slice has at most one receiver to reach, the three strategies build the same operations
    (one ``Send`` per transfer, the same senders, the same order), so one strategy stands for all.
    """
    large, exact, phased = large_plan(task, topology)
    best, best_t = large, exact if exact is not None else simulate(large, topology).time_s
    if phased is not None:
        t = simulate(phased, topology).time_s
        if t < best_t:
            best, best_t = phased, t
    if best_t <= lower_bound_details(task, topology).unmargined_s * (1 + CERTIFY_TOL):
        return best  # within CERTIFY_TOL of the bound: no plan is faster
    seen = {_ops_key(p.ops) for p in (large, phased) if p is not None}
    strategies = STRATEGIES if strategy is None else (strategy,)
    if len(strategies) > 1 and one_remote_receiver(task):
        strategies = strategies[:1]
    for s in strategies:
        for b in FIXED_BALANCES:
            p = _fixed(task, topology, s, b)
            key = _ops_key(p.ops)
            if key in seen or time_floor(p, topology) * (1 - FLOOR_TOL) >= best_t:
                continue
            seen.add(key)
            t = simulate(p, topology).time_s
            if t < best_t:
                best, best_t = Plan(task, p.ops, s, "auto", topology, p.fallbacks), t
    return best


def one_remote_receiver(task: ReshardTask) -> bool:
    """Whether every unit slice has at most one receiver that does not hold it (then the three
    strategies build the same operations for each fixed balance)."""
    dec = task.decomposition
    holders = [set(h) for h in dec.holders_of_tile]
    n_dst = len(dec.receivers_of_tile)
    pairs = np.unique(dec.src_tile * n_dst + dec.dst_tile)
    return all(
        sum(r not in holders[s] for r in dec.receivers_of_tile[t]) <= 1
        for s, t in zip((pairs // n_dst).tolist(), (pairs % n_dst).tolist())
    )


def local_search(
    task: ReshardTask, topology: Topology, ops: tuple[Op, ...], label: str
) -> tuple[tuple[Op, ...], float]:
    """Improve the order of ``ops`` (copies, sends, broadcasts) by moving one operation earlier
    at a time, keeping a move when the simulated time drops.

    A move takes an operation that ends late in the current simulation (the k-th latest with k
    drawn from an exponential of mean n/8) and puts it before a uniformly drawn earlier one.
    Seeded; at most :data:`AUTO_SEARCH_STEPS` moves and :data:`AUTO_SEARCH_BUDGET` simulated
    operations in all. Returns the best order and its simulated time.
    """
    n = len(ops)
    cur = list(ops)
    rep = simulate(Plan(task, ops, label, "auto", topology), topology)
    if n < 2:
        return ops, rep.time_s
    rng = np.random.default_rng([SEED, 7])
    for _ in range(min(AUTO_SEARCH_STEPS, AUTO_SEARCH_BUDGET // n)):
        late = np.argsort(rep.end_s, kind="stable")
        j = int(late[n - 1 - min(int(rng.exponential(n / 8)), n - 1)])
        if j == 0:
            continue
        i = int(rng.integers(0, j))
        cand = [*cur[:i], cur[j], *cur[i:j], *cur[j + 1 :]]
        new = simulate(Plan(task, tuple(cand), label, "auto", topology), topology)
        if new.time_s < rep.time_s:
            cur, rep = cand, new
    return tuple(cur), rep.time_s


def _simulate_all(
    task: ReshardTask, topology: Topology, candidates: list[tuple[str, str, tuple[Op, ...], tuple]]
) -> list[float]:
    """Simulated time of every candidate (each distinct op list simulated once)."""
    seen: dict[tuple, float] = {}
    out: list[float] = []
    for label, _, ops, fallbacks in candidates:
        key = _ops_key(ops)
        t = seen.get(key)
        if t is None:
            t = simulate(Plan(task, ops, label, "auto", topology, fallbacks), topology).time_s
            seen[key] = t
        out.append(t)
    return out

