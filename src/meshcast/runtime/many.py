"""``reshard_many``: run the plans of many tensors at once, in bounded buckets of packed messages.

Every rank runs the same :class:`~meshcast.planning.many.Schedule`: its local copies first, then
bucket after bucket, phase after phase. In a phase a rank posts all its receives, then packs the
message for each peer and posts its send at once (so packing the next message overlaps sending the
previous ones), then unpacks each received message as it arrives. A message that is one contiguous
box is sent from (or received into) the tensor itself, without a staging copy.

Failures follow the runtime's rules (docs/runtime.md, "Failures"): a failed message is reported on
the call's board, the rank goes on exchanging empty placeholders with every peer whose connection
still works, waits for every message it posted, and raises at the end, naming the ranks that
failed first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..core.cache import BoundedCache
from ..core.plan import Plan
from ..planning.many import DEFAULT_BUCKET_BYTES, Schedule, Segment, build_schedule
from .agree import agree
from .board import Call, next_step
from .detect import real_host_map
from .execute import DEFAULT_TIMEOUT, finish_call, pick_device, plan_digest, publish_refusal
from .joint import JointGroup, group_rank, group_size, to_global_of
from .p2p import Failures, Links, PeerFault
from .tensors import as_carrier, check_local, check_out, empty_out, torch_dtype

__all__ = ["ManyStats", "last_many_stats", "reshard_many", "run_many"]

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


_last: BoundedCache[str, ManyStats] = BoundedCache(
    "runtime.last_many_stats", 1, "the counters of this process's last reshard_many call")


def last_many_stats() -> ManyStats:
    """Counters of this process's last :func:`reshard_many` call (empty ones before any, or
    after :func:`meshcast.clear_caches`)."""
    return _last.get("last") or ManyStats()


def _padded(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _msg_size(segs: Sequence[Segment]) -> int:
    """Bytes of a packed message: segments start at multiples of 16, the last is not padded (so a
    one-segment message has the same size packed or not)."""
    return sum(_padded(s.nbytes) for s in segs[:-1]) + segs[-1].nbytes


def _check_arguments(tensors: list, plans: list, bucket_bytes: object, timeout: object,
                     joint: bool = False) -> None:
    if len(tensors) != len(plans):
        raise ValueError(
            f"tensors has {len(tensors)} entries but plans has {len(plans)}: give one plan per "
            f"tensor"
        )
    for k, p in enumerate(plans):
        if not isinstance(p, Plan):
            raise TypeError(f"plans[{k}] must be a meshcast.Plan, got {type(p).__name__}")
        try:
            p.check()  # once per plan object: every destination element delivered exactly once
        except ValueError as e:
            raise ValueError(f"meshcast.reshard_many: plans[{k}]: {e}") from None
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be a positive integer, got {bucket_bytes!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not joint and (not dist.is_available() or not dist.is_initialized()):
        raise RuntimeError(
            "meshcast.reshard_many needs torch.distributed: call init_process_group first "
            "(or run under meshcast.launch / torchrun)"
        )


def _device(tensors: list, device: torch.device | str | None, group: object) -> torch.device:
    first = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
    backend = "gloo" if isinstance(group, JointGroup) else str(dist.get_backend(group))
    return pick_device(first, backend, device)


def reshard_many(
    tensors: Sequence[torch.Tensor | None],
    plans: Sequence[Plan],
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    timeout: float = DEFAULT_TIMEOUT,
    device: torch.device | str | None = None,
    names: Sequence[str] | None = None,
    out: Sequence[torch.Tensor | None] | None = None,
    group: dist.ProcessGroup | JointGroup | None = None,
) -> list[torch.Tensor | None]:
    """Run ``plans[k]`` on ``tensors[k]`` for every k, together; return the destination shards.

    Call it on every rank of the default process group (or of ``group``: a process group, whose
    ranks are then the plan ranks, or a :class:`~meshcast.runtime.joint.JointGroup` of two jobs
    from :func:`meshcast.connect`, whose joint ranks are) that any plan involves, with the same
    plans in the same order (plan ranks are global ranks). ``tensors[k]`` is this rank's source
    shard of tensor k (any strides, any dtype torch has; None where it holds none). The result has
    one entry per tensor: this rank's destination shard, or None. Ranks outside every plan get a
    list of None at once.

    The operations of all plans are cut into buckets so that no rank stages (packs or unpacks)
    more than ``bucket_bytes`` at once (:func:`meshcast.planning.many.build_schedule`); within a
    bucket each pair of ranks exchanges one packed message per phase. Inputs are checked on every
    rank and the plan ranks agree through the store before any data moves: a bad input, or plans
    or ``bucket_bytes`` that differ between ranks, raise ``ValueError`` everywhere at once, naming
    the tensor (``names[k]`` when given), the rank and the rule. A failed or stopped peer, or any
    wait longer than ``timeout`` seconds, raises :class:`meshcast.ReshardError` as
    :func:`meshcast.reshard` does. ``out[k]`` (where not None) receives tensor k's destination
    shard in place and is returned as its result: any strides, e.g. a slice of a fused tensor's
    shard (:func:`meshcast.fused_part_index`); checked like ``tensors[k]``.
    """
    return run_many(tensors, plans, bucket_bytes=bucket_bytes, timeout=timeout, device=device,
                    names=names, out=out, group=group)


def run_many(
    tensors: Sequence[torch.Tensor | None],
    plans: Sequence[Plan],
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    timeout: float = DEFAULT_TIMEOUT,
    device: torch.device | str | None = None,
    names: Sequence[str] | None = None,
    errors: Sequence[str] = (),
    out: Sequence[torch.Tensor | None] | None = None,
    group: dist.ProcessGroup | JointGroup | None = None,
    caller: str = "meshcast.reshard_many",
) -> list[torch.Tensor | None]:
    """:func:`reshard_many`, with ``errors`` this rank found in its inputs before (messages that
    name the tensor and the rule, as the state-dict integration finds them): the first is raised
    on every rank of the plans as an input error, through the same agreement. ``caller`` names
    the function the user called in every error."""
    plans, tensors = list(plans), list(tensors)
    outs = [None] * len(plans) if out is None else list(out)
    try:
        _check_arguments(tensors, plans, bucket_bytes, timeout, isinstance(group, JointGroup))
        if len(outs) != len(plans):
            raise ValueError(f"out has {len(outs)} entries but plans has {len(plans)}: give one "
                             f"tensor or None per plan")
        schedule = build_schedule(plans, bucket_bytes)
        ranks = schedule.ranks
        if ranks and ranks[-1] >= group_size(group):
            raise ValueError(f"the plans use rank {ranks[-1]}, but the process group has "
                             f"{group_size(group)} ranks")
    except (TypeError, ValueError) as exc:
        publish_refusal(group, exc)
        raise
    label = [names[k] if names is not None else f"tensors[{k}]" for k in range(len(plans))]
    me = group_rank(group)
    errors = list(errors)
    where = dist.group.WORLD if group is None else group
    if me not in ranks:
        _outside(tensors + outs, errors, label + [f"out[{k}]" for k in range(len(outs))], me,
                 where, caller)
        return [None] * len(plans)
    call, dev = _join(tensors, outs, plans, ranks, me, errors, label, bucket_bytes, timeout,
                      device, where, caller)
    links = Links(where, me, to_global_of(group), _hosts(plans, ranks, group), float(timeout))
    failures = Failures(call, float(timeout))
    run = _Exchange(plans, schedule, me, tensors, outs, dev, links, failures)
    run.run()
    finish_call(call, failures)
    _last.put("last", run.stats)
    return [given if given is not None else None if o is None else o.view(torch_dtype(p.task.dtype))
            for o, p, given in zip(run.outs, plans, outs)]


def _hosts(plans: list[Plan], ranks: Sequence[int], group: object) -> dict[int, int]:
    """``{plan rank: host}`` for the byte counters: the real hosts where known."""
    if isinstance(group, JointGroup):  # gathered by meshcast.connect
        return {r: group.topology.host_of(r) for r in ranks}
    host_of: dict[int, int] = {}
    for p in plans:
        for r, h in p.topology.hosts_by_rank.items():
            host_of.setdefault(r, h)
    return real_host_map(ranks, host_of, to_global_of(group))


def _outside(tensors: list, errors: list[str], label: list[str], me: int, where: object,
             caller: str) -> None:
    """A rank outside every plan: refuse what it was given, else take its step and go."""
    if errors:
        raise ValueError(f"{caller} on rank {me}: {errors[0]}")
    for k, t in enumerate(tensors):
        if t is not None:
            raise ValueError(f"{label[k]} must be None on rank {me}: no plan involves this rank")
    next_step(where)
    _last.put("last", ManyStats())


def _join(
    tensors: list, outs: list, plans: list[Plan], ranks: Sequence[int], me: int,
    errors: list[str], label: list[str], bucket_bytes: int, timeout: float,
    device: torch.device | str | None, where: object, caller: str,
) -> tuple[Call, torch.device]:
    """Check this rank's shards and agree with the plans' ranks (raises on every rank if any
    rank cannot go ahead); the call and the results' device."""
    dev = _device(tensors + outs, device, None if where is dist.group.WORLD else where)
    for k, (t, o) in enumerate(zip(tensors, outs)):
        task = plans[k].task
        why = check_local(t, task.src_region(me), task, me, torch_dtype(task.dtype), dev)
        if why is not None:
            errors.append(f"{label[k]} {why}")
        why = check_out(o, task.dst_region(me), task, me, torch_dtype(task.dtype), dev)
        if why is not None:
            errors.append(f"out[{k}] ({label[k]}) {why}")
    digest = _plans_digest(plans, bucket_bytes)
    call = Call(where, ranks, me, caller, float(timeout), digest)
    error = None
    if errors:
        error = errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
    agree(call, {
        "plan": digest, "error": error, "options": {"bucket_bytes": bucket_bytes},
        "what": f"{len(plans)} plans, the first {plans[0].task.describe()}",
    })
    return call, dev


def _plans_digest(plans: Sequence[Plan], bucket_bytes: int) -> str:
    """A digest of the plans in order and the bucket size (it decides the messages), equal on
    every rank that holds the same plans."""
    h = hashlib.sha1(str(bucket_bytes).encode())
    for p in plans:
        h.update(plan_digest(p).encode())
    return h.hexdigest()[:16]


class _Exchange:
    """This rank's part of a schedule on carrier tensors (runtime/tensors.py)."""

    def __init__(self, plans: list[Plan], schedule: Schedule, me: int, tensors: list, outs: list,
                 dev: torch.device, links: Links, failures: Failures) -> None:
        self.schedule, self.me, self.dev = schedule, me, dev
        self.links, self.failures = links, failures
        self.src_regions = [p.task.src_region(me) for p in plans]
        self.dst_regions = [p.task.dst_region(me) for p in plans]
        self.srcs = [None if t is None else as_carrier(t) for t in tensors]
        self.outs: list[torch.Tensor | None] = [
            as_carrier(o) if o is not None else None if b is None
            else empty_out(b, p.task.itemsize, dev)
            for p, b, o in zip(plans, self.dst_regions, outs)
        ]
        self.stats = ManyStats(buckets=len(schedule.buckets))

    def view(self, seg: Segment, side: str) -> torch.Tensor:
        if side == "src" and not seg.from_out:
            return self.srcs[seg.tensor][self.src_regions[seg.tensor].local(seg.box)]
        return self.outs[seg.tensor][self.dst_regions[seg.tensor].local(seg.box)]

    def run(self) -> None:
        for k, box in self.schedule.copies_of(self.me):
            self.outs[k][self.dst_regions[k].local(box)].copy_(
                self.srcs[k][self.src_regions[k].local(box)])
        tag = _TAG_BASE
        for bucket in self.schedule.buckets:
            for phase in bucket:
                tag += 1
                sends, recvs = phase.sends_of(self.me), phase.recvs_of(self.me)
                if not sends and not recvs:
                    continue
                self.stats.phases += 1
                what = f"bucket {len(self.stats.per_bucket_staging)} (tag {tag})"
                try:
                    self._phase(sends, recvs, tag, what)
                except Exception as exc:  # a bug or a resource error: the others still finish
                    self.failures.error(what, exc)
            self.stats.per_bucket_staging.append(self.stats.peak_staging_bytes)

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
        staged = sum(b.numel() for _, _, b, _ in posted_recvs if b is not None)
        staged += sum(b.numel() for _, _, b, _ in posted_sends if b is not None)
        self.stats.peak_staging_bytes = max(self.stats.peak_staging_bytes, staged)
        for peer, segs, buf, w in posted_recvs:
            try:
                self.links.wait(w, peer, f"{what}: a receive from rank {peer}")
            except PeerFault as fault:
                self.failures.peer(fault)
                continue
            if buf is not None and not self.failures.degraded.is_set():
                self._unpack(segs, buf)
        for peer, _, _, w in posted_sends:
            try:
                self.links.wait(w, peer, f"{what}: a send to rank {peer}")
            except PeerFault as fault:
                self.failures.peer(fault)

    def _post_recv(self, peer: int, segs: tuple[Segment, ...], tag: int, what: str) -> tuple:
        stats = self.stats
        stats.bytes_received += sum(s.nbytes for s in segs)
        if len(segs) == 1:
            v = self.view(segs[0], "dst")
            if v.is_contiguous():
                stats.zero_copy_messages += 1
                return peer, segs, None, self.links.irecv(v, peer, tag, what)
        buf = torch.empty(_msg_size(segs), dtype=torch.uint8, device=self.dev)
        return peer, segs, buf, self.links.irecv(buf, peer, tag, what)

    def _post_send(self, peer: int, segs: tuple[Segment, ...], tag: int, what: str) -> tuple:
        if self.failures.degraded.is_set():
            return peer, segs, None, self.links.stub(peer, tag, what)
        staged = None
        if len(segs) == 1 and self.view(segs[0], "src").is_contiguous():
            buf = self.view(segs[0], "src")
            self.stats.zero_copy_messages += 1
        else:
            buf = staged = torch.empty(_msg_size(segs), dtype=torch.uint8, device=self.dev)
            off = 0
            for s in segs:
                src = self.view(s, "src")
                buf[off : off + s.nbytes].view(src.dtype).view(src.shape).copy_(src)
                off += _padded(s.nbytes)
        nbytes = sum(s.nbytes for s in segs)
        self.stats.messages_sent += 1
        self.stats.bytes_sent += nbytes
        return peer, segs, staged, self.links.isend(buf, peer, tag, what, payload=nbytes)

    def _unpack(self, segs: tuple[Segment, ...], buf: torch.Tensor) -> None:
        off = 0
        for s in segs:
            dst = self.view(s, "dst")
            dst.copy_(buf[off : off + s.nbytes].view(dst.dtype).view(dst.shape))
            off += _padded(s.nbytes)
