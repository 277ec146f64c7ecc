"""The plans of ``"auto"``'s own method (:mod:`meshcast.planning.auto`), in stages: the
variants of :data:`OWN_VARIANTS` (senders from :mod:`.items`, an order from :mod:`.dispatch`),
then seeded dispatch trials, on classes of slices with equal holders and receivers
(:mod:`.classes`). Pure: seeded, bounded by counts.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.ops import Op
from ..core.task import ReshardTask, iter_slices
from ..core.topology import Topology
from ..estimate.lower_bound import LowerBound
from .budgets import AUTO_TRIAL_BUDGET, AUTO_TRIALS, SEED, seeded_rng
from .classes import SliceClasses
from .dispatch import busiest_resource_work, dispatch, order_items
from .fair_share import fair_share_dispatch
from .items import Item, OwnItems, own_items

__all__ = ["FAIR_SHARE_EVERY", "OWN_VARIANTS", "TRIALS_PER_STAGE", "Candidate", "OwnMethod"]

OWN_VARIANTS: tuple[tuple[bool, bool, str], ...] = tuple(
    (stripe, chunk, order)
    for order in ("rank_rounds", "busiest_nic_first", "longest_first",
                  "earliest_start", "nondelay", "rank_nic_rounds", "fair_share")
    for stripe, chunk in ((True, False), (True, True), (False, False))
)
"""(stripe, chunk, order) of the plans of our own method that ``"auto"`` tries, in this order
(the order of the candidates decides ties)."""

FAIR_SHARE_EVERY = 4
"""One seeded trial in this many (trials 1, 5, 9, ...) runs the fair-share dispatcher instead of
the non-delay one. Set once on the planner suite (one in two gave the same geometric mean and
worst, in more time); not derived."""

TRIALS_PER_STAGE = 4
"""``"auto"`` checks after every this many seeded trials whether it can stop (the trials of one
item variant come in stages of this size). Set once; not derived."""

Candidate = tuple[tuple, str, str, tuple[Op, ...], tuple]
"""(position, strategy label, where it comes from, operations, fallbacks). Positions order the
candidates for ties: our own variants in :data:`OWN_VARIANTS` order ``(0, k)``, then the seeded
trials ``(1, c, k)``, the vectorised plans ``(2, j)``, the fixed combinations ``(3, s, b)``, then
the best of those without all-gathers with its tiles gathered ``(4,)`` (:mod:`.gathered`), the
best of all with its starts staggered ``(5, k)`` (:mod:`.stagger`) and the best after our own
variants with its starts staggered ``(6, k)``."""


class OwnMethod:
    """The plans of our own method (:mod:`.items`, :mod:`.dispatch`) in stages:
    :meth:`variant_stages`, then the seeded trials of :meth:`trial_stages`."""

    def __init__(self, task: ReshardTask, topology: Topology, lbd: LowerBound,
                 strategy: str | None, sim_limit: int) -> None:
        self.task, self.topology, self.lbd, self.strategy = task, topology, lbd, strategy
        slices = list(iter_slices(task))
        self.within = sum(len(s.remote) for s in slices) <= sim_limit
        self.classes = SliceClasses(slices)
        self.lat = topology.latency_us * 1e-6
        self.built: dict[tuple[bool, bool], tuple[list[Item], str]] = {}
        self.crit: dict[int, list[float]] = {}  # per built variant: the dispatch priorities
        self.switches: dict[tuple[bool, bool], OwnItems] = {}  # the variants own_items built
        # (id of items, order): the ops on classes and expanded
        self.ordered: dict[tuple[int, str], tuple[list[Op], tuple[Op, ...]]] = {}
        self._virtual: dict[tuple, list[Op]] = {}  # candidate position: ops on classes

    def variant_stages(self) -> list[Callable[[], list[Candidate]]]:
        """One stage per variant of :data:`OWN_VARIANTS` (only the first above ``sim_limit``
        transfers), in that order; a variant's items are built by the first that needs them."""
        n = len(OWN_VARIANTS) if self.within else 1
        return [lambda k=k: [self._variant(k)] for k in range(n)]

    def _variant(self, k: int) -> Candidate:
        stripe, chunk, order = OWN_VARIANTS[k]
        if (stripe, chunk) not in self.built:
            self.built[(stripe, chunk)] = self._items(stripe, chunk)
        items, label = self.built[(stripe, chunk)]
        if (id(items), order) not in self.ordered:  # items shared by variants: ordered once
            ops = order_items(items, order, self.lat)
            self.ordered[(id(items), order)] = ops, self.classes.expand(ops)
        return self._candidate((0, k), label, *self.ordered[(id(items), order)])

    def _candidate(self, position: tuple, label: str, ops: list[Op],
                   expanded: tuple[Op, ...]) -> Candidate:
        """The candidate of ``ops`` on classes, ``expanded``; :meth:`virtual_ops` keeps
        ``ops``."""
        self._virtual[position] = ops
        return (position, label, "own", expanded, ())

    def virtual_ops(self, position: tuple) -> list[Op] | None:
        """The operations on classes of the candidate at ``position`` when it is one of ours
        and some class has several slices (else None: its operations are the real ones)."""
        return self._virtual.get(position) if self.classes.merged else None

    def _items(self, stripe: bool, chunk: bool) -> tuple[list[Item], str]:
        """The items of one sender variant and their strategy label: those of a variant built
        already where the switches that differ changed nothing there (striping on but never
        applied; no broadcast large enough to chunk), else built."""
        for (s, c), built in self.switches.items():
            if (s == stripe or (s and not built.striped)) and (c == chunk or not built.chunked):
                break
        else:
            built = own_items(self.task, self.topology, self.classes.virtual, self.lbd,
                              stripe=stripe, chunk=chunk, p2p=self.strategy is None)
            if self.classes.merged:  # an item pays one start-up per box it covers
                built = built._replace(items=[
                    it._replace(dur=it.dur + (self.classes.boxes_in(it.op) - 1) * self.lat)
                    for it in built.items])
            self.switches[(stripe, chunk)] = built
        return built.items, "auto" if built.used_p2p else "broadcast"

    def trial_stages(self) -> list[Callable[[], list[Candidate]]]:
        """Seeded trials with perturbed priorities (non-delay :func:`~.dispatch.dispatch`; trials
        1, 5, 9, ... :func:`~.fair_share.fair_share_dispatch`), within a budget of items (none
        above ``sim_limit`` transfers), in stages of :data:`TRIALS_PER_STAGE`, on the item
        variants that :meth:`variant_stages` built (they run first)."""
        if not self.within:
            return []
        stages = []
        for c in range(3):
            for first in range(0, AUTO_TRIALS, TRIALS_PER_STAGE):
                stages.append(lambda c=c, first=first: self._trials(c, first))
        return stages

    def _trials(self, c: int, first: int) -> list[Candidate]:
        built = list(self.built.values())
        if c >= len(built):
            return []
        items, label = built[c]
        trials = min(AUTO_TRIALS, AUTO_TRIAL_BUDGET // (len(built) * max(len(items), 1)))
        if c not in self.crit:  # the same priorities for every trial of these items
            self.crit[c] = busiest_resource_work(items, self.lat)
        out: list[Candidate] = []
        for k in range(first, min(first + TRIALS_PER_STAGE, trials)):
            rng = seeded_rng(SEED, c, k)
            if k % FAIR_SHARE_EVERY == 1:
                ops = fair_share_dispatch(items, self.lat, rng)
            else:
                ops = dispatch(items, self.lat, queue_on_nic=True, rng=rng, crit=self.crit[c])
            out.append(self._candidate((1, c, k), label, ops, self.classes.expand(ops)))
        return out
