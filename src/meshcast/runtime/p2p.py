"""Messages and failures, shared by every transport: :class:`Links` (tagged isend/irecv that
count bytes and name the peer of every failure, and the bounded wait of any posted work), a memory
budget, a reaper thread that completes posted messages in order, and :class:`Failures`, what one
rank knows about a failing call.

Every message is a contiguous tensor viewed as bytes, so any dtype travels the same way. A box
that is contiguous in its shard is sent or received in place; otherwise it is packed into (or
unpacked from) one buffer whose bytes count against the budget until the message completes.

Every posted message is completed (or fails) before the call returns or raises: nothing is left
pending in the backend and no thread outlives the call. A gloo wait cannot be interrupted, so a
rank never abandons a message it posted to a live peer; after a failure it keeps exchanging its
messages with every peer whose connection still works, sending empty placeholders instead of
data (a receive accepts a shorter message), and reports the failure on the call's board first.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..core.layout import Box
from .blame import Fault
from .board import Call
from .errors import ReshardError
from .joint import JointGroup, post
from .stats import record_send
from .tensors import as_bytes

__all__ = ["Budget", "Failures", "Links", "PeerFault", "Pending", "Reaper"]

NOTE_S = 1.0
"""A rank waiting longer than this (or a quarter of the timeout) for a peer leaves a note."""
SLICE_S = 0.2
"""How often a rank waiting for a posted message looks at the clock."""


class PeerFault(Exception):
    """A message with ``peer`` failed: ``kind`` is ``"closed"`` or ``"timeout"``."""

    def __init__(self, kind: str, peer: int, what: str, detail: str) -> None:
        super().__init__(f"{what}: {detail}")
        self.kind, self.peer, self.what, self.detail = kind, peer, what, detail


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


class Links:
    """Tagged isend/irecv between plan ranks over one process group, with byte counters."""

    def __init__(
        self,
        group: dist.ProcessGroup | JointGroup,
        me: int,
        to_global: Callable[[int], int],
        host_of: dict[int, int],
        timeout: float,
    ) -> None:
        self.group = group
        self.me = me
        self.to_global = to_global
        self.host_of = host_of
        self.timeout = timeout
        self._timedelta = datetime.timedelta(seconds=timeout)
        self._stub = torch.empty(0, dtype=torch.uint8)

    def isend(
        self, buf: torch.Tensor, peer: int, tag: int, what: str, payload: int | None = None
    ) -> dist.Work:
        """Post the send of contiguous ``buf`` to plan rank ``peer``, counted in the transfer
        statistics (as ``payload`` bytes if given, else the whole buffer)."""
        data = as_bytes(buf)
        nbytes = data.numel() if payload is None else payload
        record_send(peer, nbytes, self.host_of.get(peer) != self.host_of.get(self.me))
        return self._post(dist.isend, data, peer, tag, what)

    def control(self, buf: torch.Tensor, peer: int, tag: int, what: str) -> dist.Work:
        """Post the send of contiguous ``buf`` to ``peer`` without counting it (a control message
        of the shared-memory path: a segment's handle, an acknowledgement)."""
        return self._post(dist.isend, as_bytes(buf), peer, tag, what)

    def stub(self, peer: int, tag: int, what: str) -> dist.Work:
        """Post an empty placeholder for a message to ``peer`` (after a failure)."""
        return self._post(dist.isend, self._stub, peer, tag, what)

    def irecv(self, buf: torch.Tensor, peer: int, tag: int, what: str) -> dist.Work:
        """Post the receive of contiguous ``buf`` from plan rank ``peer``."""
        return self._post(dist.irecv, as_bytes(buf), peer, tag, what)

    def _post(self, fn, data: torch.Tensor, peer: int, tag: int, what: str) -> dist.Work:
        key = "dst" if fn is dist.isend else "src"
        try:
            if isinstance(self.group, JointGroup):  # not registered with torch.distributed
                return post(self.group, fn is dist.isend, data, self.to_global(peer), tag)
            return fn(data, group=self.group, tag=tag, **{key: self.to_global(peer)})
        except Exception as exc:
            raise PeerFault("closed", peer, what, _first_line(exc)) from exc

    def wait(self, work: dist.Work, peer: int, what: str) -> None:
        """Wait for ``work`` (a message with ``peer``) at most ``timeout``."""
        try:
            work.wait(self._timedelta)
        except Exception as exc:
            detail = _first_line(exc)
            kind = "timeout" if "timed out waiting" in detail.lower() else "closed"
            raise PeerFault(kind, peer, what, detail) from exc


# messages with lost peers, never waited for (Failures.complete), by the group they were posted
# on: {id(group): (group, works)}
_ABANDONED: dict[int, tuple[object, list[object]]] = {}
_ABANDONED_LOCK = threading.Lock()


def abandon(group: object, work: object) -> None:
    """Keep ``work`` (and so its buffer) referenced while ``group`` lives: gloo may still use the
    buffer of a message to a peer that died until the group's connections close. The works of
    groups that are gone (destroyed, or a closed joint group) are dropped here."""
    with _ABANDONED_LOCK:
        for key in [k for k, (g, _) in _ABANDONED.items() if not _alive(g)]:
            del _ABANDONED[key]
        _ABANDONED.setdefault(id(group), (group, []))[1].append(work)


def _alive(group: object) -> bool:
    if isinstance(group, JointGroup):
        return not group.closed
    if not dist.is_initialized():
        return False
    try:
        from torch.distributed.distributed_c10d import _world

        return group is None or group is dist.group.WORLD or group in _world.pg_map
    except Exception:
        return True


class Failures:
    """What this rank knows about failures in one call: its faults (each reported on the call's
    board before anything else happens), the peers whose connection broke, and whether the rank
    now sends placeholders (``degraded``).

    A gloo wait that times out closes every connection of the process group on this rank, not
    just the one it waited on ("Application timeout caused pair closure"): after a time-out the
    rank exchanges nothing more (``all_closed``) and the failures that follow are not reported.
    """

    def __init__(self, call: Call, timeout: float) -> None:
        self.call = call
        self.timeout = timeout
        self.faults: list[Fault] = []
        self.broken: set[int] = set()
        self.all_closed = False
        self.degraded = threading.Event()
        self.reported = False
        self._told: set[int | None] = set()
        self._lock = threading.Lock()

    def peer(self, fault: PeerFault) -> None:
        """Record a failed message with a peer."""
        detail = f"{self.timeout:g} s" if fault.kind == "timeout" else fault.detail
        consequence = self.all_closed and fault.kind == "closed"
        self._record(self.call.fault(fault.kind, fault.peer, fault.what, detail), consequence)

    def error(self, what: str, exc: BaseException) -> None:
        """Record an exception of this rank's own."""
        self._record(self.call.fault("error", None, what, f"{type(exc).__name__}: "
                                                          f"{_first_line(exc)}"))

    def _record(self, fault: Fault, consequence: bool = False) -> None:
        with self._lock:
            self.faults.append(fault)
            if fault.peer is not None:
                self.broken.add(fault.peer)
            if fault.kind == "timeout":
                self.all_closed = True
            # one report per peer: later failures with it follow from the first
            tell = not consequence and (fault.peer is None or fault.peer not in self._told)
            self._told.add(fault.peer)
        if tell and self.call.report(fault):
            self.reported = True
        self.degraded.set()  # after the report: placeholders only ever follow a report

    def complete(self, links: Links, work: object, peer: int, what: str) -> bool:
        """Wait for ``work`` (a message with ``peer``) and record its failure; True if it
        completed. A message with a peer already known lost is not waited for: gloo can leave it
        pending until the time-out (a send posted as the peer died), and this rank's call fails
        anyway. The abandoned work is kept referenced while its group lives, so gloo never holds
        a freed buffer (:func:`abandon`)."""
        if self.closed(peer):
            abandon(links.group, work)
            return False
        try:
            links.wait(work, peer, what)
            return True
        except PeerFault as fault:
            self.peer(fault)
            return False

    def closed(self, peer: int) -> bool:
        """Whether this rank's connection with ``peer`` is known to be closed."""
        return self.all_closed or peer in self.broken

    def sendable(self, peer: int) -> bool:
        """Whether this rank still sends to ``peer`` (data, or a placeholder when degraded)."""
        return not self.closed(peer) and (self.reported or not self.degraded.is_set())

    def wait(self, item: Pending) -> None:
        """Wait (the main thread) until ``item`` is complete, leaving a note while it is slow."""
        started, noted = time.monotonic(), False
        limit = min(NOTE_S, self.timeout / 4)
        while not item.done.wait(SLICE_S):
            if not noted and time.monotonic() - started > limit:
                peer, what = item.waiting_on()
                self.call.note_waiting(self.call.fault("waiting", peer, what))
                noted = True
        if noted and not self.faults:  # after a failure the note stays: it shows the chain
            self.call.note_waiting(None)


class Budget:
    """Bytes of pack/unpack buffers in flight on this rank, at most ``limit`` (one item may
    always proceed alone, so progress never stops)."""

    def __init__(self, limit: int, timeout: float) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()
        self._timeout = timeout

    def acquire(self, nbytes: int, alone: bool = False, exempt: int = 0) -> None:
        """Block until ``nbytes`` more fit, or nothing is in flight; ``alone=True`` (a caller with
        nothing of its own in flight) never blocks, so no thread can starve another. ``exempt``:
        bytes in flight that only the caller's own progress frees (a shared segment it is still
        filling): not waited for, as if nothing else were in flight."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: alone or self.used <= exempt or self.used + nbytes <= self.limit,
                timeout=self._timeout,
            )
            if not ok:
                raise ReshardError(
                    f"no buffer memory freed within {self._timeout:g} s ({self.used} bytes in "
                    f"flight, max_inflight_bytes={self.limit})"
                )
            self.used += nbytes
            self.peak = max(self.peak, self.used)

    def try_acquire(self, nbytes: int) -> bool:
        """Take ``nbytes`` if they fit now (or nothing is in flight); never blocks."""
        with self._cond:
            if self.used and self.used + nbytes > self.limit:
                return False
            self.used += nbytes
            self.peak = max(self.peak, self.used)
            return True

    def release(self, nbytes: int) -> None:
        """Return ``nbytes``."""
        if nbytes:
            with self._cond:
                self.used -= nbytes
                self._cond.notify_all()


@dataclass
class Pending:
    """Posted messages of one chunk, ``(peer, work)``: complete them, run ``finish`` (unpack),
    free ``nbytes``. ``box`` is the destination region the item writes, if any."""

    works: list[tuple[int, dist.Work]]
    what: str
    ranks: tuple[int, ...]
    nbytes: int = 0
    finish: Callable[[], None] | None = None
    box: Box | None = None
    done: threading.Event = field(default_factory=threading.Event)
    current: Callable[[], tuple[int | None, str]] | None = None  # what a relay waits for

    def end(self) -> None:
        """Mark the item complete (a helper thread's, whose ``current`` looks back at it): the
        back reference goes first, so no cycle keeps the helper and its buffers alive."""
        self.current = None
        self.done.set()

    def waiting_on(self) -> tuple[int | None, str]:
        """(peer, what) this item is waiting for."""
        current = self.current  # read once: end() clears it
        if current is not None:
            return current()
        return (self.works[0][0] if self.works else None), self.what


class Reaper:
    """A thread that completes posted items in the order they were posted; a failed message is
    recorded in ``failures`` and the items after it are still completed."""

    def __init__(self, links: Links, budget: Budget, failures: Failures) -> None:
        self.links = links
        self.budget = budget
        self.failures = failures
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="meshcast-reaper", daemon=True)
        self._thread.start()

    def add(self, item: Pending) -> None:
        """Hand over a posted item."""
        self._queue.put(item)

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            ok = True
            for peer, work in item.works:
                try:
                    ok = self.failures.complete(self.links, work, peer, item.what) and ok
                except Exception as exc:  # a backend error without a peer's failure
                    ok = False
                    self.failures.error(item.what, exc)
            try:
                if ok and item.finish is not None:
                    item.finish()
            except Exception as exc:
                self.failures.error(f"{item.what} (unpacking)", exc)
            finally:
                self.budget.release(item.nbytes)
                item.done.set()

    def close(self, timeout: float) -> bool:
        """Wait until every item handed over so far is complete; False if the thread is still
        running after ``timeout`` (it cannot be: every wait is bounded)."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()
