"""A small decoder-only transformer (GPT), nanoGPT-style, that splits into pipeline stages.

Read top to bottom: config, attention, MLP, block, the model, then pipeline splitting.

- Deterministic: ``GPT(config, seed=0)`` initialises every parameter from a private
  ``torch.Generator`` seeded with ``seed`` (normal(0, 0.02), residual projections scaled by
  ``1/sqrt(2 n_layer)`` as in GPT-2), independent of torch's global RNG.
- No dropout, and the output head is *not* tied to the token embedding: tying would make the first
  and last pipeline stages share a weight (Megatron keeps two copies and all-reduces their
  gradients; we keep the model simple instead).
- ``TensorParallelBlock.from_block(block, tp_rank, tp_size, group)``: the same block with its
  attention heads and MLP hidden units split over ``tp_size`` ranks (Megatron-style, see
  :mod:`meshcast.parallel.tensor_parallel`); one all-reduce after attention, one after the MLP.
- ``split_stages(model, num_stages)`` cuts the model into contiguous stages: stage 0 embeds the
  tokens and runs the first blocks, the last stage runs the last blocks, the final norm and the
  head. Each stage is a module taking and returning ``{name: tensor}``; adjacent stages exchange
  ``"hidden"`` of shape (batch, seq, n_embd). ``stage_graph`` describes that traffic as plain data
  (:class:`meshcast.pipeline.StageGraph`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from ..pipeline.graph import StageGraph, TensorEdge

__all__ = [
    "GPT",
    "GPTConfig",
    "GPTStage",
    "TensorParallelBlock",
    "loss_fn",
    "split_layers",
    "split_stages",
    "stage_graph",
]


@dataclass(frozen=True)
class GPTConfig:
    """Model size. The defaults are a tiny model for tests."""

    vocab_size: int = 128
    block_size: int = 32  # longest sequence
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    bias: bool = True

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")


class CausalSelfAttention(nn.Module):
    """Multi-head attention, each position attending to itself and earlier positions."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, head size)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    """Two linear layers with a GELU between, 4x wide."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TensorParallelBlock(nn.Module):
    """A :class:`Block` split over ``tp_size`` ranks: rank ``r`` runs heads
    ``r*H/tp .. (r+1)*H/tp`` and MLP hidden units ``r*4C/tp .. (r+1)*4C/tp``; the layer norms are
    replicated. Input and output: the full hidden state, the same on every rank."""

    def __init__(self, config: GPTConfig, tp_rank: int, tp_size: int, group=None) -> None:
        super().__init__()
        if config.n_head % tp_size:
            raise ValueError(f"n_head={config.n_head} must be divisible by tp_size={tp_size}")
        C = config.n_embd
        self.local_heads = config.n_head // tp_size
        self.ln_1 = nn.LayerNorm(C, bias=config.bias)
        self.c_attn = ColumnParallelLinear(C, 3 * C, tp_rank, tp_size, group, bias=config.bias)
        self.attn_proj = RowParallelLinear(C, C, tp_rank, tp_size, group, bias=config.bias)
        self.ln_2 = nn.LayerNorm(C, bias=config.bias)
        self.c_fc = ColumnParallelLinear(C, 4 * C, tp_rank, tp_size, group, bias=config.bias)
        self.mlp_proj = RowParallelLinear(4 * C, C, tp_rank, tp_size, group, bias=config.bias)

    @classmethod
    def from_block(cls, block: Block, config: GPTConfig, tp_rank: int, tp_size: int, group=None
                   ) -> TensorParallelBlock:
        """This rank's shard of ``block`` (weights copied)."""
        tp = cls(config, tp_rank, tp_size, group)
        C, per = config.n_embd, config.n_embd // tp_size
        # reorder the rows of c_attn from [q | k | v] to [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] so that
        # a contiguous column-parallel shard holds the q, k and v of this rank's heads
        order = torch.cat([
            torch.arange(part * C + r * per, part * C + (r + 1) * per)
            for r in range(tp_size) for part in range(3)
        ])
        qkv = nn.Linear(C, 3 * C, bias=config.bias)
        with torch.no_grad():
            qkv.weight.copy_(block.attn.c_attn.weight[order])
            if config.bias:
                qkv.bias.copy_(block.attn.c_attn.bias[order])
            tp.ln_1.load_state_dict(block.ln_1.state_dict())
            tp.ln_2.load_state_dict(block.ln_2.state_dict())
        tp.c_attn = ColumnParallelLinear.from_full(qkv, tp_rank, tp_size, group)
        tp.attn_proj = RowParallelLinear.from_full(block.attn.c_proj, tp_rank, tp_size, group)
        tp.c_fc = ColumnParallelLinear.from_full(block.mlp.c_fc, tp_rank, tp_size, group)
        tp.mlp_proj = RowParallelLinear.from_full(block.mlp.c_proj, tp_rank, tp_size, group)
        return tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).chunk(3, dim=2)  # this rank's heads
        q, k, v = (t.view(B, T, self.local_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, -1))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """Token + position embedding, ``n_layer`` blocks, final norm, linear head to the vocabulary."""

    def __init__(self, config: GPTConfig, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if seed is not None:  # None: leave torch's default init (e.g. on the meta device)
            self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Initialise every parameter from ``seed`` alone (same values on every process)."""
        g = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():  # fixed order: registration order
            if ".ln_" in name or name.startswith("ln_f"):
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                std = residual_std if name.endswith("c_proj.weight") else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) -> hidden (batch, seq, n_embd)."""
        T = idx.shape[1]
        if self.config.block_size < T:
            raise ValueError(f"sequence of {T} tokens is longer than block_size")
        pos = torch.arange(T, device=idx.device)
        return self.wte(idx) + self.wpe(pos)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden -> logits (batch, seq, vocab)."""
        return self.lm_head(self.ln_f(x))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) -> logits (batch, seq, vocab)."""
        x = self.embed(idx)
        for block in self.h:
            x = block(x)
        return self.head(x)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; ``targets`` (batch, seq) are the token ids to predict."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# -- pipeline stages ------------------------------------------------------------------------------
def split_layers(
    n_layer: int, num_stages: int, layers_per_stage: Sequence[int] | None = None
) -> list[range]:
    """Blocks of each stage, contiguous. Default: as even as possible, earlier stages take the
    extra ones; ``layers_per_stage`` gives the counts instead (e.g. fewer on the last stage, which
    also runs the head)."""
    if layers_per_stage is None:
        if not 1 <= num_stages <= max(n_layer, 1):
            raise ValueError(f"num_stages={num_stages} must be in 1..n_layer ({n_layer})")
        per, extra = divmod(n_layer, num_stages)
        layers_per_stage = [per + (1 if i < extra else 0) for i in range(num_stages)]
    counts = list(layers_per_stage)
    if len(counts) != num_stages or sum(counts) != n_layer or min(counts, default=0) < 0:
        raise ValueError(f"layers_per_stage={counts} must be {num_stages} non-negative counts "
                         f"summing to n_layer={n_layer}")
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


class GPTStage(nn.Module):
    """Stage ``index`` of ``num_stages``: [embedding] + some blocks + [final norm and head].

    ``forward({"idx": ...})`` on the first stage, ``forward({"hidden": ...})`` on the others;
    returns ``{"hidden": ...}`` except on the last stage, which returns ``{"logits": ...}``. The
    submodules are the model's own (no copy): a stage trains the model's parameters.
    """

    def __init__(self, model: GPT, index: int, num_stages: int, layers: Sequence[int]) -> None:
        super().__init__()
        self.index, self.num_stages = index, num_stages
        self.layers = tuple(layers)
        self.wte = model.wte if index == 0 else None
        self.wpe = model.wpe if index == 0 else None
        self.config = model.config
        self.h = nn.ModuleList(model.h[j] for j in self.layers)
        last = index == num_stages - 1
        self.ln_f = model.ln_f if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.wte is not None:
            idx = inputs["idx"]
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        else:
            x = inputs["hidden"]
        for block in self.h:
            x = block(x)
        if self.lm_head is not None:
            return {"logits": self.lm_head(self.ln_f(x))}
        return {"hidden": x}


def split_stages(
    model: GPT, num_stages: int, layers_per_stage: Sequence[int] | None = None
) -> list[GPTStage]:
    """The model as ``num_stages`` pipeline stages (see :func:`split_layers` for the cut)."""
    ranges = split_layers(model.config.n_layer, num_stages, layers_per_stage)
    return [GPTStage(model, i, num_stages, r) for i, r in enumerate(ranges)]


def stage_graph(
    config: GPTConfig, num_stages: int, batch_size: int, seq_len: int, dtype: str = "float32"
) -> StageGraph:
    """What :func:`split_stages` stages exchange per microbatch of ``batch_size`` sequences."""
    if not 1 <= num_stages <= max(config.n_layer, 1):
        raise ValueError(f"num_stages={num_stages} must be in 1..n_layer ({config.n_layer})")
    shape = (batch_size, seq_len, config.n_embd)
    return StageGraph(
        num_stages,
        tuple(TensorEdge("hidden", i, i + 1, shape, dtype) for i in range(num_stages - 1)),
        inputs=(("idx", 0),),
        outputs=(("logits", num_stages - 1),),
    )
