"""A discrete-event simulator of how the runtime executes a plan on a topology.

The model (see ``docs/scheduling.md``):

* Every rank runs its operations in plan order; an operation starts as soon as each of its ranks
  has finished its previous operation (operations that share no rank run concurrently).
* An operation first pays a start-up latency (``latency_us``, once per operation: a broadcast's
  chain is pipelined in chunks), then moves its bytes.
* A transfer that crosses hosts loads NICs: a ``Send`` the sender's outbound NIC and the
  receiver's inbound NIC; a ``Broadcast`` follows :func:`meshcast.core.plan.broadcast_chain`: the
  sender's outbound NIC, the inbound NIC of each receiving host's leader once, and the outbound NIC
  of every leader that forwards to the next host. The chain is pipelined, so the whole broadcast
  moves at the rate of its slowest link.
* NICs are shared max-min fairly between the transfers that load them: a NIC carrying k
  transfers gives each 1/k of its bandwidth unless some are held back elsewhere, whose unused
  share goes to the others. (On each event the rates of the transfers sharing a NIC with the one
  that started or ended are water-filled; the rest keep theirs.) Hops inside a host (fan-out,
  ``AllGather``, a ``Send`` between ranks of one host, a ``Copy``) are capped at ``intra_gbps``
  and not shared.

The loop (:mod:`meshcast.estimate.events`) is event driven: an event (start, end of latency, end
of transfer) only revisits the transfers that share a NIC with the one that changed, so 100,000
operations take seconds. The NIC numbering is kept per topology (``estimate.nics`` in
:func:`meshcast.cache_info`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from ..core.cache import BoundedCache
from ..core.layout import box_size
from ..core.plan import AllGather, Broadcast, Copy, Op, Plan, Send
from ..core.topology import Topology
from ..core.units import GBIT
from .events import run_events, run_makespan
from .report import SimReport

__all__ = [
    "OrderSimulator", "SimReport", "copy_send_floor", "simulate", "simulate_many",
    "simulated_time", "time_floor",
]


class _Nics:
    """Global NIC numbering: NIC ``k`` of host ``h``; outbound resource 2g, inbound 2g+1. With
    the topology's constants :func:`_op_model` reads (kept per topology: :data:`_NICS`)."""

    def __init__(self, topology: Topology) -> None:
        self.gid, self.host_of_nic = topology.global_nics()
        self.names: list[str] = []
        self.caps: list[float] = []
        first_nic: dict[int, int] = {}  # each host's first global NIC
        for g, h in enumerate(self.host_of_nic):
            j = g - first_nic.setdefault(h, g)
            self.names += [f"h{h}.nic{j} out", f"h{h}.nic{j} in"]
            self.caps += [topology.nic_out_gbps[h] * GBIT, topology.nic_in_gbps[h] * GBIT]
        self.host_of_resource = [h for h in self.host_of_nic for _ in "oi"]
        self.host_of = topology.hosts_by_rank
        self.lat = topology.latency_us * 1e-6
        self.intra = topology.intra_gbps * GBIT
        self.hop = topology.hop_bytes


_NICS: BoundedCache[Topology, _Nics] = BoundedCache(
    "estimate.nics", 16, "the simulator's NIC numbering and capacities, by topology")


def _nics(topology: Topology) -> _Nics:
    return _NICS.get_or_make(topology, lambda: _Nics(topology))


class _Model(NamedTuple):
    """The simulator's view of a plan, one column per quantity, one row per operation: ranks,
    bytes, NIC resources, own cap (``intra_gbps`` where it hops inside a host, else ``inf``),
    latency (s)."""

    ranks: list[tuple[int, ...]]
    nbytes: list[int]
    res: list[tuple[int, ...]]
    cap: list[float]
    lat: list[float]


def _broadcast_route(op: Broadcast, host_of: Mapping[int, int], gid: Mapping[int, int]
                     ) -> tuple[tuple[int, ...], bool]:
    """The NIC resources of a broadcast along :func:`~meshcast.core.plan.broadcast_chain` (each
    leader's outbound NIC, the next leader's inbound NIC, first occurrences in order) and whether
    it fans out inside a host."""
    src_host = host_of[op.src]
    leaders: dict[int, int] = {}
    fan = False
    for r in op.dsts:
        h = host_of[r]
        if h == src_host or h in leaders:
            fan = True
        else:
            leaders[h] = r
    res: list[int] = []
    prev = op.src
    for leader in leaders.values():
        res += (2 * gid[prev], 2 * gid[leader] + 1)
        prev = leader
    return tuple(dict.fromkeys(res)), fan


def _chain_fill(route: tuple[int, ...], fan: bool, nics: _Nics) -> float:
    """Seconds until a broadcast chain's last receivers start: every hop after the first (each
    further host, and a fan-out inside a host) waits for ``hop_bytes`` at its link's rate;
    0 where ``hop_bytes`` is 0 (the default: a perfect pipeline)."""
    if not nics.hop:
        return 0.0
    rates = [nics.caps[r] for r in route[1::2]][1:]  # inbound NICs of the hosts after the first
    if fan:
        rates.append(nics.intra)
    return sum(nics.hop / rate for rate in rates)


def _op_model(ops: Sequence[Op], itemsize: int, nics: _Nics) -> _Model:
    """The columns of :class:`_Model` for operations ``ops`` of elements of ``itemsize`` bytes
    (KeyError: a rank off the topology)."""
    host_of, gid, lat, intra, inf = nics.host_of, nics.gid, nics.lat, nics.intra, math.inf
    m = _Model([], [], [], [], [])
    ranks, nbytes, res, cap, lats = m
    for op in ops:
        if isinstance(op, Send):
            src, dst = op.src, op.dst
            ranks.append((src, dst))
            nbytes.append(box_size(op.box) * itemsize)
            if host_of[src] == host_of[dst]:
                res.append(())
                cap.append(intra)
            else:
                res.append((2 * gid[src], 2 * gid[dst] + 1))
                cap.append(inf)
            lats.append(lat)
            continue
        if isinstance(op, Broadcast):
            route, fan = _broadcast_route(op, host_of, gid)
            row = ((op.src, *op.dsts), box_size(op.box) * itemsize, route, intra if fan else inf,
                   lat + _chain_fill(route, fan, nics))
        elif isinstance(op, AllGather):
            _one_host(op, host_of, len(ranks))
            row = (op.group, _allgather_bytes(op, len(ranks)) * itemsize, (), intra, lat)
        elif isinstance(op, Copy):
            _placed((op.rank,), host_of)
            row = ((op.rank,), box_size(op.box) * itemsize, (), intra, 0.0)
        else:
            raise TypeError(f"plan has an operation of unknown type {type(op).__name__}")
        for column, value in zip(m, row):
            column.append(value)
    return m


def _placed(ranks: tuple[int, ...], host_of: Mapping[int, int]) -> None:
    """KeyError unless every rank of ``ranks`` is on a host."""
    for r in ranks:
        if r not in host_of:
            raise KeyError(r)


def _one_host(op: AllGather, host_of: Mapping[int, int], index: int) -> None:
    """KeyError unless every member of ``op`` is on a host; ValueError unless all are on one
    (the model runs an all-gather on a host's fast links, and the lower bound relies on it)."""
    _placed(op.group, host_of)
    hosts = sorted({host_of[r] for r in op.group})
    if len(hosts) > 1:
        raise ValueError(
            f"plan operation {index}: an AllGather re-joins a box inside one host (the simulator "
            f"runs it on the host's fast links; the lower bound relies on it), but its group "
            f"{op.group} spans hosts {hosts}; bring the parts across with sends or broadcasts"
        )


def _allgather_bytes(op: AllGather, index: int) -> int:
    """Elements the slowest member of an all-gather receives (checked: one non-empty part per
    member)."""
    if len(op.parts) != len(op.group) or not all(box_size(p) for p in op.parts):
        raise ValueError(
            f"plan operation {index}: an AllGather needs one non-empty part per member "
            f"(group {op.group}, {len(op.parts)} parts); the lower bound and the runtimes "
            "rely on it"
        )
    total = box_size(op.box)
    return max((total - box_size(p) for p in op.parts), default=0)


def _check_types(plans: Sequence[Plan], topology: Topology | None) -> Topology:
    """``topology``, or the first plan's own, after checking the arguments' types."""
    for plan in plans:
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a meshcast.Plan, got {type(plan).__name__}")
    if topology is None:
        return plans[0].topology
    if not isinstance(topology, Topology):
        raise TypeError(f"topology must be a meshcast.Topology or None, got {topology!r}")
    return topology


def _model_of(plans: Sequence[Plan], topology: Topology, nics: _Nics) -> _Model:
    """The operations of ``plans`` (one sequence, plan after plan); a ValueError naming the
    ranks the topology does not place, if any, before any other error of the plans."""
    try:
        parts = [_op_model(plan.ops, plan.task.itemsize, nics) for plan in plans]
    except Exception:
        topology.covers({r for plan in plans for op in plan.ops for r in op.ranks()})
        raise
    if len(parts) == 1:
        return parts[0]
    return _Model(*([x for part in column for x in part] for column in zip(*parts)))


def simulate(plan: Plan, topology: Topology | None = None) -> SimReport:
    """Simulate ``plan`` on ``topology`` (default: the plan's own) and report the makespan.

    Deterministic: the same plan and topology always give the same report.
    """
    topology = _check_types([plan], topology)
    nics = _nics(topology)
    return _report(_model_of([plan], topology, nics), [op.kind for op in plan.ops], topology,
                   nics)


def simulated_time(plan: Plan, topology: Topology | None = None, *,
                   until: float = math.inf) -> float:
    """``simulate(plan, topology).time_s`` (the same float), without building the rest of the
    report: for planners that compare many candidate plans. Where that time is above ``until``
    the simulation stops once it knows, and returns a smaller time, still above ``until``."""
    topology = _check_types([plan], topology)
    nics = _nics(topology)
    return run_makespan(*_model_of([plan], topology, nics), nics.caps, until)


class OrderSimulator:
    """End times of ``plan``'s operations run in other orders (the same floats as
    :func:`simulate` of the reordered plan gives), its operations' model built once: for
    searches over the order of one plan, and over single operations replaced."""

    def __init__(self, plan: Plan, topology: Topology | None = None) -> None:
        topology = _check_types([plan], topology)
        self._nics = _nics(topology)
        self._model = _model_of([plan], topology, self._nics)
        self._itemsize = plan.task.itemsize

    def replace(self, i: int, op: Op) -> None:
        """Operation ``i`` of the plan is ``op`` from now on (the caller keeps it valid)."""
        row = _op_model((op,), self._itemsize, self._nics)
        for column, value in zip(self._model, row):
            column[i] = value[0]

    def end_s(self, order: Sequence[int]) -> list[float]:
        """When each operation ends, per position of ``order`` (indices of the plan's
        operations, each once)."""
        columns = [[column[i] for i in order] for column in self._model]
        return run_events(*columns, self._nics.caps)[2]


def simulate_many(plans: Sequence[Plan], topology: Topology | None = None) -> SimReport:
    """Simulate ``plans`` run together as one job (a weight sync, :func:`meshcast.plan_many`'s
    plans), on ``topology`` (default: the first plan's own).

    The operations of all plans form one sequence, plan after plan, each in its plan's order, as
    :func:`meshcast.reshard_many` takes them: each rank runs its operations of all plans in that
    order, and operations of different plans share the NICs like those of one plan. Operation
    ``i`` of the report is operation ``i - offset`` of the plan it falls in (offsets: the
    cumulative ``len(plan.ops)``). ``simulate_many([p])`` equals ``simulate(p)``.
    """
    plans = list(plans)
    if not plans:
        raise ValueError("simulate_many needs at least one plan")
    topology = _check_types(plans, topology)
    nics = _nics(topology)
    kinds = [op.kind for plan in plans for op in plan.ops]
    return _report(_model_of(plans, topology, nics), kinds, topology, nics)


def _report(model: _Model, kinds: list[str], topology: Topology, nics: _Nics) -> SimReport:
    """Run the event loop on ``model`` and report."""
    start, begin, end = run_events(*model, nics.caps)
    load = [0] * len(nics.caps)  # bytes per NIC resource; Python ints: exact however many
    for nbytes, res in zip(model.nbytes, model.res):
        for r in res:
            load[r] += nbytes
    n_hosts = topology.num_hosts
    host_out = [0] * n_hosts
    host_in = [0] * n_hosts
    for r, h in enumerate(nics.host_of_resource):
        if load[r]:
            (host_in if r & 1 else host_out)[h] += load[r]
    end_s = np.array(end)
    return SimReport(
        time_s=float(end_s.max()) if end else 0.0,
        start_s=np.array(start),
        transfer_s=np.array(begin),
        end_s=end_s,
        host_bytes_out=exact_array(host_out),
        host_bytes_in=exact_array(host_in),
        op_nics=tuple(model.res),
        nic_names=tuple(nics.names),
        kinds=tuple(kinds),
    )


def exact_array(values: list[int]) -> np.ndarray:
    """Byte counts as int64, or as Python ints (dtype object) where some exceed int64."""
    if all(-(2**63) <= v < 2**63 for v in values):
        return np.array(values, dtype=np.int64)
    return np.array(values, dtype=object)


def time_floor(plan: Plan, topology: Topology) -> float:
    """A quick lower bound on ``simulate(plan, topology).time_s``, without the event loop.

    In the simulator an operation starts when all its ranks have finished their previous one and
    lasts at least its latency plus its bytes at the slowest capacity on its route (a fair share
    is never above a capacity); a NIC never carries more than its capacity, nor anything before
    the first latency is paid. So the time is at least the longest path through the plan's
    rank order with those shortest durations, and the busiest NIC's bytes over its capacity plus
    one latency. Linear in the plan's size; used to skip simulating plans that cannot win.
    """
    nics = _nics(topology)
    return _floor(_op_model(plan.ops, plan.task.itemsize, nics), nics)


def copy_send_floor(srcs: Sequence[int], dsts: Sequence[int], nbytes: Sequence[int],
                    topology: Topology) -> float:
    """:func:`time_floor` of the plan whose operation ``k`` is a ``Copy`` on rank ``dsts[k]``
    where ``srcs[k] < 0``, else a ``Send`` from ``srcs[k]`` to ``dsts[k]``, moving ``nbytes[k]``:
    the same number, without building the plan (the same float operations in the same order as
    on the plan's model)."""
    nics = _nics(topology)
    host_of, gid, lat, intra, caps = nics.host_of, nics.gid, nics.lat, nics.intra, nics.caps
    load = [0.0] * len(caps)
    free: dict[int, float] = {}
    get = free.get
    end, first_lat = 0.0, math.inf
    for a, b, nb in zip(srcs, dsts, nbytes):
        if a < 0:
            t = get(b, 0.0) + 0.0 + (nb / intra if nb else 0.0)
            free[b] = t
        else:
            fa, fb = get(a, 0.0), get(b, 0.0)
            start = fa if fa >= fb else fb
            if host_of[a] == host_of[b]:
                t = start + lat + (nb / intra if nb else 0.0)
            else:
                ra, rb = 2 * gid[a], 2 * gid[b] + 1
                slowest = caps[ra] if caps[ra] < caps[rb] else caps[rb]
                t = start + lat + (nb / slowest if nb else 0.0)
                load[ra] += nb
                load[rb] += nb
                if lat < first_lat:
                    first_lat = lat
            free[a] = free[b] = t
        if t > end:
            end = t
    nic = max((b / c for b, c in zip(load, caps) if b), default=0.0)
    return max(end, first_lat + nic if nic else 0.0)


def _floor(model: _Model, nics: _Nics) -> float:
    """:func:`time_floor` of the operations of ``model``."""
    caps = nics.caps
    load = [0.0] * len(caps)
    free: dict[int, float] = {}
    get, zeros = free.get, itertools.repeat(0.0)
    first_lat = math.inf
    end = 0.0
    for ranks, nbytes, res, cap, lat in zip(*model):
        slowest = cap
        for r in res:
            if caps[r] < slowest:
                slowest = caps[r]
        t = max(map(get, ranks, zeros)) + lat + (nbytes / slowest if nbytes else 0.0)
        for r in ranks:
            free[r] = t
        if t > end:
            end = t
        if res:
            for r in res:
                load[r] += nbytes
            if lat < first_lat:
                first_lat = lat
    nic = max((b / c for b, c in zip(load, caps) if b), default=0.0)
    return max(end, first_lat + nic if nic else 0.0)
