"""The ``"collectives"`` transport: the GPU design, which runs on gloo with CPU tensors too.

Sends are point-to-point on the caller's group, posted with ``dist.batch_isend_irecv`` (one batch
per operation, cut where the memory budget is full); a Broadcast is the backend's own broadcast
and an AllGather its own all-gather, both on a sub-group of exactly the operation's ranks, cached
by rank set (groups.py: NCCL sub-groups for CUDA tensors, gloo for CPU ones). Every move is cut
into the same chunks as on the ``"p2p"`` transport; an all-gather runs one round per chunk index,
each member's chunk padded to the round's largest.

Every member of a sub-group issues its collectives in plan order, so the operations on one group
never cross. Operations run one after another whatever ``ordered`` says (collectives are not
posted ahead). After a failure this rank posts nothing more: its peers' collectives with it fail
when the connection closes, or at ``timeout``; every rank still raises naming the ranks that
failed first (the call's board, p2p.Failures).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..core.layout import Box, box_size
from ..core.plan import AllGather, Broadcast, Send
from .chunks import chunk_boxes
from .groups import group_cache
from .p2p import Pending
from .runner import Runner
from .stats import record_send
from .tensors import as_bytes

__all__ = ["Collectives"]


class Collectives:
    """The moves of the ``"collectives"`` transport (see the module docstring)."""

    def __init__(self, group: dist.ProcessGroup, to_global) -> None:
        self.group = group
        self.to_global = to_global

    def start(self, runner: Runner) -> None:
        """Create (or find) every sub-group this rank's operations use, in the one order every
        rank creates them (groups.py), and run operations one after another."""
        runner.ordered = True
        needed = [
            [self.to_global(r) for r in runner.plan.ops[i].ranks()]
            for i in runner.plan.ops_of(runner.me)
            if isinstance(runner.plan.ops[i], (Broadcast, AllGather))
        ]
        group_cache.ensure(needed, runner.timeout, _device(runner))

    def _sub(self, runner: Runner, ranks: tuple[int, ...]) -> tuple[object, list[int]]:
        """The sub-group of ``ranks`` (plan ranks) and its members' global ranks in its order."""
        order = sorted(self.to_global(r) for r in ranks)
        return group_cache.get(order, runner.timeout, _device(runner)), order

    def _count(self, runner: Runner, peer: int, nbytes: int) -> None:
        hosts = runner.links.host_of
        record_send(peer, nbytes, hosts.get(peer) != hosts.get(runner.me))

    def send(self, runner: Runner, i: int, op: Send) -> None:
        """One batch of this rank's side of every chunk (cut where the budget is full)."""
        if runner.failures.degraded.is_set():
            return
        what = f"op {i} (send {op.src}->{op.dst})"
        sending = op.src == runner.me
        peer = op.dst if sending else op.src
        batch: list[dist.P2POp] = []
        extras: list[int] = []
        finishes: list = []

        def flush() -> None:
            if not batch:
                return
            works = dist.batch_isend_irecv(list(batch))
            fins = list(finishes)

            def finish() -> None:
                for f in fins:
                    f()

            runner.post(Pending([(peer, w) for w in works], f"{what}: batch with {peer}",
                                op.ranks(), sum(extras), finish, None if sending else op.box))
            batch.clear(), extras.clear(), finishes.clear()

        for chunk in chunk_boxes(op.box, runner.itemsize, runner.chunk_bytes):
            if sending:
                buf, extra = runner.send_buffer(runner.local, runner.src_region, chunk, block=False)
                if buf is None:  # the budget is full: post what is batched, then wait for memory
                    flush()
                    buf, extra = runner.send_buffer(runner.local, runner.src_region, chunk)
                self._count(runner, peer, buf.numel() * runner.itemsize)
                fn = dist.isend
            else:
                buf, extra, fin = runner.recv_buffer(chunk, block=False)
                if buf is None:
                    flush()
                    buf, extra, fin = runner.recv_buffer(chunk)
                finishes.extend([fin] if fin is not None else [])
                fn = dist.irecv
            batch.append(dist.P2POp(fn, as_bytes(buf), self.to_global(peer), self.group, i))
            extras.append(extra)
        flush()

    def broadcast(self, runner: Runner, i: int, op: Broadcast) -> None:
        """The backend's broadcast on the sub-group of ``op.ranks()``, chunk by chunk."""
        if runner.failures.degraded.is_set():
            return
        sub, order = self._sub(runner, op.ranks())
        opts = dist.BroadcastOptions()
        opts.rootRank = order.index(self.to_global(op.src))
        what = f"op {i} (broadcast from {op.src} on the sub-group {order})"
        sending = op.src == runner.me
        for chunk in chunk_boxes(op.box, runner.itemsize, runner.chunk_bytes):
            if sending:
                buf, extra = runner.send_buffer(runner.local, runner.src_region, chunk)
                for r in op.dsts:
                    self._count(runner, r, buf.numel() * runner.itemsize)
                fin = None
            else:
                buf, extra, fin = runner.recv_buffer(chunk)
            work = sub.broadcast([as_bytes(buf)], opts)
            runner.post(Pending([(None, work)], what, op.ranks(), extra, fin,
                                None if sending else chunk))

    def allgather(self, runner: Runner, i: int, op: AllGather) -> None:
        """The backend's all-gather on the sub-group of ``op.group``: round k gathers every
        member's k-th chunk, padded to the round's largest."""
        assert runner.out is not None
        if runner.failures.degraded.is_set():
            return
        sub, order = self._sub(runner, op.group)
        mine = op.parts[op.group.index(runner.me)]
        runner.wait_writes(mine)  # this rank's part must be in before it passes it on
        chunks = [chunk_boxes(p, runner.itemsize, runner.chunk_bytes) for p in op.parts]
        member = {r: order.index(self.to_global(r)) for r in op.group}
        what = f"op {i} (all-gather on the sub-group {order})"
        for k in range(max(len(c) for c in chunks)):
            round_ = {r: c[k] for r, c in zip(op.group, chunks) if k < len(c)}
            n = max(box_size(b) for b in round_.values()) * runner.itemsize
            if n == 0:
                continue
            runner.budget.acquire(n * (len(order) + 1))
            dev = runner.out.device
            inp = torch.zeros(n, dtype=torch.uint8, device=dev)
            if runner.me in round_:
                part = runner.out[runner.dst_region.local(round_[runner.me])].contiguous()
                inp[: part.numel() * runner.itemsize] = as_bytes(part)
                for r in op.group:
                    if r != runner.me:
                        self._count(runner, r, part.numel() * runner.itemsize)
            outs = [torch.empty(n, dtype=torch.uint8, device=dev) for _ in order]
            work = sub.allgather([outs], [inp])
            pieces = {r: (b, outs[member[r]]) for r, b in round_.items() if r != runner.me}
            runner.post(Pending([(None, work)], what, op.group, n * (len(order) + 1),
                                _unpacker(runner, pieces), op.box))


def _device(runner: Runner) -> torch.device:
    t = runner.out if runner.out is not None else runner.local
    return t.device if t is not None else torch.device("cpu")


def _unpacker(runner: Runner, pieces: dict[int, tuple[Box, torch.Tensor]]):
    def finish() -> None:
        for box, gathered in pieces.values():
            view = runner.out[runner.dst_region.local(box)]
            nbytes = box_size(box) * runner.itemsize
            view.copy_(gathered[:nbytes].view(view.dtype).reshape(view.shape))

    return finish
