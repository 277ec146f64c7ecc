"""The fixed strategy x balance combinations as a stage of ``"auto"``
(:mod:`meshcast.planning.auto`): ``"auto"`` is never slower than any of them, so it builds those
that could be faster than its best so far, and rules the others out by their floors. Pure.
"""

from __future__ import annotations

import numpy as np

from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..estimate.lower_bound import LowerBound
from ..estimate.simulate import time_floor
from .dispatch import phase_rounds
from .fixed import STRATEGIES, fixed_plan
from .floors import first_holder_floor, strategy_floors
from .order import order_floor, order_plan
from .own import Candidate
from .pool import CandidatePool

__all__ = ["FIXED_BALANCES", "FixedStage", "one_remote_receiver"]

FIXED_BALANCES = ("none", "size", "order")
"""The balances of the fixed combinations ``"auto"`` compares itself with."""


def _fixed(task: ReshardTask, topology: Topology, strategy: str, balance: str,
           memo: list) -> Plan:
    if balance == "order":
        return order_plan(task, topology, strategy, memo=memo)
    return fixed_plan(task, topology, strategy, balance)


class FixedStage:
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
                 strategy: str | None, pool: CandidatePool, *, use_floors: bool = True,
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
