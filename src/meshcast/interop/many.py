"""``reshard_many``: run the plans of many tensors at once, in bounded buckets of packed messages.

Every rank runs the same :class:`~meshcast.interop.plans.Schedule`: its local copies first, then
bucket after bucket, phase after phase. In a phase a rank posts all its receives, then packs the
message for each peer and posts its send at once (so packing the next message overlaps sending the
previous ones), then unpacks each received message as it arrives. A message that is one contiguous
box is sent from (or received into) the tensor itself, without a staging copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..layout import Box, box_shape
from ..plan import Plan
from ..runtime.detect import real_host_map
from ..runtime.execute import DEFAULT_TIMEOUT, _fingerprint, _torch_dtype, agree_inputs
from ..runtime.p2p import Transport
from .plans import DEFAULT_BUCKET_BYTES, Segment, build_schedule

__all__ = ["ManyStats", "last_many_stats", "reshard_many"]

_ALIGN = 16
_TAG_BASE = 1 << 20  # away from the small tags meshcast.reshard uses (its op indices)


@dataclass
class ManyStats:
    """What the last :func:`reshard_many` call did on this rank."""

    buckets: int = 0
    phases: int = 0
    messages_sent: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    peak_staging_bytes: int = 0
    zero_copy_messages: int = 0
    per_bucket_staging: list[int] = field(default_factory=list)


_last = ManyStats()


def last_many_stats() -> ManyStats:
    """Counters of this process's last :func:`reshard_many` call."""
    return _last


def _rel(box: Box, shard_box: Box) -> tuple[slice, ...]:
    return tuple(slice(b.start - s.start, b.stop - s.start) for b, s in zip(box, shard_box))


def _padded(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _msg_size(segs: Sequence[Segment]) -> int:
    """Bytes of a packed message: segments start at multiples of 16, the last is not padded (so a
    one-segment message has the same size packed or not)."""
    return sum(_padded(s.nbytes) for s in segs[:-1]) + segs[-1].nbytes


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def reshard_many(
    tensors: Sequence[torch.Tensor | None],
    plans: Sequence[Plan],
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    timeout: float = DEFAULT_TIMEOUT,
    device: torch.device | str | None = None,
    names: Sequence[str] | None = None,
    _errors: Sequence[str] = (),
) -> list[torch.Tensor | None]:
    """Run ``plans[k]`` on ``tensors[k]`` for every k, together; return the destination shards.

    Call it on every rank of the default process group that any plan involves, with the same
    plans in the same order (plan ranks are global ranks). ``tensors[k]`` is this rank's source
    shard of tensor k (None where it holds none). The result has one entry per tensor: this
    rank's destination shard, or None. Ranks outside every plan get a list of None at once.

    The operations of all plans are cut into buckets so that no rank stages (packs or unpacks)
    more than ``bucket_bytes`` at once (:func:`meshcast.interop.plans.build_schedule`); within a
    bucket each pair of ranks exchanges one packed message per phase. Every plan is checked
    first (:meth:`meshcast.Plan.check`, once per plan object). Inputs are checked on every
    rank and the plan ranks agree on the result before any data moves: a bad input raises
    ``ValueError`` everywhere, naming the tensor (``names[k]`` when given) and the rule. Any wait
    longer than ``timeout`` seconds raises :class:`meshcast.ReshardError`.
    """
    global _last
    plans = list(plans)
    tensors = list(tensors)
    if len(tensors) != len(plans):
        raise ValueError(
            f"tensors has {len(tensors)} entries but plans has {len(plans)}: give one plan per "
            f"tensor"
        )
    for k, p in enumerate(plans):
        if not isinstance(p, Plan):
            raise TypeError(f"plans[{k}] must be a meshcast.Plan, got {type(p).__name__}")
        try:
            p.check()  # once per plan object: every destination element delivered exactly once
        except ValueError as e:
            raise ValueError(f"meshcast.reshard_many: plans[{k}]: {e}") from None
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be a positive integer, got {bucket_bytes!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    label = [names[k] if names is not None else f"tensors[{k}]" for k in range(len(plans))]
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "meshcast.reshard_many needs torch.distributed: call init_process_group first "
            "(or run under meshcast.launch / torchrun)"
        )
    me = dist.get_rank()
    world = dist.get_world_size()
    schedule = build_schedule(plans, bucket_bytes)
    ranks = schedule.ranks
    if ranks and ranks[-1] >= world:
        raise ValueError(f"the plans use rank {ranks[-1]}, but the process group has {world} ranks")
    errors = list(_errors)
    if me not in ranks:
        if errors:
            raise ValueError(f"meshcast.reshard_many on rank {me}: {errors[0]}")
        for k, t in enumerate(tensors):
            if t is not None:
                raise ValueError(
                    f"{label[k]} must be None on rank {me}: no plan involves this rank"
                )
        _last = ManyStats()
        return [None] * len(plans)

    dtypes = [_torch_dtype(p.task.dtype) for p in plans]
    dev = torch.device(device) if device is not None else None
    if dev is None:
        dev = next((t.device for t in tensors if isinstance(t, torch.Tensor)), None)
    if dev is None:
        backend = str(dist.get_backend())
        dev = (
            torch.device("cuda", torch.cuda.current_device())
            if ("nccl" in backend and torch.cuda.is_available())
            else torch.device("cpu")
        )
    src_boxes = [p.task.src_box(me) for p in plans]
    for k, (t, box) in enumerate(zip(tensors, src_boxes)):
        why = _check(t, box, plans[k], me, dtypes[k], dev)
        if why is not None:
            errors.append(f"{label[k]}: {why}")

    # agree before any data moves, with the runtime's transport and check: point-to-point on
    # the default group (no process group is created), every rank's error flag and plans' digest
    host_of: dict[int, int] = {}
    for p in plans:
        for r, h in p.topology._host_of.items():
            host_of.setdefault(r, h)
    host_of = real_host_map(ranks, host_of)  # the byte counters count by the real hosts
    transport = Transport(
        dist.group.WORLD, me, lambda r: r, host_of, timeout, caller="meshcast.reshard_many"
    )
    error = None
    if errors:
        error = errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
    agree_inputs(transport, list(ranks), error, _plans_digest(plans), dev, "meshcast.reshard_many")

    dst_boxes = [p.task.dst_box(me) for p in plans]
    outs: list[torch.Tensor | None] = [
        None if b is None else torch.empty(box_shape(b), dtype=dtypes[k], device=dev)
        for k, b in enumerate(dst_boxes)
    ]
    for k, box in schedule.copies_of(me):
        outs[k][_rel(box, dst_boxes[k])].copy_(tensors[k][_rel(box, src_boxes[k])])

    stats = ManyStats(buckets=len(schedule.buckets))

    def view(seg: Segment, side: str) -> torch.Tensor:
        if side == "src" and not seg.from_out:
            return tensors[seg.tensor][_rel(seg.box, src_boxes[seg.tensor])]
        return outs[seg.tensor][_rel(seg.box, dst_boxes[seg.tensor])]

    def wait(w: dist.Work, what: str, peer: int) -> None:
        transport.wait(w, f"{what} with rank {peer}", (me, peer))

    tag = _TAG_BASE
    for bucket in schedule.buckets:
        staged = 0
        for phase in bucket:
            tag += 1
            sends, recvs = phase.sends_of(me), phase.recvs_of(me)
            if not sends and not recvs:
                continue
            stats.phases += 1
            posted_recvs = []
            for peer, segs in recvs:
                if len(segs) == 1:
                    v = view(segs[0], "dst")
                    if v.is_contiguous():
                        w = transport.irecv(v, peer, tag)
                        posted_recvs.append((peer, segs, None, w))
                        stats.zero_copy_messages += 1
                        stats.bytes_received += segs[0].nbytes
                        continue
                buf = torch.empty(_msg_size(segs), dtype=torch.uint8, device=dev)
                staged += buf.numel()
                w = transport.irecv(buf, peer, tag)
                posted_recvs.append((peer, segs, buf, w))
                stats.bytes_received += sum(s.nbytes for s in segs)
            posted_sends = []
            for peer, segs in sends:
                if len(segs) == 1 and view(segs[0], "src").is_contiguous():
                    buf = _as_bytes(view(segs[0], "src"))
                    stats.zero_copy_messages += 1
                else:
                    buf = torch.empty(_msg_size(segs), dtype=torch.uint8, device=dev)
                    staged += buf.numel()
                    off = 0
                    for s in segs:
                        src = view(s, "src")
                        buf[off : off + s.nbytes].view(src.dtype).view(src.shape).copy_(src)
                        off += _padded(s.nbytes)
                nbytes = sum(s.nbytes for s in segs)
                stats.messages_sent += 1
                stats.bytes_sent += nbytes
                posted_sends.append((peer, transport.isend(buf, peer, tag, payload=nbytes), buf))
            stats.peak_staging_bytes = max(stats.peak_staging_bytes, staged)
            for peer, segs, buf, w in posted_recvs:
                wait(w, "a receive", peer)
                if buf is None:
                    continue
                off = 0
                for s in segs:
                    dst = view(s, "dst")
                    dst.copy_(buf[off : off + s.nbytes].view(dst.dtype).view(dst.shape))
                    off += _padded(s.nbytes)
            for peer, w, _ in posted_sends:
                wait(w, "a send", peer)
            staged = 0
        stats.per_bucket_staging.append(stats.peak_staging_bytes)
    _last = stats
    return outs


def _plans_digest(plans: Sequence[Plan]) -> int:
    """A 31-bit digest of the plans in order, equal on every rank that holds the same plans."""
    h = hashlib.sha1()
    for p in plans:
        h.update(_fingerprint(p).to_bytes(4, "little"))
    return int.from_bytes(h.digest()[:4], "little") >> 1


def _check(
    t: object, box: Box | None, plan: Plan, me: int, dtype: torch.dtype, dev: torch.device
) -> str | None:
    task = plan.task
    if box is None:
        if t is not None:
            return (
                f"must be None on rank {me}: it is not in the source mesh "
                f"{task.src.mesh.notation()}, got {type(t).__name__}"
            )
        return None
    if not isinstance(t, torch.Tensor):
        return (
            f"must be a torch.Tensor on rank {me} (it holds part of {task.describe()}), got "
            f"{type(t).__name__}"
        )
    if t.dtype != dtype:
        return f"has dtype {t.dtype} on rank {me}; its layout declares {dtype}"
    want = box_shape(box)
    if tuple(t.shape) != want:
        return (
            f"has shape {tuple(t.shape)} on rank {me}; its declared layout "
            f"{task.src.notation()} of global shape {task.shape} gives this rank {want}"
        )
    if t.device != dev:
        return f"is on device {t.device} on rank {me}; expected {dev}"
    return None
