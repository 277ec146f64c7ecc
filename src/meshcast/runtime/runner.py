"""One rank's execution of a plan with tagged point-to-point messages (gloo), see docs/runtime.md.

Operations are posted in plan order (``ordered``: each waits until the previous one completed);
a reaper thread completes sends and receives in posting order, relay threads forward broadcasts.
:meth:`Runner.run` never raises for a failed message: it records the fault (p2p.Failures), then
goes on exchanging placeholders with every peer whose connection still works, and returns once
every message it posted has completed or failed and every thread it started has ended.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from ..core.layout import Box, box_size
from ..core.plan import AllGather, Broadcast, Copy, Plan, Send, broadcast_chain
from .broadcast import Relay, chain_role
from .chunks import boxes_overlap, chunk_boxes, relative
from .p2p import Budget, Failures, PeerFault, Pending, Reaper, Transport

__all__ = ["RELAY_WINDOW", "Runner"]

RELAY_WINDOW = 4
"""Chunks a broadcast leader keeps in flight on each side of its relay."""


class Runner:
    """One rank's part of a plan on carrier tensors (``local``, ``out``: see tensors.py)."""

    def __init__(
        self,
        plan: Plan,
        me: int,
        local: torch.Tensor | None,
        out: torch.Tensor | None,
        transport: Transport,
        failures: Failures,
        chunk_bytes: int,
        max_inflight_bytes: int,
        ordered: bool = True,
    ) -> None:
        self.plan = plan
        self.me = me
        self.local = local
        self.out = out
        self.src_box = plan.task.src_box(me)
        self.dst_box = plan.task.dst_box(me)
        self.itemsize = plan.task.itemsize
        self.chunk_bytes = int(chunk_bytes)
        self.ordered = ordered
        self.transport = transport
        self.failures = failures
        self.timeout = transport.timeout
        self.budget = Budget(int(max_inflight_bytes), self.timeout)
        self.reaper = Reaper(transport, self.budget, failures)
        self.relays: list[threading.Thread] = []
        self.op_items: list[Pending] = []  # what the current operation posted (ordered mode)
        self.writes: list[Pending] = []  # pending writes into `out`, for AllGather dependencies
        self._scratch: torch.Tensor | None = None

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> None:
        """Post every operation of this rank in plan order, then complete all of them."""
        try:
            for i in self.plan.ops_of(self.me):
                try:
                    self._operation(i)
                except PeerFault as fault:
                    self.failures.peer(fault)
                except Exception as exc:  # a bug or a resource error: the others still finish
                    self.failures.error(f"op {i} ({type(self.plan.ops[i]).__name__})", exc)
                if self.ordered:
                    for item in self.op_items:
                        self.failures.wait(item)
                self.op_items.clear()
        finally:
            self._drain()

    def _drain(self) -> None:
        """Complete every posted message and end every thread (each wait is bounded)."""
        limit = 2 * self.timeout + 30
        reaped = self.reaper.close(limit)
        for thread in self.relays:
            thread.join(limit)
        if not reaped or any(t.is_alive() for t in self.relays):
            self.failures.error("the end of the call", RuntimeError(
                f"a meshcast thread was still running {limit:g} s after the last operation"))

    def _operation(self, i: int) -> None:
        op = self.plan.ops[i]
        if isinstance(op, Copy):
            assert self.out is not None and self.local is not None
            self.out[relative(op.box, self.dst_box)].copy_(
                self.local[relative(op.box, self.src_box)]
            )
        elif isinstance(op, Send):
            what = f"op {i} (send {op.src}->{op.dst})"
            if op.src == self.me:
                self._send(self.local, self.src_box, op.box, [op.dst], i, what, op.ranks())
            if op.dst == self.me:
                self._recv(op.box, op.src, i, what, op.ranks())
        elif isinstance(op, Broadcast):
            self._broadcast(i, op)
        elif isinstance(op, AllGather):
            self._allgather(i, op)
        else:
            raise TypeError(f"plan has an operation of unknown type {type(op).__name__}")

    # -- posting ------------------------------------------------------------------------------
    def _send(
        self,
        shard: torch.Tensor,
        shard_box: Box,
        box: Box,
        targets: list[int],
        index: int,
        what: str,
        ranks: tuple[int, ...],
    ) -> None:
        for chunk in chunk_boxes(box, self.itemsize, self.chunk_bytes):
            live = [t for t in targets if self.failures.sendable(t)]
            if not live:
                continue
            extra, buf = 0, None
            if not self.failures.degraded.is_set():
                buf = shard[relative(chunk, shard_box)]
                if not buf.is_contiguous():
                    extra = box_size(chunk) * self.itemsize
                    self.budget.acquire(extra)
                    buf = buf.contiguous()
            works = []
            for t in live:
                try:
                    if buf is None:
                        works.append((t, self.transport.stub(t, index, what)))
                    else:
                        works.append((t, self.transport.isend(buf, t, index, what)))
                except PeerFault as fault:
                    self.failures.peer(fault)
            self._posted(Pending(works, f"{what}: send to {live}", ranks, extra))

    def _recv(self, box: Box, peer: int, index: int, what: str, ranks: tuple[int, ...]) -> None:
        assert self.out is not None and self.dst_box is not None
        for chunk in chunk_boxes(box, self.itemsize, self.chunk_bytes):
            if self.failures.closed(peer):
                return
            view = self.out[relative(chunk, self.dst_box)]
            extra, finish, buf = 0, None, view
            if not view.is_contiguous():
                nbytes = box_size(chunk) * self.itemsize
                if self.failures.degraded.is_set():
                    buf = self._scratch_for(nbytes)  # the data is lost anyway
                else:
                    self.budget.acquire(nbytes)
                    extra = nbytes
                    buf = torch.empty(view.shape, dtype=view.dtype, device=view.device)
                    finish = _copier(view, buf)
            try:
                work = self.transport.irecv(buf, peer, index, what)
            except PeerFault:
                self.budget.release(extra)
                raise
            item = Pending([(peer, work)], f"{what}: receive from {peer}", ranks, extra, finish,
                           chunk)
            self.writes.append(item)
            self._posted(item)

    def _posted(self, item: Pending) -> None:
        self.reaper.add(item)
        self.op_items.append(item)

    def _scratch_for(self, nbytes: int) -> torch.Tensor:
        if self._scratch is None or self._scratch.numel() < nbytes:
            self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=self.out.device)
        return self._scratch[:nbytes]

    def _wait_writes(self, box: Box) -> None:
        """Wait for the pending writes into ``box`` of ``out`` (data this rank must pass on)."""
        for item in self.writes:
            if item.box is not None and boxes_overlap(item.box, box):
                self.failures.wait(item)

    # -- operations ---------------------------------------------------------------------------
    def _broadcast(self, i: int, op: Broadcast) -> None:
        chain = broadcast_chain(op, self.plan.topology._host_of)
        role, feeder, targets = chain_role(chain, self.me)
        what = f"op {i} (broadcast from {op.src})"
        if role == "sender":
            self._send(self.local, self.src_box, op.box, targets, i, what, op.ranks())
        elif role == "member":
            self._recv(op.box, feeder, i, what, op.ranks())
        else:
            done = Pending([], f"{what}: relay", op.ranks(), box=op.box)
            relay = Relay(self.transport, self.budget, self.failures, self.out, self.dst_box, op,
                          i, feeder, targets, self.chunk_bytes, RELAY_WINDOW, done)
            self.writes.append(done)
            self.op_items.append(done)
            thread = threading.Thread(target=relay.run, name=f"meshcast-relay-{i}", daemon=True)
            thread.start()
            self.relays.append(thread)

    def _allgather(self, i: int, op: AllGather) -> None:
        """Post this member's messages of an all-gather in the order every member agrees on:
        part by part in group order (receive the parts of the members before it, send its own,
        receive the parts after it), chunk by chunk. A common order is what keeps a small
        ``max_inflight_bytes`` deadlock-free (docs/runtime.md, "small budget"): were every member
        to post its own sends first, each could fill its budget with sends that wait for receives
        the others only post after their own sends."""
        assert self.out is not None
        what = f"op {i} (all-gather among {list(op.group)})"
        others = [r for r in op.group if r != self.me]
        for r, part in zip(op.group, op.parts):
            if r != self.me:
                try:
                    self._recv(part, r, i, what, op.group)
                except PeerFault as fault:
                    self.failures.peer(fault)
                continue
            self._wait_writes(part)
            self._send(self.out, self.dst_box, part, others, i, what, op.group)


def _copier(view: torch.Tensor, buf: torch.Tensor) -> Callable[[], None]:
    def finish() -> None:
        view.copy_(buf)

    return finish
