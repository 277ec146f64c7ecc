"""The candidates ``"auto"`` (:mod:`meshcast.planning.auto`) has simulated so far: each distinct
operation list simulated once, the fastest kept, ties to the earliest position. Pure.
"""

from __future__ import annotations

import math

from ..core.ops import Op
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..estimate.simulate import simulated_time
from .budgets import FLOOR_TOL
from .own import Candidate

__all__ = ["CandidatePool"]


class CandidatePool:
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



def _op_key(op: Op) -> tuple:
    """A hashable form of an operation (slices are not hashable before Python 3.12)."""
    return op.kind, op.ranks(), tuple((b.start, b.stop) for b in op.box)


def _fingerprint(ops: tuple[Op, ...]) -> tuple:
    """A cheap hashable digest of an op list (its length and end operations): equal lists have
    equal fingerprints; lists with equal fingerprints are compared whole."""
    return (len(ops), _op_key(ops[0]), _op_key(ops[-1])) if ops else (0,)


