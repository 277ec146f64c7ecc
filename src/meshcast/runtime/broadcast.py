"""Host-aware broadcast from point-to-point messages (gloo's own broadcast crosses a host link
once per receiver on that link's far side).

The route is :func:`meshcast.core.plan.broadcast_chain`: the sender feeds its local receivers and
the leader of the next receiving host; each leader receives chunk by chunk from the previous leader
and, as soon as a chunk is in, forwards it to the next leader and to its own host's receivers.
Chunks pipeline along the chain, so it runs at link speed and the data enters each host once.
A leader's relay runs in its own thread so that the rank's other operations are not held up.

A relay whose feeder fails keeps going: it still forwards one message per chunk to each target,
an empty placeholder once the failure is reported (p2p.py), so that its host's receivers finish
at once, find the report and raise, instead of waiting out the timeout.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..core.layout import box_size
from ..core.plan import Broadcast
from ..core.region import Region
from .chunks import chunk_boxes
from .p2p import Budget, Failures, Links, PeerFault, Pending
from .shm import ShmWriter

__all__ = ["Relay", "chain_role"]


def chain_role(
    chain: Sequence[tuple[int, Sequence[int]]], me: int
) -> tuple[str, int | None, list[int]]:
    """This rank's part in a broadcast chain: ``(role, feeder, targets)``.

    role is ``"sender"`` (feeds ``targets``), ``"leader"`` (receives from ``feeder``, forwards to
    ``targets``: next leader first, then its host's receivers) or ``"member"`` (receives from its
    host's leader ``feeder``).
    """
    for k, (leader, members) in enumerate(chain):
        nxt = [chain[k + 1][0]] if k + 1 < len(chain) else []
        if me == leader:
            role = "sender" if k == 0 else "leader"
            return role, (None if k == 0 else chain[k - 1][0]), [*nxt, *members]
        if me in members:
            return "member", leader, []
    raise ValueError(f"rank {me} is not in the broadcast chain {chain}")


@dataclass
class Relay:
    """A leader's relay of ``op.box``: receive it from ``feeder`` into ``out`` chunk by chunk and
    forward every chunk to ``targets``. At most ``window`` chunks are being received and
    ``window`` being forwarded; packed buffers (only where a chunk is not contiguous in ``out``)
    count against ``budget``. :meth:`run` is the body of the relay's thread; ``done`` is set when
    it has finished every message it posted.

    The relay never waits for memory while it has messages of its own in flight (only this thread
    completes them): when the budget is full it first finishes what it has in flight, then takes
    one chunk's buffer even over the limit. So it depends only on its feeder and its targets,
    which keeps small budgets deadlock-free (docs/runtime.md, "small budget")."""

    links: Links
    budget: Budget
    failures: Failures
    out: torch.Tensor
    out_region: Region
    op: Broadcast
    index: int
    feeder: int
    targets: list[int]
    chunk_bytes: int
    window: int
    done: Pending
    shared: list[int] = field(default_factory=list)
    """Receivers of this host fed through a shared-memory segment (shm.py) instead of
    ``targets``' messages."""

    def __post_init__(self) -> None:
        self.chunks = chunk_boxes(self.op.box, self.out.element_size(), self.chunk_bytes)
        self.receiving: deque = deque()
        self.forwarding: deque = deque()
        self.what = f"op {self.index} (broadcast from {self.op.src})"
        self.waiting: tuple[int | None, str] = (self.feeder, self.what)
        self.done.current = lambda: self.waiting
        self._scratch: torch.Tensor | None = None

    def run(self) -> None:
        """Relay every chunk (the thread's body); failures go to ``failures``."""
        self.writer: ShmWriter | None = None
        try:
            if self.shared and self.chunks:
                sizes = [box_size(c) * self.out.element_size() for c in self.chunks]
                self.writer = ShmWriter(self.links, self.failures, self.budget, self.shared,
                                        self.index, self.what, sizes)
            self._loop()
        except BaseException as exc:
            self.failures.error(f"{self.what}: relay", exc)
        finally:  # after an unexpected error: still complete whatever was posted
            while self.receiving:
                _, _, _, work, extra = self.receiving.popleft()
                if work is not None:
                    self.failures.complete(self.links, work, self.feeder, self.what)
                self.budget.release(extra)
            while self.forwarding:
                self._finish_forward()
            self.done.end()  # this rank's part is complete; its host's receivers finish
            if self.writer is not None:  # copying from the segment while the rank goes on
                self.writer.close()

    def _loop(self) -> None:
        nxt = 0
        while nxt < len(self.chunks) or self.receiving or self.forwarding:
            while nxt < len(self.chunks) and len(self.receiving) < self.window and self._post(nxt):
                nxt += 1
            if not self.receiving:  # the budget refused a chunk: free what this relay holds
                self._finish_forward()
                continue
            k, view, buf, work, extra = self.receiving.popleft()
            what = f"{self.what}: chunk {k + 1}/{len(self.chunks)} from {self.feeder}"
            if work is not None:
                self.waiting = (self.feeder, what)
                if self.failures.complete(self.links, work, self.feeder, what) and \
                        buf is not view and extra:
                    view.copy_(buf)
            self.forwarding.append((k, self._forward(k, buf), extra))
            if self.writer is not None:
                self.writer.put(k, buf)
            while len(self.forwarding) > self.window or (
                self.forwarding and not self.receiving and nxt == len(self.chunks)
            ):
                self._finish_forward()

    def _post(self, k: int) -> bool:
        """Post the receive of chunk ``k``; False (nothing posted) if its buffer does not fit the
        budget now while this relay has messages in flight."""
        view = self.out[self.out_region.local(self.chunks[k])]
        extra, buf, work = 0, view, None
        if not view.is_contiguous():
            nbytes = box_size(self.chunks[k]) * view.element_size()
            if self.failures.degraded.is_set():
                buf = self._scratch_for(nbytes, view)  # the data is lost anyway
            else:
                if self.receiving or self.forwarding:
                    if not self.budget.try_acquire(nbytes):
                        return False
                else:
                    self.budget.acquire(nbytes, alone=True)
                extra = nbytes
                buf = torch.empty(view.shape, dtype=view.dtype, device=view.device)
        if not self.failures.closed(self.feeder):
            what = f"{self.what}: chunk {k + 1}/{len(self.chunks)} from {self.feeder}"
            try:
                work = self.links.irecv(buf, self.feeder, self.index, what)
            except PeerFault as fault:
                self.failures.peer(fault)
        self.receiving.append((k, view, buf, work, extra))
        return True

    def _scratch_for(self, nbytes: int, view: torch.Tensor) -> torch.Tensor:
        if self._scratch is None or self._scratch.numel() < nbytes:
            self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=view.device)
        return self._scratch[:nbytes]

    def _forward(self, k: int, buf: torch.Tensor) -> list[tuple[int, object]]:
        sends = []
        for t in self.targets:
            if not self.failures.sendable(t):
                continue
            what = f"{self.what}: forwarding chunk {k + 1} to {t}"
            try:
                if self.failures.degraded.is_set():
                    sends.append((t, self.links.stub(t, self.index, what)))
                else:
                    sends.append((t, self.links.isend(buf, t, self.index, what)))
            except PeerFault as fault:
                self.failures.peer(fault)
        return sends

    def _finish_forward(self) -> None:
        k, sends, extra = self.forwarding.popleft()
        for t, w in sends:
            what = f"{self.what}: forwarding chunk {k + 1} to {t}"
            self.waiting = (t, what)
            self.failures.complete(self.links, w, t, what)
        self.budget.release(extra)
