"""Whole messages of a :func:`meshcast.reshard_many` schedule (exchange.py) between two ranks of
one host, through a shared segment instead of a loopback socket.

The sender packs its message for the phase straight into a segment (segments.py) and sends the
segment's handle (its bytes counted as the payload); the receiver maps the segment, unpacks from
it into its destination tensors, and acknowledges. The sender keeps the segment until that
acknowledgement arrives, then keeps it for reuse. So a message's bytes are copied twice (packed
in, unpacked out) and never pass through the socket stack; the receiver stages nothing.

Every message is a pair, whatever happens: the sender always posts the receive of the
acknowledgement and sends a handle (an empty placeholder after a failure, as the socket path
sends one), and the receiver always acknowledges (also a placeholder, or a segment it could not
map: the call's error board makes every rank raise). The waits keep the schedule's order (a
phase's messages are posted before any of its waits; an acknowledgement is awaited where the
socket path awaits the send), so the argument of docs/runtime.md ("Why a small budget cannot
deadlock") holds unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .p2p import Failures, Links, PeerFault
from .segments import Segment, give_back, map_segment, take_segment
from .shm import ACK_TAG

__all__ = ["ShmMessages", "ShmSend"]

_HANDLE = 5  # int64 entries of a segment's handle (Segment.handle)


class ShmSend(NamedTuple):
    """A posted message through a segment: the handle's send, the acknowledgement's receive,
    and the segment (None after a failure) to keep once it is acknowledged."""

    handle: object
    ack: object | None
    segment: Segment | None


class ShmMessages:
    """The shared-memory messages of one rank in one call: with ``peers`` (ranks on its host)."""

    def __init__(self, links: Links, failures: Failures, peers: set[int]) -> None:
        self.links, self.failures, self.peers = links, failures, peers
        self.acks: list[tuple[int, object, str]] = []  # acknowledgements sent, to complete
        self._empty = torch.empty(0, dtype=torch.uint8)
        self.messages = 0

    def send(self, peer: int, nbytes: int, pack: Callable[[torch.Tensor], None], tag: int,
             what: str) -> ShmSend:
        """Post a message of ``nbytes`` to ``peer``: ``pack(data)`` fills ``data`` (uint8, in the
        segment) unless this rank is degraded, in which case a placeholder goes instead."""
        ack = self.links.irecv(self._empty, peer, ACK_TAG + tag, f"{what}: acknowledgement")
        segment = None
        if not self.failures.degraded.is_set():
            try:
                segment = take_segment(nbytes)
                pack(segment.data[:nbytes])
            except Exception as exc:  # making or packing the source failed: a placeholder
                self.failures.error(what, exc)
                if segment is not None:
                    give_back(segment)
                segment = None
        if segment is None:
            return ShmSend(self.links.stub(peer, tag, what), ack, None)
        self.messages += 1
        work = self.links.isend(segment.handle(), peer, tag, f"{what} (shared memory)", nbytes)
        return ShmSend(work, ack, segment)

    def complete_send(self, peer: int, sent: ShmSend, what: str) -> None:
        """Wait until ``peer`` has the message and has copied it out; keep the segment."""
        self.failures.complete(self.links, sent.handle, peer, what)
        self.failures.complete(self.links, sent.ack, peer, f"{what}: acknowledgement")
        if sent.segment is not None:
            give_back(sent.segment)

    def post_recv(self, peer: int, tag: int, what: str) -> tuple[torch.Tensor, object]:
        """Post the receive of a message's handle from ``peer`` (zeros if a placeholder comes)."""
        handle = torch.zeros(_HANDLE, dtype=torch.int64)
        return handle, self.links.irecv(handle, peer, tag, f"{what} (shared memory)")

    def read(self, peer: int, handle: torch.Tensor, tag: int, what: str,
             unpack: Callable[[torch.Tensor], None]) -> None:
        """``unpack(data)`` from the segment of a received ``handle`` (nothing for a placeholder
        or once degraded), then acknowledge it."""
        if int(handle[0]) and not self.failures.degraded.is_set():
            try:
                unpack(map_segment(handle).data)
            except OSError as exc:  # not reachable: this rank's failure unless the peer died
                if not self.failures.closed(peer):
                    self.failures.error(f"{what}: mapping rank {peer}'s segment", exc)
        if self.failures.sendable(peer):
            label = f"{what}: acknowledgement to {peer}"
            try:
                self.acks.append((peer, self.links.control(self._empty, peer, ACK_TAG + tag,
                                                           label), label))
            except PeerFault as fault:
                self.failures.peer(fault)

    def complete_acks(self) -> None:
        """Complete the acknowledgements sent so far."""
        acks, self.acks = self.acks, []
        for peer, work, label in acks:
            self.failures.complete(self.links, work, peer, label)
