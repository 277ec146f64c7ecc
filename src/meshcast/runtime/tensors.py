"""Tensors as the runtime moves them: any dtype as an integer "carrier" of the same element size,
any strides, and the checks that decide whether a rank's tensor fits a plan.

The runtime never computes with the values it moves, so it works on a same-size integer view of
every tensor (``uint8``/``int16``/``int32``/``int64``, ``complex128`` for 16 bytes): slicing,
packing and copying then work for every dtype torch has (float8, bit types, sub-byte integers,
complex32, ...), and a same-size ``view`` works for any strides. Messages are byte views of
contiguous tensors (:func:`as_bytes`), which also works for one-element and empty tensors whose
strides are odd.
"""

from __future__ import annotations

import math

import torch

from ..core.region import Region
from ..core.task import ReshardTask
from .overlap import may_overlap_itself

__all__ = [
    "allocate_out",
    "as_bytes",
    "as_carrier",
    "carrier_dtype",
    "check_local",
    "check_out",
    "empty_out",
    "shard_of",
    "torch_dtype",
]

_CARRIERS = {
    1: torch.uint8,
    2: torch.int16,
    4: torch.int32,
    8: torch.int64,
    16: torch.complex128,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a plan's dtype name."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"the plan's dtype {name!r} has no torch equivalent in torch "
                         f"{torch.__version__}")
    return dtype


def carrier_dtype(itemsize: int) -> torch.dtype:
    """The integer dtype of ``itemsize`` bytes the runtime moves elements as."""
    try:
        return _CARRIERS[itemsize]
    except KeyError:
        raise ValueError(f"no carrier for elements of {itemsize} bytes") from None


def as_carrier(t: torch.Tensor) -> torch.Tensor:
    """``t`` (any dtype, any strides) as a same-shape view of its carrier dtype, detached, with
    any lazy conjugate or negative bit applied first (a copy only then)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.view(carrier_dtype(t.element_size()))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor (``is_contiguous()``) as a 1-D ``uint8`` view of its bytes, whatever
    strides its size-1 or empty dimensions report."""
    if not t.is_contiguous():
        raise ValueError("as_bytes needs a contiguous tensor")
    return t.as_strided((t.numel(),), (1,)).view(torch.uint8)


def empty_out(region: Region, itemsize: int, device: torch.device) -> torch.Tensor:
    """A new contiguous carrier tensor for a destination shard, not initialised: a plan delivers
    every element of it exactly once (``Plan.check``), and a failed call returns nothing, so
    zeroing it first would only cost a pass over its memory."""
    return torch.empty(region.shape, dtype=carrier_dtype(itemsize), device=device)


def allocate_out(region: Region | None, itemsize: int, device: torch.device
                 ) -> tuple[torch.Tensor | None, str | None]:
    """:func:`empty_out` where this rank has a destination ``region`` (None where it has none),
    or why it cannot be allocated (no memory left, a device this build lacks): found before the
    agreement, so that every rank refuses the call instead of waiting for this one."""
    if region is None:
        return None, None
    try:
        return empty_out(region, itemsize, device), None
    except (RuntimeError, AssertionError, MemoryError) as exc:
        nbytes = math.prod(region.shape) * itemsize
        return None, f"its result ({nbytes:,} bytes on {device}) cannot be allocated: {exc}"


def check_local(
    local: object,
    region: Region | None,
    task: ReshardTask,
    rank: int,
    dtype: torch.dtype,
    device: torch.device,
) -> str | None:
    """Why ``local`` cannot be this rank's source shard of ``task`` (None: it can).

    ``region`` is the rank's source shard (None: it holds nothing and ``local`` must be None). The
    message names the rank and the rule; it completes "<argument> ...".
    """
    if region is None:
        if local is not None:
            return (
                f"must be None on rank {rank}: the rank is not in the source mesh "
                f"{task.src.mesh.notation()} and holds nothing, got {type(local).__name__}"
            )
        return None
    if not isinstance(local, torch.Tensor):
        return (
            f"must be a torch.Tensor on rank {rank} (it holds part of the source layout "
            f"{task.src.notation()}), got {type(local).__name__}"
        )
    kind = _unsupported_kind(local)
    if kind is not None:
        return f"is {kind} on rank {rank}; meshcast moves plain dense tensors"
    want = region.shape
    if tuple(local.shape) != want:
        return (
            f"has shape {tuple(local.shape)} on rank {rank}; the source layout "
            f"{task.src.notation()} of global shape {task.shape} gives this rank {want}"
        )
    if local.dtype != dtype:
        return f"has dtype {local.dtype} on rank {rank}; the plan moves {dtype}"
    if local.device != device:
        return f"is on device {local.device} on rank {rank}; expected {device}"
    return None


def check_out(
    out: object, region: Region | None, task: ReshardTask, rank: int, dtype: torch.dtype,
    device: torch.device,
) -> str | None:
    """Why ``out`` cannot receive this rank's destination shard of ``task`` in place (None: it
    can, or it is None and a new tensor is made). Any strides; every element its own memory."""
    if out is None:
        return None
    if region is None:
        return (f"must be None on rank {rank}: the rank is not in the destination mesh "
                f"{task.dst.mesh.notation()}, got {type(out).__name__}")
    if not isinstance(out, torch.Tensor):
        return f"must be a torch.Tensor or None on rank {rank}, got {type(out).__name__}"
    kind = _unsupported_kind(out)
    if kind is None and (out.is_conj() or out.is_neg()):
        kind = "a lazy conjugate or negative view (its memory is not what it reads as)"
    if kind is None and may_overlap_itself(out):
        kind = (f"a view whose elements overlap (strides {tuple(out.stride())} for shape "
                f"{tuple(out.shape)}: several elements share memory)")
    if kind is not None:
        return f"is {kind} on rank {rank}; the result is written into plain dense memory"
    if tuple(out.shape) != region.shape:
        return (f"has shape {tuple(out.shape)} on rank {rank}; the destination layout "
                f"{task.dst.notation()} of global shape {task.shape} gives this rank "
                f"{region.shape}")
    if out.dtype != dtype:
        return f"has dtype {out.dtype} on rank {rank}; the plan moves {dtype}"
    if out.device != device:
        return f"is on device {out.device} on rank {rank}; expected {device}"
    return None


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__  # (a plain function: torch's "disabled")


def _unsupported_kind(t: torch.Tensor) -> str | None:
    if type(t).__name__ == "DTensor":
        return "a DTensor (pass dt.to_local(), or use meshcast.reshard_dtensor)"
    dispatch = getattr(type(t), "__torch_dispatch__", None)
    if getattr(dispatch, "__func__", dispatch) is not _PLAIN_DISPATCH:
        return (f"a {type(t).__name__} (a tensor subclass with its own __torch_dispatch__: "
                f"its memory is not its elements)")
    if t.is_nested:
        return "a nested tensor"
    if t.layout != torch.strided:
        return f"a tensor of layout {t.layout} (sparse or otherwise not strided)"
    if t.is_quantized:
        return "a quantized tensor (reshard t.int_repr() and quantize again)"
    if t.device.type == "meta":
        return "a meta tensor (it has no data)"
    return None


def shard_of(full: torch.Tensor, region: Region) -> torch.Tensor:
    """The elements of ``full`` (a whole tensor) that ``region`` holds, in its local order: a
    view for one box; a region of several boxes (strided or fused layouts) is gathered one
    dimension at a time, each dimension of several runs copied once."""
    box = region.box
    if box is not None:
        return full[box]
    out = full
    for d, runs in enumerate(region.runs):
        if len(runs) == 1:
            out = out.narrow(d, runs[0][0], runs[0][1] - runs[0][0])
        else:
            out = torch.cat([out.narrow(d, a, b - a) for a, b in runs] or [out.narrow(d, 0, 0)],
                            dim=d)
    return out
