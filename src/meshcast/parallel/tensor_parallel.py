"""Megatron-style tensor-parallel linear layers (imports torch; not imported by meshcast.pipeline).

A linear layer ``y = x W^T + b`` with ``W`` of shape (out, in) is split over the ``tp_size`` ranks
of a process group in one of two ways (Shoeybi et al., Megatron-LM, 2019):

- :class:`ColumnParallelLinear`: rank ``r`` holds rows ``r*out/tp .. (r+1)*out/tp`` of ``W`` (the
  output features, the "columns" of ``W^T``) and of ``b``; it computes its slice of ``y`` from the
  full input. Concatenating the slices of all ranks gives ``y``: the very same dot products
  (bitwise equal unless the matmul kernel, chosen by matrix width, adds in another order). The
  input's gradient is the sum over ranks (an all-reduce in backward).
- :class:`RowParallelLinear`: rank ``r`` holds columns ``r*in/tp .. (r+1)*in/tp`` of ``W`` and
  takes the matching slice of ``x``; the partial products are summed with an all-reduce, and ``b``
  is added once after the sum. Equal to ``y`` up to float rounding (the sum is split differently).

A column-parallel layer followed by a row-parallel one (an MLP, or attention with heads split
over ranks) needs one all-reduce in forward and one in backward.

Both layers take ``tp_rank``, ``tp_size`` and a ``torch.distributed`` process group (None: the
default group). ``tp_size == 1`` never communicates. ``local_forward`` computes the rank's part
without any communication, which lets one process check all shards against the full layer. Build
them from a full ``nn.Linear`` with ``from_full`` (to compare a TP run with a single-process run),
or from a seed: the shard of the weight that :func:`reference_linear` with the same seed has.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "copy_to_tensor_parallel",
    "gather_from_tensor_parallel",
    "reduce_from_tensor_parallel",
    "reference_linear",
    "scatter_to_tensor_parallel",
]


# -- collectives with the right gradients ---------------------------------------------------------
def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    x = x.clone()
    dist.all_reduce(x, group=group)
    return x


def _all_gather_last(x: torch.Tensor, group) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _chunk_last(x: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return x.chunk(size, dim=-1)[rank].contiguous()


class _CopyToTP(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce (each rank's use of x contributes a gradient)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """Forward: all-reduce (sum the partial products). Backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """Forward: all-gather along the last dimension. Backward: keep this rank's chunk."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        g = ctx.group
        return _chunk_last(grad, dist.get_rank(g), dist.get_world_size(g)), None


class _ScatterToTP(torch.autograd.Function):
    """Forward: keep this rank's chunk of the last dimension. Backward: all-gather."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _chunk_last(x, dist.get_rank(group), dist.get_world_size(group))

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_last(grad, ctx.group), None


def copy_to_tensor_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """Identity forward, all-reduce of the gradient in backward."""
    return _CopyToTP.apply(x, group)


def reduce_from_tensor_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-reduce (sum) forward, identity backward."""
    return _ReduceFromTP.apply(x, group)


def gather_from_tensor_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-gather along the last dimension forward, own chunk of the gradient backward."""
    return _GatherFromTP.apply(x, group)


def scatter_to_tensor_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """Own chunk of the last dimension forward, all-gather of the gradient backward."""
    return _ScatterToTP.apply(x, group)


# -- layers ---------------------------------------------------------------------------------------
def _full_init(out_features: int, in_features: int, seed: int, bias: bool):
    """The full weight (and bias) :func:`reference_linear` gets from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(in_features)  # nn.Linear's default range, drawn from our generator
    w = (torch.rand(out_features, in_features, generator=g) * 2 - 1) * bound
    b = (torch.rand(out_features, generator=g) * 2 - 1) * bound if bias else None
    return w, b


def reference_linear(in_features: int, out_features: int, seed: int = 0, bias: bool = True
                     ) -> nn.Linear:
    """A full ``nn.Linear`` initialised from ``seed``, the layer that the tensor-parallel layers
    built with the same seed are shards of."""
    layer = nn.Linear(in_features, out_features, bias=bias)
    w, b = _full_init(out_features, in_features, seed, bias)
    with torch.no_grad():
        layer.weight.copy_(w)
        if bias:
            layer.bias.copy_(b)
    return layer


def _check_tp(tp_rank: int, tp_size: int, features: int, what: str) -> None:
    if not (isinstance(tp_size, int) and tp_size >= 1 and isinstance(tp_rank, int)
            and 0 <= tp_rank < tp_size):
        raise ValueError(f"need 0 <= tp_rank < tp_size, got tp_rank={tp_rank}, tp_size={tp_size}")
    if features % tp_size:
        raise ValueError(f"{what}={features} must be divisible by tp_size={tp_size}")


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with the output features split over the ranks of ``group``.

    Input: the full ``x`` (same on every rank). Output: this rank's slice of ``y`` (features
    ``out_range``), or all of ``y`` when ``gather_output``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        tp_rank: int,
        tp_size: int,
        group=None,
        *,
        bias: bool = True,
        gather_output: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        _check_tp(tp_rank, tp_size, out_features, "out_features")
        self.in_features, self.out_features = in_features, out_features
        self.tp_rank, self.tp_size, self.group = tp_rank, tp_size, group
        self.gather_output = gather_output
        w, b = _full_init(out_features, in_features, seed, bias)
        rows = self.out_range
        self.weight = nn.Parameter(w[rows.start : rows.stop].clone())
        self.bias = nn.Parameter(b[rows.start : rows.stop].clone()) if bias else None

    @property
    def out_range(self) -> range:
        """Output features this rank computes."""
        per = self.out_features // self.tp_size
        return range(self.tp_rank * per, (self.tp_rank + 1) * per)

    @classmethod
    def from_full(
        cls, linear: nn.Linear, tp_rank: int, tp_size: int, group=None, *,
        gather_output: bool = False,
    ) -> ColumnParallelLinear:
        """This rank's shard of ``linear`` (weights copied)."""
        layer = cls(linear.in_features, linear.out_features, tp_rank, tp_size, group,
                    bias=linear.bias is not None, gather_output=gather_output)
        rows = layer.out_range
        with torch.no_grad():
            layer.weight.copy_(linear.weight[rows.start : rows.stop])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias[rows.start : rows.stop])
        return layer

    def local_forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's slice of ``y``, without communication."""
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.local_forward(x)
        y = self.local_forward(copy_to_tensor_parallel(x, self.group))
        return gather_from_tensor_parallel(y, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features} (rows {self.out_range.start}:"
                f"{self.out_range.stop}), tp={self.tp_rank}/{self.tp_size}")


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with the input features split over the ranks of ``group``.

    Input: this rank's slice of ``x`` (features ``in_range``; e.g. the output of a
    :class:`ColumnParallelLinear`), or the full ``x`` when ``input_is_parallel=False`` (each rank
    then takes its slice). Output: the full ``y``, the same on every rank.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        tp_rank: int,
        tp_size: int,
        group=None,
        *,
        bias: bool = True,
        input_is_parallel: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        _check_tp(tp_rank, tp_size, in_features, "in_features")
        self.in_features, self.out_features = in_features, out_features
        self.tp_rank, self.tp_size, self.group = tp_rank, tp_size, group
        self.input_is_parallel = input_is_parallel
        w, b = _full_init(out_features, in_features, seed, bias)
        cols = self.in_range
        self.weight = nn.Parameter(w[:, cols.start : cols.stop].clone())
        self.bias = nn.Parameter(b.clone()) if bias else None  # full, added once after the sum

    @property
    def in_range(self) -> range:
        """Input features this rank multiplies."""
        per = self.in_features // self.tp_size
        return range(self.tp_rank * per, (self.tp_rank + 1) * per)

    @classmethod
    def from_full(
        cls, linear: nn.Linear, tp_rank: int, tp_size: int, group=None, *,
        input_is_parallel: bool = True,
    ) -> RowParallelLinear:
        """This rank's shard of ``linear`` (weights copied; the bias is kept whole)."""
        layer = cls(linear.in_features, linear.out_features, tp_rank, tp_size, group,
                    bias=linear.bias is not None, input_is_parallel=input_is_parallel)
        cols = layer.in_range
        with torch.no_grad():
            layer.weight.copy_(linear.weight[:, cols.start : cols.stop])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def local_forward(self, x_local: torch.Tensor) -> torch.Tensor:
        """This rank's partial product (no bias), without communication; the sum over ranks plus
        the bias is ``y``."""
        return F.linear(x_local, self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1 and not self.input_is_parallel:
            x = scatter_to_tensor_parallel(x, self.group)
        y = self.local_forward(x)
        if self.tp_size > 1:
            y = reduce_from_tensor_parallel(y, self.group)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in={self.in_features} (cols {self.in_range.start}:{self.in_range.stop}), "
                f"out={self.out_features}, tp={self.tp_rank}/{self.tp_size}")
