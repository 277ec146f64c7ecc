"""Strategy floors: a time below which no plan of one fixed strategy can simulate, whatever its
senders and order (so whatever its balance: ``"none"``, ``"size"`` or ``"order"``).

A fixed strategy fixes which operations each receiver takes part in; only the senders and the
order are open. In :func:`meshcast.simulate` a rank runs its operations one after another and an
operation lasts at least its latency plus its bytes at its route's slowest capacity when it
shares nothing (a fair share is never above a capacity), so a receiver is busy at least the sum,
over its operations, of that duration at the fastest route any holder could give it. A NIC
carries at most its capacity, and nothing before a first latency. Per strategy:

* ``send_recv``: one ``Send`` per (slice, remote receiver) from a holder, at the fastest any
  holder gives it (``intra_gbps`` from the receiver's host, ``min(holder NIC out, receiver NIC
  in)`` from another), and its bytes cross the receiver's inbound NIC when no holder shares its
  host;
* ``broadcast``: one operation per slice with all its remote receivers (a ``Send`` when there is
  one): intra-host speed if a holder's host holds every receiver, else at most the sender's
  outbound NIC and every other receiving host's best inbound NIC, and no faster than
  ``intra_gbps`` when it fans out inside a host;
* ``allgather``: per receiving host, a part per receiver (as ``send_recv``) and one
  ``AllGather`` of the whole slice (``latency + (slice - smallest part) / intra_gbps``), or
  ``send_recv`` where the strategy falls back to point-to-point. The receiver of the part that
  crosses an inbound NIC last still runs its ``AllGather`` after it, so the NIC's bound gains
  the shortest such ``AllGather`` of its receivers (nothing where one of them falls back);
* every strategy: the same copies (``bytes / intra_gbps`` each, no latency).

The floor is the largest of these and the task's :func:`meshcast.lower_bound` (which holds for
every plan). ``"auto"`` uses it to skip building a strategy's fixed plans when its own best plan
is already no slower (:mod:`meshcast.planning.auto`). Linear in the unit slices.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np

from ..core.boxes import box_size
from ..core.task import ReshardTask, iter_slices
from ..core.topology import Topology
from ..estimate.lower_bound import LowerBound
from ..estimate.simulate import copy_send_floor
from .fixed import STRATEGIES, allgather_groups
from .items import Nets

__all__ = ["first_holder_floor", "strategy_floors"]


def strategy_floors(task: ReshardTask, topology: Topology, lbd: LowerBound) -> dict[str, float]:
    """``{strategy: seconds}`` for every strategy of :data:`~meshcast.planning.fixed.STRATEGIES`:
    no plan of that strategy (any senders, any order) simulates faster (module doc). ``lbd``
    is the task's :func:`~meshcast.estimate.lower_bound.lower_bound_details` on ``topology``."""
    nets = Nets(topology)
    busy = {s: defaultdict(float) for s in STRATEGIES}  # strategy -> rank -> seconds
    nic_in = {s: defaultdict(float) for s in STRATEGIES}  # strategy -> NIC -> bytes
    tail: dict[int, float] = {}  # allgather: NIC -> least time a receiver still works after
    host_of, lat, intra = nets.host_of, nets.lat, nets.intra
    for sl in iter_slices(task):
        for r in sl.local:
            for s in STRATEGIES:
                busy[s][r] += sl.nbytes / intra
        if not sl.remote:
            continue
        hosts = {host_of[h] for h in sl.holders}
        send = {r: _send_rate(nets, sl.holders, r) for r in sl.remote}
        for r, rate in send.items():
            busy["send_recv"][r] += lat + sl.nbytes / rate
            if host_of[r] not in hosts:
                nic_in["send_recv"][nets.nic[r]] += sl.nbytes
        one = lat + sl.nbytes / _broadcast_rate(nets, sl.holders, sl.remote)
        for r in sl.remote:
            busy["broadcast"][r] += one
        for group, parts in allgather_groups(sl.index, sl.box, sl.remote, host_of, []):
            sizes = [sl.nbytes] * len(group) if parts is None else [
                box_size(p) * task.itemsize for p in parts
            ]
            gather = 0.0 if parts is None else lat + (sl.nbytes - min(sizes)) / intra
            for r, nbytes in zip(group, sizes):
                busy["allgather"][r] += lat + nbytes / send[r] + gather
                if host_of[r] not in hosts:
                    k = nets.nic[r]
                    nic_in["allgather"][k] += nbytes
                    tail[k] = min(tail.get(k, gather), gather)
    out = {}
    for s in STRATEGIES:
        after = tail if s == "allgather" else {}
        nic = max((b / nets.in_bw[k] + after.get(k, 0.0) for k, b in nic_in[s].items()),
                  default=0.0)
        out[s] = max(lbd.seconds, max(busy[s].values(), default=0.0), lat + nic if nic else 0.0)
    return out


def _send_rate(nets: Nets, holders: tuple[int, ...], r: int) -> float:
    """The fastest a ``Send`` of a holder to ``r`` can move when it shares nothing: inside a
    host at ``intra_gbps``, across at the slower of the two NICs."""
    host_of, nic = nets.host_of, nets.nic
    return max(nets.intra if host_of[h] == host_of[r]
               else min(nets.out_bw[nic[h]], nets.in_bw[nic[r]]) for h in holders)


def _broadcast_rate(nets: Nets, holders: tuple[int, ...], remote: tuple[int, ...]) -> float:
    """The fastest the strategy's one operation from a holder to every rank of ``remote`` can
    move when it shares nothing (an upper bound: forwarding links are left out)."""
    nic, host_of = nets.nic, nets.host_of
    if len(remote) == 1:
        return _send_rate(nets, holders, remote[0])
    best_in: dict[int, float] = {}
    for r in remote:
        best_in[host_of[r]] = max(best_in.get(host_of[r], 0.0), nets.in_bw[nic[r]])
    best_out: dict[int, float] = {}
    for h in holders:
        best_out[host_of[h]] = max(best_out.get(host_of[h], 0.0), nets.out_bw[nic[h]])
    rate = 0.0
    for hs, out in best_out.items():
        entered = [v for h, v in best_in.items() if h != hs]
        if not entered:
            return nets.intra  # every receiver on the sender's host
        fans = len(remote) > len(entered)  # some host gets two or more, or the sender's has one
        rate = max(rate, min(out, *entered, *((nets.intra,) if fans else ())))
    return rate


def first_holder_floor(task: ReshardTask, topology: Topology) -> float:
    """:func:`meshcast.time_floor` of ``fixed_plan(task, topology, "send_recv", "none")``
    without building the plan: per unit slice in order, a copy on each receiver that holds it,
    then a send from the first holder of its source tile to each receiver that does not (the
    same number: :func:`~meshcast.estimate.simulate.copy_send_floor`). Vectorised where the
    meshes share no rank (then no receiver holds anything)."""
    dec = task.decomposition
    holders_of, receivers_of = dec.holders_of_tile, dec.receivers_of_tile
    nbytes = dec.sizes() * task.itemsize
    if set(task.src.mesh.devices).isdisjoint(task.dst.mesh.devices):
        first = np.array([h[0] for h in holders_of], dtype=np.int64)
        count = np.array([len(r) for r in receivers_of], dtype=np.int64)
        flat = np.fromiter(itertools.chain.from_iterable(receivers_of), dtype=np.int64)
        start = np.concatenate(([0], np.cumsum(count)[:-1]))
        per = count[dec.dst_tile]
        within = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
        srcs = np.repeat(first[dec.src_tile], per)
        dsts = flat[np.repeat(start[dec.dst_tile], per) + within]
        return copy_send_floor(srcs.tolist(), dsts.tolist(), np.repeat(nbytes, per).tolist(),
                               topology)
    n_dst = max(len(receivers_of), 1)
    pairs, inverse = np.unique(dec.src_tile * n_dst + dec.dst_tile, return_inverse=True)
    steps_of: list[list[tuple[int, int]]] = []
    for pr in pairs.tolist():
        holders = holders_of[pr // n_dst]
        want = receivers_of[pr % n_dst]
        steps_of.append([(-1, r) for r in want if r in holders]
                        + [(holders[0], r) for r in want if r not in holders])
    inv = inverse.ravel()
    counts = np.array([len(x) for x in steps_of], dtype=np.int64)[inv]
    steps = list(itertools.chain.from_iterable(steps_of[q] for q in inv.tolist()))
    return copy_send_floor([a for a, _ in steps], [b for _, b in steps],
                           np.repeat(nbytes, counts).tolist(), topology)
