"""The FP8 row of the two-job weight-sync benchmark (``meshcast-fp8``): the engine keeps every
matrix whose engine shards are whole 128 x 128 blocks in ``float8_e4m3fn`` with block scales
(``name + "_scale_inv"``, as FP8 checkpoints store them), the rest in bfloat16; the trainer pushes
its bfloat16 shards and :class:`meshcast.WeightSync` converts them before the wire
(``fp8_block=``), so about half the bytes cross. The bit-exactness of the conversion is tested
(tests/test_weight_sync_jobs.py); here each engine rank checks that its dequantized weights are
within FP8's rounding of the bfloat16 values.
"""

from __future__ import annotations

from typing import Any

from ..core.layout import Layout
from ..core.scales import scale_layout
from ..core.task import ReshardTask

__all__ = ["BLOCK", "FP8", "engine_specs", "fp8_tasks", "wrong_fp8"]

FP8 = "float8_e4m3fn"
BLOCK = (128, 128)
"""The engine's weight format: DeepSeek-V3's (e4m3, 128 x 128 blocks)."""


def _grid(task: ReshardTask, layout: Layout) -> tuple[Layout, tuple[int, ...]] | None:
    """The scales' engine layout and shape, or None where the tensor stays bfloat16 (not a
    matrix, or an engine shard that cuts a block)."""
    if len(task.shape) != 2:
        return None
    try:
        return scale_layout(layout, task.shape, BLOCK)
    except ValueError:
        return None


def fp8_tasks(tasks: dict[str, ReshardTask], engine: dict[str, Layout]) -> dict[str, ReshardTask]:
    """The tasks as they cross in the FP8 row (its lower bound's input): FP8 where the engine
    keeps FP8 (the scales, under 0.01 % of the bytes, left out)."""
    return {n: ReshardTask(t.shape, FP8, t.src, t.dst) if _grid(t, engine[n]) else t
            for n, t in tasks.items()}


def engine_specs(tasks: dict[str, ReshardTask], engine: dict[str, Layout]) -> dict[str, Any]:
    """``{name: ParamSpec}`` of the engine: FP8 weights with their scales, bfloat16 the rest."""
    import torch

    from ..interop.sync_fp8 import SCALE_SUFFIX
    from ..interop.sync_spec import ParamSpec

    out: dict[str, Any] = {}
    for n, t in tasks.items():
        grid = _grid(t, engine[n])
        out[n] = ParamSpec(t.shape, getattr(torch, FP8) if grid else torch.bfloat16, engine[n])
        if grid:
            out[n + SCALE_SUFFIX] = ParamSpec(grid[1], torch.float32, grid[0])
    return out


def wrong_fp8(params: dict[str, Any], expect: dict[str, Any]) -> list[str]:
    """Names whose dequantized engine shard (``params``: this rank's weights and scales) is off
    the bfloat16 values ``expect`` by more than FP8's rounding (1/16 of the block's largest
    value); a tensor kept in bfloat16 must equal its values."""
    import torch

    from ..interop.sync_fp8 import SCALE_SUFFIX

    bad = []
    for n, want in expect.items():
        got = params[n]
        if got.dtype == torch.bfloat16:
            ok = torch.equal(got, want)
        else:
            scale = params[n + SCALE_SUFFIX]
            for d, b in enumerate(BLOCK):
                scale = scale.repeat_interleave(b, d)
            scale = scale[: want.shape[0], : want.shape[1]]
            ok = bool(((got.float() * scale - want.float()).abs() <= scale * 448 / 16).all())
        if not ok:
            bad.append(n)
    return bad

