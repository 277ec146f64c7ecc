"""Balance methods that choose senders *and* order: ``"order"`` (the paper's,
:mod:`meshcast.planning.order`) and ``"auto"`` (ours, :mod:`meshcast.planning.auto`).

Both are pure functions of the task and the topology: randomness is seeded and every search is
bounded by a count (:mod:`meshcast.planning.budgets`), never by the wall clock, so every rank
computes the same plan. This module hands their public names on from one place; the pieces of
``"auto"`` are :mod:`.items` (senders and collectives), :mod:`.dispatch` (orders), :mod:`.large`
(the vectorised plan of large tasks), :mod:`.floors` (what no fixed strategy can beat). See
``docs/scheduling.md``.
"""

from __future__ import annotations

from .auto import auto_plan
from .budgets import (
    AUTO_GOOD_ENOUGH,
    AUTO_SEARCH_BUDGET,
    AUTO_SEARCH_GAP,
    AUTO_SEARCH_STEPS,
    AUTO_SIM_LIMIT,
    AUTO_TRIAL_BUDGET,
    AUTO_TRIALS,
    CERTIFY_TOL,
    FLOOR_TOL,
    ORDER_NODE_BUDGET,
    ORDER_TRIALS,
    SEARCH_MAX_JOBS,
    SEARCH_NODE_BUDGET,
    SEED,
)
from .order import order_plan

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
    "ORDER_NODE_BUDGET",
    "ORDER_TRIALS",
    "SEARCH_MAX_JOBS",
    "SEARCH_NODE_BUDGET",
    "SEED",
    "auto_plan",
    "order_plan",
]
