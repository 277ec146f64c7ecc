"""Stacked tensors: one index of a dimension as a tensor of its own (stacked MoE experts).

An engine often stacks E tensors of the same shape along a dimension (``w13[e]`` is expert ``e``,
expert parallel: the experts dimension split over a mesh axis). The slice at index ``e`` of that
dimension is held by the mesh positions whose tile of the dimension contains ``e``: they share
their coordinates on the axes splitting it, so the slice lives on the sub-mesh at those
coordinates, split there as the other dimensions are (:func:`index_layout`), and each holder's
data is one view of its shard (:func:`index_local`: an integer index of that dimension). So a
separate tensor (one expert of the trainer) moves straight into its place in the stack, as a task
of its own, like a part of a fused tensor (:mod:`.fused`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .checks import as_shape
from .layout import Layout
from .mesh import Mesh
from .splits import DimSplit

__all__ = ["index_layout", "index_local"]


def _check(layout: Layout, shape: tuple[int, ...], dim: int, index: int) -> DimSplit:
    layout.check_shape(shape)
    if not 0 <= dim < len(shape):
        raise ValueError(f"dim {dim} is not a dimension of shape {shape}")
    if not 0 <= index < shape[dim]:
        raise ValueError(f"index {index} is outside dimension {dim} of shape {shape}")
    split = layout.splits(len(shape))[dim]
    if split.parts:
        raise ValueError(f"dimension {dim} of layout {layout.spec!r} is fused: a stacked "
                         f"dimension must be split by steps only")
    return split


def _holder(layout: Layout, shape: tuple[int, ...], dim: int, index: int) -> int:
    """A rank whose shard holds ``index`` of dimension ``dim``."""
    for rank in layout.mesh.devices:
        region = layout.region(rank, shape)
        if any(a <= index < b for a, b in region.runs[dim]):
            return rank
    raise AssertionError("every index of a dimension is held by some rank")  # pragma: no cover


def index_layout(
    layout: Layout, shape: Sequence[int], dim: int, index: int
) -> tuple[Layout, tuple[int, ...]]:
    """The layout and shape of ``tensor[index]`` along ``dim`` (that dimension dropped), as a
    tensor of its own: on the sub-mesh of the positions holding ``index`` (the mesh axes that
    split ``dim`` fixed at their coordinates, the others kept in order; a one-rank mesh when
    every axis is fixed), each other dimension split as in ``layout``."""
    shape = as_shape(shape)
    split = _check(layout, shape, dim, index)
    fixed = set(split.axes)
    coords = layout.mesh.coords(_holder(layout, shape, dim, index))
    kept = [a for a in range(layout.mesh.ndim) if a not in fixed]
    at = tuple(coords[a] if a in fixed else slice(None) for a in range(layout.mesh.ndim))
    devices = np.asarray(layout.mesh.array)[at]
    mesh = Mesh(devices if kept else np.asarray([devices]))
    new_axis = {a: i for i, a in enumerate(kept)}
    splits = layout.splits(len(shape))
    tokens = [s.renumbered(new_axis).token() for d, s in enumerate(splits) if d != dim]
    return Layout(mesh, "".join(tokens)), (*shape[:dim], *shape[dim + 1:])


def index_local(
    layout: Layout, shape: Sequence[int], rank: int, dim: int, index: int
) -> int | None:
    """Where ``index`` of dimension ``dim`` lies in ``rank``'s shard: the local index
    (``local.select(dim, i)`` or ``local[..., i, ...]`` is the rank's shard of the slice, a
    view), or None where the rank does not hold it."""
    shape = as_shape(shape)
    _check(layout, shape, dim, index)
    region = layout.region(rank, shape)
    if region is None:
        return None
    offset = 0
    for a, b in region.runs[dim]:
        if a <= index < b:
            return offset + index - a
        offset += b - a
    return None
