"""Box math: a box is a rectangular region of a tensor, one ``slice(start, stop)`` per dimension,
in global coordinates. The one place for sizes, cuts and box-relative slicing."""

from __future__ import annotations

__all__ = [
    "Box", "box_inside", "box_intersection", "box_shape", "box_size", "boxes_overlap", "relative",
    "split_box",
]

Box = tuple[slice, ...]
"""A rectangular region of a tensor: one ``slice(start, stop)`` per dimension."""


def box_shape(box: Box) -> tuple[int, ...]:
    """Extent of ``box`` in each dimension."""
    return tuple(s.stop - s.start for s in box)


def box_size(box: Box) -> int:
    """Number of elements in ``box``."""
    n = 1
    for s in box:
        n *= s.stop - s.start
    return n


def split_box(box: Box, k: int) -> tuple[Box, ...] | None:
    """``box`` cut into ``k`` non-empty parts along its longest dimension, or None if too small.

    Part sizes follow ``numpy.array_split`` (the first parts one longer).
    """
    if not box:
        return None
    dim = max(range(len(box)), key=lambda d: box[d].stop - box[d].start)
    lo, hi = box[dim].start, box[dim].stop
    n = hi - lo
    if n < k:
        return None
    small, extra = divmod(n, k)
    parts, start = [], lo
    for i in range(k):
        stop = start + small + (i < extra)
        parts.append((*box[:dim], slice(start, stop), *box[dim + 1 :]))
        start = stop
    return tuple(parts)


def relative(box: Box, within: Box) -> tuple[slice, ...]:
    """``box`` (global coordinates) as slices of the shard that holds ``within``."""
    return tuple(slice(b.start - w.start, b.stop - w.start) for b, w in zip(box, within))


def boxes_overlap(a: Box, b: Box) -> bool:
    """Whether two boxes share at least one element."""
    return all(x.start < y.stop and y.start < x.stop for x, y in zip(a, b))


def box_inside(box: Box, within: Box) -> bool:
    """Whether every element of ``box`` lies in ``within``."""
    return all(w.start <= b.start and b.stop <= w.stop for b, w in zip(box, within))


def box_intersection(a: Box, b: Box) -> Box | None:
    """The elements two boxes share, as a box (None: none)."""
    out = tuple(slice(max(x.start, y.start), min(x.stop, y.stop)) for x, y in zip(a, b))
    return out if all(s.start < s.stop for s in out) else None
