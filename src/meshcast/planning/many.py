"""Planning many tensors together, a plan cache, and the bucketed schedule that runs them.

Numpy only (no torch): :func:`plan_many` and :func:`build_schedule` are pure functions of their
arguments, so every rank computes the same plans and the same buckets.

* **Joint planning** (``balance="joint"``): the unit slices of *all* tasks are visited largest
  first; each picks, among its holders, the sender whose host has been given the fewest bytes to
  send across hosts so far (divided by that host's outbound bandwidth), counting every tensor
  planned before it. So when a model's weights are replicated on several source hosts (data
  parallel), the source NICs share the whole model's traffic, not each tensor's separately. The
  result is one ordinary :class:`~meshcast.Plan` per tensor (strategy ``broadcast`` or
  ``send_recv``, balance ``"joint"``): ``execute_local``, :func:`meshcast.simulate` and
  :func:`meshcast.reshard` run them unchanged.
* **Plan cache**: plans are cached by (tasks, topology, strategy, balance), where a task is
  (shape, dtype, source layout, destination layout) and a layout includes its mesh; the second
  call with the same model plans nothing (:func:`plan_cache_info`).
* **Schedule**: the network operations of all plans, cut into *buckets* whose staging bytes (pack
  and unpack buffers) stay under a bound on every rank, each bucket in *phases* (a rank forwards
  data, as a broadcast relay or an all-gather member, one phase after it received it). Within a
  phase every pair of ranks exchanges one packed message.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..core.boxes import Box, box_size, boxes_overlap
from ..core.cache import BoundedCache
from ..core.job import topology_for_meshes
from ..core.plan import Broadcast, Copy, Op, Plan, Send
from ..core.task import ReshardTask, iter_slices
from ..core.topology import Topology
from ..core.units import GBIT
from .buckets import Xfer, cut_buckets
from .fixed import STRATEGIES
from .planner import BALANCES, PLAN_CACHE
from .planner import plan as plan_one

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "JOINT_STRATEGIES",
    "PLANS",
    "SCHEDULES",
    "Schedule",
    "build_schedule",
    "clear_plan_cache",
    "default_topology",
    "plan_cache_info",
    "plan_many",
]

DEFAULT_BUCKET_BYTES = 64 << 20
"""Staging bytes (packed send buffers + receive buffers) one rank may hold at once."""
JOINT_STRATEGIES = ("broadcast", "send_recv")
"""Strategies the joint planner emits; other (strategy, balance) pairs plan tensor by tensor."""
PLAN_CACHE_SIZE = 64
"""Distinct (tasks, topology, strategy, balance) entries kept (least recently used dropped)."""



# -- joint planning ---------------------------------------------------------------------------
def default_topology(tasks: Sequence[ReshardTask]) -> Topology:
    """The planner's default for many tasks: the job's hosts (:func:`meshcast.job_topology`),
    else the convention that the last axis of each mesh spans one host."""
    meshes = []
    for t in tasks:
        for m in (t.src.mesh, t.dst.mesh):
            if m not in meshes:
                meshes.append(m)
    return topology_for_meshes(None, *meshes)


def _joint_plans(tasks: Sequence[ReshardTask], topology: Topology, strategy: str) -> list[Plan]:
    host_of = topology.hosts_by_rank
    out_rate = [g * GBIT for g in topology.nic_out_gbps]
    nics = topology.nics_per_host
    host_load = [0.0] * topology.num_hosts  # bytes given to each host to send across hosts
    rank_load: dict[int, int] = defaultdict(int)
    # every network slice of every task, largest first (stable: task order, then slice order)
    jobs = []
    per_task: list[list[tuple[int, Box, tuple[int, ...], tuple[int, ...]]]] = []
    for k, task in enumerate(tasks):
        slices = []
        for sl in iter_slices(task):
            slices.append((sl.index, sl.box, sl.local, sl.remote))
            if sl.remote:
                jobs.append((-sl.nbytes, k, sl.index, sl.holders, sl.remote))
        per_task.append(slices)
    jobs.sort(key=lambda j: (j[0], j[1], j[2]))
    sender: dict[tuple[int, int], int] = {}
    for neg, k, i, holders, remote in jobs:
        nbytes = -neg
        remote_hosts = [host_of[r] for r in remote]

        def cost(r: int, nbytes: int = nbytes, remote_hosts: list[int] = remote_hosts):
            h = host_of[r]
            if strategy == "broadcast":
                added = nbytes if any(x != h for x in remote_hosts) else 0
            else:
                added = nbytes * sum(x != h for x in remote_hosts)
            return ((host_load[h] + added) / (out_rate[h] * nics[h]), rank_load[r], r)

        choice = holders[0] if len(holders) == 1 else min(holders, key=cost)
        h = host_of[choice]
        if strategy == "broadcast":
            host_load[h] += nbytes if any(x != h for x in remote_hosts) else 0
            rank_load[choice] += nbytes
        else:
            host_load[h] += nbytes * sum(x != h for x in remote_hosts)
            rank_load[choice] += nbytes * len(remote)
        sender[(k, i)] = choice
    plans = []
    for k, task in enumerate(tasks):
        ops: list[Op] = []
        for i, box, local, remote in per_task[k]:
            ops.extend(Copy(r, box) for r in local)
            if not remote:
                continue
            src = sender[(k, i)]
            if strategy == "send_recv":
                ops.extend(Send(src, r, box) for r in remote)
            elif len(remote) == 1:
                ops.append(Send(src, remote[0], box))
            else:
                ops.append(Broadcast(src, remote, box))
        plans.append(Plan(task, tuple(ops), strategy, "joint", topology))
    return plans


PLANS = BoundedCache(
    "planning.plan_many", PLAN_CACHE_SIZE, "plans of plan_many by (tasks, topology, options)"
)
"""The plans :func:`plan_many` made, by (tasks, topology, strategy, balance)."""
SCHEDULES = BoundedCache(
    "planning.build_schedule", PLAN_CACHE_SIZE,
    "schedules of build_schedule by (the plan objects, bucket bytes)",
)
"""The schedules :func:`build_schedule` made, by (ids of the plan objects, bucket bytes); each
entry keeps its plans, so an id is not reused while its entry lives."""


class _Key(tuple):
    """A cache key that hashes once (a model's key holds hundreds of tasks, and the cache looks
    a key up more than once per call)."""

    def __hash__(self) -> int:
        h = self.__dict__.get("hash")
        if h is None:
            h = self.__dict__["hash"] = tuple.__hash__(self)
        return h


def _check_covered(tasks: Sequence[ReshardTask], topology: Topology) -> None:
    """Raise ValueError naming the first task with a rank ``topology`` does not place. The
    distinct meshes are checked once (a model's tasks share a few meshes)."""
    meshes = {id(m): m for t in tasks for m in (t.src.mesh, t.dst.mesh)}
    try:
        topology.covers_meshes(meshes.values())
    except ValueError:
        for k, t in enumerate(tasks):
            try:
                topology.covers(set(t.src.mesh.devices) | set(t.dst.mesh.devices))
            except ValueError as exc:
                raise ValueError(f"tasks[{k}] ({t.describe()}): {exc}") from None


def plan_many(
    tasks: Sequence[ReshardTask],
    topology: Topology | None = None,
    *,
    strategy: str | None = None,
    balance: str | None = None,
    cache: bool = True,
) -> list[Plan]:
    """Plan ``tasks`` together: one :class:`~meshcast.Plan` per task, in order.

    With ``balance="joint"`` (the default) the senders of all tasks are chosen together (module
    docstring) with ``strategy`` ``"broadcast"`` (default) or ``"send_recv"``. Any other balance
    (``"none"``, ``"size"``, ``"order"``, ``"auto"``) plans each task alone with
    :func:`meshcast.plan`. ``topology`` must place every rank of every mesh; without one, the last
    axis of each mesh spans one host. Results are cached (``cache=False`` bypasses the cache).
    """
    tasks = list(tasks)
    for k, t in enumerate(tasks):
        if not isinstance(t, ReshardTask):
            raise TypeError(f"tasks[{k}] must be a meshcast.ReshardTask, got {type(t).__name__}")
    if balance is None:
        balance = "joint"
    if balance != "joint" and balance not in BALANCES:
        raise ValueError(f"balance={balance!r} is unknown; choose 'joint' (plan_many's "
                         f"default) or one of {', '.join(BALANCES)}")
    if balance == "joint":
        strategy = strategy or "broadcast"
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of "
                             f"{', '.join(STRATEGIES)} (or None)")
        if strategy not in JOINT_STRATEGIES:
            raise ValueError(
                f"strategy={strategy!r} cannot be planned with balance='joint'; choose one of "
                f"{', '.join(JOINT_STRATEGIES)}, or another balance to plan tensor by tensor"
            )
    if topology is None:
        topology = default_topology(tasks) if tasks else None
    elif not isinstance(topology, Topology):
        raise TypeError(f"topology must be a meshcast.Topology or None, got {topology!r}")
    if topology is not None:
        _check_covered(tasks, topology)
    key = _Key((tuple(tasks), topology, strategy, balance))
    if cache:
        hit = PLANS.get(key)
        if hit is not None:
            return list(hit)
    if balance == "joint":
        plans = _joint_plans(tasks, topology, strategy) if tasks else []
    else:
        plans = [plan_one(t, topology, strategy, balance, cache=cache) for t in tasks]
    if cache:
        PLANS.put(key, tuple(plans))
    return plans


def plan_cache_info() -> dict[str, int]:
    """``{"hits": ..., "misses": ..., "size": ...}`` of this process's cache of
    :func:`plan_many` (:data:`PLANS`; every cache: :func:`meshcast.cache_info`)."""
    info = PLANS.info()
    return {"hits": info.hits, "misses": info.misses, "size": info.size}


def clear_plan_cache() -> None:
    """Forget every cached plan and schedule (:data:`PLANS`, :data:`SCHEDULES`, and
    :func:`meshcast.plan`'s :data:`~meshcast.planning.planner.PLAN_CACHE`) and zero the
    counters."""
    PLANS.clear()
    SCHEDULES.clear()
    PLAN_CACHE.clear()


# -- the bucketed, phased schedule ------------------------------------------------------------
class Segment(NamedTuple):
    """One box of tensor ``tensor`` inside a packed message; ``from_out``: read from the sender's
    destination shard (it received the box earlier) rather than its source shard."""

    tensor: int
    box: Box
    from_out: bool
    nbytes: int


@dataclass(frozen=True)
class Phase:
    """Messages that may all be in flight at once: ``messages[(src, dst)]`` lists the segments
    ``src`` packs, in order, into one message to ``dst``."""

    messages: dict[tuple[int, int], tuple[Segment, ...]]

    def sends_of(self, rank: int) -> list[tuple[int, tuple[Segment, ...]]]:
        """``[(peer, segments), ...]`` that ``rank`` sends, by peer."""
        return sorted((d, segs) for (s, d), segs in self.messages.items() if s == rank)

    def recvs_of(self, rank: int) -> list[tuple[int, tuple[Segment, ...]]]:
        """``[(peer, segments), ...]`` that ``rank`` receives, by peer."""
        return sorted((s, segs) for (s, d), segs in self.messages.items() if d == rank)


@dataclass(frozen=True)
class Schedule:
    """What :func:`meshcast.reshard_many` runs: local copies first, then the buckets in order,
    each a list of phases. ``staging[r]`` is the most bytes rank ``r`` stages in one bucket."""

    copies: tuple[tuple[int, int, Box], ...]  # (tensor, rank, box)
    buckets: tuple[tuple[Phase, ...], ...]
    staging: dict[int, int]
    ranks: tuple[int, ...]
    bucket_bytes: int

    def copies_of(self, rank: int) -> list[tuple[int, Box]]:
        """``[(tensor, box), ...]`` that ``rank`` copies from its source to its destination."""
        return [(t, b) for t, r, b in self.copies if r == rank]


def build_schedule(plans: Sequence[Plan], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Schedule:
    """Cut the operations of ``plans`` (tensor ``k`` = ``plans[k]``) into buckets and phases.

    The buckets (:mod:`.buckets`) keep every rank's staged bytes within ``bucket_bytes``, each
    filled from lanes of operations by the hosts they connect, so that every host keeps sending;
    an operation that alone exceeds the bound is cut into parts (all-gathers are never cut).
    Cached per list of plan objects (:data:`SCHEDULES`).
    """
    key = (tuple(id(p) for p in plans), int(bucket_bytes))
    hit = SCHEDULES.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], plans)):
        return hit[1]
    copies, buckets, staging = cut_buckets(plans, bucket_bytes)
    phased = [_phases(xfers, plans) for xfers in buckets if xfers]
    ranks = sorted({r for p in plans for r in p.ranks})
    schedule = Schedule(tuple(copies), tuple(phased), staging, tuple(ranks), int(bucket_bytes))
    SCHEDULES.put(key, (tuple(plans), schedule))
    return schedule


def _phases(xfers: list[Xfer], plans: Sequence[Plan]) -> tuple[Phase, ...]:
    """The phases of one bucket: a movement that forwards a box its sender received in this
    bucket goes in a later phase than the one delivering it."""
    writes: dict[tuple[int, int], list[tuple[Box, int]]] = defaultdict(list)
    messages: list[dict[tuple[int, int], list[Segment]]] = []
    for x in xfers:
        phase = 0
        if x.from_out:
            for box, p in writes.get((x.src, x.tensor), ()):
                if p >= phase and boxes_overlap(box, x.box):
                    phase = p + 1
        writes[(x.dst, x.tensor)].append((x.box, phase))
        while len(messages) <= phase:
            messages.append(defaultdict(list))
        nbytes = box_size(x.box) * plans[x.tensor].task.itemsize
        messages[phase][(x.src, x.dst)].append(Segment(x.tensor, x.box, x.from_out, nbytes))
    return tuple(Phase({k: tuple(v) for k, v in m.items()}) for m in messages)
