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
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ..core.cache import BoundedCache
from ..core.plan import Plan
from ..planning.many import DEFAULT_BUCKET_BYTES, build_schedule
from .agree import agree
from .arguments import call_family, not_a_member, publish_refusal, require_distributed
from .board import Call, next_step
from .detect import real_host_map
from .exchange import Exchange, ManyStats, is_maker
from .execute import DEFAULT_TIMEOUT, end_call, pick_device, plan_digest, timeout_problem
from .interrupt import call_interrupts, interrupts_as_failures
from .joint import JointGroup, group_rank, group_size, to_global_of
from .overlap import shared_pair
from .p2p import Failures, Links
from .shm import intra_setting
from .tensors import allocate_out, as_carrier, check_local, check_out, torch_dtype

__all__ = ["ManyStats", "agree_before", "last_many_stats", "reshard_many", "run_many"]

_last: BoundedCache[str, ManyStats] = BoundedCache(
    "runtime.last_many_stats", 1, "the counters of this process's last reshard_many call")


def last_many_stats() -> ManyStats:
    """Counters of this process's last :func:`reshard_many` call (empty ones before any, or
    after :func:`meshcast.clear_caches`)."""
    return _last.get("last") or ManyStats()


def _as_list(given: object, argument: str) -> list:
    """``given`` (a sequence, one entry per plan) as a list; ``TypeError`` if it is not one."""
    if isinstance(given, (str, bytes, dict, torch.Tensor)) or not hasattr(given, "__iter__"):
        raise TypeError(f"{argument} must be a sequence with one entry per plan, got "
                        f"{type(given).__name__}")
    return list(given)


def _check_arguments(tensors: list, plans: list, bucket_bytes: object, timeout: object,
                     joint: bool, outs: list, names: object) -> None:
    if len(tensors) != len(plans):
        raise ValueError(
            f"tensors has {len(tensors)} entries but plans has {len(plans)}: give one plan per "
            f"tensor"
        )
    if len(outs) != len(plans):
        raise ValueError(f"out has {len(outs)} entries but plans has {len(plans)}: give one "
                         f"tensor or None per plan")
    if names is not None and (isinstance(names, str) or len(names) != len(plans)
                              or not all(isinstance(n, str) for n in names)):
        raise ValueError(f"names must be a sequence of {len(plans)} strings, one per plan, got "
                         f"{names!r:.200}")
    for k, p in enumerate(plans):
        if not isinstance(p, Plan):
            raise TypeError(f"plans[{k}] must be a meshcast.Plan, got {type(p).__name__}")
        try:
            p.check()  # once per plan object: every destination element delivered exactly once
        except ValueError as e:
            raise ValueError(f"meshcast.reshard_many: plans[{k}]: {e}") from None
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be a positive integer, got {bucket_bytes!r}")
    bad = timeout_problem(timeout)
    if bad is not None:
        raise ValueError(bad)
    if not joint:
        require_distributed("meshcast.reshard_many")


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
    the tensor (``names[k]`` when given), the rank and the rule; ``names`` that differ between
    ranks (tensors of the same plans passed in another order) are refused so too. A failed or
    stopped peer, or any wait longer than ``timeout`` seconds, raises
    :class:`meshcast.ReshardError` as :func:`meshcast.reshard` does. ``out[k]`` (where not None)
    receives tensor k's destination shard in place and is returned as its result: any strides,
    e.g. a slice of a fused tensor's shard (:func:`meshcast.fused_part_index`); checked like
    ``tensors[k]``.
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
    overlap: bool = False,
    sync: str | None = None,
) -> list[torch.Tensor | None]:
    """:func:`reshard_many`, with ``errors`` this rank found in its inputs before (messages that
    name the tensor and the rule, as the state-dict integration finds them): the first is raised
    on every rank of the plans as an input error, through the same agreement. ``caller`` names
    the function the user called in every error. ``tensors[k]`` may be a function making the
    source on demand, and ``overlap`` packs the next phase while the current one's sends are in
    flight (exchange.py; the schedule is then cut at half of ``bucket_bytes``). ``sync`` names
    the weight sync and step the call belongs to, agreed like an option (weight_sync.py)."""
    with call_interrupts() as sigint:  # from the argument checks on (interrupt.py)
        try:
            plans, tensors = _as_list(plans, "plans"), _as_list(tensors, "tensors")
            outs = [None] * len(plans) if out is None else _as_list(out, "out")
            if not_a_member(group, tensors + outs):
                return [None] * len(plans)
            _check_arguments(tensors, plans, bucket_bytes, timeout, isinstance(group, JointGroup),
                             outs, names)
            ranks = sorted({r for p in plans for r in p.ranks})
            if ranks and ranks[-1] >= group_size(group):
                raise ValueError(f"the plans use rank {ranks[-1]}, but the process group has "
                                 f"{group_size(group)} ranks")
        except (TypeError, ValueError) as exc:
            publish_refusal(group, exc, call_family(plans, group, _plans_digest))
            raise
        label = [names[k] if names is not None else f"tensors[{k}]" for k in range(len(plans))]
        me, errors = group_rank(group), list(errors)
        where = dist.group.WORLD if group is None else group
        if me not in ranks:
            _outside(tensors + outs, errors, label + [f"out[{k}]" for k in range(len(outs))], me,
                     where, caller)
            return [None] * len(plans)
        call, dev, intra, carriers = _join(tensors, outs, plans, ranks, me, errors, label,
                                           {"bucket_bytes": bucket_bytes, "sync": sync},
                                           names is not None, timeout, device, where, caller,
                                           sigint)
        # (after the agreement: a plan too large for any rank's memory is refused there first)
        schedule = build_schedule(plans, max(1, bucket_bytes // 2) if overlap else bucket_bytes)
        links = Links(where, me, to_global_of(group), _hosts(plans, ranks, group), float(timeout))
        failures = Failures(call, float(timeout))
        run = Exchange(plans, schedule, me, tensors, carriers, dev, links, failures, overlap,
                       label, intra or "socket")
        with interrupts_as_failures(failures) as interrupted:
            run.run()
        end_call(call, failures, interrupted[0])
    _last.put("last", run.stats)
    return [given if given is not None else None if o is None else o.view(torch_dtype(p.task.dtype))
            for o, p, given in zip(run.outs, plans, outs)]


def agree_before(plans: Sequence[Plan], before: str, *, timeout: float, caller: str,
                 errors: Sequence[str] = ()) -> None:
    """Agree with every rank of ``plans`` on the plans (and this rank's ``errors``, messages
    naming the tensor and the rule) before this rank does ``before``, a collective step of its
    own on some of those ranks that must not start where a peer refuses the call (the reduction
    of a Partial DTensor source on its mesh: a peer that refused its arguments would leave the
    others waiting in that collective, or pair it with its next one). Raises ``ValueError`` on
    every rank of the plans as :func:`run_many`'s agreement does; nothing on a rank outside
    them. :func:`run_many` with the same plans then agrees again, as its own call."""
    bad = timeout_problem(timeout)
    if bad is not None:
        exc = ValueError(bad)
        publish_refusal(None, exc)
        raise exc
    plans = list(plans)
    me, ranks = dist.get_rank(), sorted({r for p in plans for r in p.ranks})
    if not plans or me not in ranks:
        return
    digest = _plans_digest(plans)
    call = Call(dist.group.WORLD, ranks, me, caller, float(timeout), digest)
    error = None
    if errors:
        error = errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
    agree(call, {"plan": digest, "error": error, "options": {"before": before}, "names": None,
                 "what": f"{len(plans)} plans (digest {digest}), the first "
                         f"{plans[0].task.describe()}, before {before}"})


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
    errors: list[str], label: list[str], options: dict, named: bool, timeout: float,
    device: torch.device | str | None, where: object, caller: str,
    interrupted: Callable[[], bool],
) -> tuple[Call, torch.device, str | None, list[torch.Tensor | None]]:
    """Check this rank's shards, allocate the results ``outs`` does not give, and agree with the
    plans' ranks on the plans, ``options``, and the tensors' names where ``named`` (``label``);
    raises on every rank if any rank cannot go ahead. The call, the results' device, the
    intra-host path (shm.py; None for CUDA tensors, which have no path of their own) and the
    results as carriers (tensors.py; None where this rank receives no part of a tensor)."""
    try:
        dev = _device(tensors + outs, device, None if where is dist.group.WORLD else where)
    except ValueError as exc:
        errors.append(str(exc))
        dev = torch.device("cpu")
    intra, why = intra_setting() if dev.type == "cpu" else (None, None)
    if why is not None:
        errors.append(why)
    for k, (t, o) in enumerate(zip(tensors, outs)):
        task = plans[k].task
        why = None if is_maker(t) else check_local(t, task.src_region(me), task, me,
                                                     torch_dtype(task.dtype), dev)
        if why is not None:
            errors.append(f"{label[k]} {why}")
        why = check_out(o, task.dst_region(me), task, me, torch_dtype(task.dtype), dev)
        if why is not None:
            errors.append(f"out[{k}] ({label[k]}) {why}")
    shared = None if errors else shared_pair(
        [(f"out[{k}] ({label[k]})", o) for k, o in enumerate(outs) if isinstance(o, torch.Tensor)],
        [(label[k], t) for k, t in enumerate(tensors) if isinstance(t, torch.Tensor)])
    if shared is not None:
        errors.append(f"{shared[0]} shares memory with {shared[1]} on rank {me}: a result "
                      f"would overwrite data still to be read or written; pass separate tensors")
    carriers = _results(plans, outs, me, dev, errors)
    digest = _plans_digest(plans)
    call = Call(where, ranks, me, caller, float(timeout), digest)
    error = None
    if errors:
        error = errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
    agree(call, {
        "plan": digest, "error": error, "options": {**options, "intra": intra},
        "names": _names_digest(label) if named else None,
        "what": f"{len(plans)} plans (digest {digest}), the first {plans[0].task.describe()}",
    }, interrupted=interrupted)
    return call, dev, intra, carriers


def _results(plans: list[Plan], outs: list, me: int, dev: torch.device, errors: list[str]
             ) -> list[torch.Tensor | None]:
    """Where this rank's results go, as carriers: ``outs[k]``, else a new tensor (none once an
    error is found: the call is refused; a result that cannot be allocated is such an error)."""
    carriers: list[torch.Tensor | None] = []
    for p, o in zip(plans, outs):
        fresh, why = (None, None) if o is not None or errors else allocate_out(
            p.task.dst_region(me), p.task.itemsize, dev)
        if why is not None:
            errors.append(why)
        carriers.append(as_carrier(o) if o is not None else fresh)
    return carriers


def _names_digest(names: Sequence[str]) -> str:
    """A digest of the tensors' names in order (the agreement compares digests: a record stays
    small with hundreds of tensors)."""
    return hashlib.sha1("\0".join(names).encode()).hexdigest()[:16]


def _plans_digest(plans: Sequence[Plan]) -> str:
    """A digest of the plans in order, equal on every rank that holds the same plans (the bucket
    size, which also decides the messages, is agreed as an option, so a difference is named)."""
    h = hashlib.sha1()
    for p in plans:
        h.update(plan_digest(p).encode())
    return h.hexdigest()[:16]
