"""From a task to a plan: which sender, which collective, in what order (:func:`plan` picks the
balance method: :mod:`.fixed`, :mod:`.order` or :mod:`.auto`).

Planning is a pure function of its arguments: the same plan on every rank and every machine.
"""

from __future__ import annotations

from ..core.cache import BoundedCache
from ..core.job import topology_for_meshes
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from .auto import auto_plan
from .fixed import STRATEGIES, fixed_plan
from .order import order_plan

__all__ = ["BALANCES", "PLAN_CACHE", "PLAN_CACHE_OPS", "STRATEGIES", "plan", "plan_key"]

BALANCES = ("none", "size", "order", "auto")
"""How senders (and order) are chosen among the holders of a slice: ``"none"`` takes the first
holder (the paper's "Naive"); ``"size"`` the holder on the host that has sent the fewest bytes so
far ("Load balance only"); ``"order"`` chooses senders and order jointly (the paper's "Ours":
seeded greedy rounds plus a bounded search, :mod:`meshcast.planning.order`); ``"auto"`` is our
method (LP senders, striping, per-slice strategy, list scheduling, checked by simulation:
:mod:`meshcast.planning.auto`)."""

PLAN_CACHE_OPS = 1_000_000
"""The plan cache holds plans of at most this many operations together, beside its 256 entries:
a 262,144-operation plan holds about 40 MB, and the objects of cached plans are walked by every
full garbage collection of the process (docs/scheduling.md, "Planner speed")."""
PLAN_CACHE: BoundedCache[tuple[ReshardTask, Topology, str | None, str], Plan] = BoundedCache(
    "planning.plan", 256, "plans of plan() by (task, topology, strategy, balance)",
    weight=lambda p: len(p.ops), max_weight=PLAN_CACHE_OPS,
)
"""The plans :func:`plan` made, by (task, resolved topology, strategy, balance). A plan is
immutable and a pure function of that key, so a hit is the plan the call would make. At most
256 entries (a model's distinct tensor shapes x layouts fit) and :data:`PLAN_CACHE_OPS`
operations, least recently used dropped first; ``meshcast.clear_caches(["planning.plan"])``
empties it."""


def plan_key(
    task: ReshardTask, topology: Topology | None, strategy: str | None, balance: str | None
) -> tuple[ReshardTask, Topology, str | None, str]:
    """``(task, resolved topology, strategy, balance)`` as :func:`plan` resolves its arguments
    (its defaults, checked: ``TypeError`` / ``ValueError`` naming the bad one): the key of
    :data:`PLAN_CACHE`."""
    if not isinstance(task, ReshardTask):
        raise TypeError(f"task must be a meshcast.ReshardTask, got {task!r}")
    if strategy is None and balance is None:
        balance = "auto"
    elif balance is None:
        balance = "none"
    if strategy is None and balance != "auto":
        strategy = "broadcast"
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is unknown; choose one of {', '.join(STRATEGIES)}")
    if balance not in BALANCES:
        raise ValueError(f"balance={balance!r} is unknown; choose one of {', '.join(BALANCES)}")
    topology = topology_for_meshes(topology, task.src.mesh, task.dst.mesh)
    return task, topology, strategy, balance


def plan(
    task: ReshardTask,
    topology: Topology | None = None,
    strategy: str | None = None,
    balance: str | None = None,
    *,
    cache: bool = True,
) -> Plan:
    """Plan ``task``: decompose it into unit slices and choose, for each, how it moves.

    ``topology`` says which ranks share a host and how fast they talk; without one, inside a job
    the job's real hosts are read from its environment (:func:`meshcast.job_topology`: torchrun,
    ``meshcast.launch``; same on every rank, no collective), and outside a job the last axis of
    each mesh is taken to span one host (the paper's (hosts, devices) convention), with default
    bandwidths. ``strategy`` is one of :data:`STRATEGIES`, ``balance`` one of :data:`BALANCES`.
    With neither given, ``balance="auto"`` chooses per slice among the strategies and is never
    slower in :func:`meshcast.simulate` than any fixed strategy x balance (above
    :data:`meshcast.planning.budgets.AUTO_SIM_LIMIT` unit slices: by more than a relative 2e-9, when
    its one plan is certified optimal against the lower bound). A strategy alone keeps the old
    default
    ``balance="none"``; a balance alone uses ``strategy="broadcast"`` (``"auto"``: any).

    Plans are cached (:data:`PLAN_CACHE`): a second call with an equal task, topology and
    options returns the same :class:`Plan` object without planning; ``cache=False`` plans anew
    and leaves the cache as it is.
    """
    key = plan_key(task, topology, strategy, balance)
    task, topology, strategy, balance = key
    if cache:
        hit = PLAN_CACHE.get(key)
        if hit is not None:
            return hit
    if balance == "auto":
        made = auto_plan(task, topology, strategy)
    elif balance == "order":
        assert strategy is not None
        made = order_plan(task, topology, strategy)
    else:
        assert strategy is not None
        made = fixed_plan(task, topology, strategy, balance)
    return PLAN_CACHE.put(key, made) if cache else made
