"""A joint communicator between two separately launched jobs (a trainer and an inference engine),
made by :func:`meshcast.connect` (rendezvous.py) without touching either job's default group.

Its ranks are the *joint ranks*: the trainer's ranks first (joint rank ``r`` is trainer rank
``r``), then the engine's (joint rank ``T + r`` is engine rank ``r``, ``T`` the trainer's world
size). Users address them as ``(job, rank)`` (:meth:`JointGroup.joint_rank`,
:meth:`JointGroup.member`); the runtime's calls (:func:`meshcast.reshard_many` with
``group=joint``) take joint ranks as plan ranks, as they take a sub-group's ranks.

A :class:`JointGroup` is not registered with ``torch.distributed`` (it is no ``new_group``): it
holds its own store (a prefix of the rendezvous store, private to the session) and backend process
groups built directly on it (gloo for CPU tensors, NCCL for CUDA tensors, made on first use by
every rank together). The runtime posts its messages with the backend group's own ``send``/``recv``
(:func:`post`), and reads the rank, size and store through the helpers below, which accept a
registered process group, None (the default group) or a :class:`JointGroup`.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from ..core.topology import Topology

__all__ = ["ROLES", "JointGroup", "check_role", "group_rank", "group_size", "member_of", "post",
           "to_global_of"]

ROLES = ("trainer", "engine")
"""The two jobs of a joint group, in joint-rank order."""


class JointGroup:
    """The joint communicator of one session between a trainer job and an engine job (see the
    module docstring); made by :func:`meshcast.connect` on every rank of both jobs.

    ``role``/``rank``: this process's job and rank in it; ``me``: its joint rank; ``sizes``: each
    job's world size; ``topology``: the hosts of all joint ranks (each rank's ``$MESHCAST_HOST``
    or hostname); ``model``: what both sides declared they hold (equal on both); ``session``: the
    session's name in the rendezvous store.
    """

    def __init__(
        self, *, role: str, rank: int, sizes: Mapping[str, int], store: dist.Store,
        session: str, topology: Topology, model: str, timeout: float,
        gloo: dist.ProcessGroup, address: str,
    ) -> None:
        self.role, self.rank = role, rank
        self.sizes = {r: int(sizes[r]) for r in ROLES}
        self.size = sum(self.sizes.values())
        self.me = self.joint_rank(role, rank)
        self.store, self.session, self.topology = store, session, topology
        self.model, self.timeout, self.address = model, float(timeout), address
        self._groups: dict[str, dist.ProcessGroup] = {"gloo": gloo}
        self._lock = threading.Lock()
        self.closed = False  # (disconnect closes it)
        self.failed: set[int] = set()  # joint ranks a sync on the group named as failed
        self._syncs = 0
        self._begun = [0, 0]  # weight syncs begun on the group; the first whose keys are kept

    # -- addressing ----------------------------------------------------------------------------
    def offset(self, role: str) -> int:
        """The joint rank of rank 0 of ``role``'s job."""
        check_role(role)
        return 0 if role == ROLES[0] else self.sizes[ROLES[0]]

    def joint_rank(self, role: str, rank: int) -> int:
        """The joint rank of ``(role, rank)``."""
        check_role(role)
        if not 0 <= rank < self.sizes[role]:
            raise ValueError(f"the {role} job has ranks 0..{self.sizes[role] - 1}, not {rank}")
        return self.offset(role) + rank

    def member(self, joint: int) -> tuple[str, int]:
        """``(job, rank)`` of joint rank ``joint``."""
        return member_of(self.sizes, joint)

    def ranks(self, role: str) -> range:
        """The joint ranks of ``role``'s job."""
        return range(self.offset(role), self.offset(role) + self.sizes[role])

    def describe(self, joints: Sequence[int]) -> str:
        """``"trainer rank 1, engine rank 0"`` for joint ranks ``joints``."""
        return ", ".join("{} rank {}".format(*self.member(j)) for j in joints) or "no rank"

    def legend(self) -> str:
        """How joint ranks read as ``(job, rank)``, for messages that name joint ranks."""
        def side(role: str, first: bool) -> str:  # "joint ranks 2-3 are engine ranks 0-1"
            r = self.ranks(role)
            one = len(r) == 1
            span = f"{r.start}" if one else f"{r.start}-{r.stop - 1}"
            own = "0" if one else f"0-{len(r) - 1}"
            return (f"joint rank{'' if one else 's'} " if first else "") + \
                f"{span} {'is' if one else 'are'} {role} rank{'' if one else 's'} {own}"

        return f"{side(ROLES[0], True)}, {side(ROLES[1], False)}"

    def next_sync(self) -> int:
        """A number for the next object built on this group that keeps keys in its store (every
        rank builds them in the same order)."""
        with self._lock:
            self._syncs += 1
            return self._syncs

    def next_begin(self) -> tuple[int, int]:
        """A number for the next weight sync begun on this group, by any object (every rank
        begins them in the same order), and the first earlier one whose start records are not
        yet deleted (those from it on may be, once every rank has begun this one)."""
        with self._lock:
            self._begun[0] += 1
            return self._begun[0], self._begun[1]

    def begun_tidy(self, number: int) -> None:
        """The start records before ``number`` are deleted (:meth:`next_begin`)."""
        with self._lock:
            self._begun[1] = max(self._begun[1], number)

    # -- backends ------------------------------------------------------------------------------
    def backend_group(self, device: torch.device | str | None = None) -> dist.ProcessGroup:
        """The backend process group for tensors on ``device`` (NCCL for CUDA, made on first use:
        every rank must ask for it in the same call, as a reshard on CUDA tensors does)."""
        backend = "nccl" if torch.device(device or "cpu").type == "cuda" else "gloo"
        with self._lock:
            if backend not in self._groups:
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = datetime.timedelta(seconds=self.timeout)
                self._groups[backend] = dist.ProcessGroupNCCL(
                    dist.PrefixStore("nccl/", self.store), self.me, self.size, options)
            return self._groups[backend]

    def close(self) -> None:
        """Drop the backend groups (their connections close when nothing else holds them)."""
        with self._lock:
            self._groups.clear()
            self.closed = True

    def __repr__(self) -> str:
        return (f"JointGroup({self.role} rank {self.rank} = joint rank {self.me} of {self.size}; "
                f"trainer {self.sizes['trainer']} + engine {self.sizes['engine']} ranks, "
                f"model {self.model!r}, session {self.session})")


def check_role(role: str) -> None:
    """Raise ``ValueError`` unless ``role`` is one of :data:`ROLES`."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(map(repr, ROLES))}, got {role!r}")


def member_of(sizes: Mapping[str, int], joint: int) -> tuple[str, int]:
    """``(job, rank)`` of joint rank ``joint`` when the jobs have ``sizes`` ranks."""
    t = sizes[ROLES[0]]
    if not 0 <= joint < t + sizes[ROLES[1]]:
        raise ValueError(f"the joint group has ranks 0..{t + sizes[ROLES[1]] - 1}, not {joint}")
    return (ROLES[0], joint) if joint < t else (ROLES[1], joint - t)


def group_rank(group: object) -> int:
    """This process's rank in ``group`` (None: the default group; a :class:`JointGroup`: its
    joint rank)."""
    if isinstance(group, JointGroup):
        return group.me
    return dist.get_rank(group)


def group_size(group: object) -> int:
    """The number of ranks of ``group`` (as :func:`group_rank`)."""
    if isinstance(group, JointGroup):
        return group.size
    return dist.get_world_size(group)


def to_global_of(group: object):
    """The function from ``group``'s ranks to the ranks ``dist.isend``/``irecv`` take (a joint
    group's messages go through :func:`post`, which takes joint ranks)."""
    if group is None or isinstance(group, JointGroup) or group is dist.group.WORLD:
        return int
    return lambda r: dist.get_global_rank(group, r)


def post(group: JointGroup, send: bool, data: torch.Tensor, peer: int, tag: int) -> dist.Work:
    """Post the send of ``data`` to joint rank ``peer`` (or its receive from it) on the joint
    group's backend group for ``data``'s device."""
    pg = group.backend_group(data.device)
    return pg.send([data], peer, tag) if send else pg.recv([data], peer, tag)
