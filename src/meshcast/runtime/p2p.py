"""Point-to-point machinery for gloo (or any backend with tagged isend/irecv): a transport that
counts bytes, a memory budget, and a reaper thread that completes posted messages in order.

Every message is a contiguous tensor viewed as bytes, so any dtype travels the same way. A box
that is contiguous in its shard is sent or received in place; otherwise it is packed into (or
unpacked from) one buffer whose bytes count against the budget until the message completes.
"""

from __future__ import annotations

import datetime
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..layout import Box
from .errors import ReshardError
from .stats import record_send

__all__ = ["Budget", "Pending", "Reaper", "Transport"]


class Transport:
    """Tagged isend/irecv between plan ranks over one process group, with byte counters.

    Used by :func:`meshcast.reshard` and :func:`meshcast.reshard_many`; ``caller`` names the
    function in error messages.
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        me: int,
        to_global: Callable[[int], int],
        host_of: dict[int, int],
        timeout: float,
        caller: str = "meshcast.reshard",
    ) -> None:
        self.group = group
        self.me = me
        self.to_global = to_global
        self.host_of = host_of
        self.timeout = timeout
        self.caller = caller
        self._timedelta = datetime.timedelta(seconds=timeout)

    @staticmethod
    def _bytes(buf: torch.Tensor) -> torch.Tensor:
        return buf.reshape(-1).view(torch.uint8)

    def isend(
        self, buf: torch.Tensor, peer: int, tag: int, count: bool = True,
        payload: int | None = None,
    ) -> dist.Work:
        """Post the send of contiguous ``buf`` to plan rank ``peer`` (``count``: add it to the
        transfer statistics, as ``payload`` bytes if given, else the whole buffer)."""
        data = self._bytes(buf)
        if count:
            nbytes = data.numel() if payload is None else payload
            record_send(peer, nbytes, self.host_of.get(peer) != self.host_of.get(self.me))
        try:
            return dist.isend(data, dst=self.to_global(peer), group=self.group, tag=tag)
        except Exception as exc:
            raise self._post_error("sending to", peer, tag, exc) from exc

    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> dist.Work:
        """Post the receive of contiguous ``buf`` from plan rank ``peer``."""
        try:
            return dist.irecv(self._bytes(buf), src=self.to_global(peer), group=self.group, tag=tag)
        except Exception as exc:
            raise self._post_error("receiving from", peer, tag, exc) from exc

    def _post_error(self, verb: str, peer: int, tag: int, exc: Exception) -> ReshardError:
        ranks = (self.me, peer)
        return ReshardError(
            f"{self.caller} on rank {self.me}: {verb} rank {peer} (tag {tag}) failed "
            f"(ranks involved: {list(ranks)}): {exc}",
            ranks,
        )

    def wait(self, work: dist.Work, what: str, ranks: tuple[int, ...]) -> None:
        """Wait for ``work`` at most ``timeout``; raise :class:`ReshardError` naming ``ranks``."""
        try:
            work.wait(self._timedelta)
        except Exception as exc:
            raise ReshardError(
                f"{self.caller} on rank {self.me}: {what} did not complete within "
                f"{self.timeout:g} s (ranks involved: {list(ranks)}): {exc}",
                ranks,
            ) from exc


class Budget:
    """Bytes of pack/unpack buffers in flight on this rank, at most ``limit`` (one item may
    always proceed alone, so progress never stops)."""

    def __init__(self, limit: int, failed: threading.Event, timeout: float) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()
        self._failed = failed
        self._timeout = timeout

    def acquire(self, nbytes: int, alone: bool = False) -> None:
        """Block until ``nbytes`` more fit, or nothing is in flight; ``alone=True`` (a caller with
        nothing of its own in flight) never blocks, so no thread can starve another."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: (
                    alone
                    or self._failed.is_set()
                    or self.used == 0
                    or self.used + nbytes <= self.limit
                ),
                timeout=self._timeout,
            )
            if self._failed.is_set():
                raise ReshardError("meshcast.reshard: aborted after an earlier failure")
            if not ok:
                raise ReshardError(
                    f"meshcast.reshard: no buffer memory freed within {self._timeout:g} s "
                    f"({self.used} bytes in flight, max_inflight_bytes={self.limit})"
                )
            self.used += nbytes
            self.peak = max(self.peak, self.used)

    def try_acquire(self, nbytes: int) -> bool:
        """Take ``nbytes`` if they fit now (or nothing is in flight); never blocks."""
        with self._cond:
            if self._failed.is_set():
                raise ReshardError("meshcast.reshard: aborted after an earlier failure")
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

    def wake(self) -> None:
        """Wake waiters (after a failure)."""
        with self._cond:
            self._cond.notify_all()


@dataclass
class Pending:
    """Posted messages of one chunk: complete them, run ``finish`` (unpack), free ``nbytes``."""

    works: list[dist.Work]
    what: str
    ranks: tuple[int, ...]
    nbytes: int = 0
    finish: Callable[[], None] | None = None
    box: Box | None = None  # destination region this item writes, if any
    done: threading.Event = field(default_factory=threading.Event)


class Reaper:
    """A thread that completes posted items in the order they were posted.

    The first error is kept in ``errors`` and sets ``failed``; the items after it are abandoned.
    """

    def __init__(self, transport: Transport, budget: Budget, failed: threading.Event) -> None:
        self.transport = transport
        self.budget = budget
        self.failed = failed
        self.errors: list[BaseException] = []
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="meshcast-reaper", daemon=True)
        self._thread.start()

    def add(self, item: Pending) -> None:
        """Hand over a posted item."""
        self._queue.put(item)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self.failed.is_set():  # abandoned: free it so nobody waits on it
                self.budget.release(item.nbytes)
                item.done.set()
                continue
            try:
                for work in item.works:
                    self.transport.wait(work, item.what, item.ranks)
                if item.finish is not None:
                    item.finish()
            except BaseException as exc:
                self.errors.append(exc)
                self.failed.set()
                self.budget.wake()
            finally:
                self.budget.release(item.nbytes)
                item.done.set()

    def close(self, timeout: float) -> None:
        """Wait until every item handed over so far is complete (or failed)."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive() and not self.errors:
            self.errors.append(
                ReshardError(f"meshcast.reshard: transfers still pending after {timeout:g} s")
            )
            self.failed.set()
