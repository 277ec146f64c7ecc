"""Dtype conversion on the sending side, exactly as on the whole tensor (imports torch).

A trainer rank converts its shard before it goes on the wire (an FP8 shard is a quarter of the
float32 bytes): to bfloat16 or float16 element by element (``local.to(dtype)``), or to FP8
(``float8_e4m3fn``, ``float8_e5m2``) with per-tensor or block-wise scales
(:mod:`meshcast.core.scales`). A scaled conversion of a shard equals, bit for bit, the same
conversion of the whole tensor cut by the layout, because every step is element by element except
``amax``, and a maximum is exact in any order:

1. :func:`partial_amax`: each source rank's magnitudes of the blocks its shard touches;
2. :func:`combine_amax`: the exchange :func:`meshcast.planning.amax.plan_amax` plans, over a
   process group: each source rank gets the whole ``amax`` of its blocks, each rank of the scale
   layout its scales (float32, ``amax / fp8_max``);
3. :func:`quantize_shard`: ``(x / scale).to(fp8)`` on the shard, each element with its block's
   scale. :func:`quantize` is the same on a whole tensor, the reference.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..core.region import Region
from ..core.scales import FP8_MAX, MIN_AMAX, touched_blocks
from ..planning.amax import AmaxPlan
from .errors import ReshardError
from .execute import DEFAULT_TIMEOUT
from .joint import JointGroup, group_rank, post, to_global_of
from .tensors import torch_dtype

__all__ = ["combine_amax", "partial_amax", "quantize", "quantize_shard", "scales_of"]

_TAG = 0x4D43  # the exchange's messages, apart from any plan's


def _scaled(dtype: str) -> torch.dtype:
    if str(dtype).removeprefix("torch.") not in FP8_MAX:
        raise ValueError(f"dtype {dtype!r} has no scaled conversion; scaled: {', '.join(FP8_MAX)}")
    return torch_dtype(str(dtype).removeprefix("torch."))


def partial_amax(
    local: torch.Tensor, region: Region, shape: Sequence[int], block: Sequence[int] | None
) -> torch.Tensor:
    """The largest magnitude (float32) of each block ``local`` (the shard of ``region``) touches:
    a tensor over the product of the touched block ids of each dimension."""
    x = local.detach().float().abs()
    for d, (ids, counts, _) in enumerate(touched_blocks(region, shape, block)):
        if len(ids) == x.shape[d]:
            continue  # one index per block: its magnitude is itself
        if (counts == counts[0]).all():
            x = x.unflatten(d, (len(ids), int(counts[0]))).amax(dim=d + 1)
        else:
            x = torch.cat([p.amax(dim=d, keepdim=True)
                           for p in torch.split(x, counts.tolist(), dim=d)], dim=d)
    return x


def scales_of(amax: torch.Tensor, dtype: str) -> torch.Tensor:
    """Scales (float32, ``weight_scale_inv``) of blocks of ``amax``: ``max(amax, MIN_AMAX) /
    fp8_max``; the stored element is ``x / scale``, and ``q * scale`` dequantizes."""
    _scaled(dtype)
    return amax.float().clamp(min=MIN_AMAX) / FP8_MAX[str(dtype).removeprefix("torch.")]


def quantize_shard(
    local: torch.Tensor, region: Region, shape: Sequence[int], block: Sequence[int] | None,
    amax: torch.Tensor, dtype: str,
) -> torch.Tensor:
    """``local`` (the shard of ``region``) in ``dtype`` (FP8), each element divided by its
    block's scale: ``amax`` holds the whole tensor's magnitudes of the touched blocks (as
    :func:`partial_amax` orders them; from :func:`combine_amax`)."""
    out = _scaled(dtype)
    scale = scales_of(amax, dtype)
    for d, (_, counts, _) in enumerate(touched_blocks(region, shape, block)):
        scale = scale.repeat_interleave(torch.as_tensor(counts, device=scale.device), dim=d)
    return (local.detach().float() / scale).to(out)


def quantize(
    x: torch.Tensor, dtype: str, block: Sequence[int] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole tensor ``x`` in ``dtype`` (FP8) and its scales (the block grid, or a 0-d
    tensor per tensor, ``block=None``): the reference every shard's conversion equals."""
    whole = Region.of_box(tuple(slice(0, n) for n in x.shape))
    amax = partial_amax(x, whole, x.shape, block)
    one = amax.new_zeros(()) if amax.numel() == 0 else amax.amax()  # an empty tensor's: 0
    scales = scales_of(one if block is None else amax, dtype)
    return quantize_shard(x, whole, x.shape, block, amax, dtype), scales


def _poster(group: dist.ProcessGroup | JointGroup | None):
    """``(send, data, peer) -> Work`` over ``group`` (a joint group posts on its backend)."""
    if isinstance(group, JointGroup):
        return lambda send, data, peer: post(group, send, data, peer, _TAG)
    to_global = to_global_of(group)
    return lambda send, data, peer: (dist.isend if send else dist.irecv)(
        data, to_global(peer), group=group, tag=_TAG)


def _wait(works: list, me: int, what: str, timeout: float) -> None:
    span = datetime.timedelta(seconds=timeout)
    for peer, work in works:
        try:
            work.wait(span)
        except Exception as exc:
            raise ReshardError(
                f"rank {me}: combine_amax: {what} rank {peer} did not complete within "
                f"{timeout} s ({str(exc).strip().splitlines()[-1] if str(exc).strip() else exc})",
                ranks=(me, peer), failed=(peer,)) from exc


def _check(plans: Sequence[AmaxPlan], partials: Sequence[torch.Tensor | None], me: int) -> None:
    if len(plans) != len(partials):
        raise ValueError(f"rank {me}: combine_amax got {len(plans)} plans but "
                         f"{len(partials)} partials")
    for k, (plan, p) in enumerate(zip(plans, partials)):
        want = plan.partial_shape.get(me)
        got = None if p is None else tuple(p.shape)
        if got != want:
            raise ValueError(f"rank {me}: partials[{k}] has shape {got}, plan {k} gives this "
                             f"rank a partial amax of shape {want} (None: it holds no block)")


def combine_amax(
    plans: Sequence[AmaxPlan],
    partials: Sequence[torch.Tensor | None],
    *,
    group: dist.ProcessGroup | JointGroup | None = None,
    rank: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
    """Run the exchanges of ``plans`` (one per tensor, the same on every rank) together: one
    message per pair of ranks. Plan ranks are ranks of ``group`` (default: the default group;
    a :class:`~meshcast.runtime.joint.JointGroup`: joint ranks);
    ``rank`` is this rank's (default: its rank in ``group``); ``partials[k]`` its
    :func:`partial_amax` for plan k (None where it holds no block). Returns, per plan, this
    rank's whole ``amax`` of the blocks it touches (for :func:`quantize_shard`; None off the
    source) and the whole ``amax`` of its shard of the scale layout (its scales are
    :func:`scales_of` it, in the engine's dtype; None off it). A peer that fails or stays
    silent past ``timeout`` raises :class:`~meshcast.ReshardError` naming it."""
    me = group_rank(group) if rank is None else rank
    _check(plans, partials, me)
    known = [torch.zeros(len(p.known.get(me, ())), dtype=torch.float32) for p in plans]
    flat = [None if p is None else p.detach().float().reshape(-1) for p in partials]
    for k, plan in enumerate(plans):
        if me in plan.partial:
            known[k][torch.as_tensor(plan.slots(me, plan.partial[me]))] = flat[k]
    peers = sorted({r for p in plans for c, r in p.messages if c == me}
                   | {c for p in plans for c, r in p.messages if r == me})
    send, recvs, sends = _poster(group), [], []
    inbox = {}
    for peer in peers:
        n = sum(len(p.messages.get((peer, me), ())) for p in plans)
        if n:
            inbox[peer] = torch.empty(n, dtype=torch.float32)
            recvs.append((peer, send(False, inbox[peer], peer)))
    for peer in peers:
        parts = [flat[k][torch.as_tensor(p.send_slots(me, peer))]
                 for k, p in enumerate(plans) if (me, peer) in p.messages]
        if parts:
            sends.append((peer, send(True, torch.cat(parts), peer)))
    _wait(recvs, me, "the partial amax from", timeout)
    _wait(sends, me, "the partial amax to", timeout)
    for peer, buf in inbox.items():
        at = 0
        for k, plan in enumerate(plans):
            ids = plan.messages.get((peer, me))
            if ids is not None:
                slots = torch.as_tensor(plan.slots(me, ids))
                known[k][slots] = torch.maximum(known[k][slots], buf[at:at + len(ids)])
                at += len(ids)
    return [_results(plan, vals, me) for plan, vals in zip(plans, known)]


def _results(plan: AmaxPlan, vals: torch.Tensor, me: int):
    amax = dst = None
    if me in plan.partial:
        amax = vals[torch.as_tensor(plan.slots(me, plan.partial[me]))].reshape(
            plan.partial_shape[me])
    if me in plan.scale:
        dst = vals[torch.as_tensor(plan.slots(me, plan.scale[me]))].reshape(
            () if plan.block is None else plan.dst.shard_shape(me, plan.grid))
    return amax, dst
