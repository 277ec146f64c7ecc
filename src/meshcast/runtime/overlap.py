"""Whether strided tensors share memory: an ``out`` tensor must not overlap itself, the rank's
source shard, or another result of the same call (the runtime writes results while it still
reads sources, so any shared element would be read after it was overwritten).

Exact for the views a program makes of one tensor (slices, transposes, narrowed or fused parts:
the same element size, strides that each exceed the reach of the smaller ones); otherwise exact
by listing the elements when both are small, and else "may overlap", which the callers refuse.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["may_overlap_itself", "may_share_memory", "shared_pair"]

_LIST_LIMIT = 1 << 20
"""Elements (both tensors together) up to which an undecided pair is settled by listing them."""


def _dims(t: torch.Tensor) -> list[tuple[int, int]]:
    """``(stride, size)`` of the dimensions of more than one element, smallest stride first."""
    return sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1)


def may_overlap_itself(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory: False when each dimension's stride
    exceeds the furthest offset the smaller strides reach (every view of a dense tensor)."""
    reach = 0
    for stride, size in _dims(t):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    reach = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    start = t.data_ptr()
    return start, start + (reach + 1) * t.element_size()


def may_share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some element of ``a`` and some element of ``b`` may be the same memory."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if a.device.type == "meta" or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    if a1 <= b0 or b1 <= a0:
        return False
    size = a.element_size()
    if size != b.element_size() or (b0 - a0) % size:
        return True
    decided = _same_lattice(_dims(a), _dims(b), (b0 - a0) // size)
    if decided is not None:
        return decided
    if a.numel() + b.numel() > _LIST_LIMIT:
        return True
    return bool(np.intersect1d(_offsets(a), _offsets(b) + (b0 - a0) // size).size)


def _same_lattice(da: list[tuple[int, int]], db: list[tuple[int, int]], d: int) -> bool | None:
    """Whether ``sum(i_k s_k) == d + sum(j_k s_k)`` has a solution with ``0 <= i_k < n_a`` and
    ``0 <= j_k < n_b`` per stride ``s_k`` (a dimension missing on one side has size 1 there);
    None where a stride does not exceed what the smaller ones reach (then several digits could
    fit, and this does not decide)."""
    sizes_a, sizes_b = dict((s, n) for s, n in da), dict((s, n) for s, n in db)
    if len(sizes_a) != len(da) or len(sizes_b) != len(db):
        return None  # two dimensions of one stride
    strides = sorted(set(sizes_a) | set(sizes_b))
    up = [(sizes_a.get(s, 1) - 1) * s for s in strides]  # what each digit adds at most to i
    down = [(sizes_b.get(s, 1) - 1) * s for s in strides]  # ... and to j
    below_up, below_down = 0, 0
    for k, s in enumerate(strides):  # smaller strides' reach must stay below each stride
        if s <= below_up + below_down:
            return None
        below_up += up[k]
        below_down += down[k]
    for k in range(len(strides) - 1, -1, -1):  # largest stride first: at most one digit fits
        s = strides[k]
        below_up -= up[k]
        below_down -= down[k]
        digit = -((below_up - d) // s)  # the least delta with d - delta * s <= below_up
        if d - digit * s < -below_down:
            return False
        if not -(sizes_b.get(s, 1) - 1) <= digit <= sizes_a.get(s, 1) - 1:
            return False
        d -= digit * s
    return d == 0


def _offsets(t: torch.Tensor) -> np.ndarray:
    """Every element's offset from ``t``'s first element, in elements."""
    out = np.zeros(1, dtype=np.int64)
    for n, s in zip(t.shape, t.stride()):
        out = (out[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).ravel()
    return out


def shared_pair(outs: list[tuple[str, torch.Tensor]], sources: list[tuple[str, torch.Tensor]]
                ) -> tuple[str, str] | None:
    """The names of the first result found that may share memory with another result or a
    source (``(label, tensor)`` each), or None. Only tensors of one storage whose byte ranges
    meet are compared (a sweep over the ranges: results that are views of one buffer cost
    O(n log n), not a comparison per pair)."""
    # (start, end, order: results first in their order, then sources; label, tensor)
    by_storage: dict[tuple, list[tuple[int, int, int, str, torch.Tensor]]] = {}
    for k, (label, t) in enumerate([*outs, *sources]):
        try:
            key = (str(t.device), t.untyped_storage().data_ptr())
        except RuntimeError:  # a tensor subclass without storage of its own: refused elsewhere
            continue
        if t.numel() and t.device.type != "meta":
            by_storage.setdefault(key, []).append((*_byte_range(t), k, label, t))
    found: list[tuple[int, int, str, str]] = []
    for group in by_storage.values():
        group.sort(key=lambda item: item[0])
        active: list[tuple[int, int, int, str, torch.Tensor]] = []
        for item in group:
            start, _, k, label, t = item
            active = [a for a in active if a[1] > start]  # ranges still open here
            for _, _, j, other, u in active:
                if min(j, k) < len(outs) and may_share_memory(t, u):
                    first, second = sorted(((j, other), (k, label)))
                    found.append((first[0], second[0], first[1], second[1]))
            active.append(item)
    return min(found)[2:] if found else None
