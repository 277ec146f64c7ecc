"""The plan check: a plan is run only if it delivers exactly the destination layout.

:func:`plan_error` (behind ``Plan.check`` and :func:`meshcast.check_plan`) verifies, before
any byte moves, that

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
from .coverage import fmt_box
from .ops import AllGather, Broadcast, Copy, Op, Send
from .plan_ops import BadOp, Records, read_ops
from .task import ReshardTask
from .topology import Topology

__all__ = ["plan_error"]


def _ranks_text(ranks: Any) -> str:
    return str(list(ranks)) if isinstance(ranks, (tuple, list)) else repr(ranks)


def _describe(op: Any) -> str:
    if isinstance(op, Copy):
        return f"copy on rank {op.rank} of {fmt_box(op.box)}"
    if isinstance(op, Send):
        return f"send {op.src}->{op.dst} of {fmt_box(op.box)}"
    if isinstance(op, Broadcast):
        return f"broadcast from {op.src} to {_ranks_text(op.dsts)} of {fmt_box(op.box)}"
    if isinstance(op, AllGather):
        return f"allgather among {_ranks_text(op.group)} of {fmt_box(op.box)}"
    return type(op).__name__


def plan_error(task: Any, topology: Any, ops: Any) -> str | None:
    """Why a plan of ``task`` on ``topology`` with operations ``ops`` must not run (module doc),
    or None if it is sound. The arguments are a plan's fields, checked here too."""
    if not isinstance(task, ReshardTask):
        return f"plan.task must be a meshcast.ReshardTask, got {type(task).__name__}"
    if not isinstance(topology, Topology):
        return f"plan.topology must be a meshcast.Topology, got {type(topology).__name__}"
    if type(ops) is not tuple:
        return f"plan.ops must be a tuple of operations, got {type(ops).__name__}"
    try:
        topology.covers(sorted(set(task.src.mesh.devices) | set(task.dst.mesh.devices)))
    except ValueError as e:
        return f"plan.topology: {e}"
    rec = Records(task)
    try:
        read_ops(rec, ops)
    except BadOp as e:
        i, op = e.args[1], ops[e.args[1]]
        return f"op {i} ({_describe(op)}): {e.args[0]}"
    bounds, owners = {}, {}
    for side in ("src", "dst"):
        bounds[side], owners[side] = _shard_boxes(task, side)
        if not (task.src if side == "src" else task.dst).is_plain:
            for kind in ("src",) if side == "src" else ("dst", "own"):
                rec.rows[kind] = _onto_boxes(rec.rows[kind], bounds[side], owners[side])
    return (
        _inside(task, ops, rec, bounds, owners) or _coverage(task, ops, rec, bounds["dst"],
                                                             owners["dst"])
        or _contributions(task, ops, rec, owners["dst"])
    )


def _shard_boxes(task: ReshardTask, side: str) -> tuple[np.ndarray, np.ndarray]:
    """The boxes of the source or destination shards, one row (starts, stops) per box, and the
    mesh position holding each: one box per position (in order) for a plain layout, each
    region's boxes for a strided or fused one (the checks below treat a box as a shard; an empty
    region is one empty box, so that every position owns a box)."""
    layout = task.src if side == "src" else task.dst
    d = len(task.shape)
    rows, owners = [], []
    regions = {} if layout.is_plain else layout.regions(task.shape)
    for pos, r in enumerate(layout.mesh.devices):
        if layout.is_plain:
            boxes = [layout.box(r, task.shape)]
        else:
            boxes = ([box for box, _ in regions[r].boxes()]
                     or [(slice(0, 0),) * d])  # an empty region: one empty box
        rows += [[s.start for s in b] + [s.stop for s in b] for b in boxes]
        owners += [pos] * len(boxes)
    return (np.array(rows, dtype=np.int64).reshape(len(rows), 2 * d),
            np.array(owners, dtype=np.int64))


def _onto_boxes(rows: tuple, shards: np.ndarray, owners: np.ndarray) -> tuple:
    """Records of positions turned into records of shard boxes: each box goes to the first box of
    its position that holds it (the position's first box if none does: then it is outside).
    Vectorised over the records, one pass per box a position may have (``owners`` is sorted and
    every position owns at least one box)."""
    ops, pos, boxes = rows
    d = shards.shape[1] // 2
    first = np.searchsorted(owners, pos)
    count = np.searchsorted(owners, pos, side="right") - first
    target = first.copy()
    found = np.zeros(len(pos), dtype=bool)
    for j in range(int(count.max(initial=0))):
        cand = np.minimum(first + j, len(owners) - 1)
        inside = ~found & (j < count) & (
            (boxes[:, :d] >= shards[cand, :d]) & (boxes[:, d:] <= shards[cand, d:])).all(axis=1)
        target[inside] = cand[inside]
        found |= inside
    return ops, target, boxes


def _inside(
    task: ReshardTask, plan_ops: tuple[Op, ...], rec: Records, bounds: dict[str, np.ndarray],
    owners: dict[str, np.ndarray],
) -> str | None:
    """Reads inside the sender's source shard, deliveries and contributions inside the
    receiver's destination shard: the first operation breaking this, or None."""
    d = len(task.shape)
    found: list[tuple[int, str]] = []
    for kind, side, verb in (
        ("src", "src", "reads {box}, but rank {r} holds {shard} of the source layout"),
        ("dst", "dst", "delivers {box} to rank {r}, whose destination shard is {shard}"),
        ("own", "dst", "has rank {r} contribute {box}, but its destination shard is {shard}"),
    ):
        ops, pos, boxes = rec.rows[kind]
        shard = bounds[side][pos]
        bad = ((boxes[:, :d] < shard[:, :d]) | (boxes[:, d:] > shard[:, d:])).any(axis=1)
        if bad.any():
            k = int(np.argmax(bad))
            mesh = task.src.mesh if side == "src" else task.dst.mesh
            found.append((int(ops[k]), verb.format(
                box=coverage.fmt_flat(boxes[k]), r=mesh.devices[int(owners[side][pos[k]])],
                shard=coverage.fmt_flat(shard[k]),
            )))
    if not found:
        return None
    i, why = min(found)
    return f"op {i} ({_describe(plan_ops[i])}) {why}"


def _coverage(
    task: ReshardTask, plan_ops: tuple[Op, ...], rec: Records, shards: np.ndarray,
    owners: np.ndarray,
) -> str | None:
    """Every destination shard delivered exactly once: None, or the first wrong region."""
    ops, pos, boxes = rec.rows["dst"]
    wrong = coverage.exact_cover(task.shape, pos, boxes, shards)
    if not wrong:
        return None
    ranks = task.dst.mesh.devices
    findings = [coverage.locate(p, element, ops, pos, boxes, shards[p]) for p, element in wrong]
    doubles = [f for f in findings if f.later is not None]
    f = min(doubles, key=lambda f: f.later) if doubles else findings[0]
    r = ranks[owners[f.position]]
    more = f" ({len(wrong)} destination ranks are wrong in all)" if len(wrong) > 1 else ""
    if f.later is None:
        return (
            f"rank {r} never receives {coverage.fmt_flat(f.region)} of its destination shard "
            f"{coverage.fmt_flat(shards[f.position])}: no operation delivers element "
            f"{f.element}{more}"
        )
    return (
        f"op {f.later} ({_describe(plan_ops[f.later])}) delivers {coverage.fmt_flat(f.region)} "
        f"to rank {r} a second time (op {f.earlier} delivered it before){more}"
    )


def _contributions(
    task: ReshardTask, plan_ops: tuple[Op, ...], rec: Records, owners: np.ndarray
) -> str | None:
    """Each all-gather member's part delivered to it by earlier operations: None, or the first
    contribution that is not (coverage is exact by now, so no other delivery overlaps it)."""
    own_ops, own_pos, own = rec.rows["own"]
    if not len(own_ops):
        return None
    ops, pos, boxes = rec.rows["dst"]
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
    r = task.dst.mesh.devices[int(owners[own_pos[k]])]
    return (
        f"op {i} ({_describe(plan_ops[i])}) has rank {r} contribute part "
        f"{coverage.fmt_flat(own[k])} before it holds it: op {int(ops[j])} delivers "
        f"{coverage.fmt_flat(coverage.intersect(own[k], boxes[j]))} of it later"
    )

