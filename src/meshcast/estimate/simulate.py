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

The loop is event driven: an event (start, end of latency, end of transfer) only revisits the
transfers that share a NIC with the one that changed, so 100,000 operations take seconds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

from ..core.layout import box_size
from ..core.plan import AllGather, Broadcast, Copy, Plan, Send, broadcast_chain
from ..core.topology import Topology
from ..core.units import GBIT
from .report import SimReport

__all__ = ["SimReport", "simulate", "simulate_many", "time_floor"]


class _Nics:
    """Global NIC numbering: NIC ``k`` of host ``h``; outbound resource 2g, inbound 2g+1."""

    def __init__(self, topology: Topology) -> None:
        self.gid, self.host_of_nic = topology.global_nics()
        self.names: list[str] = []
        self.caps: list[float] = []
        for g, h in enumerate(self.host_of_nic):
            j = g - self.host_of_nic.index(h)
            self.names += [f"h{h}.nic{j} out", f"h{h}.nic{j} in"]
            self.caps += [topology.nic_out_gbps[h] * GBIT, topology.nic_in_gbps[h] * GBIT]


def _op_model(plan: Plan, topology: Topology, nics: _Nics):
    """Per op: (ranks, bytes, NIC resources, intra cap or inf, latency s, kind)."""
    itemsize = plan.task.itemsize
    host_of = topology.hosts_by_rank
    gid = nics.gid
    lat = topology.latency_us * 1e-6
    intra = topology.intra_gbps * GBIT
    inf = math.inf
    out = []
    for op in plan.ops:
        if isinstance(op, Send):
            nbytes = box_size(op.box) * itemsize
            if host_of[op.src] == host_of[op.dst]:
                out.append(((op.src, op.dst), nbytes, (), intra, lat))
            else:
                out.append(((op.src, op.dst), nbytes, (2 * gid[op.src], 2 * gid[op.dst] + 1), inf,
                            lat))
        elif isinstance(op, Broadcast):
            nbytes = box_size(op.box) * itemsize
            chain = broadcast_chain(op, host_of)
            res: list[int] = []
            fan = False
            prev = None
            for leader, members in chain:
                if prev is not None:
                    res.append(2 * gid[prev])
                    res.append(2 * gid[leader] + 1)
                if members:
                    fan = True
                prev = leader
            out.append(((op.src, *op.dsts), nbytes, tuple(dict.fromkeys(res)),
                        intra if fan else inf, lat))
        elif isinstance(op, AllGather):
            if len(op.parts) != len(op.group) or not all(box_size(p) for p in op.parts):
                raise ValueError(
                    f"plan operation {len(out)}: an AllGather needs one non-empty part per member "
                    f"(group {op.group}, {len(op.parts)} parts); the lower bound and the runtimes "
                    "rely on it"
                )
            total = box_size(op.box)
            worst = max((total - box_size(p) for p in op.parts), default=0) * itemsize
            out.append((op.group, worst, (), intra, lat))
        elif isinstance(op, Copy):
            out.append(((op.rank,), box_size(op.box) * itemsize, (), intra, 0.0))
        else:
            raise TypeError(f"plan has an operation of unknown type {type(op).__name__}")
    return out


def _topology_of(plans: Sequence[Plan], topology: Topology | None) -> Topology:
    """``topology``, or the first plan's own; checked to place every rank of every plan."""
    for plan in plans:
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a meshcast.Plan, got {type(plan).__name__}")
    if topology is None:
        topology = plans[0].topology
    elif not isinstance(topology, Topology):
        raise TypeError(f"topology must be a meshcast.Topology or None, got {topology!r}")
    topology.covers({r for plan in plans for op in plan.ops for r in op.ranks()})
    return topology


def simulate(plan: Plan, topology: Topology | None = None) -> SimReport:
    """Simulate ``plan`` on ``topology`` (default: the plan's own) and report the makespan.

    Deterministic: the same plan and topology always give the same report.
    """
    topology = _topology_of([plan], topology)
    nics = _Nics(topology)
    return _report(_op_model(plan, topology, nics), [op.kind for op in plan.ops], topology, nics)


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
    topology = _topology_of(plans, topology)
    nics = _Nics(topology)
    model = [m for plan in plans for m in _op_model(plan, topology, nics)]
    kinds = [op.kind for plan in plans for op in plan.ops]
    return _report(model, kinds, topology, nics)


def _report(model, kinds: list[str], topology: Topology, nics: _Nics) -> SimReport:
    """Run the event loop on ``model`` (:func:`_op_model`'s rows) and report."""
    start, begin, end = _run(model, nics.caps)
    n_hosts = topology.num_hosts
    host_out = [0] * n_hosts  # Python ints: exact however many bytes cross
    host_in = [0] * n_hosts
    host_of_nic = nics.host_of_nic
    for _, nbytes, res, _, _ in model:
        for r in res:
            h = host_of_nic[r >> 1]
            if r & 1:
                host_in[h] += nbytes
            else:
                host_out[h] += nbytes
    return SimReport(
        time_s=float(end.max()) if len(end) else 0.0,
        start_s=start,
        transfer_s=begin,
        end_s=end,
        host_bytes_out=exact_array(host_out),
        host_bytes_in=exact_array(host_in),
        op_nics=tuple(tuple(r for r in m[2]) for m in model),
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
    nics = _Nics(topology)
    caps = nics.caps
    load = [0.0] * len(caps)
    free: dict[int, float] = {}
    first_lat = math.inf
    end = 0.0
    for ranks, nbytes, res, cap, lat in _op_model(plan, topology, nics):
        slowest = min(cap, *(caps[r] for r in res)) if res else cap
        t = max(free.get(r, 0.0) for r in ranks) + lat + (nbytes / slowest if nbytes else 0.0)
        for r in ranks:
            free[r] = t
        end = max(end, t)
        for r in res:
            load[r] += nbytes
        if res:
            first_lat = min(first_lat, lat)
    nic = max((b / c for b, c in zip(load, caps) if b), default=0.0)
    return max(end, first_lat + nic if nic else 0.0)


def _run(model, caps: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The event loop. Returns per-op start, transfer-begin and end times (seconds)."""
    loop = _EventLoop(model, caps)
    return loop.run()


class _EventLoop:
    """The simulator's state: operations wait for their ranks' previous operation, pay their
    latency, then share their NICs max-min fairly until their bytes are moved.

    Events on the heap are ``(time, sequence, kind, op, version)``: kind 0 ends an operation's
    latency, kind 1 ends the operation (stale when its rate changed since: ``version``)."""

    def __init__(self, model, caps: list[float]) -> None:
        n = len(model)
        self.model, self.caps = model, caps
        # dependencies: the previous op of each rank
        last_of: dict[int, int] = {}
        self.npred = [0] * n
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for i, m in enumerate(model):
            preds = set()
            for r in m[0]:
                p = last_of.get(r)
                if p is not None:
                    preds.add(p)
                last_of[r] = i
            self.npred[i] = len(preds)
            for p in preds:
                self.succs[p].append(i)
        self.start = [0.0] * n
        self.begin = [0.0] * n
        self.end = [0.0] * n
        self.remaining = [0.0] * n
        self.rate = [0.0] * n
        self.stamp = [0.0] * n
        self.version = [0] * n
        self.flows: list[dict[int, None]] = [{} for _ in caps]
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0

    def _push(self, t: float, kind: int, i: int, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, i, version))

    def run(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Run every operation; per-op start, transfer-begin and end times."""
        for i in range(len(self.model)):
            if self.npred[i] == 0:
                self._launch(i, 0.0)
        heap, pop = self.heap, heapq.heappop
        while heap:
            t, _, kind, i, ver = pop(heap)
            if kind == 0:
                self._latency_over(i, t)
            elif not self.model[i][2] or ver == self.version[i]:  # else stale: rate changed
                self._finish(i, t)
        return np.array(self.start), np.array(self.begin), np.array(self.end)

    def _launch(self, i: int, t: float) -> None:
        self.start[i] = t
        _, nbytes, res, cap, lat = self.model[i]
        if res:
            self._push(t + lat, 0, i, 0)
        else:
            self.begin[i] = t + lat
            self._push(t + lat + (nbytes / cap if nbytes else 0.0), 1, i, 0)

    def _latency_over(self, i: int, t: float) -> None:
        """The transfer of ``i`` joins its NICs."""
        m = self.model[i]
        self.begin[i] = t
        self.remaining[i] = float(m[1])
        self.stamp[i] = t
        self.rate[i] = 0.0
        if not m[1]:
            self._push(t, 1, i, self.version[i])
            return
        touched: dict[int, None] = {}
        for r in m[2]:
            self.flows[r][i] = None
            touched.update(self.flows[r])
        self._refill(touched, t)

    def _finish(self, i: int, t: float) -> None:
        m = self.model[i]
        self.end[i] = t
        if m[2] and m[1]:
            touched: dict[int, None] = {}
            for r in m[2]:
                del self.flows[r][i]
                touched.update(self.flows[r])
            self.rate[i] = 0.0
            if touched:
                self._refill(touched, t)
        for s in self.succs[i]:
            self.npred[s] -= 1
            if self.npred[s] == 0:
                self._launch(s, t)

    def _reset(self, f: int, new: float, t: float) -> None:
        old = self.rate[f]
        if new == old:
            return
        remaining = self.remaining
        remaining[f] -= old * (t - self.stamp[f])
        if remaining[f] < 0.0:
            remaining[f] = 0.0
        self.stamp[f] = t
        self.rate[f] = new
        self.version[f] += 1
        self._push(t + remaining[f] / new, 1, f, self.version[f])

    def _refill(self, touched: dict[int, None], t: float) -> None:
        """Max-min fair rates for the touched transfers; the others keep theirs (local
        water-filling: feasible, and exact when the touched set is a whole component)."""
        model, caps, flows, rate = self.model, self.caps, self.flows, self.rate
        resid: dict[int, float] = {}
        cnt: dict[int, int] = {}
        for f in touched:
            for r in model[f][2]:
                if r not in resid:
                    resid[r] = caps[r] - sum(rate[g] for g in flows[r] if g not in touched)
                    cnt[r] = 0
                cnt[r] += 1
        todo = dict(touched)
        while todo:
            share, where = math.inf, -1
            for r, c in cnt.items():
                if c:
                    v = resid[r] / c
                    if v < share:
                        share, where = v, r
            own = min(todo, key=lambda f: model[f][3])
            if model[own][3] <= share:
                fixed, share = [own], model[own][3]
            else:
                fixed = [f for f in flows[where] if f in todo]
            if share <= 0.0:
                share = 1e-300
            for f in fixed:
                del todo[f]
                self._reset(f, share, t)
                for r in model[f][2]:
                    resid[r] -= share
                    cnt[r] -= 1
