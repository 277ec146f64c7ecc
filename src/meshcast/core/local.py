"""A plain numpy executor: runs a plan inside one process. The reference for every runtime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .boxes import Box
from .checks import as_shape
from .layout import Layout
from .ops import AllGather, Broadcast, Copy, Send
from .plan import Plan
from .region import Region

__all__ = ["execute_local", "gather", "scatter"]


def _local(box: Box, within: Region) -> tuple:
    """``box`` (global coordinates) as an index of the local tensor of the shard ``within``
    that gives an array view (a 0-d one for a 0-d tensor, not a scalar)."""
    return (*within.local(box), ...)


def _held(region: Region) -> tuple:
    """An index of the global array giving the elements ``region`` holds, in local order (a
    view for one box, a copy for several)."""
    box = region.box
    return (*box, ...) if box is not None else np.ix_(*region.indices())


def _layout(layout: object) -> Layout:
    """``layout``, a :class:`Layout` or its string notation (``"2x4:S0R"``)."""
    if isinstance(layout, str):
        return Layout.parse(layout)
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a meshcast.Layout or its notation (e.g. '2x4:S0R'), got "
                        f"{type(layout).__name__}")
    return layout


def scatter(array: np.ndarray, layout: Layout | str) -> dict[int, np.ndarray]:
    """Split ``array`` into the shards of ``layout`` (a :class:`Layout` or its notation):
    ``{rank: copy of its shard}``."""
    layout = _layout(layout)
    array = np.asarray(array)
    return {r: np.array(array[_held(region)])
            for r, region in layout.regions(array.shape).items()}


def _check_shards(
    shards: Mapping[int, np.ndarray],
    layout: Layout,
    shape: tuple[int, ...],
    dtype: np.dtype | None,
    argument: str,
) -> None:
    if not isinstance(shards, Mapping):
        raise TypeError(f"{argument} must be a dict {{rank: ndarray}}, got {type(shards).__name__}")
    regions = layout.regions(shape)
    for r in layout.mesh.devices:
        if r not in shards:
            raise ValueError(f"{argument} is missing rank {r} of mesh {layout.mesh.notation()}")
        shard = shards[r]
        if not isinstance(shard, np.ndarray):
            raise TypeError(f"{argument}[{r}] must be a numpy array, got {type(shard).__name__}")
        want = regions[r].shape
        if shard.shape != want:
            raise ValueError(
                f"{argument}[{r}] has shape {shard.shape}, but layout "
                f"{layout.spec!r} gives rank {r} a shard of shape {want}"
            )
        if dtype is not None and shard.dtype != dtype:
            raise ValueError(f"{argument}[{r}] has dtype {shard.dtype}, the plan moves {dtype}")


def gather(
    shards: Mapping[int, np.ndarray], layout: Layout | str, shape: Sequence[int] | None = None
) -> np.ndarray:
    """Assemble the global array from ``{rank: shard}`` laid out by ``layout`` (a
    :class:`Layout` or its notation).

    The global shape is inferred from the shards unless given. Replicas must agree exactly.
    """
    layout = _layout(layout)
    if not isinstance(shards, Mapping):
        raise TypeError(f"shards must be a dict {{rank: ndarray}}, got {type(shards).__name__}")
    devices = layout.mesh.devices
    missing = [r for r in devices if r not in shards]
    if missing:
        raise ValueError(f"shards is missing ranks {missing} of mesh {layout.mesh.notation()}")
    first = np.asarray(shards[devices[0]])
    if shape is None:
        shape = _inferred_shape(shards, layout, first.ndim)
    shape = as_shape(shape)
    _check_shards(shards, layout, shape, first.dtype, "shards")
    out = np.empty(shape, dtype=first.dtype)
    seen = np.zeros(shape, dtype=bool)
    for r, region in layout.regions(shape).items():
        where = _held(region)
        held, shard = seen[where], np.asarray(shards[r])
        # replicas agree byte for byte (NaN payloads equal, 0.0 and -0.0 not)
        if held.any() and out[where][held].tobytes() != np.ascontiguousarray(shard[held]).tobytes():
            raise ValueError(f"shards[{r}] disagrees with another replica of the same region")
        out[where] = shard
        seen[where] = True
    return out


def _inferred_shape(shards: Mapping[int, np.ndarray], layout: Layout, ndim: int) -> tuple:
    """The global shape of ``shards`` of ``layout``: per dimension, the sum over the tiles of
    each piece of the local extent a holder of that tile alone has (fused pieces: ValueError,
    the part sizes are in the layout)."""
    splits = layout.splits(ndim)
    if any(s.parts or not s.is_plain for s in splits):
        raise ValueError(f"give shape: it cannot be inferred for layout {layout.spec!r}")
    tiles = layout.position_tiles(ndim)
    extents: list[dict[int, int]] = [{} for _ in range(ndim)]
    for pos, r in enumerate(layout.mesh.devices):
        for d in range(ndim):
            extents[d][int(tiles[d][0][pos])] = np.shape(shards[r])[d]
    return tuple(sum(e.values()) for e in extents)


def execute_local(plan: Plan, shards: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Run ``plan`` in this process: from source shards ``{rank: ndarray}`` (every rank of the
    source mesh) to destination shards (every rank of the destination mesh).

    The plan is checked first (:meth:`Plan.check`): one that does not deliver every destination
    element exactly once raises ``ValueError`` naming the first missing or wrong region.
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a meshcast.Plan, got {type(plan).__name__}")
    plan.check()
    task = plan.task
    _check_shards(shards, task.src, task.shape, task.numpy_dtype, "shards")
    src_box = {r: task.src_region(r) for r in task.src.mesh.devices}
    dst_box = {r: task.dst_region(r) for r in task.dst.mesh.devices}
    out = {r: np.zeros(b.shape, dtype=task.numpy_dtype) for r, b in dst_box.items()}

    def read(rank: int, box: Box) -> np.ndarray:
        return shards[rank][_local(box, src_box[rank])]

    def write(rank: int, box: Box, data: np.ndarray) -> None:
        out[rank][_local(box, dst_box[rank])] = data

    for op in plan.ops:
        if isinstance(op, Copy):
            write(op.rank, op.box, read(op.rank, op.box))
        elif isinstance(op, Send):
            write(op.dst, op.box, read(op.src, op.box))
        elif isinstance(op, Broadcast):
            data = read(op.src, op.box)
            for r in op.dsts:
                write(r, op.box, data)
        elif isinstance(op, AllGather):
            for owner, part in zip(op.group, op.parts):
                data = out[owner][_local(part, dst_box[owner])].copy()
                for r in op.group:
                    if r != owner:
                        write(r, part, data)
        else:
            raise TypeError(f"plan has an operation of unknown type {type(op).__name__}")
    return out
