"""The communication side of one rank of the pipeline runtime: per step, one slot per tensor
handed over between the compute thread and the two communication threads (activations,
gradients), each thread running its transfers one after another in the global order."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from ..runtime import reshard, shard_of
from .graph import TensorEdge
from .step_state import Slot, StepAbort
from .transfers import Transfer, describe

__all__ = ["BoundaryExchange"]

SlotKey = tuple[str, str, int, int]
"""(kind, edge name, sending stage of the edge, microbatch)."""


class BoundaryExchange:
    """The boundary transfers this rank takes part in, and their threads for one step at a time.

    :meth:`start` makes fresh slots (:attr:`inbox`: tensors received for the compute thread,
    :attr:`outbox`: tensors it hands over to send) and starts one thread per kind; a failure in
    a thread is recorded in the step's :class:`StepAbort` (and published to the other ranks).
    """

    def __init__(self, rank: int, transfers: Sequence[Transfer],
                 groups: Mapping[str, dist.ProcessGroup], timeout: float,
                 free_communication: bool) -> None:
        self.rank = rank
        self.mine = {
            kind: [t for t in transfers if t.kind == kind and rank in t.plan.ranks]
            for kind in ("F", "B")
        }
        self.groups = groups
        self.timeout = timeout
        self.free_communication = free_communication
        self.inbox: dict[SlotKey, Slot] = {}
        self.outbox: dict[SlotKey, Slot] = {}
        self.count = 0
        self._lock = threading.Lock()
        self._standins: dict[tuple[str, str, int], torch.Tensor] = {}

    def start(self, abort: StepAbort) -> list[threading.Thread]:
        """Fresh slots and counter for a step; the two communication threads, started."""
        self._abort = abort
        self.count = 0
        mine = self.mine["F"] + self.mine["B"]
        self.inbox = {_key(t): Slot() for t in mine if self.rank in t.receiver}
        self.outbox = {_key(t): Slot() for t in mine if self.rank in t.sender}
        threads = [
            threading.Thread(target=self._communicate, args=(kind,), daemon=True,
                             name=f"meshcast-pipeline-{kind}-{self.rank}")
            for kind in ("F", "B")
        ]
        for thread in threads:
            thread.start()
        return threads

    def _communicate(self, kind: str) -> None:
        group = self.groups[kind]
        abort = self._abort
        try:
            for t in self.mine[kind]:
                if self.rank in t.sender:
                    self._send(t, self.outbox[_key(t)], group)
                else:
                    self._receive(t, self.inbox[_key(t)], group)
                with self._lock:
                    self.count += 1
        except BaseException as exc:  # handed to the compute thread
            if not abort.event.is_set():
                text = (f"{abort.who} failed in a boundary transfer: "
                        f"{type(exc).__name__}: {exc}")
                abort.errors.append(exc)
                abort.publish(text)
            abort.event.set()

    def _send(self, t: Transfer, slot: Slot, group: dist.ProcessGroup) -> None:
        self._abort.wait(slot.ready, f"its own {describe(t)} to be computed", [self.rank])
        if self.free_communication:
            local = torch.ones(1, dtype=torch.uint8)
        else:
            full = slot.value
            assert full is not None
            local = shard_of(full, t.send_layout.region(self.rank, t.edge.shape))
        reshard(local, t.plan, group=group, timeout=self.timeout, abort=self._abort.reason)
        slot.value = None
        slot.done.set()

    def _receive(self, t: Transfer, slot: Slot, group: dist.ProcessGroup) -> None:
        reason = self._abort.reason
        got = reshard(None, t.plan, group=group, timeout=self.timeout, abort=reason)
        if self.free_communication:
            got = self._standin(t.kind, t.edge).clone()
        elif t.gather is not None:
            got = reshard(got, t.gather, group=group, timeout=self.timeout, abort=reason)
        slot.value = got
        slot.ready.set()

    def _standin(self, kind: str, edge: TensorEdge) -> torch.Tensor:
        key = (kind, edge.name, edge.src)
        if key not in self._standins:
            g = torch.Generator().manual_seed(len(self._standins) + 1)
            self._standins[key] = torch.randn(edge.shape, generator=g).to(
                getattr(torch, edge.dtype))
        return self._standins[key]


def _key(t: Transfer) -> SlotKey:
    return (t.kind, t.edge.name, t.edge.src, t.microbatch)
