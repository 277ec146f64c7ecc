"""The plan check: a plan is run only if it delivers exactly the destination layout.

:func:`check_plan` verifies, before any byte moves, that

* every operation is well formed: a known kind, integer ranks, boxes as tuples of ``slice(start,
  stop)`` inside the tensor; a ``Copy``'s rank in both meshes, senders in the source mesh,
  receivers and all-gather members in the destination mesh; a ``Send`` between two ranks, a
  ``Broadcast`` to distinct ranks other than its sender, an ``AllGather`` of distinct members
  with one non-empty part each, the parts tiling its box exactly once;
* every operation reads only what its sender holds: the box of a ``Copy``, ``Send`` or
  ``Broadcast`` lies in the sender's source shard, and each all-gather member contributes a part
  of its destination shard that earlier operations (in plan order) delivered to it;
* every receiver's boxes lie in its destination shard, and together they deliver every element
  of it exactly once.

Coverage is decided exactly and in time linear in the plan: the indicator function of a box is a
signed sum of orthant indicators at its ``2^d`` corners (``+`` at the lower corner, a sign flip
per upper coordinate), and orthant indicators at distinct points are linearly independent. So the
boxes delivered to a rank sum to its destination box, point by point, exactly when their signed
corners, added up, cancel the destination box's corners: one sort of ``2^d`` corners per
delivered box, where ``d`` counts only the dimensions some box does not span whole. Where they
do not cancel, the smallest uncancelled corner (in lexicographic order) is an element delivered
zero or several times; the message names it, the region around it and the operations involved.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import coverage
from .plan import AllGather, Broadcast, Copy, Plan, Send
from .task import ReshardTask
from .topology import Topology

__all__ = ["check_plan", "plan_error"]


def check_plan(plan: Plan) -> None:
    """Raise ``ValueError`` naming the first missing or wrong region (rank, box, operation index)
    if ``plan`` does not deliver its destination layout exactly (module doc). The verdict is kept
    on the plan, so a plan is checked once however often it runs."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a meshcast.Plan, got {type(plan).__name__}")
    plan.check()


class _Bad(Exception):
    """An operation field that is not well formed (the message says why)."""


def _int(value: Any, what: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, np.integer):
        return int(value)
    raise _Bad(f"{what} must be an integer, got {value!r}")


def fmt_box(box: Any) -> str:
    """``[0:4, 8:16]`` for a well-formed box, its repr otherwise."""
    try:
        return "[" + ", ".join(f"{s.start}:{s.stop}" for s in box) + "]"
    except (AttributeError, TypeError):
        return repr(box)


def _describe(op: Any) -> str:
    if isinstance(op, Copy):
        return f"copy on rank {op.rank} of {fmt_box(op.box)}"
    if isinstance(op, Send):
        return f"send {op.src}->{op.dst} of {fmt_box(op.box)}"
    if isinstance(op, Broadcast):
        return f"broadcast from {op.src} to {list(op.dsts)} of {fmt_box(op.box)}"
    if isinstance(op, AllGather):
        return f"allgather among {list(op.group)} of {fmt_box(op.box)}"
    return type(op).__name__


class _Records:
    """The boxes each operation reads and writes, flattened in plan order for the vector checks.

    ``src``: (op, position in the source mesh, box) for data read from a source shard;
    ``dst``: (op, position in the destination mesh, box) for every delivery;
    ``own``: (op, position in the destination mesh, part) for every all-gather contribution.
    A box is stored as its ``d`` starts then its ``d`` stops.
    """

    def __init__(self, task: ReshardTask) -> None:
        self.shape = task.shape
        self.src_pos = {r: i for i, r in enumerate(task.src.mesh.devices)}
        self.dst_pos = {r: i for i, r in enumerate(task.dst.mesh.devices)}
        self.lists: dict[str, tuple[list[int], list[int], list[int]]] = {
            k: ([], [], []) for k in ("src", "dst", "own")
        }
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def flat(self, box: Any, what: str = "box") -> list[int]:
        """``box`` as starts + stops, checked to be a tuple of slices inside the tensor."""
        shape = self.shape
        if type(box) is not tuple or len(box) != len(shape):
            raise _Bad(
                f"{what} {box!r} must be a tuple of {len(shape)} slices (one per dimension of "
                f"the tensor's shape {shape})"
            )
        lo, hi = [], []
        for d, s in enumerate(box):
            if type(s) is not slice or s.step not in (None, 1):
                raise _Bad(f"{what} {box!r} must hold slice(start, stop) objects, got {s!r}")
            a = _int(s.start, f"{what} start"), _int(s.stop, f"{what} stop")
            if not 0 <= a[0] <= a[1] <= shape[d]:
                raise _Bad(
                    f"{what} {fmt_box(box)} is not inside the tensor of shape {shape} "
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
            raise _Bad(f"{role} rank {r} is not in the {name} mesh")
        return pos

    def add(self, kind: str, op: int, pos: int, flat: list[int]) -> None:
        ops, positions, boxes = self.lists[kind]
        ops.append(op)
        positions.append(pos)
        boxes.extend(flat)

    def arrays(self, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(op indices, mesh positions, boxes ``(n, 2d)``) as int64 arrays (after
        :meth:`plausible`)."""
        return self._arrays[kind]

    def plausible(self) -> bool:
        """Whether every recorded box coordinate is an int64 integer with ``0 <= start <= stop
        <= size`` (the fast path records boxes unchecked); builds the arrays."""
        shape = np.array(self.shape, dtype=np.int64)
        d = len(self.shape)
        self._arrays = {}
        for kind, (ops, positions, boxes) in self.lists.items():
            try:
                table = np.array(boxes) if boxes else np.zeros(0, dtype=np.int64)
            except (OverflowError, ValueError):
                return False
            if table.dtype != np.int64 or table.ndim != 1:
                return False
            table = table.reshape(len(ops), 2 * d)
            lo, hi = table[:, :d], table[:, d:]
            if ((lo < 0) | (lo > hi) | (hi > shape)).any():
                return False
            self._arrays[kind] = (
                np.array(ops, dtype=np.int64),
                np.array(positions, dtype=np.int64),
                table,
            )
        return True


def _ranks_tuple(value: Any, what: str) -> tuple:
    if type(value) is not tuple or not value:
        raise _Bad(f"{what} must be a non-empty tuple of ranks, got {value!r}")
    return value


def _parse(rec: _Records, i: int, op: Any) -> None:
    """Record what operation ``i`` reads and writes; raise _Bad if it is not well formed."""
    if isinstance(op, Copy):
        flat = rec.flat(op.box)
        rec.add("src", i, rec.rank(op.rank, "src", "the copy's"), flat)
        rec.add("dst", i, rec.rank(op.rank, "dst", "the copy's"), flat)
    elif isinstance(op, Send):
        flat = rec.flat(op.box)
        src = rec.rank(op.src, "src", "src")
        dst = rec.rank(op.dst, "dst", "dst")
        if op.src == op.dst:
            raise _Bad(f"src and dst are both rank {op.src} (a move inside a rank is a Copy)")
        rec.add("src", i, src, flat)
        rec.add("dst", i, dst, flat)
    elif isinstance(op, Broadcast):
        flat = rec.flat(op.box)
        rec.add("src", i, rec.rank(op.src, "src", "src"), flat)
        dsts = _ranks_tuple(op.dsts, "dsts")
        if op.src in dsts:
            raise _Bad(f"src rank {op.src} is among its own dsts")
        if len(set(dsts)) != len(dsts):
            raise _Bad(f"dsts {list(dsts)} name a rank more than once")
        for r in dsts:
            rec.add("dst", i, rec.rank(r, "dst", "dsts"), flat)
    elif isinstance(op, AllGather):
        _parse_allgather(rec, i, op)
    else:
        raise _Bad(
            f"an operation of unknown type {type(op).__name__} (known: Copy, Send, Broadcast, "
            "AllGather)"
        )


def _parse_allgather(rec: _Records, i: int, op: AllGather) -> None:
    box = rec.flat(op.box)
    group = _ranks_tuple(op.group, "group")
    positions = [rec.rank(r, "dst", "group") for r in group]
    if len(set(positions)) != len(positions):
        raise _Bad(f"group {list(group)} names a rank more than once")
    if type(op.parts) is not tuple or len(op.parts) != len(group):
        raise _Bad(f"parts must be a tuple of one box per member of the group ({len(group)})")
    d = len(rec.shape)
    parts = [rec.flat(p, f"part {k}") for k, p in enumerate(op.parts)]
    for k, p in enumerate(parts):
        if any(p[j] >= p[d + j] for j in range(d)):
            raise _Bad(f"part {k} {fmt_box(op.parts[k])} (of rank {group[k]}) is empty")
        if any(p[j] < box[j] or p[d + j] > box[d + j] for j in range(d)):
            raise _Bad(f"part {k} {fmt_box(op.parts[k])} is not inside the box")
    wrong = coverage.tiling_error(box, parts)
    if wrong is not None:
        element, count, which = wrong
        raise _Bad(
            f"its parts do not tile its box exactly once: element {element} lies in "
            f"{count} parts {which}"
        )
    for k, pos in enumerate(positions):
        rec.add("own", i, pos, parts[k])
        for j, p in enumerate(parts):
            if j != k:
                rec.add("dst", i, pos, p)


def plan_error(plan: Plan) -> str | None:
    """Why ``plan`` must not run (module doc), or None if it is sound."""
    task = plan.task
    if not isinstance(task, ReshardTask):
        return f"plan.task must be a meshcast.ReshardTask, got {type(task).__name__}"
    if not isinstance(plan.topology, Topology):
        return f"plan.topology must be a meshcast.Topology, got {type(plan.topology).__name__}"
    if type(plan.ops) is not tuple:
        return f"plan.ops must be a tuple of operations, got {type(plan.ops).__name__}"
    try:
        plan.topology.covers(plan.ranks)
    except ValueError as e:
        return f"plan.topology: {e}"
    rec = _Records(task)
    try:
        _collect(rec, plan.ops, fast=True)
        if not rec.plausible():  # a box field is off: find the first bad op precisely
            rec = _Records(task)
            _collect(rec, plan.ops, fast=False)
            if not rec.plausible():  # pragma: no cover - the precise pass raises first
                return "a box coordinate is not an integer inside the tensor"
    except _Bad as e:
        i, op = e.args[1], plan.ops[e.args[1]]
        return f"op {i} ({_describe(op)}): {e.args[0]}"
    return _inside(plan, rec) or _coverage(plan, rec) or _contributions(plan, rec)


def _quick_box(box: Any, ndim: int) -> list[int] | None:
    """Starts + stops of a box of plain slices, unchecked (:meth:`_Records.plausible` checks
    them all at once); None if it is not a tuple of ``ndim`` step-less slices."""
    if type(box) is not tuple or len(box) != ndim:
        return None
    try:
        if any([s.step for s in box]):
            return None
        return [s.start for s in box] + [s.stop for s in box]
    except AttributeError:
        return None


def _collect(rec: _Records, ops: tuple, fast: bool) -> None:
    """Record every operation (:func:`_parse`). ``fast``: the common cases inlined, their box
    coordinates left for :meth:`_Records.plausible` to check in one go (the plan check is one
    pass over the plan). Raises ``_Bad(why, op index)``."""
    src_pos, dst_pos, nd = rec.src_pos, rec.dst_pos, len(rec.shape)
    s_ops, s_pos, s_box = rec.lists["src"]
    d_ops, d_pos, d_box = rec.lists["dst"]
    i = 0
    try:
        for i, op in enumerate(ops):
            kind = type(op) if fast else None
            if kind is Send or kind is Copy:
                src, dst, box = op if kind is Send else (op.rank, op.rank, op.box)
                a, b = src_pos.get(src), dst_pos.get(dst)
                if a is not None and b is not None and type(src) is int and type(dst) is int:
                    f = _quick_box(box, nd)
                    if f is not None and (src != dst or kind is Copy):
                        s_ops.append(i), s_pos.append(a), s_box.extend(f)
                        d_ops.append(i), d_pos.append(b), d_box.extend(f)
                        continue
            elif kind is Broadcast:
                src, dsts, box = op
                a, f = src_pos.get(src), _quick_box(box, nd)
                if a is not None and f is not None and type(src) is int and type(dsts) is tuple:
                    b = [dst_pos.get(r) if type(r) is int else None for r in dsts]
                    if dsts and None not in b and src not in dsts and len(set(b)) == len(b):
                        s_ops.append(i), s_pos.append(a), s_box.extend(f)
                        for p in b:
                            d_ops.append(i), d_pos.append(p), d_box.extend(f)
                        continue
            _parse(rec, i, op)
    except _Bad as e:
        raise _Bad(str(e), i) from None


def _bounds(task: ReshardTask, side: str) -> np.ndarray:
    """Shard boxes of the source or destination mesh, one row (starts, stops) per position."""
    layout = task.src if side == "src" else task.dst
    rows = []
    for r in layout.mesh.devices:
        box = layout.box(r, task.shape)
        rows.append([s.start for s in box] + [s.stop for s in box])
    return np.array(rows, dtype=np.int64).reshape(len(rows), 2 * len(task.shape))


def _inside(plan: Plan, rec: _Records) -> str | None:
    """Reads inside the sender's source shard, deliveries and contributions inside the
    receiver's destination shard: the first operation breaking this, or None."""
    task, d = plan.task, len(plan.task.shape)
    found: list[tuple[int, str]] = []
    for kind, side, verb in (
        ("src", "src", "reads {box}, but rank {r} holds {shard} of the source layout"),
        ("dst", "dst", "delivers {box} to rank {r}, whose destination shard is {shard}"),
        ("own", "dst", "has rank {r} contribute {box}, but its destination shard is {shard}"),
    ):
        ops, pos, boxes = rec.arrays(kind)
        shard = _bounds(task, side)[pos]
        bad = ((boxes[:, :d] < shard[:, :d]) | (boxes[:, d:] > shard[:, d:])).any(axis=1)
        if bad.any():
            k = int(np.argmax(bad))
            mesh = task.src.mesh if side == "src" else task.dst.mesh
            found.append((int(ops[k]), verb.format(
                box=coverage.fmt_flat(boxes[k]), r=mesh.devices[int(pos[k])],
                shard=coverage.fmt_flat(shard[k]),
            )))
    if not found:
        return None
    i, why = min(found)
    return f"op {i} ({_describe(plan.ops[i])}) {why}"


def _coverage(plan: Plan, rec: _Records) -> str | None:
    """Every destination shard delivered exactly once: None, or the first wrong region."""
    task = plan.task
    ops, pos, boxes = rec.arrays("dst")
    shards = _bounds(task, "dst")
    wrong = coverage.exact_cover(task.shape, pos, boxes, shards)
    if not wrong:
        return None
    ranks = task.dst.mesh.devices
    findings = [coverage.locate(p, element, ops, pos, boxes, shards[p]) for p, element in wrong]
    doubles = [f for f in findings if f.later is not None]
    f = min(doubles, key=lambda f: f.later) if doubles else findings[0]
    r = ranks[f.position]
    more = f" ({len(wrong)} destination ranks are wrong in all)" if len(wrong) > 1 else ""
    if f.later is None:
        return (
            f"rank {r} never receives {coverage.fmt_flat(f.region)} of its destination shard "
            f"{coverage.fmt_flat(shards[f.position])}: no operation delivers element "
            f"{f.element}{more}"
        )
    return (
        f"op {f.later} ({_describe(plan.ops[f.later])}) delivers {coverage.fmt_flat(f.region)} "
        f"to rank {r} a second time (op {f.earlier} delivered it before){more}"
    )


def _contributions(plan: Plan, rec: _Records) -> str | None:
    """Each all-gather member's part delivered to it by earlier operations: None, or the first
    contribution that is not (coverage is exact by now, so no other delivery overlaps it)."""
    own_ops, own_pos, own = rec.arrays("own")
    if not len(own_ops):
        return None
    ops, pos, boxes = rec.arrays("dst")
    first = coverage.first_matching(own_pos, own, pos, boxes, ops)
    late = np.flatnonzero(first >= own_ops)
    bad: dict[int, tuple[int, int]] = {}
    for k in late.tolist():
        j = coverage.first_overlap_from(own_pos[k], own[k], pos, boxes, ops, int(own_ops[k]))
        if j is not None:
            bad.setdefault(int(own_ops[k]), (k, j))
    if not bad:
        return None
    i = min(bad)
    k, j = bad[i]
    r = plan.task.dst.mesh.devices[int(own_pos[k])]
    return (
        f"op {i} ({_describe(plan.ops[i])}) has rank {r} contribute part "
        f"{coverage.fmt_flat(own[k])} before it holds it: op {int(ops[j])} delivers "
        f"{coverage.fmt_flat(coverage.intersect(own[k], boxes[j]))} of it later"
    )

