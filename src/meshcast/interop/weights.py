"""Layouts of a GPT-style model's weights under pipeline x tensor parallelism (numpy only).

Megatron-style tensor parallelism, per parameter name of :class:`meshcast.models.gpt.GPT`:
column-parallel linears (``attn.c_attn``, ``mlp.c_fc``) shard their weight and bias along dim 0
(``c_attn`` each of its q, k and v parts: a fused layout),
row-parallel linears (``attn.c_proj``, ``mlp.c_proj``) shard their weight along dim 1 and
replicate their bias, the token embedding and the head are vocabulary-parallel (dim 0), layer
norms and the position embedding are replicated. Pipeline stages hold contiguous blocks of layers;
the first stage also holds the embeddings, the last the final norm and the head.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..core.layout import Layout, Replicate, Shard
from ..core.mesh import Mesh
from ..core.task import ReshardTask

__all__ = ["gpt_stage_of", "gpt_weight_tasks", "tensor_parallel_layout"]

_FUSED_QKV = ("attn.c_attn.weight", "attn.c_attn.bias")
_COLUMN = ("mlp.c_fc.weight", "mlp.c_fc.bias")
_ROW = ("attn.c_proj.weight", "mlp.c_proj.weight")
_VOCAB = ("wte.weight", "lm_head.weight")


def tensor_parallel_layout(name: str, tp_mesh: Mesh,
                           shape: Sequence[int] | None = None) -> Layout:
    """The layout of GPT parameter ``name`` under Megatron-style tensor parallelism over the
    1-D ``tp_mesh``, as :class:`meshcast.models.gpt.TensorParallelBlock` holds it.

    ``attn.c_attn`` (rows ``[q; k; v]``) is fused: rank ``r`` holds ``[q_r; k_r; v_r]``, the
    layout ``{q=C:S0+k=C:S0+v=C:S0}`` of the whole tensor, so it needs ``shape`` (a plain
    ``Shard(0)`` would give rank ``r`` rows of the wrong heads whenever the two tensor-parallel
    degrees differ)."""
    if tp_mesh.ndim != 1:
        raise ValueError(f"tp_mesh must be 1-D (one tensor-parallel group), got {tp_mesh!r}")
    if name.endswith(_FUSED_QKV):
        if shape is None:
            raise ValueError(
                f"parameter {name!r}: its layout needs its shape (each tensor-parallel rank "
                "holds its own rows of q, k and v, a fused layout of the whole tensor)")
        c = shape[0] // 3
        return Layout(tp_mesh, "{" + "+".join(f"{x}={c}:S0" for x in "qkv") + "}"
                      + "R" * (len(shape) - 1))
    if name.endswith(_COLUMN) or name in _VOCAB:
        return Layout(tp_mesh, [Shard(0)])
    if name.endswith(_ROW):
        return Layout(tp_mesh, [Shard(1)])
    return Layout(tp_mesh, [Replicate()])


def gpt_stage_of(name: str, layer_ranges: Sequence[range]) -> int:
    """The pipeline stage holding parameter ``name`` when stage ``s`` runs ``layer_ranges[s]``."""
    m = re.match(r"h\.(\d+)\.", name)
    if m:
        layer = int(m.group(1))
        for s, r in enumerate(layer_ranges):
            if layer in r:
                return s
        raise ValueError(f"parameter {name!r}: layer {layer} is in no stage of {layer_ranges}")
    if name.startswith(("wte.", "wpe.")):
        return 0
    if name.startswith(("ln_f.", "lm_head.")):
        return len(layer_ranges) - 1
    raise ValueError(f"parameter {name!r} is not a GPT parameter this helper knows")


def gpt_weight_tasks(
    params: Mapping[str, tuple[Sequence[int], str]],
    train_stages: Sequence[Mesh],
    layer_ranges: Sequence[range],
    infer_mesh: Mesh,
) -> dict[str, ReshardTask]:
    """One :class:`~meshcast.ReshardTask` per parameter: from stage ``s``'s tensor-parallel mesh
    ``train_stages[s]`` to the tensor-parallel ``infer_mesh`` (both Megatron-style).

    ``params`` maps each name to (shape, dtype name), in the model's order.
    """
    if len(train_stages) != len(layer_ranges):
        raise ValueError(
            f"train_stages has {len(train_stages)} meshes but layer_ranges has "
            f"{len(layer_ranges)} stages"
        )
    out = {}
    for name, (shape, dtype) in params.items():
        stage = train_stages[gpt_stage_of(name, layer_ranges)]
        out[name] = ReshardTask(
            shape, dtype, tensor_parallel_layout(name, stage, shape),
            tensor_parallel_layout(name, infer_mesh, shape),
        )
    return out
