"""One rank's part of a :func:`meshcast.reshard_many` schedule (many.py): local copies, then
bucket after bucket, phase after phase, of packed messages.

In a phase the rank posts all its receives, then packs the message for each peer and posts its
send at once (so packing the next message overlaps sending the previous ones), then unpacks each
received message as it arrives. With ``overlap`` the sends of a phase are waited for only after
the next phase's sends are packed and posted, so packing (and making, below) the next bucket
overlaps the transfer of the current one; the schedule is then cut at half the staging bound, so
two phases in flight stay within it.

A source given as a function (no arguments) is *made on demand*: called when the schedule first
needs that tensor on this rank (a weight sync converts a shard to the engine's dtype there),
checked like a given source, and dropped after its last message is posted, so made sources live
about one bucket rather than the whole call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..core.plan import Plan
from ..planning.many import Schedule, Segment
from .p2p import Failures, Links, PeerFault
from .shm_messages import ShmMessages, ShmSend
from .tensors import as_carrier, check_local, torch_dtype

__all__ = ["Exchange", "ManyStats", "is_maker"]

_ALIGN = 16
_TAG_BASE = 1 << 20  # away from the small tags meshcast.reshard uses (its op indices)


@dataclass
class ManyStats:
    """What the last :func:`reshard_many` call did on this rank."""

    buckets: int = 0
    phases: int = 0
    messages_sent: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    peak_staging_bytes: int = 0
    zero_copy_messages: int = 0
    per_bucket_staging: list[int] = field(default_factory=list)
    made_sources: int = 0
    peak_made_bytes: int = 0
    shm_messages: int = 0


def is_maker(x: object) -> bool:
    """Whether ``x`` is a source made on demand (a function, not a tensor)."""
    return callable(x) and not isinstance(x, torch.Tensor)


def _padded(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _msg_size(segs: Sequence[Segment]) -> int:
    """Bytes of a packed message: segments start at multiples of 16, the last is not padded (so a
    one-segment message has the same size packed or not)."""
    return sum(_padded(s.nbytes) for s in segs[:-1]) + segs[-1].nbytes


class Posted(NamedTuple):
    """A message posted in a phase: with ``peer``, of ``segs``; ``buf``: the bytes it stages (a
    pack or unpack buffer, or the packed message in a shared segment), ``work``: its message (a
    :class:`~meshcast.runtime.shm_messages.ShmSend` through shared memory), ``handle``: where a
    receive through shared memory gets the segment's handle."""

    peer: int
    segs: tuple[Segment, ...]
    buf: torch.Tensor | None
    work: object
    label: str
    handle: torch.Tensor | None = None


class Exchange:
    """This rank's part of a schedule on carrier tensors (runtime/tensors.py): ``outs``, the
    results (None where this rank receives no part of a tensor); ``intra``: the path of messages
    between ranks of one host (``"shm"``: shm_messages.py, for CPU tensors)."""

    def __init__(self, plans: list[Plan], schedule: Schedule, me: int, tensors: list, outs: list,
                 dev: torch.device, links: Links, failures: Failures, overlap: bool = False,
                 labels: Sequence[str] = (), intra: str = "socket") -> None:
        self.plans, self.schedule, self.me, self.dev = plans, schedule, me, dev
        self.links, self.failures, self.overlap = links, failures, overlap
        host = links.host_of.get(me)
        self.shm = ShmMessages(links, failures, {
            r for r in schedule.ranks
            if intra == "shm" and dev.type == "cpu" and r != me and host is not None
            and links.host_of.get(r) == host
        })
        self.labels = list(labels) or [f"tensors[{k}]" for k in range(len(plans))]
        self.src_regions = [p.task.src_region(me) for p in plans]
        self.dst_regions = [p.task.dst_region(me) for p in plans]
        self.srcs: list = [None if t is None else t if is_maker(t) else as_carrier(t)
                           for t in tensors]
        self.made: dict[int, int] = {}  # made sources alive: tensor -> bytes
        self.last_use = self._last_uses() if any(is_maker(t) for t in tensors) else {}
        self.outs: list[torch.Tensor | None] = list(outs)
        self.stats = ManyStats(buckets=len(schedule.buckets))
        self._pending: list[Posted] = []  # the previous phase's sends (overlap)

    def _last_uses(self) -> dict[int, int]:
        """``{tensor: number of the last phase whose sends read its source}`` on this rank."""
        last: dict[int, int] = {}
        number = 0
        for bucket in self.schedule.buckets:
            for phase in bucket:
                number += 1
                for _, segs in phase.sends_of(self.me):
                    for s in segs:
                        if not s.from_out:
                            last[s.tensor] = number
        return last

    def source(self, k: int) -> torch.Tensor:
        """This rank's source shard of tensor ``k`` (made now if it is made on demand)."""
        src = self.srcs[k]
        if not is_maker(src):
            return src
        made = src()
        task = self.plans[k].task
        why = check_local(made, self.src_regions[k], task, self.me, torch_dtype(task.dtype),
                          self.dev)
        if why is not None:
            raise ValueError(f"{self.labels[k]} made on demand {why}")
        self.srcs[k] = carrier = as_carrier(made)
        self.made[k] = carrier.numel()
        self.stats.made_sources += 1
        self.stats.peak_made_bytes = max(self.stats.peak_made_bytes, sum(self.made.values()))
        return carrier

    def _release(self, number: int) -> None:
        """Drop the made sources whose last message was posted in phase ``number``."""
        for k in [k for k in self.made if self.last_use.get(k) == number]:
            del self.made[k]
            self.srcs[k] = None

    def view(self, seg: Segment, side: str) -> torch.Tensor:
        if side == "src" and not seg.from_out:
            return self.source(seg.tensor)[self.src_regions[seg.tensor].local(seg.box)]
        return self.outs[seg.tensor][self.dst_regions[seg.tensor].local(seg.box)]

    def run(self) -> None:
        for k, box in self.schedule.copies_of(self.me):
            self.outs[k][self.dst_regions[k].local(box)].copy_(
                self.source(k)[self.src_regions[k].local(box)])
        tag, number = _TAG_BASE, 0
        for bucket in self.schedule.buckets:
            for phase in bucket:
                tag += 1
                number += 1
                sends, recvs = phase.sends_of(self.me), phase.recvs_of(self.me)
                if not sends and not recvs:
                    continue
                self.stats.phases += 1
                what = f"bucket {len(self.stats.per_bucket_staging)} (tag {tag})"
                try:
                    self._phase(sends, recvs, tag, what)
                except Exception as exc:  # a bug or a resource error: the others still finish
                    self.failures.error(what, exc)
                self._release(number)
            self.stats.per_bucket_staging.append(self.stats.peak_staging_bytes)
        self._wait_sends(self._pending)
        self._pending = []
        self.stats.shm_messages = self.shm.messages

    def _phase(self, sends: list, recvs: list, tag: int, what: str) -> None:
        """Post, complete and unpack one phase's messages."""
        posted_recvs = []
        for peer, segs in recvs:
            if self.failures.closed(peer):
                continue
            try:
                posted_recvs.append(self._post_recv(peer, segs, tag, what))
            except PeerFault as fault:
                self.failures.peer(fault)
        posted_sends = []
        for peer, segs in sends:
            if not self.failures.sendable(peer):
                continue
            try:
                posted_sends.append(self._post_send(peer, segs, tag, what))
            except PeerFault as fault:
                self.failures.peer(fault)
            except Exception as exc:  # making or packing the message failed: report, then
                self.failures.error(what, exc)  # the peer gets a placeholder (degraded now)
                if self.failures.sendable(peer):
                    try:
                        posted_sends.append(self._post_send(peer, segs, tag, what))
                    except PeerFault as fault:
                        self.failures.peer(fault)
        staged = sum(p.buf.numel() for p in posted_recvs + posted_sends + self._pending
                     if p.buf is not None)
        self.stats.peak_staging_bytes = max(self.stats.peak_staging_bytes, staged)
        self._wait_sends(self._pending)  # the previous phase's, now that this one's are posted
        self._pending = []
        for p in posted_recvs:
            if not self.failures.complete(self.links, p.work, p.peer, p.label):
                continue
            if p.handle is not None:
                self.shm.read(p.peer, p.handle, tag, what, lambda d, p=p: self._unpack(p.segs, d))
            elif p.buf is not None and not self.failures.degraded.is_set():
                self._unpack(p.segs, p.buf)
        if self.overlap:
            self._pending = posted_sends
        else:
            self._wait_sends(posted_sends)

    def _wait_sends(self, posted: list[Posted]) -> None:
        for p in posted:
            if isinstance(p.work, ShmSend):
                self.shm.complete_send(p.peer, p.work, p.label)
            else:
                self.failures.complete(self.links, p.work, p.peer, p.label)
        self.shm.complete_acks()

    def _post_recv(self, peer: int, segs: tuple[Segment, ...], tag: int, what: str) -> Posted:
        stats, label = self.stats, f"{what}: a receive from rank {peer}"
        stats.bytes_received += sum(s.nbytes for s in segs)
        if peer in self.shm.peers:
            handle, work = self.shm.post_recv(peer, tag, what)
            return Posted(peer, segs, None, work, label, handle)
        if len(segs) == 1:
            v = self.view(segs[0], "dst")
            if v.is_contiguous():
                stats.zero_copy_messages += 1
                return Posted(peer, segs, None, self.links.irecv(v, peer, tag, what), label)
        buf = torch.empty(_msg_size(segs), dtype=torch.uint8, device=self.dev)
        return Posted(peer, segs, buf, self.links.irecv(buf, peer, tag, what), label)

    def _post_send(self, peer: int, segs: tuple[Segment, ...], tag: int, what: str) -> Posted:
        label = f"{what}: a send to rank {peer}"
        nbytes = sum(s.nbytes for s in segs)
        if peer in self.shm.peers:
            size = _msg_size(segs)
            sent = self.shm.send(peer, size, lambda d: self._pack(segs, d), tag, what)
            if sent.segment is None:
                return Posted(peer, segs, None, sent, label)
            self.stats.messages_sent += 1
            self.stats.bytes_sent += nbytes
            return Posted(peer, segs, sent.segment.data[:size], sent, label)
        if self.failures.degraded.is_set():
            return Posted(peer, segs, None, self.links.stub(peer, tag, what), label)
        staged = None
        if len(segs) == 1 and self.view(segs[0], "src").is_contiguous():
            buf = self.view(segs[0], "src")
            self.stats.zero_copy_messages += 1
        else:
            buf = staged = torch.empty(_msg_size(segs), dtype=torch.uint8, device=self.dev)
            self._pack(segs, buf)
        self.stats.messages_sent += 1
        self.stats.bytes_sent += nbytes
        return Posted(peer, segs, staged, self.links.isend(buf, peer, tag, what, payload=nbytes),
                      label)

    def _pack(self, segs: tuple[Segment, ...], buf: torch.Tensor) -> None:
        off = 0
        for s in segs:
            src = self.view(s, "src")
            buf[off : off + s.nbytes].view(src.dtype).view(src.shape).copy_(src)
            off += _padded(s.nbytes)

    def _unpack(self, segs: tuple[Segment, ...], buf: torch.Tensor) -> None:
        off = 0
        for s in segs:
            dst = self.view(s, "dst")
            dst.copy_(buf[off : off + s.nbytes].view(dst.dtype).view(dst.shape))
            off += _padded(s.nbytes)


MakeSource = Callable[[], torch.Tensor]
"""A source made on demand (see the module docstring)."""
