"""Exact covers of boxes by boxes, decided from signed corners (used by
:mod:`meshcast.core.plan_check`).

A box ``[a, b)`` in ``d`` dimensions has the indicator ``prod_j (H(x_j - a_j) - H(x_j - b_j))``
(``H`` the unit step), a sum over its ``2^d`` corners ``v`` of ``(-1)^(upper coordinates of v)``
times the orthant indicator ``prod_j H(x_j - v_j)``. Orthant indicators at distinct points are
linearly independent, so a family of boxes adds up to a target box, element by element, exactly
when the signed corner counts of the family minus those of the target are all zero. If some are
not, the lexicographically smallest such corner ``v`` is minimal in the product order among
them, and the family's count at element ``v`` is ``1 + c(v)`` inside the target: an element
delivered zero or several times. Boxes are rows of ``d`` starts followed by ``d`` stops.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import NamedTuple

import numpy as np

__all__ = [
    "Finding",
    "exact_cover",
    "first_matching",
    "first_overlap_from",
    "fmt_box",
    "fmt_flat",
    "intersect",
    "locate",
    "tiling_error",
]


def fmt_box(box) -> str:
    """``[0:4, 8:16]`` for a box of slices, its repr if it is not one."""
    try:
        return "[" + ", ".join(f"{s.start}:{s.stop}" for s in box) + "]"
    except (AttributeError, TypeError):
        return repr(box)


def fmt_flat(row) -> str:
    """``[0:4, 8:16]`` for a box row (starts, then stops)."""
    d = len(row) // 2
    return "[" + ", ".join(f"{int(a)}:{int(b)}" for a, b in zip(row[:d], row[d:])) + "]"


def intersect(a, b) -> list[int]:
    """The box row common to box rows ``a`` and ``b`` (assumed to overlap)."""
    d = len(a) // 2
    return [max(int(a[j]), int(b[j])) for j in range(d)] + [
        min(int(a[d + j]), int(b[d + j])) for j in range(d)
    ]


def tiling_error(box: list[int], parts: list[list[int]]) -> tuple[tuple, int, list[int]] | None:
    """None if ``parts`` (non-empty, inside ``box``) tile ``box`` exactly once; otherwise
    ``(element, number of parts holding it, their indices)`` for an element held by 0 or >= 2.
    Plain Python, for the few parts of one all-gather."""
    d = len(box) // 2
    active = [j for j in range(d) if any(p[j] != box[j] or p[d + j] != box[d + j] for p in parts)]
    sums: dict[tuple[int, ...], int] = defaultdict(int)
    for sign, p in [(1, p) for p in parts] + [(-1, box)]:
        for bits in range(1 << len(active)):
            corner = tuple(p[d + j] if bits >> t & 1 else p[j] for t, j in enumerate(active))
            sums[corner] += -sign if bin(bits).count("1") & 1 else sign
    wrong = sorted(c for c, v in sums.items() if v)
    if not wrong:
        return None
    element = list(box[:d])
    for t, j in enumerate(active):
        element[j] = wrong[0][t]
    which = [k for k, p in enumerate(parts) if all(p[j] <= element[j] < p[d + j] for j in range(d))]
    return tuple(element), len(which), which


def _corner_keys(
    pos: np.ndarray, boxes: np.ndarray, sign: np.ndarray, shape: tuple[int, ...], active: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Every corner of every box: (sort keys, signs, coordinates or None when the keys pack
    position and coordinates into one int64)."""
    d = len(shape)
    radix = [shape[j] + 1 for j in active]
    packed = (int(pos.max(initial=0)) + 1) * math.prod(radix) < 2**63
    keys, signs, coords = [], [], []
    for bits in range(1 << len(active)):
        flip = -1 if bin(bits).count("1") & 1 else 1
        cols = [boxes[:, d + j] if bits >> t & 1 else boxes[:, j] for t, j in enumerate(active)]
        signs.append(sign * flip)
        if packed:
            key = pos.copy()
            for c, r in zip(cols, radix):
                key = key * r + c
            keys.append(key)
        else:
            coords.append(np.stack([pos, *cols], axis=1))
    if packed:
        return np.concatenate(keys), np.concatenate(signs), None
    table = np.concatenate(coords)
    return table, np.concatenate(signs), table


def exact_cover(
    shape: tuple[int, ...], pos: np.ndarray, boxes: np.ndarray, targets: np.ndarray
) -> list[tuple[int, tuple[int, ...]]]:
    """Positions whose boxes (``boxes[k]`` goes to position ``pos[k]``; all inside the target)
    do not add up to ``targets[position]`` exactly once, each with an element of the target
    delivered zero or several times (the smallest, module doc); ``[]`` if every one does."""
    d = len(shape)
    if math.prod(shape) == 0:
        return []  # every box is empty
    keep = (boxes[:, d:] > boxes[:, :d]).all(axis=1)
    tpos = np.flatnonzero((targets[:, d:] > targets[:, :d]).all(axis=1))
    pos = np.concatenate([pos[keep], tpos])
    boxes = np.concatenate([boxes[keep], targets[tpos]])
    sign = np.concatenate([np.ones(int(keep.sum()), np.int64), -np.ones(len(tpos), np.int64)])
    full = [shape[j] for j in range(d)]
    active = [
        j for j in range(d) if not ((boxes[:, j] == 0).all() and (boxes[:, d + j] == full[j]).all())
    ]
    keys, signs, table = _corner_keys(pos, boxes, sign, shape, active)
    if table is None:
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        new = np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]
    else:
        order = np.lexsort(table.T[::-1])
        rows = table[order]
        new = np.r_[True, (rows[1:] != rows[:-1]).any(axis=1)]
    starts = np.flatnonzero(new)
    sums = np.add.reduceat(signs[order], starts) if len(starts) else starts
    out: dict[int, tuple[int, ...]] = {}
    for s in starts[sums != 0].tolist():
        row = order[s]
        p = int(pos[row % len(pos)])
        if p in out:
            continue
        bits = row // len(pos)
        element = [0] * d
        for t, j in enumerate(active):
            element[j] = int(boxes[row % len(pos), d + j if bits >> t & 1 else j])
        out[p] = tuple(element)
    return sorted(out.items())


class Finding(NamedTuple):
    """A wrong element of one position's target: ``region`` (a box row) holds it; ``later`` /
    ``earlier``: the op indices of its second and first delivery, None if it is never
    delivered (then ``region`` is delivered by no operation at all)."""

    position: int
    element: tuple[int, ...]
    region: list[int]
    earlier: int | None
    later: int | None


def locate(
    p: int,
    element: tuple[int, ...],
    ops: np.ndarray,
    pos: np.ndarray,
    boxes: np.ndarray,
    target: np.ndarray,
) -> Finding:
    """What is wrong at ``element`` of position ``p``: its first two deliveries, or a box
    around it that no delivery touches (grown from the whole target, cut back greedily)."""
    d = len(element)
    idx = np.flatnonzero(pos == p)
    lo, hi = boxes[idx, :d], boxes[idx, d:]
    v = np.array(element, dtype=np.int64)
    holding = idx[((lo <= v) & (v < hi)).all(axis=1)]
    if len(holding) >= 2:
        a, b = holding[:2].tolist()
        return Finding(p, element, intersect(boxes[a], boxes[b]), int(ops[a]), int(ops[b]))
    region = [int(x) for x in target]
    while True:
        rlo, rhi = np.array(region[:d], dtype=np.int64), np.array(region[d:], dtype=np.int64)
        touching = np.flatnonzero(((lo < rhi) & (hi > rlo) & (hi > lo)).all(axis=1))
        if not len(touching):
            return Finding(p, element, region, None, None)
        b = boxes[idx[touching[0]]].tolist()
        best: list[int] | None = None
        for j in range(d):
            cut = list(region)
            if element[j] < b[j]:
                cut[d + j] = b[j]
            elif element[j] >= b[d + j]:
                cut[j] = b[d + j]
            else:
                continue
            if best is None or _volume(cut) > _volume(best):
                best = cut
        assert best is not None  # the box does not hold the element
        region = best


def _volume(row: list[int]) -> int:
    d = len(row) // 2
    return math.prod(row[d + j] - row[j] for j in range(d))


def _row_ids(*tables: np.ndarray) -> list[np.ndarray]:
    """Equal rows across ``tables`` get equal ids."""
    rows = np.ascontiguousarray(np.concatenate(tables))
    void = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, inverse = np.unique(void, return_inverse=True)
    inverse = inverse.ravel()
    out, start = [], 0
    for t in tables:
        out.append(inverse[start : start + len(t)])
        start += len(t)
    return out


def first_matching(
    want_pos: np.ndarray, want: np.ndarray, pos: np.ndarray, boxes: np.ndarray, ops: np.ndarray
) -> np.ndarray:
    """For each box ``want[k]`` of position ``want_pos[k]``: the first op index delivering exactly
    that box to that position (``2^63 - 1`` if none)."""
    a, b = _row_ids(np.column_stack([want_pos, want]), np.column_stack([pos, boxes]))
    first = np.full(int(max(a.max(initial=0), b.max(initial=0))) + 1, 2**63 - 1, dtype=np.int64)
    np.minimum.at(first, b, ops)
    return first[a]


def first_overlap_from(
    p: int, box: np.ndarray, pos: np.ndarray, boxes: np.ndarray, ops: np.ndarray, start: int
) -> int | None:
    """The first delivery (record index) to position ``p`` at op index ``start`` or later that
    shares an element with ``box``; None if there is none."""
    d = len(box) // 2
    hit = (
        (pos == p)
        & (ops >= start)
        & ((boxes[:, :d] < box[d:]) & (boxes[:, d:] > box[:d])).all(axis=1)
        & (boxes[:, d:] > boxes[:, :d]).all(axis=1)
    )
    k = np.flatnonzero(hit)
    return int(k[0]) if len(k) else None
