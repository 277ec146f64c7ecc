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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from ..core.layout import Layout
from ..core.scales import FP8_MAX, scale_layout
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
    scales in the engine parameter ``scale`` (layout ``plan.dst``, joint ranks)."""

    index: int
    block: tuple[int, ...] | None
    dtype: str
    scale: str
    plan: AmaxPlan


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
    every problem (no scale parameter, one in the wrong shape, dtype or layout, a shard cutting a
    block, a fused or stacked FP8 tensor) in one ``ValueError`` listing them all."""
    out, problems = [], []
    for k, route in enumerate(routes):
        task = route.task
        if not is_fp8(task.dtype):
            continue
        scale = route.target + SCALE_SUFFIX
        try:
            if route.piece is not None:
                raise ValueError("FP8 into fused or stacked engine tensors (mapping=) is not "
                                 "supported by WeightSync yet")
            if scale not in engine:
                raise ValueError(f"the engine declares no scale parameter {scale!r}")
            block = _block(fp8_block, route.target)
            layout, grid = scale_layout(task.dst, task.shape, block)
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
                            plan_amax(task.shape, block, task.src, layout)))
    if problems:
        raise ValueError("the engine's FP8 parameters do not fit: " + "; ".join(problems))
    return out


def combine(fp8: Sequence[Fp8Route], shards: Mapping[int, torch.Tensor | None],
            group: JointGroup, timeout: float,
            ) -> tuple[dict[int, torch.Tensor], dict[str, torch.Tensor]]:
    """This rank's part of the sync's one ``amax`` exchange: ``shards`` (trainer ranks: route
    index -> the local shard, None where missing) give the partials. Returns the whole ``amax``
    of this rank's touched blocks per route index, and its scales per scale parameter."""
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
    scales = {f.scale: scales_of(s, f.dtype) for f, (_, s) in zip(fp8, done) if s is not None}
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
        if me not in f.plan.scale:
            continue
        shape = () if f.block is None else f.plan.dst.shard_shape(me, f.plan.grid)
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
