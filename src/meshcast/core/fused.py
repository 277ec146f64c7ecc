"""Fused tensors: a tensor that is the concatenation along one dimension of named parts, each
split its own way over the mesh (fused QKV with grouped-query attention, gate_up, stacked
experts), written as a fused dimension of a layout (splits.py): ``{q=4096:S1+k=1024:S1+...}``.

A rank's shard of a fused tensor holds, along the fused dimension, its indices of each part in
part order (``[q_i; k_i; v_i]``). Each part is a tensor of its own with the part's layout
(:func:`part_layout`); its data on a rank is one slice of the rank's fused shard
(:func:`fused_part_index`). So moving separate tensors into a fused one (or out of it) is one
task per part, planned and run together (:func:`meshcast.plan_many`,
:func:`meshcast.reshard_many` with ``out=`` the part slices): no part is assembled anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .checks import as_shape
from .dtypes import DTypeLike
from .layout import Layout
from .task import ReshardTask

__all__ = ["fused_part_index", "fused_part_views", "fused_tasks", "part_layout", "part_names"]


def _fused_dim(layout: Layout, ndim: int, dim: int | None) -> int:
    fused = [d for d, s in enumerate(layout.splits(ndim)) if s.parts]
    if dim is None:
        if len(fused) != 1:
            raise ValueError(
                f"layout {layout.spec!r} has {len(fused)} fused dimensions: "
                + ("give dim" if fused else "write one as {name=size:split+...}")
            )
        return fused[0]
    if dim not in fused:
        raise ValueError(f"dimension {dim} of layout {layout.spec!r} is not fused")
    return dim


def part_names(layout: Layout, shape: Sequence[int], dim: int | None = None) -> tuple[str, ...]:
    """The names of the fused dimension's parts, in order."""
    shape = as_shape(shape)
    d = _fused_dim(layout, len(shape), dim)
    return tuple(p.name for p in layout.splits(len(shape))[d].parts)


def part_layout(
    layout: Layout, shape: Sequence[int], name: str, dim: int | None = None
) -> tuple[Layout, tuple[int, ...]]:
    """The layout and shape of part ``name`` of a fused tensor of ``shape``, as a tensor of its
    own (the fused dimension cut to the part, split by the part's steps)."""
    shape = as_shape(shape)
    d = _fused_dim(layout, len(shape), dim)
    splits = layout.splits(len(shape))
    part = next((p for p in splits[d].parts if p.name == name), None)
    if part is None:
        raise ValueError(f"layout {layout.spec!r} has no part {name!r}: its parts are "
                         f"{', '.join(p.name for p in splits[d].parts)}")
    layout.check_shape(shape)  # the parts add up to the dimension
    tokens = [s.token() for s in splits]
    tokens[d] = type(splits[d])(steps=part.steps).token()
    return Layout(layout.mesh, "".join(tokens)), (*shape[:d], part.size, *shape[d + 1:])


def fused_part_index(
    layout: Layout, shape: Sequence[int], rank: int, name: str, dim: int | None = None
) -> tuple[slice, ...] | None:
    """Where part ``name`` lies in ``rank``'s shard of a fused tensor: an index of the rank's
    local tensor (``local[index]`` is the part's shard, a view), or None off the mesh."""
    shape = as_shape(shape)
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"rank must be an int, got {type(rank).__name__}")
    d = _fused_dim(layout, len(shape), dim)
    offset = 0
    for other in part_names(layout, shape, d):
        sub, sub_shape = part_layout(layout, shape, other, d)
        region = sub.region(rank, sub_shape)
        if region is None:
            return None
        n = region.shape[d]
        if other == name:
            return tuple(slice(offset, offset + n) if j == d else slice(None)
                         for j in range(len(shape)))
        offset += n
    raise ValueError(f"layout {layout.spec!r} has no part {name!r}")


def fused_part_views(
    local: Any, layout: Layout, shape: Sequence[int], rank: int, dim: int | None = None
) -> dict[str, Any]:
    """``{part name: view}`` of ``rank``'s shard ``local`` (a torch tensor or numpy array) of a
    fused tensor: each part's shard, in part order, ready for ``reshard_many(out=...)`` or as a
    source. Empty on a rank off the mesh."""
    names = part_names(layout, shape, dim)
    region = layout.region(rank, as_shape(shape)) if isinstance(rank, int) else None
    if region is not None and tuple(local.shape) != region.shape:
        raise ValueError(f"local has shape {tuple(local.shape)}, but rank {rank}'s shard of the "
                         f"fused tensor {layout.notation()} of shape {tuple(shape)} is "
                         f"{region.shape}")
    views = {}
    for name in names:
        index = fused_part_index(layout, shape, rank, name, dim)
        if index is None:
            return {}
        views[name] = local[index]
    return views


def fused_tasks(
    fused: Layout,
    shape: Sequence[int],
    dtype: DTypeLike,
    parts: Mapping[str, Layout],
    *,
    into: bool = True,
    dim: int | None = None,
) -> list[ReshardTask]:
    """One task per part of the fused tensor (``fused`` layout, ``shape``), in part order:
    from the separate tensor ``parts[name]`` into the part (``into=True``), or out of the part
    into it. ``parts`` must name every part exactly (one ValueError lists what is missing or
    extra)."""
    names = part_names(fused, shape, dim)
    missing = [n for n in names if n not in parts]
    extra = [n for n in parts if n not in names]
    if missing or extra:
        raise ValueError(
            f"parts must name the parts {', '.join(names)} of layout {fused.spec!r}: "
            + "; ".join(f"{what} {', '.join(map(repr, v))}"
                        for what, v in (("missing", missing), ("not a part:", extra)) if v)
        )
    tasks = []
    for name in names:
        part, part_shape = part_layout(fused, shape, name, dim)
        src, dst = (parts[name], part) if into else (part, parts[name])
        tasks.append(ReshardTask(part_shape, dtype, src, dst))
    return tasks
