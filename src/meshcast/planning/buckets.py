"""The buckets of the schedule of many tensors (:func:`meshcast.planning.many.build_schedule`):
which point-to-point movements go together, under a bound on the bytes each rank stages.

A bucket's messages are posted together and a rank goes on to the next bucket once its own are
done, so what moves at once is what shares a bucket. Taken plan by plan, a model whose pipeline
stages sit on different hosts filled bucket after bucket with one stage's tensors (an embedding
alone fills several) while the other stages' hosts idled, and with a bound near one message per
receiving rank a bucket closed as soon as one receiver was full, however idle the others were.
So the operations go into *lanes* by the hosts they connect (a sender's host and the first
receiving host; a plan with all-gathers, whose parts arrive in earlier operations, stays whole in
one lane, in plan order), and each bucket is filled by taking the next operation of the lane
that has given the fewest bytes so far whose next operation still fits, until none fits (ties:
the lane seen first). An operation whose staging exceeds a part of the bound
(:data:`PIECES_PER_BUCKET`) is cut into parts along its box's longest dimension, so that a
receiver's share of a bucket can come from several senders at once (all-gathers are never
cut). Every other operation reads only its sender's source shard (a broadcast's relays are
inside the operation), so any order of them moves the same data. Pure: the same on every
rank. docs/weight-sync.md ("Measured: two jobs") has the measurement.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from ..core.boxes import Box, box_size, split_box
from ..core.ops import AllGather, Broadcast, Copy, Op, Send, broadcast_chain
from ..core.plan import Plan

__all__ = ["PIECES_PER_BUCKET", "Xfer", "cut_buckets"]

PIECES_PER_BUCKET = 8
"""An operation whose staging on some rank exceeds this fraction of the bound is cut into parts
(all-gathers are never cut), so that a bucket can take, for each receiving rank, parts from
several lanes (several sending hosts at once) rather than one message that fills it. Measured on
the two-job weight bench (docs/weight-sync.md): 2, 4, 8 and 16 parts gave 0.86, 0.85, 0.89 and
0.89 of the joint bound; 8 keeps messages of 4 MiB at the default bound."""


class Xfer(NamedTuple):
    """One point-to-point movement: ``src`` sends ``box`` of tensor ``tensor`` to ``dst``, from its
    destination shard where ``from_out`` (it received the box earlier), else its source shard."""

    src: int
    dst: int
    tensor: int
    box: Box
    from_out: bool


def _expand(op: Op, k: int, host_of: dict[int, int]) -> list[Xfer]:
    """The point-to-point movements of operation ``op`` of tensor ``k``."""
    if isinstance(op, Send):
        return [Xfer(op.src, op.dst, k, op.box, False)]
    if isinstance(op, Broadcast):
        out, prev = [], None
        for leader, members in broadcast_chain(op, host_of):
            if prev is not None:
                out.append(Xfer(prev, leader, k, op.box, prev != op.src))
            out.extend(Xfer(leader, r, k, op.box, leader != op.src) for r in members)
            prev = leader
        return out
    if isinstance(op, AllGather):
        return [Xfer(i, j, k, part, True) for i, part in zip(op.group, op.parts)
                for j in op.group if j != i]
    raise TypeError(f"plan has an operation of unknown type {type(op).__name__}")


def _staging(xfers: list[Xfer], itemsize: int) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for x in xfers:
        n = box_size(x.box) * itemsize
        out[x.src] += n
        out[x.dst] += n
    return out


class _Piece(NamedTuple):
    xfers: list[Xfer]
    need: dict[int, int]  # staged bytes per rank
    nbytes: int  # bytes it gives (its box)


def _pieces(op: Op, k: int, plan: Plan, bucket_bytes: int) -> list[_Piece]:
    """``op`` (of tensor ``k``) as one piece, or in parts where its staging exceeds the part of
    the bound it may take (:data:`PIECES_PER_BUCKET`)."""
    itemsize = plan.task.itemsize
    xfers = _expand(op, k, plan.topology.hosts_by_rank)
    need = _staging(xfers, itemsize)
    worst = max(need.values(), default=0)
    cap = max(1, bucket_bytes // PIECES_PER_BUCKET)
    if worst <= cap or isinstance(op, AllGather) or not op.box:  # (a 0-d element is whole)
        return [_Piece(xfers, need, box_size(op.box) * itemsize)]
    longest = max(s.stop - s.start for s in op.box)
    out = []
    for box in split_box(op.box, max(1, min(-(-worst // cap), longest))) or (op.box,):
        part = [x._replace(box=box) for x in xfers]
        out.append(_Piece(part, _staging(part, itemsize), box_size(box) * itemsize))
    return out


def _lanes(plans: Sequence[Plan]) -> list[list[tuple[int, Op]]]:
    """The network operations of ``plans`` in lanes (module doc), lanes in order of first
    appearance, each lane's operations in plan order."""
    lanes: dict[tuple, list[tuple[int, Op]]] = {}
    for k, p in enumerate(plans):
        host_of = p.topology.hosts_by_rank
        ops = [op for op in p.ops if not isinstance(op, Copy)]
        if any(isinstance(op, AllGather) for op in ops):
            senders = {host_of[r] for op in ops
                       for r in (op.group if isinstance(op, AllGather) else (op.src,))}
            lanes.setdefault(("whole", *sorted(senders)), []).extend((k, op) for op in ops)
            continue
        for op in ops:
            first = op.dst if isinstance(op, Send) else op.dsts[0]
            lanes.setdefault((host_of[op.src], host_of[first]), []).append((k, op))
    return list(lanes.values())


def cut_buckets(plans: Sequence[Plan], bucket_bytes: int
                ) -> tuple[list[tuple[int, int, Box]], list[list[Xfer]], dict[int, int]]:
    """The copies ``(tensor, rank, box)``, the buckets of point-to-point movements (module doc)
    and the most each rank stages in one bucket."""
    copies = [(k, op.rank, op.box) for k, p in enumerate(plans) for op in p.ops
              if isinstance(op, Copy)]
    lanes = _lanes(plans)
    queues: list[list[_Piece]] = [[] for _ in lanes]
    heap = [(0, i, 0) for i in range(len(lanes))]  # (bytes given, lane, next operation)
    buckets: list[list[Xfer]] = []
    staging: dict[int, int] = defaultdict(int)
    while heap:
        bucket: list[Xfer] = []
        load: dict[int, int] = defaultdict(int)
        blocked = []
        while heap:
            given, i, at = heapq.heappop(heap)
            if not queues[i]:
                k, op = lanes[i][at]
                queues[i] = _pieces(op, k, plans[k], bucket_bytes)
            piece = queues[i][0]
            if bucket and any(load[r] + n > bucket_bytes for r, n in piece.need.items()):
                blocked.append((given, i, at))  # nothing fits it in this bucket any more
                continue
            bucket.extend(piece.xfers)
            for r, n in piece.need.items():
                load[r] += n
            queues[i].pop(0)
            nxt = at + (not queues[i])
            if queues[i] or nxt < len(lanes[i]):
                heapq.heappush(heap, (given + piece.nbytes, i, nxt))
        buckets.append(bucket)
        for r, n in load.items():
            staging[r] = max(staging[r], n)
        heap = blocked
        heapq.heapify(heap)
    return copies, buckets, dict(staging)
