"""FP8 on the way of a weight sync (:class:`meshcast.WeightSync`, ``fp8_block``): where the engine
declares a parameter ``name`` in ``float8_e4m3fn`` or ``float8_e5m2``, it declares its float32
scales too, as the parameter ``name + SCALE_SUFFIX`` (``"w"`` -> ``"w_scale_inv"``, DeepSeek-V3's
``weight_scale_inv``), in the layout :func:`meshcast.scale_layout` gives (per tensor: a 0-d
tensor on every rank of the weight's mesh; per block: the weight's layout on the block grid).

Every sync, before the weights move, the trainer ranks and the engine ranks holding scales run
one :func:`meshcast.combine_amax` over the joint group for all FP8 tensors together (the
exchanges :func:`meshcast.plan_amax` planned once): each trainer rank then converts its shard with
:func:`meshcast.quantize_shard` (FP8 bytes on the wire), and each engine rank computes its scales
(:func:`meshcast.scales_of`) from the whole ``amax`` of its blocks: both bit for bit what
:func:`meshcast.quantize` gives on the whole tensor. No scale crosses the wire as a tensor.
A fused or stacked engine tensor (``mapping=``) is scaled block-wise, each part from its own
trainer tensor, its scales placed by :func:`meshcast.scale_piece` (:func:`plan_fp8`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from ..core.layout import Layout
from ..core.names import Piece
from ..core.scales import FP8_MAX, scale_layout, scale_piece
from ..planning.amax import AmaxPlan, plan_amax
from ..runtime.convert import combine_amax, partial_amax, quantize_shard, scales_of
from ..runtime.joint import JointGroup
from .sync_spec import Route, shift_layout

__all__ = ["SCALE_SUFFIX", "Fp8Block", "Fp8Route", "combine", "plan_fp8", "scale_names",
           "scale_targets", "trainer_maker"]

SCALE_SUFFIX = "_scale_inv"
"""The engine's scale parameter of an FP8 parameter ``name`` is ``name + SCALE_SUFFIX``."""

Fp8Block = Sequence[int] | None | Mapping[str, Sequence[int] | None]
"""The scaling of the engine's FP8 parameters: a block size of the last dimensions (e.g.
``(128, 128)``) for all, None for one scale per tensor, or ``{engine name: block or None}``."""


class Fp8Route(NamedTuple):
    """An FP8 route of the sync: ``routes[index]``, scaled per ``block`` (None: per tensor), its
    scales (layout ``plan.dst``, joint ranks) in the engine parameter ``scale`` (layout
    ``layout`` of shape ``grid``): the whole of it, or for a part of a fused or stacked engine
    tensor the place ``piece`` gives (:func:`meshcast.scale_piece`)."""

    index: int
    block: tuple[int, ...] | None
    dtype: str
    scale: str
    plan: AmaxPlan
    layout: Layout
    grid: tuple[int, ...]
    piece: Piece | None = None

    def view(self, scales: torch.Tensor, me: int) -> torch.Tensor:
        """This route's scales inside joint rank ``me``'s shard ``scales`` of ``scale``."""
        return scales if self.piece is None else self.piece.dst_view(scales, me)


def is_fp8(dtype: Any) -> bool:
    """Whether ``dtype`` (a torch dtype or its name) is a scaled FP8 format."""
    return str(dtype).removeprefix("torch.") in FP8_MAX


def scale_names(engine: Mapping[str, dict]) -> list[str]:
    """The engine's scale parameters: ``name + SCALE_SUFFIX`` of each FP8 ``name`` it declares."""
    return [n + SCALE_SUFFIX for n, e in engine.items() if is_fp8(e["dtype"])
            and n + SCALE_SUFFIX in engine]


def _block(fp8_block: Fp8Block, name: str) -> tuple[int, ...] | None:
    block = fp8_block.get(name, ()) if isinstance(fp8_block, Mapping) else fp8_block
    if block == ():
        raise ValueError(f"fp8_block has no entry for the engine's FP8 tensor {name!r}")
    return None if block is None else tuple(int(b) for b in block)


def plan_fp8(routes: Sequence[Route], engine: Mapping[str, dict], offset: int,
             fp8_block: Fp8Block) -> list[Fp8Route]:
    """One :class:`Fp8Route` per route into an FP8 engine tensor, its ``amax`` exchange planned;
    every problem (no scale parameter, one in the wrong shape, dtype or layout, a shard or a
    fused part cutting a block, per-tensor scales of a fused or stacked tensor) in one
    ``ValueError`` listing them all.

    A part of a fused or stacked engine tensor (``mapping=``) is scaled block-wise as the whole
    engine tensor is, each part's blocks being whole blocks of that tensor: its scales are
    computed from its own trainer tensor and land in their place in the engine tensor's
    scales. One scale per tensor would span parts that come from different trainer tensors: it
    is refused."""
    out, problems = [], []
    for k, route in enumerate(routes):
        task, piece = route.task, route.piece
        if not is_fp8(task.dtype):
            continue
        scale = route.target + SCALE_SUFFIX
        try:
            if scale not in engine:
                raise ValueError(f"the engine declares no scale parameter {scale!r}")
            block = _block(fp8_block, route.target)
            if piece is None:
                layout, grid = scale_layout(task.dst, task.shape, block)
                dst = layout
            elif block is None:
                raise ValueError("a fused or stacked FP8 tensor needs block-wise scales "
                                 "(fp8_block): one scale per tensor would span its parts, "
                                 "which come from different trainer tensors")
            else:
                piece = scale_piece(piece, block)
                layout, grid, dst = piece.engine_layout, piece.engine_shape, piece.task.dst
            have = engine[scale]
            declared = shift_layout(Layout.from_json(have["layout"]), offset)
            if (tuple(have["shape"]), have["dtype"], declared) != (grid, "float32", layout):
                raise ValueError(
                    f"{scale!r} is declared {tuple(have['shape'])} {have['dtype']} "
                    f"{declared.notation()}; its scales ({block or 'per tensor'}) are {grid} "
                    f"float32 {layout.notation()} (joint ranks)")
        except ValueError as exc:
            problems.append(f"{route.target}: {exc}")
            continue
        out.append(Fp8Route(k, block, task.dtype, scale,
                            plan_amax(task.shape, block, task.src, dst), layout, grid, piece))
    if problems:
        raise ValueError("the engine's FP8 parameters do not fit: "
                         + "; ".join(dict.fromkeys(problems)))  # a fused tensor's parts: once
    return out


def combine(fp8: Sequence[Fp8Route], shards: Mapping[int, torch.Tensor | None],
            group: JointGroup, timeout: float,
            ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """This rank's part of the sync's one ``amax`` exchange: ``shards`` (trainer ranks: route
    index -> the local shard, None where missing) give the partials. Returns the whole ``amax``
    of this rank's touched blocks per route index, and its scales per route index (the
    route's part of its scale parameter: :meth:`Fp8Route.view`)."""
    me, partials = group.me, []
    for f in fp8:
        if me not in f.plan.partial:
            partials.append(None)
        elif shards.get(f.index) is None:  # refused later by the run, on every rank
            partials.append(torch.zeros(f.plan.partial_shape[me]))
        else:
            region = f.plan.src.region(me, f.plan.shape)
            partials.append(partial_amax(shards[f.index], region, f.plan.shape, f.block))
    done = combine_amax([f.plan for f in fp8], partials, group=group, rank=me, timeout=timeout)
    amax = {f.index: a for f, (a, _) in zip(fp8, done) if a is not None}
    scales = {f.index: scales_of(s, f.dtype) for f, (_, s) in zip(fp8, done) if s is not None}
    return amax, scales


def trainer_maker(f: Fp8Route, shard: torch.Tensor, me: int,
                  amaxes: Mapping[int, torch.Tensor]):
    """Joint rank ``me``'s FP8 conversion of ``shard`` (route ``f``), made when the transfer
    first needs it, once ``amaxes`` (:func:`combine`) holds its whole ``amax``."""
    region = f.plan.src.region(me, f.plan.shape)
    return lambda: quantize_shard(shard, region, f.plan.shape, f.block, amaxes[f.index], f.dtype)


def scale_targets(fp8: Sequence[Fp8Route], params: Mapping[str, Any] | None, me: int,
                  rank: int, local, errors: list[str]) -> dict[str, torch.Tensor | None]:
    """This engine rank's scale parameters (``local`` reads a value's local tensor), checked
    (float32, the scale layout's shard shape), or fresh tensors when ``params`` is None."""
    out: dict[str, torch.Tensor | None] = {}
    for f in fp8:
        if me not in f.layout.mesh or f.scale in out:  # (an empty shard is one too)
            continue
        shape = f.layout.shard_shape(me, f.grid)
        if params is None:
            out[f.scale] = torch.empty(shape, dtype=torch.float32)
            continue
        target = local(params.get(f.scale))
        if target is None:
            errors.append(f"params[{f.scale!r}] is missing on engine rank {rank}, which holds "
                          f"scales of it")
        elif tuple(target.shape) != tuple(shape) or target.dtype != torch.float32:
            errors.append(f"params[{f.scale!r}] is {tuple(target.shape)} {target.dtype} on "
                          f"engine rank {rank}; its scale layout gives it {tuple(shape)} "
                          f"torch.float32")
            target = None
        out[f.scale] = target
    return out
