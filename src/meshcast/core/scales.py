"""Scaled low-precision formats (numpy only): the block grid of a tensor and its scales' layout.

An FP8 weight is stored with float32 scales, per tensor (one scale) or per block (DeepSeek-V3's
``weight_scale_inv``: one per 128 x 128 block of the last two dimensions). A block's scale is
``amax / fp8_max`` (``amax`` the largest magnitude in the block, at least :data:`MIN_AMAX`), its
elements ``(x / scale).to(fp8)`` (:mod:`meshcast.runtime.convert`).

The **block grid** of a tensor of ``shape`` has one entry per block: ``ceil(n / b)`` along each
dimension with a block size ``b`` (the trailing dimensions of ``block``; leading dimensions, such
as stacked experts, have blocks of 1); per-tensor scaling is one block of the whole tensor.

The **scale layout** (:func:`scale_layout`) of a weight of layout ``L`` is ``L`` on the grid:
the same steps, fused parts of ``ceil(size / b)``. It holds only where the weight's every shard is
whole blocks (the tensor's last block may be short) and every fused part is whole blocks, so each
rank's scales are exactly those of its elements; it is checked, naming the rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from .checks import as_shape
from .layout import Layout
from .names import Piece
from .region import Region
from .splits import DimSplit, Part
from .task import ReshardTask

__all__ = ["FP8_MAX", "MIN_AMAX", "block_sizes", "grid_runs", "grid_shape", "scale_layout",
           "scale_piece", "touched_blocks"]

FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
"""The largest finite magnitude of each scaled format (``torch.finfo(dtype).max``)."""

MIN_AMAX = 1e-12
"""``amax`` is clamped to at least this before ``scale = amax / fp8_max`` (an all-zero block
gets a tiny scale, not a division by zero)."""


def block_sizes(shape: Sequence[int], block: Sequence[int] | None) -> tuple[int, ...]:
    """The block size along each dimension: ``block`` right-aligned, 1 before it; per tensor
    (``block=None``) each dimension whole."""
    shape = as_shape(shape)
    if block is None:
        return tuple(max(n, 1) for n in shape)
    block = tuple(int(b) for b in block)
    if len(block) > len(shape) or any(b < 1 for b in block):
        raise ValueError(f"block {block} must be positive sizes of the last dimensions of a "
                         f"tensor of shape {shape}")
    return (1,) * (len(shape) - len(block)) + block


def grid_shape(shape: Sequence[int], block: Sequence[int] | None) -> tuple[int, ...]:
    """Blocks along each dimension: ``ceil(n / b)``."""
    shape = as_shape(shape)
    return tuple(-(-n // b) for n, b in zip(shape, block_sizes(shape, block)))


def touched_blocks(
    region: Region, shape: Sequence[int], block: Sequence[int] | None
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """Per dimension, for the blocks ``region`` touches (increasing ids): ``(ids, counts,
    whole)``: the block ids, how many of the region's local indices fall in each (consecutive
    in local order, which is global order), and whether the region holds the whole block."""
    shape = as_shape(shape)
    out = []
    for (n, b), index in zip(zip(shape, block_sizes(shape, block)), region.indices()):
        ids, counts = np.unique(np.asarray(index, dtype=np.int64) // b, return_counts=True)
        size = np.minimum((ids + 1) * b, n) - ids * b
        out.append((ids, counts, counts == size))
    return tuple(out)


def grid_runs(runs: Sequence[tuple[int, int]], b: int, n: int) -> list[tuple[int, int]] | None:
    """The runs of block ids that exactly make ``runs`` of a dimension of ``n`` (blocks of
    ``b``), or None where a run starts or stops inside a block (other than the last)."""
    out: list[tuple[int, int]] = []
    for a, z in runs:
        if a % b or (z % b and z != n):
            return None
        g = (a // b, -(-z // b))
        if out and out[-1][1] == g[0]:
            out[-1] = (out[-1][0], g[1])
        elif g[1] > g[0]:
            out.append(g)
    return out


def _merged(runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, z in runs:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], z)
        elif z > a:
            out.append((a, z))
    return out


def scale_layout(
    layout: Layout, shape: Sequence[int], block: Sequence[int] | None
) -> tuple[Layout, tuple[int, ...]]:
    """The layout and shape of the scales of a weight of ``layout`` and ``shape``: per tensor, a
    0-d tensor on every rank of the mesh; per block, ``layout`` on the grid (module docstring).
    ``ValueError`` where a rank's shard or a fused part cuts a block, naming them."""
    shape = as_shape(shape)
    layout.check_shape(shape)
    if block is None:
        return Layout(layout.mesh, ""), ()
    sizes = block_sizes(shape, block)
    splits = []
    for d, (split, b) in enumerate(zip(layout.splits(len(shape)), sizes)):
        if split.parts:
            cut = [p.name for p in split.parts if p.size % b]
            if cut:
                raise ValueError(f"fused parts {cut} of dimension {d} of layout {layout.spec!r} "
                                 f"are not whole blocks of {b}: each part needs its own scales")
            split = DimSplit(parts=tuple(Part(p.name, p.size // b, p.steps) for p in split.parts))
        splits.append(split)
    grid = grid_shape(shape, block)
    scales = Layout(layout.mesh, "".join(s.token() for s in splits))
    for rank, region in layout.regions(shape).items():
        held = scales.region(rank, grid)
        for d, (n, b) in enumerate(zip(shape, sizes)):
            if grid_runs(_merged(region.runs[d]), b, n) != _merged(held.runs[d]):
                raise ValueError(
                    f"rank {rank}'s shard of layout {layout.spec!r} (shape {shape}) holds "
                    f"indices {region.runs[d]} of dimension {d}, which are not whole blocks of "
                    f"{b}: its scales cannot lie with it (the engine's shards must be whole "
                    f"blocks for block-wise scales)")
    return scales, grid



def scale_piece(piece: Piece, block: Sequence[int]) -> Piece:
    """The block-wise scales of ``piece`` (:func:`meshcast.map_weights`) as a piece of the
    engine tensor's scales (``scale_layout`` of the engine tensor): ``task.dst`` is the scale
    layout of the piece's place, ``dst_view`` finds it in a rank's shard of the engine's scale
    tensor. The scales do not move by a plan: they arrive by the exchange
    ``plan_amax(piece.task.shape, block, piece.task.src, scales.task.dst)``, so the task's
    source is its destination. Stacked dimensions must have blocks of 1 (leading dimensions)."""
    sizes = block_sizes(piece.engine_shape, block)
    dims = list(range(len(piece.engine_shape)))
    for kind, d, _ in piece.path:
        if kind == "stack":
            if sizes[dims[d]] != 1:
                raise ValueError(f"{piece.engine}: stacked dimension {dims[d]} is inside the "
                                 f"block {tuple(block)}: blocks must not span stacked items")
            dims.pop(d)
    layout, grid = scale_layout(piece.engine_layout, piece.engine_shape, block)
    dst, part_grid = scale_layout(piece.task.dst, piece.task.shape, block)
    return replace(piece, task=ReshardTask(part_grid, "float32", dst, dst),
                   engine_shape=grid, engine_layout=layout)
