"""The ``"p2p"`` transport: every move as tagged point-to-point messages on the caller's group
(gloo's path, the default for CPU tensors). No process group is created, so a rank outside a plan
is never needed; broadcasts follow the host-aware chain of broadcast.py.

Between ranks of one host (by the real host map), a move goes through a
shared-memory segment instead of loopback sockets where ``intra="shm"`` (shm.py; the default on
Linux, ``MESHCAST_INTRA=socket`` chooses the sockets): a broadcast's sender and leaders feed
their own receivers, a ``Send`` inside a host and an all-gather member's part to the
members of its host go through it.

After a failure the rank goes on exchanging its messages with every peer whose connection still
works, sending empty placeholders instead of data (p2p.py), so its peers finish at once, find the
report and raise, instead of waiting out the timeout.
"""

from __future__ import annotations

from ..core.layout import Box, box_size
from ..core.plan import AllGather, Broadcast, Send, broadcast_chain
from ..core.region import Region
from .broadcast import Relay, chain_role
from .chunks import chunk_boxes
from .p2p import PeerFault, Pending
from .runner import Runner
from .shm import ShmReader, ShmWriter

__all__ = ["RELAY_WINDOW", "PointToPoint"]

RELAY_WINDOW = 4
"""Chunks a broadcast leader keeps in flight on each side of its relay."""


class PointToPoint:
    """The moves of the ``"p2p"`` transport (see the module docstring); ``intra``: the path
    between ranks of one host, ``"shm"`` or ``"socket"`` (shm.py)."""

    def __init__(self, intra: str = "socket") -> None:
        self.intra = intra

    def local(self, runner: Runner, peer: int) -> bool:
        """Whether messages between this rank and ``peer`` go through shared memory."""
        if self.intra != "shm":
            return False
        hosts = runner.links.host_of
        return peer in hosts and hosts.get(peer) == hosts.get(runner.me)

    def start(self, runner: Runner) -> None:
        """Nothing to set up: messages go on the caller's group."""

    def send(self, runner: Runner, i: int, op: Send) -> None:
        """Send ``op.box`` from the source shard, or receive it, chunk by chunk."""
        what = f"op {i} (send {op.src}->{op.dst})"
        if op.src == runner.me:
            self._send(runner, runner.local, runner.src_region, op.box, [op.dst], i, what,
                       op.ranks())
        if op.dst == runner.me:
            self._recv(runner, op.box, op.src, i, what, op.ranks())

    def broadcast(self, runner: Runner, i: int, op: Broadcast) -> None:
        """This rank's part of the host-aware chain: send, relay (in a thread) or receive."""
        chain = broadcast_chain(op, runner.plan.topology.hosts_by_rank)
        role, feeder, targets = chain_role(chain, runner.me)
        what = f"op {i} (broadcast from {op.src})"
        # only this rank's own members may read a segment: the next leader runs a relay, which
        # receives messages (even where the real hosts put it beside this rank)
        members = next((set(m) for leader, m in chain if leader == runner.me), set())
        if role == "sender":
            self._send(runner, runner.local, runner.src_region, op.box, targets, i, what,
                       op.ranks(), members)
        elif role == "member":
            self._recv(runner, op.box, feeder, i, what, op.ranks())
        else:
            done = Pending([], f"{what}: relay", op.ranks(), box=op.box)
            shared = [t for t in targets if t in members and self.local(runner, t)]
            relay = Relay(runner.links, runner.budget, runner.failures, runner.out,
                          runner.dst_region, op, i, feeder,
                          [t for t in targets if t not in shared], runner.chunk_bytes,
                          RELAY_WINDOW, done, shared)
            runner.writes.append(done)
            runner.op_items.append(done)
            runner.start_thread(relay.run, f"meshcast-relay-{i}")

    def allgather(self, runner: Runner, i: int, op: AllGather) -> None:
        """Post this member's messages of an all-gather in the order every member agrees on:
        part by part in group order (receive the parts of the members before it, send its own,
        receive the parts after it), chunk by chunk. A common order is what keeps a small
        ``max_inflight_bytes`` deadlock-free (docs/runtime.md, "small budget"): were every member
        to post its own sends first, each could fill its budget with sends that wait for receives
        the others only post after their own sends."""
        assert runner.out is not None
        what = f"op {i} (all-gather among {list(op.group)})"
        others = [r for r in op.group if r != runner.me]
        for r, part in zip(op.group, op.parts):
            if r != runner.me:
                try:
                    self._recv(runner, part, r, i, what, op.group)
                except PeerFault as fault:
                    runner.failures.peer(fault)
                continue
            runner.wait_writes(part)
            self._send(runner, runner.out, runner.dst_region, part, others, i, what, op.group)

    def _send(self, runner: Runner, shard, shard_region: Region, box: Box, targets: list[int],
              index: int, what: str, ranks: tuple[int, ...],
              readers: set[int] | None = None) -> None:
        """Send ``box`` of ``shard`` to ``targets``: through a segment to those on this host
        (among ``readers``, if given), as messages to the others."""
        failures, links = runner.failures, runner.links
        chunks = chunk_boxes(box, runner.itemsize, runner.chunk_bytes)
        shared = [t for t in targets if (readers is None or t in readers)
                  and self.local(runner, t)]
        sockets = [t for t in targets if t not in shared]
        writer = None
        if shared and chunks:
            writer = ShmWriter(links, failures, runner.budget, shared, index, what,
                               [box_size(c) * runner.itemsize for c in chunks])
        try:
            for k, chunk in enumerate(chunks):
                live = [t for t in sockets if failures.sendable(t)]
                if live:  # (the segment this thread fills is not waited for: only it frees it)
                    self._post_sends(runner, shard, shard_region, chunk, live, index, what, ranks,
                                     0 if writer is None else writer.nbytes)
                if writer is not None:
                    writer.put(k, shard[shard_region.local(chunk)])
        finally:
            if writer is not None:  # completed by the reaper: this rank goes on meanwhile
                runner.reaper.add(writer.pending(ranks))

    @staticmethod
    def _post_sends(runner: Runner, shard, shard_region: Region, chunk: Box, live: list[int],
                    index: int, what: str, ranks: tuple[int, ...], exempt: int = 0) -> None:
        failures, links = runner.failures, runner.links
        buf, extra = runner.send_buffer(shard, shard_region, chunk, exempt=exempt)
        works = []
        for t in live:
            try:
                if buf is None:
                    works.append((t, links.stub(t, index, what)))
                else:
                    works.append((t, links.isend(buf, t, index, what)))
            except PeerFault as fault:
                failures.peer(fault)
        runner.post(Pending(works, f"{what}: send to {live}", ranks, extra))

    def _recv(self, runner: Runner, box: Box, peer: int, index: int, what: str,
              ranks: tuple[int, ...]) -> None:
        chunks = chunk_boxes(box, runner.itemsize, runner.chunk_bytes)
        if self.local(runner, peer) and chunks:
            assert runner.out is not None and runner.dst_region is not None
            done = Pending([], f"{what}: shared-memory receive from {peer}", ranks, box=box)
            views = [runner.out[runner.dst_region.local(c)] for c in chunks]
            reader = ShmReader(runner.links, runner.failures, peer, index, what, views, done)
            runner.writes.append(done)
            runner.op_items.append(done)
            runner.start_thread(reader.run, f"meshcast-shm-{index}")
            return
        for chunk in chunks:
            if runner.failures.closed(peer):
                return
            buf, extra, finish = runner.recv_buffer(chunk)
            try:
                work = runner.links.irecv(buf, peer, index, what)
            except PeerFault:
                runner.budget.release(extra)
                raise
            runner.post(Pending([(peer, work)], f"{what}: receive from {peer}", ranks, extra,
                                finish, chunk))
