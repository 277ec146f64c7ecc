"""Unit slices in classes: the slices that share their holders and receivers move alike, so
``"auto"``'s own method plans each class as one slice and then cuts its operations back into
the class's boxes.

A rank holding k boxes (a strided, interleaved or fused layout, docs/concepts.md) gives a task
k times the unit slices of the one-box layout, in classes of k that share (holders, receivers).
Planning one slice per class keeps the schedulers' work that of the one-box task; the operations
they make are expanded, linearly, into one operation per box. A one-box layout has one slice
per class (two slices with the same holders and receivers would be two boxes of one rank), so
its planning is unchanged.

A class is a *virtual* one-dimensional box: the classes lie end to end on one axis, each
class's boxes end to end inside it in slice order. An operation on a part of a class covers the
same share of each box it overlaps, cut along the box's longest dimension at the rounded
proportional point; neighbouring parts cut at the same points, so the parts of a class cover
each of its boxes exactly once. Such an operation costs one start-up per box
(:meth:`SliceClasses.boxes_in`, which the schedulers' durations count), and the expanded
operations go in *passes*: the virtual order once per box, the j-th pass with the j-th box of
each operation, so a class's start-ups are spread over the plan as the one-box plan spreads its
operations' (the overlapping all-to-all of docs/concepts.md at k = 8: 1.229 x the lower bound
before ``"auto"``'s local search, against 1.347 with each class's boxes back to back).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ..core.boxes import Box, box_size
from ..core.ops import AllGather, Op
from ..core.task import SliceInfo

__all__ = ["SliceClasses"]


class SliceClasses:
    """The classes of ``slices`` (equal holders, local and remote receivers), each as one
    virtual slice (:attr:`virtual`), and the map of operations on virtual boxes back to the
    real boxes (:meth:`expand`). :attr:`merged` is false when every class has one slice: then
    :attr:`virtual` is ``slices`` itself and :meth:`expand` returns its input."""

    def __init__(self, slices: Sequence[SliceInfo]) -> None:
        groups: dict[tuple, list[SliceInfo]] = {}
        for sl in slices:
            groups.setdefault((sl.holders, sl.local, sl.remote), []).append(sl)
        self.merged = len(groups) < len(slices)
        self.virtual: list[SliceInfo] = list(slices)
        if not self.merged:
            return
        self.virtual = []
        self._starts: list[int] = []  # virtual offset of each class
        self._offsets: list[list[int]] = []  # virtual offset of each box of each class
        self._boxes: list[list[Box]] = []
        offset = 0
        for members in groups.values():  # in the order of their first slices
            self._starts.append(offset)
            begin = offset
            offsets = []
            for sl in members:
                offsets.append(offset)
                offset += box_size(sl.box)
            self.virtual.append(members[0]._replace(
                box=(slice(begin, offset),), nbytes=sum(sl.nbytes for sl in members)))
            self._offsets.append(offsets)
            self._boxes.append([sl.box for sl in members])

    def boxes_in(self, op: Op) -> int:
        """How many real boxes the operation ``op`` on a virtual box covers (1 when no class
        was merged)."""
        if not self.merged:
            return 1
        (part,) = op.box
        return len(self._real_boxes(part.start, part.stop))

    def first_pass(self, ops: Sequence[Op]) -> tuple[list[int], tuple[Op, ...]]:
        """The operations of :meth:`expand`'s first pass: which of ``ops`` cover a box, and the
        operation on the first box of each. (A search over their order, repeated in every pass,
        is a search over the one-box task's order.)"""
        kept: list[int] = []
        first: list[Op] = []
        for i, op in enumerate(ops):
            (part,) = op.box
            boxes = self._real_boxes(part.start, part.stop)
            if boxes:
                kept.append(i)
                first.append(op._replace(box=boxes[0]))
        return kept, tuple(first)

    def expand(self, ops: Sequence[Op]) -> tuple[Op, ...]:
        """``ops`` (on virtual boxes) as operations on the real boxes, one per box each
        overlaps (none for an empty share), in passes: the j-th pass holds the j-th box of every
        operation that has one, in the order of ``ops``. (Any order of the own method's copies,
        sends and broadcasts moves the same data.)"""
        if not self.merged:
            return tuple(ops)
        per_op: list[tuple[Op, list[Box]]] = []
        for op in ops:
            assert not isinstance(op, AllGather), "the own method makes no all-gathers"
            (part,) = op.box
            per_op.append((op, self._real_boxes(part.start, part.stop)))
        out: list[Op] = []
        for j in range(max((len(boxes) for _, boxes in per_op), default=0)):
            out.extend(op._replace(box=boxes[j]) for op, boxes in per_op if j < len(boxes))
        return tuple(out)

    def _real_boxes(self, a: int, b: int) -> list[Box]:
        """The real boxes of virtual elements ``a:b`` (within one class)."""
        c = bisect.bisect_right(self._starts, a) - 1
        offsets, boxes = self._offsets[c], self._boxes[c]
        first = bisect.bisect_right(offsets, a) - 1
        out: list[Box] = []
        for offset, box in zip(offsets[first:], boxes[first:]):
            if offset >= b:
                break
            size = box_size(box)
            lo, hi = max(a, offset) - offset, min(b, offset + size) - offset
            if lo == 0 and hi == size:
                out.append(box)
                continue
            piece = _share(box, lo, hi, size)
            if piece is not None:
                out.append(piece)
        return out


def _share(box: Box, lo: int, hi: int, size: int) -> Box | None:
    """The part of ``box`` for its elements ``lo:hi`` of ``size``: cut along its longest
    dimension at the rounded proportional points (None when the part is empty)."""
    dim = max(range(len(box)), key=lambda d: box[d].stop - box[d].start)
    start, stop = box[dim].start, box[dim].stop
    n = stop - start
    cut_lo, cut_hi = start + round(n * lo / size), start + round(n * hi / size)
    if cut_hi <= cut_lo:
        return None
    return (*box[:dim], slice(cut_lo, cut_hi), *box[dim + 1 :])
