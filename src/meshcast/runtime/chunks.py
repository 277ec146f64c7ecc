"""Geometry of a transfer: a box cut into bounded chunks (box-relative slicing and overlap are
:mod:`meshcast.core.boxes`, re-exported here).

Every rank taking part in an operation cuts its box the same way (a pure function of the box, the
element size and the chunk size), so sender and receivers agree on message sizes without talking.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import product

from ..core.boxes import Box, boxes_overlap, relative

__all__ = ["boxes_overlap", "chunk_boxes", "relative"]


def chunk_boxes(box: Box, itemsize: int, chunk_bytes: int) -> list[Box]:
    """``box`` cut in row-major order into sub-boxes of at most ``chunk_bytes`` (at least one
    element each), so that each chunk is contiguous wherever the whole box is.

    The cut is along the outermost dimension whose trailing slab fits in ``chunk_bytes``; the
    dimensions before it are stepped one index at a time. Empty boxes give no chunks.
    """
    if chunk_bytes < itemsize:
        raise ValueError(f"chunk_bytes={chunk_bytes} must be at least the element size {itemsize}")
    extents = [s.stop - s.start for s in box]
    if 0 in extents:
        return []
    if math.prod(extents) * itemsize <= chunk_bytes:
        return [box]
    # find the outermost dim d whose slab (one index of d, all of the trailing dims) fits
    d = 0
    while math.prod(extents[d + 1 :]) * itemsize > chunk_bytes:
        d += 1
    slab = math.prod(extents[d + 1 :]) * itemsize
    step = max(1, chunk_bytes // slab)
    return list(_walk(box, d, step))


def _walk(box: Box, d: int, step: int) -> Iterator[Box]:
    outer = [range(s.start, s.stop) for s in box[:d]]
    for index in product(*outer):
        head = tuple(slice(i, i + 1) for i in index)
        s = box[d]
        for lo in range(s.start, s.stop, step):
            yield (*head, slice(lo, min(lo + step, s.stop)), *box[d + 1 :])
