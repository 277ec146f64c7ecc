"""A call's arguments before its agreement: the group a rank was given, and refusals told to the
peers that wait for a rank whose arguments it cannot use (agree.py, ``refuse_early``)."""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist

from ..core.plan import Plan
from .agree import refuse_early
from .board import family_of
from .joint import JointGroup

__all__ = ["call_family", "not_a_member", "publish_refusal", "require_distributed"]


def not_a_member(group: object, given: list) -> bool:
    """Whether this process is outside ``group`` (a process group it is not a member of);
    ``ValueError`` if it is and was ``given`` tensors (or anything but None), ``TypeError`` if
    ``group`` is not a group."""
    if not _is_group(group):
        raise TypeError(f"group must be a torch.distributed.ProcessGroup, a meshcast JointGroup "
                        f"or None (the default group), got {type(group).__name__}")
    outside = (group is not None and not isinstance(group, JointGroup) and dist.is_available()
               and dist.is_initialized() and dist.get_rank(group) < 0)
    if outside and any(t is not None for t in given):
        raise ValueError(f"tensors must be None on global rank {dist.get_rank()}: it is not a "
                         f"member of group, so no plan rank is")
    return outside


def require_distributed(caller: str) -> None:
    """``RuntimeError`` unless torch.distributed is initialised."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{caller} needs torch.distributed: call init_process_group first "
                           f"(or run under meshcast.launch / torchrun)")


def _is_group(group: object) -> bool:
    """Whether ``group`` is a group argument: None, a process group (or what ``new_group`` gives
    a rank outside it) or a joint group."""
    return group is None or isinstance(group, JointGroup) or (dist.is_available() and (
        isinstance(group, dist.ProcessGroup) or group == dist.GroupMember.NON_GROUP_MEMBER))


def _rank_in(group: object) -> tuple[object, int] | None:
    """The group whose waiting peers an argument error is told to, and this rank in it: ``group``,
    or the default group where ``group`` is not a group (the peers most likely wait there); None
    without a process group, or where this rank is not in it (nobody waits for it there)."""
    if isinstance(group, JointGroup):
        return group, group.me
    if not dist.is_available() or not dist.is_initialized():
        return None
    g = group if group is not None and _is_group(group) else dist.group.WORLD
    me = dist.get_rank(g)
    return (g, me) if me >= 0 else None


def publish_refusal(group: object, exc: BaseException, family: str | None = None) -> None:
    """After an argument error found before the agreement: tell waiting peers (agree.py).
    ``family``: the refused call's plan family where this rank is one of its ranks
    (:func:`call_family`)."""
    where = _rank_in(group)
    if where is not None:
        refuse_early(where[0], where[1], f"an argument error: {exc}", family)


def call_family(plans: object, group: object, digest: Callable[[list[Plan]], str]
                ) -> str | None:
    """The plan family of a call of ``plans`` (a list of them) on ``group`` that this rank is
    in, named by ``digest``; None where ``plans`` are not all plans or do not involve it, or
    there is no process group."""
    if not isinstance(plans, list) or not plans or not all(isinstance(p, Plan) for p in plans):
        return None
    where = _rank_in(group)
    if where is None:
        return None
    ranks = sorted({r for p in plans for r in p.ranks})
    return family_of(ranks, digest(plans)) if where[1] in ranks else None
