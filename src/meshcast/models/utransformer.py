"""A transformer U-Net (U-Transformer) that splits into pipeline stages, skips crossing stages.

The shape of a diffusion-model backbone: a sequence of tokens goes down ``levels`` levels (each a
few transformer blocks, then a merge of token pairs: half the tokens, twice the width), through a
middle, and back up (split each token in two, fuse with the *skip connection* saved by the down
block of that level, transformer blocks). Read top to bottom: config, block, down, up, the model,
then pipeline splitting.

- Input: ``x`` of shape (batch, seq_len, in_dim), e.g. flattened image patches; output: same shape
  (e.g. the predicted noise). No timestep conditioning: the communication pattern is what matters
  here, and a timestep embedding would only add a small input to every stage.
- Deterministic: ``UTransformer(config, seed=0)`` initialises from its own ``torch.Generator``.
- Pipeline: the model is a chain of *units* ``down0 .. down{L-1}, middle, up{L-1} .. up0``
  (the input projection rides with the first unit, the output head with the last). Stages are
  contiguous runs of units. Adjacent stages exchange ``"hidden"``; the skip of level ``k``
  (``"skip{k}"``, shape (batch, seq_len / 2^k, dim * 2^k)) goes straight from the stage holding
  ``down{k}`` to the stage holding ``up{k}``, which for ``k`` < the last level is a later,
  non-adjacent stage: e.g. 5 units in 4 stages ``[down0 down1] [middle] [up1] [up0]`` send
  ``skip1`` from stage 0 to 2 and ``skip0`` from stage 0 to 3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from ..pipeline.graph import StageGraph, TensorEdge

__all__ = [
    "TensorParallelBlock",
    "UTransformer",
    "UTransformerConfig",
    "UTransformerStage",
    "loss_fn",
    "split_stages",
    "split_units",
    "stage_graph",
    "unit_names",
]


@dataclass(frozen=True)
class UTransformerConfig:
    """Model size. The defaults are a tiny model for tests."""

    in_dim: int = 8  # features per input token
    dim: int = 32  # width at the top level; doubles at each level down
    levels: int = 2  # number of down blocks (= number of up blocks)
    blocks_per_level: int = 1  # transformer blocks in each down / up block and in the middle
    n_head: int = 2
    seq_len: int = 16  # tokens at the top level; halves at each level down
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        if self.levels < 1 or self.seq_len % (2**self.levels):
            raise ValueError(f"seq_len={self.seq_len} must be divisible by 2**levels "
                             f"(levels={self.levels} >= 1)")
        if self.dim % self.n_head:
            raise ValueError(f"dim={self.dim} must be a multiple of n_head={self.n_head}")

    def width(self, level: int) -> int:
        """Channels at ``level`` (0 = top)."""
        return self.dim * 2**level

    def tokens(self, level: int) -> int:
        """Tokens at ``level`` (0 = top)."""
        return self.seq_len // 2**level


class Block(nn.Module):
    """Pre-norm transformer block with bidirectional attention."""

    def __init__(self, width: int, n_head: int, mlp_ratio: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, mlp_ratio * width)
        self.fc_out = nn.Linear(mlp_ratio * width, width)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


class TensorParallelBlock(nn.Module):
    """A :class:`Block` split over ``tp_size`` ranks (Megatron-style, like
    :class:`meshcast.models.gpt.TensorParallelBlock`): rank ``r`` runs heads
    ``r*H/tp .. (r+1)*H/tp`` and MLP hidden units ``r*mC/tp .. (r+1)*mC/tp``; the layer norms are
    replicated. Input and output: the full hidden state, the same on every rank."""

    def __init__(self, width: int, n_head: int, mlp_ratio: int, tp_rank: int, tp_size: int,
                 group=None) -> None:
        super().__init__()
        if n_head % tp_size:
            raise ValueError(f"n_head={n_head} must be divisible by tp_size={tp_size}")
        self.local_heads = n_head // tp_size
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = ColumnParallelLinear(width, 3 * width, tp_rank, tp_size, group)
        self.proj = RowParallelLinear(width, width, tp_rank, tp_size, group)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = ColumnParallelLinear(width, mlp_ratio * width, tp_rank, tp_size, group)
        self.fc_out = RowParallelLinear(mlp_ratio * width, width, tp_rank, tp_size, group)

    @classmethod
    def from_block(cls, block: Block, tp_rank: int, tp_size: int, group=None
                   ) -> TensorParallelBlock:
        """This rank's shard of ``block`` (weights copied)."""
        C = block.qkv.in_features
        tp = cls(C, block.n_head, block.fc.out_features // C, tp_rank, tp_size, group)
        per = C // tp_size
        # rows of qkv from [q | k | v] to [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]: a contiguous
        # column-parallel shard then holds the q, k and v of this rank's heads
        order = torch.cat([
            torch.arange(part * C + r * per, part * C + (r + 1) * per)
            for r in range(tp_size) for part in range(3)
        ])
        qkv = nn.Linear(C, 3 * C)
        with torch.no_grad():
            qkv.weight.copy_(block.qkv.weight[order])
            qkv.bias.copy_(block.qkv.bias[order])
            tp.ln_1.load_state_dict(block.ln_1.state_dict())
            tp.ln_2.load_state_dict(block.ln_2.state_dict())
        tp.qkv = ColumnParallelLinear.from_full(qkv, tp_rank, tp_size, group)
        tp.proj = RowParallelLinear.from_full(block.proj, tp_rank, tp_size, group)
        tp.fc = ColumnParallelLinear.from_full(block.fc, tp_rank, tp_size, group)
        tp.fc_out = RowParallelLinear.from_full(block.fc_out, tp_rank, tp_size, group)
        return tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(self.ln_1(x)).chunk(3, dim=2)  # this rank's heads
        q, k, v = (t.view(B, T, self.local_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, -1))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


class Down(nn.Module):
    """Level ``k`` going down: blocks at width d, save the skip, merge token pairs to width 2d."""

    def __init__(self, config: UTransformerConfig, level: int) -> None:
        super().__init__()
        d = config.width(level)
        self.blocks = nn.Sequential(
            *(Block(d, config.n_head, config.mlp_ratio) for _ in range(config.blocks_per_level))
        )
        self.merge = nn.Linear(2 * d, config.width(level + 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (skip, x for the next level down)."""
        skip = self.blocks(x)
        B, T, C = skip.shape
        return skip, self.merge(skip.reshape(B, T // 2, 2 * C))


class Up(nn.Module):
    """Level ``k`` going up: split each token in two at width d, fuse with the skip, blocks."""

    def __init__(self, config: UTransformerConfig, level: int) -> None:
        super().__init__()
        d = config.width(level)
        self.split = nn.Linear(config.width(level + 1), 2 * d)
        self.fuse = nn.Linear(2 * d, d)
        self.blocks = nn.Sequential(
            *(Block(d, config.n_head, config.mlp_ratio) for _ in range(config.blocks_per_level))
        )

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        x = self.split(x).reshape(B, 2 * T, -1)
        return self.blocks(self.fuse(torch.cat([x, skip], dim=-1)))


class UTransformer(nn.Module):
    """Input projection, ``levels`` down blocks, middle, ``levels`` up blocks, output head."""

    def __init__(self, config: UTransformerConfig, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        L = config.levels
        self.in_proj = nn.Linear(config.in_dim, config.dim)
        self.pos = nn.Parameter(torch.zeros(config.seq_len, config.dim))
        self.down = nn.ModuleList(Down(config, k) for k in range(L))
        self.middle = nn.Sequential(
            *(Block(config.width(L), config.n_head, config.mlp_ratio)
              for _ in range(config.blocks_per_level))
        )
        self.up = nn.ModuleList(Up(config, k) for k in range(L))  # up[k] pairs with down[k]
        self.ln_out = nn.LayerNorm(config.dim)
        self.out_proj = nn.Linear(config.dim, config.in_dim)
        if seed is not None:  # None: leave torch's default init (e.g. on the meta device)
            self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Initialise every parameter from ``seed`` alone (same values on every process)."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():  # fixed order: registration order
            if ".ln_" in name or name.startswith("ln_"):
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq_len, in_dim) -> (batch, seq_len, in_dim)."""
        h = self.in_proj(x) + self.pos
        skips = []
        for down in self.down:
            skip, h = down(h)
            skips.append(skip)
        h = self.middle(h)
        for k in reversed(range(self.config.levels)):
            h = self.up[k](h, skips[k])
        return self.out_proj(self.ln_out(h))


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error (a denoiser predicts the noise)."""
    return F.mse_loss(out, target)


# -- pipeline stages ------------------------------------------------------------------------------
def unit_names(levels: int) -> list[str]:
    """The chain of units: ``down0 .. down{L-1}, middle, up{L-1} .. up0``."""
    return (
        [f"down{k}" for k in range(levels)] + ["middle"]
        + [f"up{k}" for k in reversed(range(levels))]
    )


def split_units(levels: int, num_stages: int) -> list[list[str]]:
    """Units of each stage: contiguous runs, as even as possible, earlier stages take extras."""
    units = unit_names(levels)
    if not 1 <= num_stages <= len(units):
        raise ValueError(f"num_stages={num_stages} must be in 1..{len(units)} (2 * levels + 1)")
    per, extra = divmod(len(units), num_stages)
    out, start = [], 0
    for i in range(num_stages):
        stop = start + per + (1 if i < extra else 0)
        out.append(units[start:stop])
        start = stop
    return out


def _unit_output(config: UTransformerConfig, unit: str) -> tuple[int, int]:
    """(tokens, width) of the hidden state a unit hands to the next one."""
    if unit == "middle":
        level = config.levels
    elif unit.startswith("down"):
        level = int(unit[4:]) + 1
    else:
        level = int(unit[2:])
    return config.tokens(level), config.width(level)


def _stage_of(groups: Sequence[Sequence[str]]) -> dict[str, int]:
    return {u: i for i, group in enumerate(groups) for u in group}


class UTransformerStage(nn.Module):
    """Stage ``index``: a contiguous run of units (plus the input projection on the first stage
    and the output head on the last).

    ``forward`` takes ``{"x"}`` (first stage) or ``{"hidden"}``, plus ``{"skip{k}"}`` for each up
    unit here whose down unit is on an earlier stage; it returns ``{"hidden"}`` (or ``{"out"}``
    on the last stage) plus ``{"skip{k}"}`` for each down unit here whose up unit is on a later
    stage. The submodules are the model's own (no copy).
    """

    def __init__(self, model: UTransformer, index: int, groups: Sequence[Sequence[str]]) -> None:
        super().__init__()
        self.index, self.num_stages = index, len(groups)
        self.units = tuple(groups[index])
        stage_of = _stage_of(groups)
        first, last = index == 0, index == len(groups) - 1
        self.in_proj = model.in_proj if first else None
        self.pos = model.pos if first else None
        self.ln_out = model.ln_out if last else None
        self.out_proj = model.out_proj if last else None
        self.parts = nn.ModuleDict()
        for unit in self.units:
            if unit == "middle":
                self.parts[unit] = model.middle
            elif unit.startswith("down"):
                self.parts[unit] = model.down[int(unit[4:])]
            else:
                self.parts[unit] = model.up[int(unit[2:])]
        # skips leaving this stage: down units here whose up unit is later
        self.skips_out = tuple(
            int(u[4:])
            for u in self.units
            if u.startswith("down") and stage_of[f"up{u[4:]}"] > index
        )

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        h = self.in_proj(inputs["x"]) + self.pos if self.in_proj is not None else inputs["hidden"]
        skips = {int(name[4:]): t for name, t in inputs.items() if name.startswith("skip")}
        for unit in self.units:
            part = self.parts[unit]
            if unit.startswith("down"):
                skips[int(unit[4:])], h = part(h)
            elif unit.startswith("up"):
                h = part(h, skips[int(unit[2:])])
            else:
                h = part(h)
        result = {f"skip{k}": skips[k] for k in self.skips_out}
        if self.out_proj is not None:
            result["out"] = self.out_proj(self.ln_out(h))
        else:
            result["hidden"] = h
        return result


def split_stages(model: UTransformer, num_stages: int) -> list[UTransformerStage]:
    """The model as ``num_stages`` pipeline stages (see :func:`split_units` for the cut)."""
    groups = split_units(model.config.levels, num_stages)
    return [UTransformerStage(model, i, groups) for i in range(num_stages)]


def stage_graph(
    config: UTransformerConfig, num_stages: int, batch_size: int, dtype: str = "float32"
) -> StageGraph:
    """What :func:`split_stages` stages exchange per microbatch of ``batch_size`` sequences."""
    groups = split_units(config.levels, num_stages)
    stage_of = _stage_of(groups)
    edges: list[TensorEdge] = []
    for i in range(num_stages - 1):
        tokens, width = _unit_output(config, groups[i][-1])
        edges.append(TensorEdge("hidden", i, i + 1, (batch_size, tokens, width), dtype))
    for k in range(config.levels):
        src, dst = stage_of[f"down{k}"], stage_of[f"up{k}"]
        if src != dst:
            shape = (batch_size, config.tokens(k), config.width(k))
            edges.append(TensorEdge(f"skip{k}", src, dst, shape, dtype))
    return StageGraph(
        num_stages, tuple(edges), inputs=(("x", 0),), outputs=(("out", num_stages - 1),)
    )
