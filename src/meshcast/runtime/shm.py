"""The intra-host path of the ``"p2p"`` transport for CPU tensors: shared-memory segments.

Between two ranks of one host, a chunk sent over a loopback socket goes through the kernel's socket
stack once per receiver (a copy in, a copy out, and the TCP work of both sides, all on the host's
cores). Here a producer (a broadcast's sender or leader, the source of a ``Send``, an all-gather
member passing on its part) writes each chunk once into a ring of ``slots`` chunk-sized slots of a
shared segment, and every consumer on its host copies it from there straight into its destination
(any strides, no pack buffer): one copy in, one copy out per receiver, no socket payload.

**Segments have no name** (segments.py). A segment is a ``memfd`` (anonymous shared memory).
The producer sends ``(pid, fd, size, token, slots)`` to its consumers, which map
``/proc/<pid>/fd/<fd>`` and check the token (a random number the producer wrote at the
segment's start). Nothing is ever created in ``/dev/shm`` or on disk, so nothing can leak: the
kernel frees the memory when the last process holding the fd or a mapping closes it or dies,
whatever way it ends. A process keeps its free segments and its mappings for reuse (two caches
bounded by bytes; a fresh segment costs a page fault per page on both sides), drops them all after
a failed call, and on :func:`meshcast.clear_caches`.

**Synchronisation** uses the same tagged messages as the data path, with no payload: a
notification per chunk and consumer (producer -> consumer, tag of the operation; it carries the
chunk's size in the byte counters) and an acknowledgement per chunk and consumer (consumer ->
producer, tag ``ACK_TAG + tag``) once the consumer has copied the chunk out. The producer refills a
slot only after every consumer acknowledged the chunk it held. A consumer waits only for its
producer's notifications; a producer waits only for its consumers' acknowledgements of chunks it
has already published, so every wait goes back to a message already posted (docs/runtime.md,
"Why a small budget cannot deadlock"). Consumers run in their own thread (like a broadcast relay),
so a producer never waits for a consumer's main thread.

After a failure both sides go on exchanging their (empty) messages with every live peer, as the
socket path does with placeholders; a consumer that got no segment (a placeholder handshake)
copies nothing, and the call's error board makes every rank raise.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from dataclasses import dataclass

import torch

from .p2p import Budget, Failures, Links, PeerFault, Pending
from .segments import INTRA_ENV, Segment, give_back, map_segment, take_segment

__all__ = [
    "ACK_TAG",
    "INTRA_ENV",
    "INTRA_MODES",
    "PIECE_BYTES",
    "SLOTS",
    "Ring",
    "ShmReader",
    "ShmWriter",
    "intra_mode",
    "intra_setting",
    "shm_supported",
]

INTRA_MODES = ("shm", "socket")
"""``shm``: shared-memory segments (the default on Linux); ``socket``: loopback messages."""
ACK_TAG = 1 << 29
"""Added to an operation's tag for a consumer's acknowledgements (away from every data tag)."""
SLOTS = 4
"""Pieces a producer's segment holds at most (fewer where ``max_inflight_bytes`` is smaller)."""
POSTED = 2
"""Notifications a consumer keeps posted ahead (so a piece's message needs no round trip)."""
PIECE_BYTES = 4 << 20
"""Consecutive chunks up to this many bytes share one slot, one notification and one
acknowledgement (fewer messages per byte than one per chunk)."""
_ALIGN = 64


def shm_supported() -> bool:
    """Whether this platform has anonymous shared segments (Linux ``memfd_create``)."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create")


def intra_mode() -> str:
    """The intra-host path ``$MESHCAST_INTRA`` asks for (:data:`INTRA_MODES`); unset: ``"shm"``
    where :func:`shm_supported`, else ``"socket"``. A bad value is a ``ValueError``."""
    raw = os.environ.get(INTRA_ENV, "").strip().lower()
    if not raw:
        return "shm" if shm_supported() else "socket"
    if raw not in INTRA_MODES:
        raise ValueError(f"${INTRA_ENV} must be 'shm' or 'socket' (or unset), got {raw!r}")
    if raw == "shm" and not shm_supported():
        raise ValueError(f"${INTRA_ENV}=shm needs Linux memfd_create; use 'socket' here")
    return raw


def intra_setting() -> tuple[str | None, str | None]:
    """This rank's :func:`intra_mode` for the call's agreement, and why it is refused (then the
    value this rank was given, which is what the other ranks see), if it is."""
    try:
        return intra_mode(), None
    except ValueError as exc:
        return os.environ.get(INTRA_ENV), str(exc)


def _slot_view(seg: Segment, offset: int, like: torch.Tensor) -> torch.Tensor:
    """The bytes at ``offset`` of ``seg`` as a contiguous tensor of ``like``'s dtype and shape."""
    n = like.numel() * like.element_size()
    return seg.data[offset:offset + n].view(like.dtype).view(like.shape)


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class Ring:
    """How an operation's chunks (``sizes``, bytes) lie in a segment, the same on both sides:
    consecutive chunks grouped into pieces of at most :data:`PIECE_BYTES` (a chunk alone if
    bigger), one notification and acknowledgement per piece; ``piece_of[k]`` and ``offset[k]``
    (inside its piece's slot) of chunk ``k``; ``slot_bytes`` per slot."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.piece_of: list[int] = []
        self.offset: list[int] = []
        self.last: list[int] = []  # the last chunk of each piece
        used = 0
        for k, n in enumerate(sizes):
            if self.piece_of and used + _align(n) <= PIECE_BYTES:
                self.piece_of.append(self.piece_of[-1])
            else:
                if self.piece_of:
                    self.last.append(k - 1)
                self.piece_of.append(len(self.last))
                used = 0
            self.offset.append(used)
            used += _align(n)
        if sizes:
            self.last.append(len(sizes) - 1)
        self.slot_bytes = max((self.offset[k] + _align(sizes[k]) for k in range(len(sizes))),
                              default=_ALIGN)

    def piece_bytes(self, p: int) -> int:
        """Payload bytes of piece ``p``."""
        first = self.last[p - 1] + 1 if p else 0
        return sum(self.sizes[first:self.last[p] + 1])


class ShmWriter:
    """A producer's side of one operation: a segment of ``slots`` piece slots (:class:`Ring`),
    the handshake to every consumer, then :meth:`put` per chunk, then :meth:`close` (waits for
    every consumer)."""

    def __init__(self, links: Links, failures: Failures, budget: Budget, consumers: list[int],
                 tag: int, what: str, sizes: list[int]) -> None:
        self.links, self.failures, self.budget = links, failures, budget
        self.consumers, self.tag, self.what = consumers, tag, what
        self.ring = Ring(sizes)
        pieces = len(self.ring.last)
        self.slots = max(1, min(SLOTS, pieces, budget.limit // self.ring.slot_bytes))
        self.nbytes = self.slots * self.ring.slot_bytes
        self.acks: deque[tuple[int, list[tuple[int, object]]]] = deque()
        self.sends: list[tuple[int, object]] = []
        self.segment: Segment | None = None
        self._empty = torch.empty(0, dtype=torch.uint8)
        # counted in the budget, never waited for: it depends only on its consumers
        budget.acquire(self.nbytes, alone=True)
        if not failures.degraded.is_set():
            try:
                self.segment = take_segment(self.nbytes)
            except Exception as exc:
                failures.error(f"{what}: creating a shared segment", exc)
        handle = self.segment.handle(self.slots) if self.segment is not None else None
        for c in consumers:
            self._send(c, handle, f"{what}: segment to {c}")

    def _send(self, peer: int, buf: torch.Tensor | None, what: str, payload: int = 0) -> None:
        if not self.failures.sendable(peer):
            return
        try:
            if buf is None or self.failures.degraded.is_set():
                self.sends.append((peer, self.links.stub(peer, self.tag, what)))
            elif payload:
                self.sends.append((peer, self.links.isend(buf, peer, self.tag, what, payload)))
            else:
                self.sends.append((peer, self.links.control(buf, peer, self.tag, what)))
        except PeerFault as fault:
            self.failures.peer(fault)

    def put(self, k: int, src: torch.Tensor) -> None:
        """Write chunk ``k`` (``src``: any strides) into its piece's slot; at the piece's last
        chunk, tell every consumer."""
        ring, p = self.ring, self.ring.piece_of[k]
        while self.acks and self.acks[0][0] <= p - self.slots:
            self._finish_ack()
        if self.segment is not None and not self.failures.degraded.is_set():
            at = (p % self.slots) * ring.slot_bytes + ring.offset[k]
            _slot_view(self.segment, at, src).copy_(src)
        if k != ring.last[p]:
            return
        what = f"{self.what}: piece {p + 1}/{len(ring.last)}"
        for c in self.consumers:
            self._send(c, self._empty, f"{what} to {c} (shared memory)", ring.piece_bytes(p))
        acks = []
        for c in self.consumers:
            if not self.failures.closed(c):
                try:
                    acks.append((c, self.links.irecv(self._empty, c, ACK_TAG + self.tag,
                                                     f"{what}: acknowledgement of {c}")))
                except PeerFault as fault:
                    self.failures.peer(fault)
        self.acks.append((p, acks))

    def _finish_ack(self) -> None:
        p, acks = self.acks.popleft()
        for c, work in acks:
            self.failures.complete(self.links, work, c, f"{self.what}: piece {p + 1} "
                                                        f"acknowledged by {c}")

    def pending(self, ranks: tuple[int, ...]) -> Pending:
        """What is left once every piece is published, as an item for the runner's reaper: the
        consumers' acknowledgements and this side's messages; it keeps the segment for reuse and
        frees its budget when they are complete (the producer's rank goes on meanwhile, as it
        does when the kernel buffers a socket's last chunks)."""
        works = [(c, w) for _, acks in self.acks for c, w in acks] + self.sends
        self.acks.clear()
        self.sends = []
        segment, self.segment = self.segment, None

        def keep() -> None:
            if segment is not None:
                give_back(segment)

        return Pending(works, f"{self.what}: shared-memory consumers", ranks, self.nbytes, keep)

    def close(self) -> None:
        """Wait until every consumer has copied every piece; release the segment."""
        try:
            while self.acks:
                self._finish_ack()
            for peer, work in self.sends:
                self.failures.complete(self.links, work, peer, self.what)
        finally:
            if self.segment is not None:
                give_back(self.segment)
                self.segment = None
            self.budget.release(self.nbytes)


@dataclass
class ShmReader:
    """A consumer's side of one operation: the body (:meth:`run`) of a thread that maps the
    producer's segment and copies chunk ``k`` into ``views[k]`` as each is published; ``done`` is
    set when it has finished every message."""

    links: Links
    failures: Failures
    producer: int
    tag: int
    what: str
    views: list[torch.Tensor]
    done: Pending

    def __post_init__(self) -> None:
        self.posted: deque = deque()  # receives of the next notifications, posted ahead
        self.unreachable: OSError | None = None  # the producer's segment could not be mapped
        self.waiting: tuple[int | None, str] = (self.producer, self.what)
        self.done.current = lambda: self.waiting
        self._empty = torch.empty(0, dtype=torch.uint8)

    def run(self) -> None:
        """Copy every chunk out (the thread's body); failures go to ``failures``."""
        acks: list[object] = []
        try:
            self._loop(acks)
        except BaseException as exc:
            self.failures.error(f"{self.what}: shared-memory receive", exc)
        finally:
            while self.posted:  # after an unexpected error: complete what was posted
                self._wait(self.posted.popleft(), f"{self.what}: piece from {self.producer}")
            for work in acks:
                self.failures.complete(self.links, work, self.producer,
                                       f"{self.what}: acknowledgement")
            # a producer that died after sending its handle took its /proc entry with it: that
            # is its failure (reported above), not this rank's
            if self.unreachable is not None and not self.failures.closed(self.producer):
                self.failures.error(f"{self.what}: mapping rank {self.producer}'s segment",
                                    self.unreachable)
            self.done.end()

    def _post(self, buf: torch.Tensor, what: str) -> object | None:
        """Post the receive of one message from the producer into ``buf`` (None: not posted)."""
        if self.failures.closed(self.producer):
            return None
        try:
            return self.links.irecv(buf, self.producer, self.tag, what)
        except PeerFault as fault:
            self.failures.peer(fault)
            return None

    def _wait(self, work: object | None, what: str) -> bool:
        """Complete a posted receive; False if it was not posted or failed."""
        if work is None:
            return False
        self.waiting = (self.producer, what)
        return self.failures.complete(self.links, work, self.producer, what)

    def _what(self, p: int, n: int) -> str:
        return f"{self.what}: piece {p + 1}/{n} from {self.producer}"

    def _loop(self, acks: list[object]) -> None:
        handle = torch.zeros(5, dtype=torch.int64)
        seg = None
        what = f"{self.what}: segment from {self.producer}"
        if self._wait(self._post(handle, what), what) and handle[0]:
            try:
                seg = map_segment(handle)
            except OSError as exc:  # told once the producer is known to be alive (run)
                self.unreachable = exc
        ring = Ring([v.numel() * v.element_size() for v in self.views])
        n, slots = len(ring.last), 1 if seg is None else max(1, int(handle[4]))
        first = 0
        for p, last in enumerate(ring.last):
            while len(self.posted) < POSTED and p + len(self.posted) < n:  # ahead of the data
                q = p + len(self.posted)
                self.posted.append(self._post(self._empty, self._what(q, n)))
            ok = self._wait(self.posted.popleft(), self._what(p, n))
            if ok and seg is not None and not self.failures.degraded.is_set():
                for k in range(first, last + 1):
                    at = (p % slots) * ring.slot_bytes + ring.offset[k]
                    self.views[k].copy_(_slot_view(seg, at, self.views[k]))
            first = last + 1
            if self.failures.sendable(self.producer):
                try:
                    acks.append(self.links.control(self._empty, self.producer,
                                                   ACK_TAG + self.tag, self._what(p, n)))
                except PeerFault as fault:
                    self.failures.peer(fault)
