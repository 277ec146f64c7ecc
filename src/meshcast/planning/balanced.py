"""Sender-balanced pieces: where a send's box has holders behind other NICs, its bytes are cut
into pieces that leave over those NICs, sized so that the NICs' sending loads level out.

A plan's senders are chosen per operation (a whole box from one holder), so where the tiles to
send are few and large and the holders many, some NICs send two boxes while others send one:
e.g. two groups of four GPUs with a NIC each holding the halves of a tensor that three groups of
four need by thirds (paper case 6 on ``h100x8`` hosts): the middle third's four parts go out over
four of the eight NICs, which then carry twice the bytes of the others, and the plan takes
1.56 x the lower bound. :func:`balanced` takes the operations in order of their sender NIC's
load (then bytes, both as the plan has them), and levels each one's bytes between its own NIC
and the least loaded NIC of another holder, given the load the others carry by then: that NIC
gets the bytes that raise it to the sender's level. Two NICs per operation, not all of its
holders': water-filling over all of them cut case 6's parts in three and four, whose receivers
then waited for one piece after another (2.12 x the bound in the plan's order, 1.34 dispatched
again, against 1.23 with two). A piece whose bytes take its NIC less time than one start-up is
not worth its start-up and is left out. Pieces cut the box along its outermost dimension
that is long enough (contiguous runs where the box spans the inner dimensions), one operation
each, in the place of the original; the receivers are the same, so an all-gather after them
still finds its part. A candidate of ``"auto"`` (:mod:`meshcast.planning.auto`), kept only
where it simulates faster.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ..core.boxes import Box, box_size
from ..core.ops import Broadcast, Op, Send
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..core.units import GBIT
from .local_search import other_holders

__all__ = ["balanced"]


def balanced(ops: Sequence[Op], task: ReshardTask, topology: Topology) -> tuple[Op, ...] | None:
    """``ops`` with the sends and broadcasts that leave their host cut into sender-balanced
    pieces (module doc); None where nothing changes."""
    nic_of, host_of_nic = topology.global_nics()
    host_of = topology.hosts_by_rank
    cap = [topology.nic_out_gbps[h] * GBIT for h in host_of_nic]
    start_up = topology.latency_us * 1e-6
    others = other_holders(task, tuple(ops))
    nbytes = [box_size(op.box) * task.itemsize if isinstance(op, (Send, Broadcast)) else 0
              for op in ops]
    load = [0.0] * len(cap)  # seconds each NIC sends
    sent: dict[int, int] = {}  # bytes each rank sends
    leaving = [k for k, op in enumerate(ops) if nbytes[k] and _leaves(op, host_of)]
    for k in leaving:
        load[nic_of[ops[k].src]] += nbytes[k] / cap[nic_of[ops[k].src]]
        sent[ops[k].src] = sent.get(ops[k].src, 0) + nbytes[k]
    pieces: dict[int, list[Op]] = {}
    for k in sorted(leaving, key=lambda k: (-load[nic_of[ops[k].src]], -nbytes[k], k)):
        op = ops[k]
        senders = _senders(op, others[k], nic_of, host_of, sent)
        if len(senders) < 2:
            continue
        n0 = nic_of[op.src]
        load[n0] -= nbytes[k] / cap[n0]
        sent[op.src] -= nbytes[k]
        other = min((n for n in senders if n != n0), key=lambda n: (load[n], n))
        shares = _levelled({n0: load[n0], other: load[other]}, cap, nbytes[k], start_up)
        chosen = [(senders[n], shares[n]) for n in senders if n in shares]
        boxes = _cut(op.box, [share for _, share in chosen])
        parts = [(src, box) for (src, _), box in zip(chosen, boxes) if box_size(box)] \
            if boxes else [(op.src, op.box)]
        for src, box in parts:
            b = box_size(box) * task.itemsize
            load[nic_of[src]] += b / cap[nic_of[src]]
            sent[src] = sent.get(src, 0) + b
        if parts != [(op.src, op.box)]:
            pieces[k] = [op._replace(src=src, box=box) for src, box in parts]
    if not pieces:
        return None
    return tuple(x for k, op in enumerate(ops) for x in pieces.get(k, (op,)))


def _leaves(op: Op, host_of: dict[int, int]) -> bool:
    """Whether ``op`` is a send or broadcast with a receiver on another host than its sender."""
    if isinstance(op, Send):
        return host_of[op.dst] != host_of[op.src]
    return isinstance(op, Broadcast) and any(host_of[r] != host_of[op.src] for r in op.dsts)


def _senders(op: Send | Broadcast, others: tuple[int, ...], nic_of: dict[int, int],
             host_of: dict[int, int], sent: dict[int, int]) -> dict[int, int]:
    """``{NIC: the rank that would send over it}``: ``op``'s sender on its NIC, on each other
    NIC of a holder (none on a receiver's host) the holder that sends the fewest bytes so far
    (the first listed among equals); NICs in order of first appearance."""
    dsts = (op.dst,) if isinstance(op, Send) else op.dsts
    away = {host_of[r] for r in dsts}
    out = {nic_of[op.src]: op.src}
    for r in others:
        n = nic_of[r]
        if host_of[r] in away or n == nic_of[op.src]:
            continue
        if n not in out or sent.get(r, 0) < sent.get(out[n], 0):
            out[n] = r
    return out


def _levelled(load: dict[int, float], cap: list[float], nbytes: int, start_up: float
              ) -> dict[int, float]:
    """``{NIC: bytes}`` for the NICs that get a piece: ``nbytes`` water-filled over ``load``
    (seconds per NIC) at the NICs' rates ``cap``; a NIC whose share would take it less than
    ``start_up`` is left out and the rest filled again (one NIC at least keeps all)."""
    live = dict(load)
    while True:
        shares = _level(live, cap, nbytes)
        small = [n for n, b in shares.items() if b < start_up * cap[n]]
        if not small or len(shares) == 1:
            return shares
        del live[min(small, key=lambda n: (shares[n], n))]


def _level(load: dict[int, float], cap: list[float], nbytes: int) -> dict[int, float]:
    """The bytes of each NIC of ``load`` that ``nbytes`` raise to a common level (seconds),
    filling the least loaded first."""
    order = sorted(load, key=lambda n: (load[n], n))
    rate, base = 0.0, 0.0  # bytes/s of the NICs below the level, and their bytes at it
    level = load[order[0]]
    for j, n in enumerate(order):
        rate += cap[n]
        base += load[n] * cap[n]
        level = (nbytes + base) / rate
        if j + 1 == len(order) or level <= load[order[j + 1]]:
            break
    return {n: (level - load[n]) * cap[n] for n in order if load[n] < level}


def _cut(box: Box, shares: list[float]) -> list[Box] | None:
    """``box`` cut into consecutive pieces in proportion to ``shares`` (one each, some maybe
    empty) along its outermost dimension at least as long as their number; None where none
    is."""
    dims = [d for d in range(len(box)) if box[d].stop - box[d].start >= len(shares)]
    if not dims:
        return None
    d = dims[0]
    lo, n = box[d].start, box[d].stop - box[d].start
    total, acc, edges = sum(shares), 0.0, [lo]
    for s in shares[:-1]:
        acc += s
        edges.append(lo + round(n * acc / total))
    edges.append(box[d].stop)
    return [(*box[:d], slice(a, b), *box[d + 1:]) for a, b in itertools.pairwise(edges)]
