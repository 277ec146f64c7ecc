"""``"auto"``'s plan for large tasks, built without simulating candidates (vectorised), and its
exact time where that can be had without the simulator.

One broadcast per unit slice, senders in turn among the holders of each source tile, ordered in
rank-disjoint rounds (a Latin square when every sender sends to every receiver, else a
first-fit colouring); where NICs are shared also a phased order that overlaps the start-ups of
some of each NIC's ranks with the others' transfers (:mod:`.phased`). Where no NIC serves two
ranks the plan's simulated time is evaluated exactly round by round (:mod:`.exact_rounds`).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

from ..core.boxes import Box, box_size
from ..core.indexing import position_coder
from ..core.ops import Broadcast, Copy, Op, Send, broadcast_chain
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from .dispatch import first_fit_rounds
from .exact_rounds import by_round, rounds_end, sends_rounds_time
from .items import Nets
from .phased import bipartite_components, phased_sends

__all__ = ["LargePlans", "large_plan", "unshared_nics"]


def unshared_nics(topology: Topology) -> bool:
    """Whether every NIC serves one rank at most (then no two transfers ever share a NIC: a NIC
    is loaded only by operations of its one rank, which that rank runs one after another)."""
    return all(
        -(-len(ranks) // k) <= 1 for ranks, k in zip(topology.hosts, topology.nics_per_host)
    )


def _op_rate(op: Op, topology: Topology, nets: Nets) -> float:
    """Bytes/s of ``op`` when it shares no NIC: the slowest NIC on its route, and ``intra_gbps``
    when it fans out inside a host (:func:`meshcast.simulate`'s rules for a lone transfer)."""
    host_of, nic = nets.host_of, nets.nic
    rates: list[float] = []
    fan = False
    if isinstance(op, Send):
        if host_of[op.src] == host_of[op.dst]:
            return nets.intra
        return min(nets.out_bw[nic[op.src]], nets.in_bw[nic[op.dst]])
    assert isinstance(op, Broadcast)
    prev = None
    for leader, members in broadcast_chain(op, host_of):
        if prev is not None:
            rates += [nets.out_bw[nic[prev]], nets.in_bw[nic[leader]]]
        fan = fan or bool(members)
        prev = leader
    if fan:
        rates.append(nets.intra)
    return min(rates) if rates else nets.intra


def _rounds(senders: list[int], remotes: list[tuple[int, ...]]) -> np.ndarray:
    """A round per operation such that the operations of one round share no rank.

    Where the sends form complete bipartite graphs (:func:`~.phased.bipartite_components`: an
    all-to-all, or disjoint groups of ranks that exchange all-to-all), a Latin square in each:
    as few rounds as the busiest rank needs. Otherwise a greedy colouring: each operation into
    the first round in which none of its ranks is busy (bit masks per rank).
    """
    components = bipartite_components(senders, remotes)
    if components is not None:
        return components.latin_rounds()
    resources = [(sender, *remote) for sender, remote in zip(senders, remotes)]
    return np.array(first_fit_rounds(resources, range(len(senders))), dtype=np.int64)


class _LargeSends(NamedTuple):
    """The network slices of a large task with their senders: slice ``keep[k]`` goes from
    ``senders[k]`` to ``remotes[k]``."""

    copies: list[Op]
    keep: list[int]
    senders: list[int]
    remotes: list[tuple[int, ...]]
    boxes: list[Box]
    sizes: np.ndarray


def _large_sends(task: ReshardTask) -> _LargeSends:
    """Copies and network slices of ``task``, vectorised: senders in turn among the holders of
    each source tile."""
    dec = task.decomposition
    n = len(dec)
    src_t = dec.src_tile
    by_tile = np.argsort(src_t, kind="stable")
    first = np.searchsorted(src_t[by_tile], src_t[by_tile], side="left")
    pos = np.empty(n, dtype=np.int64)
    pos[by_tile] = np.arange(n) - first
    n_holders = np.array([len(h) for h in dec.holders_of_tile], dtype=np.int64)
    pick = pos % n_holders[src_t]
    holders_of, receivers_of = dec.holders_of_tile, dec.receivers_of_tile
    # per (source tile, destination tile) pair: receivers holding the slice, and the others
    n_dst = max(len(receivers_of), 1)
    pairs, inverse = np.unique(src_t * n_dst + dec.dst_tile, return_inverse=True)
    local_of: list[tuple[int, ...]] = []
    remote_of: list[tuple[int, ...]] = []
    if set(task.src.mesh.devices).isdisjoint(task.dst.mesh.devices):  # nobody holds its own
        remote_of = [receivers_of[pr] for pr in (pairs % n_dst).tolist()]
        local_of = [()] * len(remote_of)
    else:
        for pr in pairs.tolist():
            held = set(holders_of[pr // n_dst])
            want = receivers_of[pr % n_dst]
            local_of.append(tuple(r for r in want if r in held))
            remote_of.append(tuple(r for r in want if r not in held))
    flat_holders = np.fromiter(itertools.chain.from_iterable(holders_of), dtype=np.int64)
    first_holder = np.concatenate(([0], np.cumsum(n_holders)[:-1]))
    sender_of = flat_holders[first_holder[src_t] + pick].tolist()
    boxes = dec.boxes()
    inv = inverse.ravel().tolist()
    copies: list[Op] = [
        Copy(r, boxes[i]) for i, q in enumerate(inv) if local_of[q] for r in local_of[q]
    ]
    keep = [i for i, q in enumerate(inv) if remote_of[q]]
    senders = [sender_of[i] for i in keep]
    remotes = [remote_of[inv[i]] for i in keep]
    return _LargeSends(copies, keep, senders, remotes, boxes, dec.sizes())


class LargePlans(NamedTuple):
    """What :func:`large_plan` builds: the plan in rank-disjoint rounds (None where pruned), its
    exact simulated time (None unless no NIC serves two ranks), the phased order (None where
    it does not apply or is pruned)."""

    rounds: Plan | None
    exact: float | None
    phased: Plan | None


def large_plan(task: ReshardTask, topology: Topology, *, prune: bool = False) -> LargePlans:
    """``"auto"``'s plans for large tasks: one broadcast per slice, senders in turn among the
    holders of each source tile (vectorised), ordered in rank-disjoint rounds, and where NICs
    are shared the same sends in the order of :func:`~.phased.phased_sends` when that applies.

    With ``prune``, of the two orders only the one that :func:`~.phased.phase_model` predicts
    faster is built where the model applies (:class:`~.phased.Phased` ``gain``; both
    otherwise)."""
    ls = _large_sends(task)
    copies, keep, senders, remotes, boxes = ls.copies, ls.keep, ls.senders, ls.remotes, ls.boxes
    if unshared_nics(topology):
        ops, order_a, slot = _round_ops(ls)
        exact = _exact_time(task, topology, ls, ops, order_a, slot)
        return LargePlans(_rounds_plan(task, topology, ls, ops, order_a), exact, None)
    phased = phased_sends(senders, remotes, [boxes[i] for i in keep],
                          ls.sizes[keep] * task.itemsize, topology)
    ph = None if phased is None else Plan(task, (*copies, *phased.ops), "broadcast", "auto",
                                          topology)
    if prune and phased is not None and phased.gain is not None:
        if phased.gain > 1:
            return LargePlans(None, None, ph)
        ph = None
    ops, order_a, _ = _round_ops(ls)
    return LargePlans(_rounds_plan(task, topology, ls, ops, order_a), None, ph)


def _round_ops(ls: _LargeSends) -> tuple[list[Op], np.ndarray, np.ndarray]:
    """The operations of ``ls`` (a send or a broadcast per slice), their order in rank-disjoint
    rounds (largest first within a round) and each one's round."""
    ops: list[Op] = [
        Send(a, rem[0], ls.boxes[i]) if len(rem) == 1 else Broadcast(a, rem, ls.boxes[i])
        for i, a, rem in zip(ls.keep, ls.senders, ls.remotes)
    ]
    slot = _rounds(ls.senders, ls.remotes)
    order_a = np.lexsort((np.arange(len(ops)), -ls.sizes[ls.keep] if ls.keep else [], slot))
    return ops, order_a, slot


def _rounds_plan(task: ReshardTask, topology: Topology, ls: _LargeSends, ops: list[Op],
                 order_a: np.ndarray) -> Plan:
    return Plan(task, (*ls.copies, *(ops[j] for j in order_a.tolist())), "broadcast", "auto",
                topology)


def _exact_time(
    task: ReshardTask,
    topology: Topology,
    ls: _LargeSends,
    ops: list[Op],
    order_a: np.ndarray,
    slot: np.ndarray,
) -> float:
    """The exact time (:mod:`.exact_rounds`) of the large plan (``ops`` in the order
    ``order_a``, rounds ``slot``) on a topology where no NIC serves two ranks."""
    senders, remotes, keep, sizes = ls.senders, ls.remotes, ls.keep, ls.sizes
    nets = Nets(topology)
    itemsize = task.itemsize
    copy_end: dict[int, float] = {}
    for c in ls.copies:  # one rank each, zero latency, one after another
        assert isinstance(c, Copy)
        copy_end[c.rank] = copy_end.get(c.rank, 0.0) + box_size(c.box) * itemsize / nets.intra
    counts = 1 + np.fromiter((len(r) for r in remotes), dtype=np.int64, count=len(remotes))
    nbytes = sizes[np.asarray(keep, dtype=np.int64)[order_a]] * itemsize if keep else sizes[:0]
    slots = slot[order_a] if keep else np.zeros(0, dtype=np.int64)
    if len(ops) and int(counts.max()) == 2:  # sends only: vectorised
        snd = np.array(senders, dtype=np.int64)[order_a]
        rcv = np.array([r[0] for r in remotes], dtype=np.int64)[order_a]
        return sends_rounds_time(topology, copy_end, by_round(slots, snd, rcv, nbytes), nets)
    order = order_a.tolist()
    dur = nbytes / np.array([_op_rate(ops[j], topology, nets) for j in order])
    ranks = np.array(sorted(topology.hosts_by_rank), dtype=np.int64)
    flat = position_coder(ranks)(np.fromiter(
        itertools.chain.from_iterable((senders[j], *remotes[j]) for j in order),
        dtype=np.int64,
    ))
    counts = counts[order_a] if len(ops) else counts
    offsets = np.concatenate(([0], np.cumsum(counts)))
    rounds = ((flat[offsets[i[0]] : offsets[i[-1] + 1]], d, c)
              for i, d, c in by_round(slots, np.arange(len(counts)), dur, counts))
    return rounds_end(topology, copy_end, ranks, rounds)
