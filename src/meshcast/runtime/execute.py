"""``reshard``: run a plan on ``torch.distributed``, every rank doing only its own operations."""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..core.cache import BoundedCache
from ..core.plan import Plan
from .agree import agree
from .arguments import call_family, not_a_member, publish_refusal, require_distributed
from .blame import diagnose
from .board import Call, next_step
from .detect import real_host_map
from .errors import ReshardError
from .interrupt import call_interrupts, interrupts_as_failures
from .overlap import may_share_memory
from .p2p import Failures, Links
from .runner import Runner
from .segments import release_segments
from .shm import intra_setting
from .tensors import allocate_out, as_carrier, check_local, check_out, torch_dtype
from .transport_collectives import Collectives
from .transport_p2p import PointToPoint

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "TRANSPORTS",
    "end_call",
    "failure",
    "finish_call",
    "pick_device",
    "plan_digest",
    "reshard",
    "timeout_problem",
]

DEFAULT_CHUNK_BYTES = 1 << 20
"""Message size of chunked transfers (measured, see docs/runtime.md)."""
DEFAULT_MAX_INFLIGHT_BYTES = 64 << 20
"""Pack/unpack buffer bytes a rank may have in flight."""
DEFAULT_TIMEOUT = 300.0
"""Seconds any single wait may take before the runtime raises."""
MAX_TIMEOUT = 1e7
"""The largest ``timeout`` taken (about 116 days): every wait is bounded, and the backends'
and threads' waits take at most about this much."""
TRANSPORTS = ("p2p", "collectives")
"""What ``transport=`` takes: tagged point-to-point messages (transport_p2p.py; the default for
CPU tensors) or native collectives on cached sub-groups (transport_collectives.py; the default
for CUDA tensors, and it runs on gloo with CPU tensors too)."""

PLAN_DIGESTS = 256
"""Plan objects whose digest a process remembers (a recomputed digest is the same digest)."""
_digests: BoundedCache[int, tuple[weakref.ref, str]] = BoundedCache(
    "runtime.plan_digests", PLAN_DIGESTS,
    "digests of recently run plan objects, by id (a weak reference tells a reused id)")


def plan_digest(plan: Plan) -> str:
    """A digest of the plan (its JSON), equal on every rank that holds the same plan; computed
    once per plan object while it is among the last :data:`PLAN_DIGESTS` used."""
    hit = _digests.get(id(plan))
    if hit is not None and hit[0]() is plan:
        return hit[1]
    digest = hashlib.sha1(plan.to_json().encode()).hexdigest()[:16]
    _digests.put(id(plan), (weakref.ref(plan), digest))
    return digest


def _bad_argument(
    timeout: object, chunk_bytes: object, max_inflight_bytes: object, transport: object = None
) -> str | None:
    if transport is not None and transport not in TRANSPORTS:
        return (f"transport must be one of {', '.join(map(repr, TRANSPORTS))} (or None: "
                f"'collectives' for CUDA tensors, else 'p2p'), got {transport!r}")
    for argument, value in (("chunk_bytes", chunk_bytes),
                            ("max_inflight_bytes", max_inflight_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return f"{argument} must be a positive number, got {value!r}"
    return timeout_problem(timeout) or (
        f"chunk_bytes must be a whole number of bytes, got {chunk_bytes!r}"
        if isinstance(chunk_bytes, float) and not chunk_bytes.is_integer() else None)


def timeout_problem(timeout: object) -> str | None:
    """Why ``timeout`` (seconds) cannot bound a call's waits, or None."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        return f"timeout must be a positive number of seconds, got {timeout!r}"
    if not timeout <= MAX_TIMEOUT:
        return (f"timeout must be at most {MAX_TIMEOUT:g} seconds (every wait is bounded), got "
                f"{timeout!r}")
    return None


def pick_device(local: object, backend: str, device: object) -> torch.device:
    """Where a call's results go: ``device`` if given, else ``local``'s device (a tensor), else
    the current CUDA device on an NCCL ``backend``, else CPU. ``ValueError`` for a ``device``
    that is not one or that holds no data."""
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device={device!r} is not a torch device") from exc
        if dev.type == "meta":
            raise ValueError("device='meta' holds no data: results need a real device")
        return dev
    if isinstance(local, torch.Tensor):
        return local.device
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reshard(
    local: torch.Tensor | None,
    plan: Plan,
    *,
    group: dist.ProcessGroup | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
    device: torch.device | str | None = None,
    ordered: bool = True,
    transport: str | None = None,
    abort: Callable[[], str | None] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Run ``plan`` and return this rank's destination shard (None if it holds none).

    Call it on every rank of the default process group (or of ``group``) that the plan involves,
    with the same plan; plan ranks are ranks of ``group`` (others may call and get None at once).
    ``local`` is this rank's source shard (any strides and dtype; None where it holds nothing).

    Before any data moves, the plan's ranks agree through the process group's store that they
    hold the same plan and ``chunk_bytes`` and that every ``local`` fits the plan (shape, dtype,
    device, a plain dense tensor); if not, every rank raises ``ValueError`` at once, naming the
    ranks and the rule, and the process group is untouched. A rank that dies or stops, and any
    wait longer than ``timeout`` seconds, raise :class:`ReshardError` on every rank that depends
    on it, naming the ranks that failed first, what they were doing and the elapsed time
    (docs/runtime.md, "Failures"). The call returns or raises only once every message it posted
    has completed and every thread it started has ended. ``chunk_bytes`` is the message size of
    chunked transfers; ``max_inflight_bytes`` bounds the pack/unpack buffers in flight on this rank.
    ``device``: where the result goes on a rank without ``local`` (CPU, or CUDA on NCCL). With
    ``ordered`` (the default) a rank runs its operations one after another in plan order (the
    model of :func:`meshcast.simulate`); ``ordered=False`` posts them all at once and lets them
    share the links (the plan's order is then only the posting order). ``transport``
    (:data:`TRANSPORTS`, docs/runtime.md): ``"p2p"`` or
    ``"collectives"``; default ``"collectives"`` for CUDA tensors, else ``"p2p"``. ``abort`` (as
    the pipeline runtime uses it): a function polled while the ranks agree, returning why the
    caller gave up (the call is then called off on every rank) or None. ``out`` (any strides)
    receives the destination shard in place and is returned; checked like ``local``.
    """
    with call_interrupts() as interrupted:  # from the argument checks on (interrupt.py)
        try:
            if not_a_member(group, [local, out]):
                return None
            inside = _validate(local, plan, group)
            if not inside:
                bad = _bad_argument(timeout, chunk_bytes, max_inflight_bytes, transport)
                if bad is not None:  # nobody waits for this rank
                    raise ValueError(bad)
        except (TypeError, ValueError) as exc:
            publish_refusal(group, exc, call_family([plan], group,
                                                    lambda ps: plan_digest(ps[0])))
            raise
        require_distributed("meshcast.reshard")
        if not inside:
            next_step(group if group is not None else dist.group.WORLD)
            return None
        call, dev, how, fresh = _join(local, out, plan, group, timeout, chunk_bytes,
                                      max_inflight_bytes, device, transport, abort, interrupted)
        return _transfer(call, local, out, fresh, plan, dev, timeout, chunk_bytes,
                         max_inflight_bytes, ordered, how)


def _join(
    local: torch.Tensor | None, out: torch.Tensor | None, plan: Plan,
    group: dist.ProcessGroup | None, timeout: float,
    chunk_bytes: int, max_inflight_bytes: int, device: object, transport: str | None,
    abort: Callable[[], str | None] | None, interrupted: Callable[[], bool],
) -> tuple[Call, torch.device, str, torch.Tensor | None]:
    """Check this rank's inputs and allocate its result where ``out`` is None, and agree with the
    plan's ranks (raises on every rank if any rank cannot go ahead); the call, the result's
    device, the transport and the result allocated."""
    task = plan.task
    me = dist.get_rank(group)
    # what this rank cannot use is an error of the agreement, so that every rank refuses it
    error = _bad_argument(timeout, chunk_bytes, max_inflight_bytes, transport)
    if error is None and chunk_bytes < task.itemsize:
        error = f"chunk_bytes={chunk_bytes} must be at least the element size {task.itemsize}"
    try:
        dev = pick_device(local if local is not None else out, str(dist.get_backend(group)),
                          device)
    except ValueError as exc:
        error, dev = error or str(exc), torch.device("cpu")
    how = transport if transport in TRANSPORTS else "collectives" if dev.type == "cuda" else "p2p"
    why = check_local(local, task.src_region(me), task, me, torch_dtype(task.dtype), dev)
    error = error or (None if why is None else f"local {why}")
    why = check_out(out, task.dst_region(me), task, me, torch_dtype(task.dtype), dev)
    error = error or (None if why is None else f"out {why}")
    if error is None and isinstance(local, torch.Tensor) and isinstance(out, torch.Tensor) \
            and may_share_memory(local, out):
        error = (f"out shares memory with local on rank {me}: results would overwrite source "
                 f"data before it is sent; pass a separate tensor")
    intra, why = _intra(how)
    error = error or why
    fresh = None
    if error is None and out is None:
        fresh, why = allocate_out(task.dst_region(me), task.itemsize, dev)
        error = why
    wait = float(timeout) if error is None else DEFAULT_TIMEOUT
    p2p_group = group if group is not None else dist.group.WORLD
    call = Call(p2p_group, plan.ranks, me, "meshcast.reshard", wait, plan_digest(plan))
    agree(call, {
        "plan": plan_digest(plan), "error": error,
        "what": f"{task.describe()}, {plan.strategy}/{plan.balance} on "
                f"{plan.topology.num_hosts} hosts (digest {plan_digest(plan)})",
        "options": {"chunk_bytes": chunk_bytes, "transport": how, "intra": intra},
    }, abort, interrupted)
    return call, dev, how, fresh


def _transfer(
    call: Call, local: torch.Tensor | None, into: torch.Tensor | None,
    fresh: torch.Tensor | None, plan: Plan, dev: torch.device, timeout: float,
    chunk_bytes: int, max_inflight_bytes: int, ordered: bool, transport: str,
) -> torch.Tensor | None:
    """Move the data of an agreed call into ``into`` (the caller's) or else ``fresh``; this
    rank's destination shard."""
    task, me, group = plan.task, call.me, call.group
    world = group is dist.group.WORLD

    def to_global(r: int) -> int:
        return r if world else dist.get_global_rank(group, r)

    src = None if local is None else as_carrier(local)
    out = fresh if into is None else as_carrier(into)
    failures = Failures(call, float(timeout))
    # byte counters count by the real hosts
    hosts = real_host_map(plan.ranks, plan.topology.hosts_by_rank, to_global)
    links = Links(group, me, to_global, hosts, float(timeout))
    moves = (PointToPoint(_intra(transport)[0] or "socket") if transport == "p2p"
             else Collectives(group, to_global))
    with interrupts_as_failures(failures) as interrupted:
        Runner(plan, me, src, out, links, moves, failures, chunk_bytes, max_inflight_bytes,
               ordered).run()
    end_call(call, failures, interrupted[0])
    return into if into is not None else None if out is None else out.view(torch_dtype(task.dtype))


def _intra(transport: str) -> tuple[str | None, str | None]:
    """The intra-host path of a call (shm.py; None on ``"collectives"``, which has none of its
    own) and why ``$MESHCAST_INTRA`` is refused, if it is."""
    return intra_setting() if transport == "p2p" else (None, None)


def _validate(local: object, plan: object, group: dist.ProcessGroup | None) -> bool:
    """Check what must hold before a rank can join the agreement; whether this rank takes part
    in the plan."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a meshcast.Plan, got {type(plan).__name__}")
    plan.check()  # once per plan object: every destination element delivered exactly once
    if not dist.is_available() or not dist.is_initialized():
        return False
    me = dist.get_rank(group)
    size = dist.get_world_size(group)
    ranks = plan.ranks
    if ranks[-1] >= size:
        raise ValueError(
            f"plan uses rank {ranks[-1]}, but the process group has {size} ranks (0..{size - 1})"
        )
    if me not in ranks:
        if local is not None:
            raise ValueError(f"local must be None on rank {me}: the plan does not involve it")
        return False
    return True


def finish_call(call: Call, failures: Failures) -> None:
    """End of a call: raise :class:`ReshardError` if this rank or any rank of the call reported
    a failure on the board (a rank that received placeholders finds the report there)."""
    flagged = bool(failures.faults)
    if not flagged:
        try:
            flagged = call.flagged()
        except Exception as exc:
            raise ReshardError(
                f"{call.caller} on rank {call.me}: could not read the call's error board in "
                f"the process group's store after {call.elapsed():.2f} s ({exc}); the result "
                f"cannot be trusted", call.ranks) from exc
    if flagged:
        raise failure(call, failures)


def end_call(call: Call, failures: Failures, interrupted: bool) -> None:
    """:func:`finish_call`, and after a failure drop the cached shared memory (a failed peer's
    goes once no survivor maps it); ``KeyboardInterrupt`` (from the call's error) where this
    rank was ``interrupted`` (interrupt.py)."""
    try:
        finish_call(call, failures)
    except ReshardError as exc:
        release_segments()
        if interrupted:
            raise KeyboardInterrupt(str(exc)) from exc
        raise


def failure(call: Call, failures: Failures) -> ReshardError:
    """The error of a failed call on this rank: the ranks that failed first (from every rank's
    reports), what this rank saw, the elapsed time and the state left behind."""
    own = failures.faults
    faults, notes = call.faults()
    seen = {f.to_json() for f in faults}
    faults += [f for f in own if f.to_json() not in seen]  # reports that did not get through
    diagnosis = diagnose(faults, notes)
    mine = own[0].describe() if own else (
        "its messages completed, but what it received came from or through the failed ranks")
    if own and mine in diagnosis.text:
        mine = "as above"
    peers = {f.peer for f in own if f.peer is not None}
    involved = sorted(set(diagnosis.first) | {call.me} | peers)
    if failures.all_closed:
        state = ("a wait timed out on this rank, and gloo then closes every connection of the "
                 "process group on this rank: destroy the group (its peers see their "
                 "connections with this rank closed)")
    elif failures.broken:
        state = (f"this rank's connections with ranks {sorted(failures.broken)} are closed; its "
                 f"other connections are left as they were")
    else:
        state = "this rank's connections are left as they were"
    return ReshardError(
        f"{call.caller} on rank {call.me} failed after {call.elapsed():.2f} s: {diagnosis.text}. "
        f"On this rank: {mine} (ranks involved: {involved}); {state}",
        tuple(involved), diagnosis.first,
    )
