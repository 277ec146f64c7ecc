"""The one executor: a rank's walk over its operations of a plan, whatever moves the bytes.

:class:`Runner` owns what every transport shares: the operations in plan order (``ordered``:
each waits until the previous one completed), local copies, chunk buffers (a chunk that is not
contiguous in its shard is packed into, or received into, a buffer counted against the memory
budget), the reaper thread that completes posted messages in posting order, the writes later
operations depend on, error handling per operation and the drain at the end. A transport
(:class:`Moves`: transport_p2p.py's tagged messages, transport_collectives.py's collectives) only
supplies the moves of a Send, a Broadcast and an AllGather.

:meth:`Runner.run` never raises for a failed message: it records the fault (p2p.Failures), the
transport goes on as its failure rules say, and the run returns once every message it posted has
completed or failed and every thread it started has ended.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import torch

from ..core.layout import Box, box_size
from ..core.plan import AllGather, Broadcast, Copy, Plan, Send
from ..core.region import Region
from .chunks import boxes_overlap
from .p2p import Budget, Failures, Links, PeerFault, Pending, Reaper

__all__ = ["Moves", "Runner"]


class Moves(Protocol):
    """What a transport supplies: the moves of one operation on ``runner``'s buffers."""

    def start(self, runner: Runner) -> None:
        """Before the first operation (create what the transport needs, e.g. sub-groups)."""

    def send(self, runner: Runner, i: int, op: Send) -> None:
        """Post this rank's side of point-to-point ``op`` (index ``i``)."""

    def broadcast(self, runner: Runner, i: int, op: Broadcast) -> None:
        """Post this rank's side of ``op``."""

    def allgather(self, runner: Runner, i: int, op: AllGather) -> None:
        """Post this rank's side of ``op``."""


class Runner:
    """One rank's part of a plan on carrier tensors (``local``, ``out``: see tensors.py)."""

    def __init__(
        self,
        plan: Plan,
        me: int,
        local: torch.Tensor | None,
        out: torch.Tensor | None,
        links: Links,
        moves: Moves,
        failures: Failures,
        chunk_bytes: int,
        max_inflight_bytes: int,
        ordered: bool = True,
    ) -> None:
        self.plan = plan
        self.me = me
        self.local = local
        self.out = out
        self.src_region = plan.task.src_region(me)
        self.dst_region = plan.task.dst_region(me)
        self.itemsize = plan.task.itemsize
        self.chunk_bytes = int(chunk_bytes)
        self.ordered = ordered
        self.links = links
        self.moves = moves
        self.failures = failures
        self.timeout = links.timeout
        self.budget = Budget(int(max_inflight_bytes), self.timeout)
        self.reaper = Reaper(links, self.budget, failures)
        self.threads: list[threading.Thread] = []  # helper threads (broadcast relays)
        self.op_items: list[Pending] = []  # what the current operation posted (ordered mode)
        self.writes: list[Pending] = []  # pending writes into `out`, for AllGather dependencies
        self._scratch: torch.Tensor | None = None

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> None:
        """Post every operation of this rank in plan order, then complete all of them."""
        try:
            try:
                self.moves.start(self)
            except Exception as exc:
                self.failures.error("the transport's set-up", exc)
                return
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
            self.drain()

    def drain(self) -> None:
        """Complete every posted message and end every thread (each wait is bounded)."""
        limit = 2 * self.timeout + 30
        reaped = self.reaper.close(limit)
        for thread in self.threads:
            thread.join(limit)
        if not reaped or any(t.is_alive() for t in self.threads):
            self.failures.error("the end of the call", RuntimeError(
                f"a meshcast thread was still running {limit:g} s after the last operation"))
        if self.out is not None and self.out.device.type == "cuda":
            torch.cuda.synchronize(self.out.device)  # the result is complete when we return

    def _operation(self, i: int) -> None:
        op = self.plan.ops[i]
        if isinstance(op, Copy):
            assert self.out is not None and self.local is not None
            assert self.src_region is not None and self.dst_region is not None
            self.out[self.dst_region.local(op.box)].copy_(self.local[self.src_region.local(op.box)])
        elif isinstance(op, Send):
            self.moves.send(self, i, op)
        elif isinstance(op, Broadcast):
            self.moves.broadcast(self, i, op)
        elif isinstance(op, AllGather):
            self.moves.allgather(self, i, op)
        else:
            raise TypeError(f"plan has an operation of unknown type {type(op).__name__}")

    # -- what every transport uses ------------------------------------------------------------
    def send_buffer(
        self, shard: torch.Tensor, shard_region: Region, chunk: Box, block: bool = True,
        exempt: int = 0,
    ) -> tuple[torch.Tensor | None, int]:
        """``(buffer, packed bytes)`` holding ``chunk`` of ``shard`` contiguously: the shard's own
        memory where it is contiguous, else a packed copy counted against the budget (``exempt``:
        see :meth:`Budget.acquire`). ``(None, 0)`` when the rank is degraded (it sends
        placeholders), or when ``block`` is False and the packed copy does not fit the budget
        now."""
        if self.failures.degraded.is_set():
            return None, 0
        buf = shard[shard_region.local(chunk)]
        if buf.is_contiguous():
            return buf, 0
        extra = box_size(chunk) * self.itemsize
        if block:
            self.budget.acquire(extra, exempt=exempt)
        elif not self.budget.try_acquire(extra):
            return None, 0
        return buf.contiguous(), extra

    def recv_buffer(
        self, chunk: Box, block: bool = True
    ) -> tuple[torch.Tensor | None, int, Callable[[], None] | None]:
        """``(buffer, packed bytes, finish)`` to receive ``chunk`` of ``out`` into: the view of
        ``out`` where it is contiguous; else a buffer counted against the budget and ``finish``
        copying it into place (after a failure, a scratch buffer: the data is lost anyway).
        ``(None, 0, None)`` when ``block`` is False and the buffer does not fit the budget now."""
        assert self.out is not None and self.dst_region is not None
        view = self.out[self.dst_region.local(chunk)]
        if view.is_contiguous():
            return view, 0, None
        nbytes = box_size(chunk) * self.itemsize
        if self.failures.degraded.is_set():
            return self.scratch(nbytes), 0, None
        if block:
            self.budget.acquire(nbytes)
        elif not self.budget.try_acquire(nbytes):
            return None, 0, None
        buf = torch.empty(view.shape, dtype=view.dtype, device=view.device)
        return buf, nbytes, copier(view, buf)

    def scratch(self, nbytes: int) -> torch.Tensor:
        """A reused buffer of at least ``nbytes`` for data that is lost anyway."""
        device = self.out.device if self.out is not None else torch.device("cpu")
        if self._scratch is None or self._scratch.numel() < nbytes:
            self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return self._scratch[:nbytes]

    def post(self, item: Pending) -> None:
        """Hand a posted item to the reaper; items that write ``out`` (``item.box``) are
        remembered for :meth:`wait_writes`."""
        self.reaper.add(item)
        self.op_items.append(item)
        if item.box is not None:
            self.writes.append(item)

    def wait_writes(self, box: Box) -> None:
        """Wait for the pending writes into ``box`` of ``out`` (data this rank must pass on)."""
        for item in self.writes:
            if item.box is not None and boxes_overlap(item.box, box):
                self.failures.wait(item)

    def start_thread(self, target: Callable[[], None], name: str) -> None:
        """Run ``target`` in a thread that the drain joins."""
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)


def copier(view: torch.Tensor, buf: torch.Tensor) -> Callable[[], None]:
    """A function copying ``buf`` into ``view`` (the unpacking of a received chunk)."""

    def finish() -> None:
        view.copy_(buf)

    return finish
