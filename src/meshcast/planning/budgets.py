"""The seeds and budgets of the balance methods that search (``"order"`` and ``"auto"``).

Every search is bounded by a count (of jobs, nodes, moves, items), never by the wall clock, and
every random choice is seeded, so every rank computes the same plan. Each number says where it
comes from; the counts were set once for the planner benchmark suite (docs/scheduling.md: "no
task-specific tuning") and changing any of them changes plans.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numpy.random import PCG64, Generator, SeedSequence  # at import: numpy loads it lazily
from numpy.random.bit_generator import ISeedSequence

__all__ = [
    "AUTO_GOOD_ENOUGH",
    "AUTO_SEARCH_BUDGET",
    "AUTO_SEARCH_GAP",
    "AUTO_SEARCH_STEPS",
    "AUTO_SIM_LIMIT",
    "AUTO_TRIALS",
    "AUTO_TRIAL_BUDGET",
    "CERTIFY_TOL",
    "FLOOR_TOL",
    "NEAR_BOUND",
    "ORDER_NODE_BUDGET",
    "ORDER_TRIALS",
    "SEARCH_MAX_JOBS",
    "SEARCH_NODE_BUDGET",
    "SEED",
    "seeded_rng",
]

SEED = 20230501
"""Seed of every random choice (the same plan everywhere). Any fixed value would do (it reads
as a date); changing it changes the plans of ``"order"`` and ``"auto"``."""
ORDER_TRIALS = 100
"""Greedy-round trials of ``"order"``: the paper's 100 (PAPER.md section 3)."""
ORDER_NODE_BUDGET = 60_000
"""Job examinations the greedy rounds of ``"order"`` may spend over all trials. Set once for
the planner suite (bounds the time of ``"order"`` on its largest tasks); not derived."""
SEARCH_NODE_BUDGET = 2_000
"""Nodes of the depth-first branch-and-bound search of ``"order"``. Measured on 2,224 searches
(1,000 random tasks of seeds 1 and 2 on both presets, x 3 strategies): 2,124 end at the root,
84 spend 20,000 nodes (the budget until 2026-12-05, about 40 ms each), and the 16 that improve
on the best trial (a few instances, under several strategies) find their order by node 86
(16.7 % shorter), 993 (3e-6) or 6,731 (0.07 %); the planner suite's one improvement came at
node 6,731 (2e-5). A tenth of the old budget keeps the large gains at a tenth of the cost. Not
derived."""
SEARCH_MAX_JOBS = 12
"""The search runs when an instance has at most this many network transfers: small enough
that the bounded search explores a useful share of the orders. Set once; not derived."""
AUTO_SIM_LIMIT = 4_096
"""Above this many unit slices ``"auto"`` builds one vectorised plan instead of its candidates,
and checks it against the fixed combinations only where it cannot certify it optimal; below it
but above this many transfers, ``"auto"`` builds one variant of its own plan and no trials.
The planner suite's tasks have at most 512 slices; at 16,384 slices (a 16x8 -> 16x8
all-to-all) the candidates took 16 s and kept the vectorised plan anyway (docs/scheduling.md,
"Planner speed"), so the limit came down from 20,000. Not derived."""
FLOOR_TOL = 1e-9
"""Relative float margin under which a fixed plan's quick time floor is trusted to rule it out:
the lower bound's own float margin (:data:`meshcast.estimate.lower_bound.FLOAT_MARGIN`)."""
CERTIFY_TOL = 1e-9
"""Above :data:`AUTO_SIM_LIMIT`, the one plan built is kept without simulating others when its
exact time is within this relative margin of the lower bound (before the bound's own 1e-9 float
margin): then no plan, fixed or not, is faster by more than about 2e-9 relative."""
NEAR_BOUND = 1e-4
"""``"auto"`` stops building candidates, also between two of its own variants, once the best is
within this relative margin of the lower bound and no fixed plan can be faster: no plan is
faster by more than this. The paper cases' best plans on ``p3.8xlarge`` hosts are one start-up
(30 us in 0.86 s, 3.5e-5) above the bound, which they cannot certify, and were found among the
first of 21 variants; all 21 were built. Changed no plan of the planner suite (both presets) or
the paper cases; not derived."""
AUTO_GOOD_ENOUGH = 0.01
"""``"auto"`` stops building candidates once the best is within this relative margin of the lower
bound and no fixed plan can be faster (docs/scheduling.md, "Stages"): the rest could gain at
most this much. Set once on the planner suite: 0.001, 0.01, 0.02 and 0.05 gave geometric means
1.0389, 1.0391, 1.0393 and 1.0404 (worst 1.415 each) and 81, 85, 87 and 88 of its 182 tasks of
at most 64 unit slices planned in under 5 ms; not derived."""
AUTO_SEARCH_GAP = 1.2
"""``"auto"`` improves its best plan by local search when it simulates above this many times the
lower bound (docs/scheduling.md, step 9); below it, ``"auto"`` also tries its first own variant
staggered at once (docs/scheduling.md, "Stages"). Set once; not derived."""
AUTO_SEARCH_STEPS = 200
"""Moves the local search tries at most. Set once with :data:`AUTO_SEARCH_BUDGET`."""
AUTO_SEARCH_BUDGET = 60_000
"""Operations all the local search's simulations may run together (steps x plan length). Set
once, equal to :data:`ORDER_NODE_BUDGET`; not derived."""
AUTO_TRIALS = 16
"""Seeded dispatch trials (perturbed priorities; non-delay, every fourth fair-share) per sender
choice of ``"auto"``. Set once (docs/scheduling.md, step 6); not derived."""
AUTO_TRIAL_BUDGET = 30_000
"""Items all those trials may schedule together (so each trial's simulation stays bounded). Set
once; not derived."""


def seeded_rng(*key: int) -> Generator:
    """``numpy.random.default_rng(list(key))``: the same stream, with the seed sequence (the
    slow part: it hashes the key) and the state it generates made once per key; searches draw
    a new generator per trial with the same keys on every call (about 2 us each instead of 7).
    ``numpy.random`` is imported with this module (numpy loads it lazily: about 14 ms on the
    first plan of a process that needs it)."""
    return Generator(PCG64(_seed_sequence(key)))


class _KeptState(ISeedSequence):
    """A :class:`~numpy.random.SeedSequence` whose generated states are kept (the same words)."""

    def __init__(self, seq: SeedSequence) -> None:
        self._seq = seq
        self._kept: dict[tuple[int, str], np.ndarray] = {}

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        key = (n_words, np.dtype(dtype).str)
        if key not in self._kept:
            self._kept[key] = self._seq.generate_state(n_words, dtype)
        return self._kept[key].copy()


@functools.lru_cache(maxsize=1024)
def _seed_sequence(key: tuple[int, ...]) -> _KeptState:
    return _KeptState(SeedSequence(list(key)))
