"""The physical limit of one resharding task on a topology (PAPER.md section 6).

* Inbound: every unit slice that some device of host h needs and no device of h holds must enter
  h at least once: ``time >= in_bytes(h) / B_in(h)`` (``B_in`` = the NICs of h that serve its
  destination ranks together: bytes enter a host only through a receiver's NIC).
* Outbound: every such slice must leave at least one of its holder hosts. The best split of each
  slice's bytes among its holder hosts is a small linear programme (solved with scipy's HiGHS):
  minimise T subject to ``sum of bytes host h sends <= T * B_out(h)`` (``B_out`` = the NICs of h
  that serve ranks of the task).
* Nothing moves before the first operation has paid its start-up latency, so the bound adds
  ``latency_us`` once when any byte must cross hosts.
* Per rank (latency): a transfer (``Copy``, ``Send``, ``Broadcast``) carries data of one unit
  slice at most (its box lies in one source shard and in the destination shard of every
  receiver), an ``AllGather`` runs inside one host and may re-join several slices, and a rank
  runs its operations one after another, each paying ``latency_us``. So a receiver that takes
  part in no all-gather pays at least ``latency + bytes / fastest link`` for each unit slice it
  lacks, and ``latency + min(bytes / NIC, latency + bytes / fastest link)`` for one no rank of
  its host holds: the first operation that brings it such bytes crosses the NIC (an intra-host
  sender is a holder, and an AllGather member contributes a non-empty part it must have
  received before), so either that one operation brings it all (waiting for the bytes at one
  NIC's rate) or it takes part in two. One that takes part in an all-gather (where another rank
  of its host needs one of its tiles) pays at least that start-up, one more for its part unless
  it holds some of what it needs, and its bytes at the fastest link. The ``m >= 2`` ranks of a
  host that need one tile, ``k`` of whose slices none of them holds, run ``k`` transfers at
  least (one slice each), so one of them ``ceil(k / m)`` and an all-gather (unless it runs all
  ``k``); and the bytes of those slices no rank of the host holds cross its inbound NIC into
  one of them, so one of them is busy at least ``(k / m + 1) * lat + bytes / (m * NIC)``
  (the mean; one that runs all ``k`` even longer). On the sending side, the k holders of a
  source tile (they hold no other tile) run at least one operation per slice of it that must
  move (n in all), each paying ``latency`` and carrying at most one slice of the tile, at most
  at the fastest link (one NIC's rate for a slice none of whose receivers sits on a holder
  host): the least time in which k holders can do that, counting operations in whole numbers, is
  :func:`~meshcast.estimate.rank_bounds.holders_bound` (e.g. 7 slices of 15 us from 5 holders
  with 30 us start-ups: two operations on every holder, 81 us, where spreading the start-ups
  evenly gave 63 us). These terms matter for small tensors cut into many small slices.
* Per host (rank time): the task's ranks on host h (no other rank takes part in an operation)
  are busy at most ``|ranks of h| * T`` together. A slice that k ranks of h lack costs them at
  least ``k*lat + tr + (k-1) * min(tr, lat + bytes / fastest link)`` if no rank of h holds it
  (``tr`` = bytes over one inbound NIC of h; by the per-rank argument each receiver waits for
  the whole transfer or pays a second latency and takes the bytes at the fastest link at most,
  and the bytes cross once at least) and ``k*lat + min(k*tr, lat)`` if one does (an intra-host
  operation pays one more latency); where two or more ranks of h need its tile and may re-join
  it in an all-gather (whose start-up is counted for no slice), at least its bytes at the
  fastest link on each rank that lacks it and does not bring it in, plus ``lat + tr`` for the
  transfer that brings it in if h does not hold it, when that is less. A slice held on h alone
  and needed elsewhere costs the ranks of h ``lat + bytes / B_out``. Proof in
  ``docs/scheduling.md``; it needs every transfer to carry data of one unit slice at most, every
  AllGather to run inside one host with a non-empty part per member (:func:`meshcast.simulate`
  refuses the others) and to meet a holder's source tile in one slice at most (its box lies in
  one destination tile), which every plan of :func:`meshcast.plan` satisfies.

The bound holds for every plan that passes the plan check (:func:`meshcast.check_plan`) and
that the simulator can run; ``efficiency = lower_bound / time``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..core.indexing import unique_inverse, unique_rows
from ..core.job import topology_for_meshes
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..core.units import GBIT
from .rank_bounds import host_bound, host_joins, rank_bound, rank_tiles

__all__ = [
    "FLOAT_MARGIN",
    "LowerBound",
    "bound_seconds",
    "host_matrix",
    "inbound_seconds",
    "joint_lower_bound",
    "lower_bound",
    "lower_bound_details",
    "nics_serving",
]



@dataclass(frozen=True)
class LowerBound:
    """The parts of the bound. ``groups[g]`` is a tuple of holder hosts; ``group_bytes[g]`` the
    bytes of the slices held on exactly those hosts that must leave them; ``fractions[g][k]`` the
    share of ``group_bytes[g]`` host ``groups[g][k]`` sends in the LP optimum."""

    seconds: float
    inbound_s: float
    outbound_s: float
    latency_s: float
    rank_s: float
    host_in_bytes: np.ndarray
    groups: tuple[tuple[int, ...], ...]
    group_bytes: tuple[int, ...]
    fractions: tuple[tuple[float, ...], ...]
    host_s: float = 0.0

    @property
    def unmargined_s(self) -> float:
        """The bound without its downward float margin (:data:`FLOAT_MARGIN`)."""
        return bound_seconds(
            self.inbound_s, self.outbound_s, self.latency_s, self.rank_s, self.host_s
        )


FLOAT_MARGIN = 1e-9
"""Relative margin the bound is lowered by, so that float rounding in the simulator (sums of
many durations) never puts a plan's simulated time below it."""


def bound_seconds(
    inbound: float, outbound: float, latency: float, rank: float, host: float, margin: float = 0.0
) -> float:
    """The lower bound from its parts: the larger of the network bound (inbound or outbound,
    plus one latency) and the per-rank and per-host bounds, each lowered by ``margin``."""
    return max(max(inbound, outbound) * (1 - margin) + latency, max(rank, host) * (1 - margin))


def host_matrix(tiles: list[tuple[int, ...]], host_of: dict[int, int], n_hosts: int) -> np.ndarray:
    """Tile x host, bool: some rank of the host is among the tile's ranks."""
    out = np.zeros((len(tiles), n_hosts), dtype=bool)
    for t, ranks in enumerate(tiles):
        for r in ranks:
            out[t, host_of[r]] = True
    return out


def nics_serving(topology: Topology, ranks: Iterable[int]) -> np.ndarray:
    """Per host, how many of its NICs serve at least one of ``ranks`` (at least one): bytes
    enter a host only through the NICs of ranks that receive (destination ranks: receivers and
    the leaders of broadcast chains) and leave it only through those of ranks that send or
    forward (the task's ranks); a NIC that serves none of them carries nothing of the task."""
    nic_of, host_of_nic = topology.global_nics()
    used = np.zeros(len(host_of_nic), dtype=bool)
    used[[nic_of[r] for r in ranks]] = True
    return np.maximum(np.bincount(host_of_nic, weights=used, minlength=topology.num_hosts), 1)


def inbound_seconds(host_in: np.ndarray, topology: Topology, receivers: Iterable[int]) -> float:
    """The inbound bound: the busiest host's bytes in (``host_in[h]``) over its NICs that serve
    some of ``receivers`` (the destination ranks)."""
    b_in = np.array(topology.nic_in_gbps) * nics_serving(topology, receivers) * GBIT
    return float((host_in / b_in).max())


def joint_lower_bound(tasks: Sequence[ReshardTask], topology: Topology) -> float:
    """Seconds no joint run of ``tasks`` (all at once, e.g. a weight sync) can beat on
    ``topology``: the busiest host's inbound bytes of all tasks together, plus one latency where
    any bytes cross hosts, and no less than any one task's :func:`lower_bound`."""
    host_in = np.zeros(topology.num_hosts)
    single = 0.0
    receivers: set[int] = set()
    for t in tasks:
        d = lower_bound_details(t, topology)
        host_in += d.host_in_bytes
        single = max(single, d.seconds)
        receivers.update(t.dst.mesh.devices)
    inbound = inbound_seconds(host_in, topology, receivers) if host_in.any() else 0.0
    return max(inbound + (topology.latency_us * 1e-6 if inbound > 0 else 0.0), single)


def lower_bound_details(task: ReshardTask, topology: Topology | None = None) -> LowerBound:
    """The lower bound with its parts (see :class:`LowerBound`)."""
    if not isinstance(task, ReshardTask):
        raise TypeError(f"task must be a meshcast.ReshardTask, got {task!r}")
    topology = topology_for_meshes(topology, task.src.mesh, task.dst.mesh)
    dec = task.decomposition
    n_hosts = topology.num_hosts
    host_of = topology.hosts_by_rank
    held = host_matrix(dec.holders_of_tile, host_of, n_hosts)
    wanted = host_matrix(dec.receivers_of_tile, host_of, n_hosts)
    n_dst = len(dec.receivers_of_tile)
    pairs, inverse = unique_inverse(dec.src_tile * n_dst + dec.dst_tile)
    exact = _sum_by(inverse, dec.sizes(), len(pairs)) * task.itemsize  # int64, exact
    nbytes = exact.astype(np.float64)
    s, t = pairs // n_dst, pairs % n_dst
    # bytes that must enter each host: slices some rank of it needs and none of it holds
    w_host, w_tile = np.nonzero(wanted.T)  # (host, destination tile) it needs
    j_entry, j_pair = host_joins(pairs, n_dst, held, w_host, w_tile)  # ... and holds a source
    host_in = (np.bincount(w_host, np.bincount(t, nbytes, minlength=n_dst)[w_tile], n_hosts)
               - np.bincount(w_host[j_entry], nbytes[j_pair], n_hosts))
    common = np.bincount(j_pair, minlength=len(pairs))  # hosts that need and hold each pair
    need_any = wanted.sum(axis=1)[t] - common > 0  # some host needs it
    dst_ranks = task.dst.mesh.devices
    b_out = (np.array(topology.nic_out_gbps) * GBIT
             * nics_serving(topology, (*task.src.mesh.devices, *dst_ranks)))
    inbound = inbound_seconds(host_in, topology, dst_ranks) if n_hosts else 0.0
    # outbound: bytes of each source tile that must leave, grouped by holder-host set (exact
    # int64 sums of disjoint parts of the tensor, which has at most 2^63 - 1 bytes)
    leave = _sum_by(s, np.where(need_any, exact, 0), len(held))
    keys, group_of = unique_rows(held)
    group_exact = _sum_by(group_of, leave, len(keys))
    group_bytes = group_exact.astype(np.float64)
    groups = [tuple(np.flatnonzero(k).tolist()) for k in keys]
    keep = [g for g in range(len(groups)) if group_bytes[g] > 0]
    outbound, fractions = _outbound_lp([groups[g] for g in keep], group_bytes[keep], b_out)
    latency = topology.latency_us * 1e-6 if (inbound > 0 or outbound > 0) else 0.0
    per_rank = rank_tiles(task, topology)
    rank = rank_bound(topology, per_rank, s, t, nbytes, held, common == 0)
    host = host_bound(topology, per_rank, s, t, nbytes, held, wanted, need_any)
    return LowerBound(
        seconds=bound_seconds(inbound, outbound, latency, rank, host, FLOAT_MARGIN),
        inbound_s=inbound,
        outbound_s=outbound,
        latency_s=latency,
        rank_s=rank,
        host_in_bytes=host_in,
        groups=tuple(groups[g] for g in keep),
        group_bytes=tuple(int(group_exact[g]) for g in keep),
        fractions=fractions,
        host_s=host,
    )


def _sum_by(index: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """``out[k] = sum(values[index == k])`` in int64 (``np.bincount`` sums in float64)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, index, values.astype(np.int64))
    return out


def _outbound_lp(
    groups: list[tuple[int, ...]], group_bytes: np.ndarray, b_out: np.ndarray
) -> tuple[float, tuple[tuple[float, ...], ...]]:
    """min T s.t. each group's bytes are split among its hosts, each host's share <= T*B_out.
    Solved exactly when no host is in two groups (each group split in proportion to its hosts'
    bandwidths), else with scipy's HiGHS."""
    if not groups:
        return 0.0, ()
    if all(len(g) == 1 for g in groups):
        load = np.zeros(len(b_out))
        for g, b in zip(groups, group_bytes):
            load[g[0]] += b
        return float((load / b_out).max()), tuple((1.0,) for _ in groups)
    if sum(len(g) for g in groups) == len({h for g in groups for h in g}):
        # no host in two groups: each group alone, its hosts busy equally long (the LP optimum)
        rates = [[float(b_out[h]) for h in g] for g in groups]
        return (max(float(b) / sum(r) for b, r in zip(group_bytes, rates)),
                tuple(tuple(x / sum(r) for x in r) for r in rates))
    from scipy.optimize import linprog

    # variables: y[g, k] (time units of host groups[g][k]'s outbound time spent on group g),
    # then T. The unit is a second unless a second moves a tiny share of the largest group
    # (transfers of days): then a unit moves about all of it, so that no coefficient falls
    # below the solver's tolerance (HiGHS drops tiny matrix entries, making the LP infeasible).
    scale = float(max(group_bytes.max(), 1.0))
    cols = [(g, h) for g, hosts in enumerate(groups) for h in hosts]
    n = len(cols) + 1
    hosts_used = sorted({h for g in groups for h in g})
    fastest = max(float(b_out[h]) for h in hosts_used)
    unit = 1.0 if min(float(b_out[h]) for h in hosts_used) / scale >= 1e-6 else scale / fastest
    row_of = {h: i for i, h in enumerate(hosts_used)}
    a_ub = np.zeros((len(hosts_used), n))
    a_eq = np.zeros((len(groups), n))
    for j, (g, h) in enumerate(cols):
        a_ub[row_of[h], j] = 1.0  # seconds host h sends
        a_eq[g, j] = b_out[h] * unit / scale  # bytes (scaled) those units move
    a_ub[:, -1] = -1.0
    c = np.zeros(n)
    c[-1] = 1.0
    res = linprog(
        c,
        A_ub=a_ub,
        b_ub=np.zeros(len(hosts_used)),
        A_eq=a_eq,
        b_eq=group_bytes / scale,
        bounds=[(0, None)] * n,
        method="highs",
    )
    if not res.success:  # pragma: no cover - the LP is always feasible and bounded
        raise RuntimeError(f"outbound lower-bound LP failed: {res.message}")
    x = res.x
    fractions: list[tuple[float, ...]] = []
    j = 0
    for hosts in groups:
        moved = [x[j + k] * b_out[h] * unit / scale for k, h in enumerate(hosts)]
        j += len(hosts)
        total = sum(moved) or 1.0
        fractions.append(tuple(m / total for m in moved))
    # the LP optimum up to solver tolerance; never above what an exact split could reach
    return float(max(x[-1], 0.0)) * unit * (1 - 1e-7), tuple(fractions)


def lower_bound(task: ReshardTask, topology: Topology | None = None) -> float:
    """Seconds below which no plan of ``task`` can run on ``topology``: the larger of the inbound
    and the outbound bound of PAPER.md section 6, plus one operation latency."""
    return lower_bound_details(task, topology).seconds
