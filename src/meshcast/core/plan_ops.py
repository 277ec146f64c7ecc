"""The operations of a plan read into arrays for :mod:`meshcast.core.plan_check`.

:func:`read_ops` records, in plan order, what every operation reads and writes: ``src`` rows (op
index, position of the sender in the source mesh, box read from its source shard), ``dst`` rows
(op index, position of the receiver in the destination mesh, box delivered) and ``own`` rows
(op index, position of an all-gather member, the part it contributes from its destination
shard). A box is a row of ``d`` starts then ``d`` stops.

The common operations are read all at once (C-level maps and numpy, a few passes over the plan);
a plan with any irregular field is read again one operation at a time, which stops at the first
bad one with a message (:class:`BadOp`).
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import numpy as np

from . import coverage
from .ops import AllGather, Broadcast, Copy, Send
from .task import ReshardTask

__all__ = ["BadOp", "Records", "read_ops"]

Rows = tuple[np.ndarray, np.ndarray, np.ndarray]  # op indices, mesh positions, boxes (n, 2d)


class BadOp(Exception):
    """Operation ``args[1]`` is not well formed; ``args[0]`` says why."""


def _int(value: Any, what: str) -> int:
    """A plain Python int (plans are plain data: JSON holds them exactly), else BadOp."""
    if type(value) is int:
        return value
    raise BadOp(f"{what} must be a Python int, got {value!r} ({type(value).__name__})")


def _ranks_tuple(value: Any, what: str) -> tuple:
    if type(value) is not tuple or not value:
        raise BadOp(f"{what} must be a non-empty tuple of ranks, got {value!r}")
    return value


class Records:
    """What the operations of a plan of ``task`` read and write (module doc): ``rows[kind]``
    once read, ``lists[kind]`` while read one operation at a time."""

    def __init__(self, task: ReshardTask) -> None:
        self.shape = task.shape
        self.src_pos = {r: i for i, r in enumerate(task.src.mesh.devices)}
        self.dst_pos = {r: i for i, r in enumerate(task.dst.mesh.devices)}
        self.lists: dict[str, tuple[list[int], list[int], list[int]]] = {
            k: ([], [], []) for k in ("src", "dst", "own")
        }
        self.rows: dict[str, Rows] = {}

    def flat(self, box: Any, what: str = "box") -> list[int]:
        """``box`` as starts + stops, checked to be a tuple of slices inside the tensor."""
        shape = self.shape
        if type(box) is not tuple or len(box) != len(shape):
            raise BadOp(
                f"{what} {box!r} must be a tuple of {len(shape)} slices (one per dimension of "
                f"the tensor's shape {shape})"
            )
        lo, hi = [], []
        for d, s in enumerate(box):
            if type(s) is not slice or s.step not in (None, 1):
                raise BadOp(f"{what} {box!r} must hold slice(start, stop) objects, got {s!r}")
            a = _int(s.start, f"{what} start"), _int(s.stop, f"{what} stop")
            if not 0 <= a[0] <= a[1] <= shape[d]:
                raise BadOp(
                    f"{what} {coverage.fmt_box(box)} is not inside the tensor of shape {shape} "
                    f"(dimension {d}: need 0 <= start <= stop <= {shape[d]})"
                )
            lo.append(a[0])
            hi.append(a[1])
        return lo + hi

    def rank(self, value: Any, mesh: str, role: str) -> int:
        """The position of rank ``value`` in the source or destination mesh."""
        r = _int(value, f"{role} rank")
        pos = (self.src_pos if mesh == "src" else self.dst_pos).get(r)
        if pos is None:
            name = "source" if mesh == "src" else "destination"
            raise BadOp(f"{role} rank {r} is not in the {name} mesh")
        return pos

    def add(self, kind: str, op: int, pos: int, flat: list[int]) -> None:
        ops, positions, boxes = self.lists[kind]
        ops.append(op)
        positions.append(pos)
        boxes.extend(flat)

    def listed(self, kind: str) -> Rows:
        """The rows recorded one operation at a time."""
        ops, positions, boxes = self.lists[kind]
        return (
            np.array(ops, dtype=np.int64),
            np.array(positions, dtype=np.int64),
            np.array(boxes, dtype=np.int64).reshape(len(ops), 2 * len(self.shape)),
        )


def parse(rec: Records, i: int, op: Any) -> None:
    """Record what operation ``i`` reads and writes; raise BadOp if it is not well formed."""
    if isinstance(op, Copy):
        flat = rec.flat(op.box)
        rec.add("src", i, rec.rank(op.rank, "src", "the copy's"), flat)
        rec.add("dst", i, rec.rank(op.rank, "dst", "the copy's"), flat)
    elif isinstance(op, Send):
        flat = rec.flat(op.box)
        src = rec.rank(op.src, "src", "src")
        dst = rec.rank(op.dst, "dst", "dst")
        if op.src == op.dst:
            raise BadOp(f"src and dst are both rank {op.src} (a move inside a rank is a Copy)")
        rec.add("src", i, src, flat)
        rec.add("dst", i, dst, flat)
    elif isinstance(op, Broadcast):
        flat = rec.flat(op.box)
        rec.add("src", i, rec.rank(op.src, "src", "src"), flat)
        dsts = _ranks_tuple(op.dsts, "dsts")
        if op.src in dsts:
            raise BadOp(f"src rank {op.src} is among its own dsts")
        if len(set(dsts)) != len(dsts):
            raise BadOp(f"dsts {list(dsts)} name a rank more than once")
        for r in dsts:
            rec.add("dst", i, rec.rank(r, "dst", "dsts"), flat)
    elif isinstance(op, AllGather):
        parse_allgather(rec, i, op)
    else:
        raise BadOp(
            f"an operation of unknown type {type(op).__name__} (known: Copy, Send, Broadcast, "
            "AllGather)"
        )


def parse_allgather(rec: Records, i: int, op: AllGather) -> None:
    """Record an all-gather: each member contributes its part and receives the others."""
    box = rec.flat(op.box)
    group = _ranks_tuple(op.group, "group")
    positions = [rec.rank(r, "dst", "group") for r in group]
    if len(set(positions)) != len(positions):
        raise BadOp(f"group {list(group)} names a rank more than once")
    if type(op.parts) is not tuple or len(op.parts) != len(group):
        raise BadOp(f"parts must be a tuple of one box per member of the group ({len(group)})")
    d = len(rec.shape)
    parts = [rec.flat(p, f"part {k}") for k, p in enumerate(op.parts)]
    for k, p in enumerate(parts):
        if any(p[j] >= p[d + j] for j in range(d)):
            raise BadOp(f"part {k} {coverage.fmt_box(op.parts[k])} (of rank {group[k]}) is empty")
        if any(p[j] < box[j] or p[d + j] > box[d + j] for j in range(d)):
            raise BadOp(f"part {k} {coverage.fmt_box(op.parts[k])} is not inside the box")
    wrong = coverage.tiling_error(box, parts)
    if wrong is not None:
        element, count, which = wrong
        raise BadOp(
            f"its parts do not tile its box exactly once: element {element} lies in "
            f"{count} parts {which}"
        )
    for k, pos in enumerate(positions):
        rec.add("own", i, pos, parts[k])
        for j, p in enumerate(parts):
            if j != k:
                rec.add("dst", i, pos, p)


def read_ops(rec: Records, ops: tuple) -> None:
    """Fill ``rec.rows`` from ``ops`` (module doc); raise ``BadOp(why, op index)`` at the first
    operation that is not well formed."""
    kinds = (Copy, Send, Broadcast)
    ids = {k: i for i, k in enumerate((*kinds, AllGather))}
    kind_of = np.fromiter(
        map(ids.get, map(type, ops), itertools.repeat(-1)), dtype=np.int64, count=len(ops)
    )
    chunks: dict[str, list[Rows]] = {"src": [], "dst": [], "own": []}
    regular = not (kind_of < 0).any()
    for k, kind in enumerate(kinds):
        if not regular:
            break
        where = np.flatnonzero(kind_of == k)
        picked = ops if len(where) == len(ops) else [ops[i] for i in where.tolist()]
        got = _read_kind(rec, kind, where, picked)
        regular = got is not None
        if regular:
            for side, rows in got.items():
                chunks[side].append(rows)
    if not regular:  # read every operation one by one: the first bad one raises
        chunks = {side: [] for side in chunks}
        where = np.arange(len(ops))
    else:
        where = np.flatnonzero(kind_of == len(kinds))
    i = 0
    try:
        for i in where.tolist():
            parse(rec, i, ops[i])
    except BadOp as e:
        raise BadOp(str(e), i) from None
    for side in chunks:
        parts = [*chunks[side], rec.listed(side)]
        op_index = np.concatenate([p[0] for p in parts])
        order = np.argsort(op_index, kind="stable")  # plan order
        rec.rows[side] = (
            op_index[order],
            np.concatenate([p[1] for p in parts])[order],
            np.concatenate([p[2] for p in parts])[order],
        )


def _positions(values: list, pos: dict[int, int]) -> np.ndarray | None:
    """Mesh positions of rank ``values`` (plain ints, all in the mesh), else None."""
    if values and set(map(type, values)) != {int}:
        return None
    found = list(map(pos.get, values))
    return None if None in found else np.array(found, dtype=np.int64)


def _boxes(rec: Records, boxes: list) -> np.ndarray | None:
    """``(n, 2d)`` rows of boxes of plain step-less slices inside the tensor, else None."""
    d = len(rec.shape)
    if boxes and (set(map(type, boxes)) != {tuple} or set(map(len, boxes)) != {d}):
        return None
    slices = list(itertools.chain.from_iterable(boxes))
    if slices and (
        set(map(type, slices)) != {slice} or set(map(operator.attrgetter("step"), slices)) != {None}
    ):
        return None
    starts = list(map(operator.attrgetter("start"), slices))
    stops = list(map(operator.attrgetter("stop"), slices))
    if slices and set(map(type, starts)) | set(map(type, stops)) != {int}:
        return None
    try:
        lo = np.array(starts, dtype=np.int64).reshape(len(boxes), d)
        hi = np.array(stops, dtype=np.int64).reshape(len(boxes), d)
    except OverflowError:
        return None
    if ((lo < 0) | (lo > hi) | (hi > np.array(rec.shape, dtype=np.int64))).any():
        return None
    return np.concatenate([lo, hi], axis=1)


def _read_kind(rec: Records, kind: type, where: np.ndarray, ops: list) -> dict[str, Rows] | None:
    """All Copy, Send or Broadcast operations at once (at plan indices ``where``); None if any
    field is irregular (then they are read one by one for the message)."""
    if not ops:
        return {}
    fields = [list(map(operator.itemgetter(k), ops)) for k in range(len(kind._fields))]
    if kind is Copy:
        src, dst, boxes = fields[0], fields[0], fields[1]
    else:
        src, dst, boxes = fields
    a = _positions(src, rec.src_pos)
    box = _boxes(rec, boxes)
    if a is None or box is None:
        return None
    if kind is not Broadcast:
        b = _positions(dst, rec.dst_pos)
        if b is None or (kind is Send and any(map(operator.eq, src, dst))):
            return None
        return {"src": (where, a, box), "dst": (where, b, box)}
    if set(map(type, dst)) != {tuple}:
        return None
    counts = np.fromiter(map(len, dst), dtype=np.int64, count=len(dst))
    flat = list(itertools.chain.from_iterable(dst))
    b = _positions(flat, rec.dst_pos)
    if b is None or not counts.min():
        return None
    senders = np.repeat(np.array(src, dtype=np.int64), counts)
    if (senders == np.array(flat, dtype=np.int64)).any():
        return None  # a sender among its own dsts
    owner = np.repeat(where, counts)
    order = np.lexsort((b, owner))
    if ((np.diff(owner[order]) == 0) & (np.diff(b[order]) == 0)).any():
        return None  # a rank twice among one broadcast's dsts
    return {"src": (where, a, box), "dst": (owner, b, np.repeat(box, counts, axis=0))}
