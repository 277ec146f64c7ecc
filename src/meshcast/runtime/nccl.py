"""The NCCL path (CUDA tensors): sends as batched isend/irecv, broadcasts and all-gathers as
native collectives on cached sub-groups (NCCL's broadcast already crosses each host once).

Not exercised by the test suite (no GPU on the development machine); kept deliberately small.
Operations are issued in plan order; NCCL runs each group's operations in that order on its own
stream, so operations on different groups overlap.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ..core.layout import Box, box_size
from ..core.plan import AllGather, Broadcast, Copy, Plan, Send
from .chunks import boxes_overlap, chunk_boxes, relative
from .errors import ReshardError
from .tensors import as_bytes

__all__ = ["run_nccl"]


def run_nccl(
    plan: Plan,
    me: int,
    local: torch.Tensor | None,
    out: torch.Tensor | None,
    group: dist.ProcessGroup,
    to_global: Callable[[int], int],
    timeout: float,
    chunk_bytes: int,
    max_inflight_bytes: int,
) -> None:
    """Run this rank's operations of ``plan`` on NCCL (see the module docstring); ``local`` and
    ``out`` are carrier tensors (tensors.py)."""
    from .groups import group_cache

    task = plan.task
    itemsize = task.itemsize
    src_box, dst_box = task.src_box(me), task.dst_box(me)
    my_ops = plan.ops_of(me)
    # every group this rank needs, created up front in the canonical order
    needed = [
        [to_global(r) for r in plan.ops[i].ranks()]
        for i in my_ops
        if isinstance(plan.ops[i], (Broadcast, AllGather))
    ]
    group_cache.ensure(needed, timeout)
    p2p: list[dist.P2POp] = []
    works: list[dist.Work] = []
    finishers: list[tuple[Box | None, Callable[[], None]]] = []
    inflight = 0

    def flush(wait: bool) -> None:
        nonlocal inflight
        if p2p:
            works.extend(dist.batch_isend_irecv(p2p))
            p2p.clear()
        if wait:
            for w in works:
                w.wait()  # orders the current stream after the communication
            works.clear()
            for _, fin in finishers:
                fin()
            finishers.clear()
            torch.cuda.current_stream().synchronize()
            inflight = 0

    def buffer(view: torch.Tensor, fill: bool) -> tuple[torch.Tensor, bool]:
        nonlocal inflight
        if view.is_contiguous():
            return view, False
        if inflight + view.numel() * itemsize > max_inflight_bytes:
            flush(wait=True)
        inflight += view.numel() * itemsize
        if fill:
            return view.contiguous(), True
        return torch.empty_like(view, memory_format=torch.contiguous_format), True

    for i in my_ops:
        op = plan.ops[i]
        if isinstance(op, Copy):
            out[relative(op.box, dst_box)].copy_(local[relative(op.box, src_box)])
        elif isinstance(op, Send):
            for c in chunk_boxes(op.box, itemsize, chunk_bytes):
                if op.src == me:
                    buf, _ = buffer(local[relative(c, src_box)], True)
                    p2p.append(dist.P2POp(dist.isend, as_bytes(buf), to_global(op.dst), group))
                if op.dst == me:
                    view = out[relative(c, dst_box)]
                    buf, packed = buffer(view, False)
                    p2p.append(dist.P2POp(dist.irecv, as_bytes(buf), to_global(op.src), group))
                    if packed:
                        finishers.append((c, lambda v=view, b=buf: v.copy_(b)))
        elif isinstance(op, Broadcast):
            flush(wait=False)
            sub = group_cache.get([to_global(r) for r in op.ranks()], timeout)
            for c in chunk_boxes(op.box, itemsize, chunk_bytes):
                if op.src == me:
                    buf, _ = buffer(local[relative(c, src_box)], True)
                else:
                    view = out[relative(c, dst_box)]
                    buf, packed = buffer(view, False)
                    if packed:
                        finishers.append((c, lambda v=view, b=buf: v.copy_(b)))
                opts = dist.BroadcastOptions()
                opts.rootRank = sorted(to_global(r) for r in op.ranks()).index(to_global(op.src))
                works.append(sub.broadcast([as_bytes(buf)], opts))
        elif isinstance(op, AllGather):
            mine = op.parts[op.group.index(me)]
            if any(b is not None and boxes_overlap(b, mine) for b, _ in finishers) or p2p:
                flush(wait=True)  # my part must have arrived before I pass it on
            sub = group_cache.get([to_global(r) for r in op.group], timeout)
            n = max(box_size(p) for p in op.parts) * itemsize
            order = sorted(to_global(r) for r in op.group)  # the sub-group's rank order
            inp = torch.zeros(n, dtype=torch.uint8, device=out.device)
            part = out[relative(mine, dst_box)].contiguous()
            inp[: part.numel() * itemsize] = as_bytes(part)
            gathered = torch.empty(n * len(op.group), dtype=torch.uint8, device=out.device)
            works.append(sub._allgather_base(gathered, inp))

            def unpack(
                op: AllGather = op,
                gathered: torch.Tensor = gathered,
                n: int = n,
                order: list[int] = order,
            ) -> None:
                for r, p in zip(op.group, op.parts):
                    k = order.index(to_global(r))
                    if r != me:
                        view = out[relative(p, dst_box)]
                        view.copy_(
                            gathered[k * n : k * n + box_size(p) * itemsize]
                            .view(view.dtype)
                            .reshape(view.shape)
                        )

            finishers.append((op.box, unpack))
        else:
            raise TypeError(f"plan has an operation of unknown type {type(op).__name__}")
    try:
        flush(wait=True)
    except Exception as exc:
        raise ReshardError(
            f"meshcast.reshard on rank {me}: NCCL transfers failed: {exc}", tuple(plan.ranks)
        ) from exc
