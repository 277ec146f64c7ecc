"""One meshcast call's side channel in the process group's store (c10d's key-value store, the one
the group was created with): the input agreement and the error board.

A call is named by its plan ranks, its plan's digest and its number among this process's calls
of that plan on those ranks in this group; every rank of a consistent program gives the same call
the same name. Its keys live under ``meshcast/c/<ranks digest>/<plan digest>/<number>/``;
``meshcast/at/<rank>`` says which call a rank is in (read by the agreement of ranks that wait for
it, see agree.py).

The error board is one appended key per call: the first rank to see a failure writes a
:class:`~meshcast.runtime.blame.Fault` there before doing anything else, so a rank that later
receives the placeholder messages of a failing peer (see p2p.py) always finds the report when it
checks the board at the end of its call. Ranks that wait long for a peer leave a note under
``waiting/<rank>``, cleared when the wait ends; the notes let
:func:`~meshcast.runtime.blame.diagnose` follow a chain of waits to a rank that stopped.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .blame import Fault
from .joint import JointGroup

__all__ = ["Call", "calls_by_plan_ranks", "calls_made", "next_step", "ranks_digest",
           "recent_refusals", "steps_agree", "store_of"]


class _GroupCalls:
    """What this process counts of its meshcast calls on one process group: ``steps`` (calls
    made, board.next_step), ``numbers`` (calls made of each plan family) and ``refusals`` (its
    last refusals, agree.py). Kept as long as the group object lives and dropped with it (after
    ``destroy_process_group``), so a later group never inherits the numbers of an earlier one.

    Not bounded while the group lives (one integer per distinct plan family): the numbers name
    store keys that every rank of a call must agree on, so forgetting a live family would make
    this rank reuse a name its peers have moved past (a refused or hanging call)."""

    __slots__ = ("numbers", "refusals", "spmd", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self.numbers: dict[str, int] = {}
        self.refusals: list[dict[str, Any]] = []
        self.spmd = True


_groups: dict[int, tuple[weakref.ref, _GroupCalls]] = {}
_counter_lock = threading.Lock()


def _group_calls(group: object) -> _GroupCalls:
    """This process's :class:`_GroupCalls` of ``group``, made on first use; call it with
    ``_counter_lock`` held."""
    key = id(group)
    hit = _groups.get(key)
    if hit is not None and hit[0]() is group:
        return hit[1]
    try:  # dropped when the group is collected; popped without the lock (the callback may run
        # inside a locked section, whenever the collector runs)
        ref = weakref.ref(group, lambda _: _groups.pop(key, None))
    except TypeError:  # an object without weak references: kept (and held) for the process
        ref = (lambda g: lambda: g)(group)
    calls = _GroupCalls()
    _groups[key] = (ref, calls)
    return calls


def store_of(group: dist.ProcessGroup) -> dist.Store:
    """The store ``group`` was created with (its keys are private to the group; a
    :class:`~meshcast.runtime.joint.JointGroup`'s own)."""
    if isinstance(group, JointGroup):
        return group.store
    try:
        return c10d._world.pg_map[group][1]
    except (AttributeError, KeyError, IndexError, TypeError):
        return dist.PrefixStore(f"meshcast-group-{group.group_name}/", c10d._get_default_store())


def ranks_digest(ranks: Sequence[int]) -> str:
    """A short name of a rank set."""
    return hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:12]


def family_of(ranks: Sequence[int], plan_digest: str) -> str:
    """The name of a plan family: calls of the same plan on the same ranks (numbered in turn)."""
    return f"{ranks_digest(tuple(ranks))}/{plan_digest}"


def skip_number(group: dist.ProcessGroup, family: str) -> int:
    """Use up this process's next call number of ``family`` without a call (a call refused
    before it could be made), so that its next call of the family has the name its peers give
    theirs; the number used up."""
    with _counter_lock:
        numbers = _group_calls(group).numbers
        number = numbers.get(family, 0)
        numbers[family] = number + 1
        return number


def next_step(group: dist.ProcessGroup) -> int:
    """Count one meshcast call on ``group`` by this process, inside its plan or not; the
    call's step. In a program where every rank makes every call (SPMD), a call has the same step
    on every rank."""
    with _counter_lock:
        calls = _group_calls(group)
        step = calls.steps
        calls.steps = step + 1
        return step


def calls_by_plan_ranks(group: dist.ProcessGroup) -> None:
    """Say that on ``group`` each call is made by its plan's ranks only, not by every rank (the
    pipeline's boundary groups): the ranks' steps (:func:`next_step`) then say nothing about
    which call a peer makes, and the agreement does not compare them (agree.py)."""
    with _counter_lock:
        _group_calls(group).spmd = False


def steps_agree(group: dist.ProcessGroup) -> bool:
    """Whether every rank of ``group`` makes every call on it (:func:`calls_by_plan_ranks`)."""
    with _counter_lock:
        return _group_calls(group).spmd


def calls_made(group: dist.ProcessGroup, family: str) -> int:
    """How many calls of ``family`` (ranks digest/plan digest) this process started on
    ``group``."""
    with _counter_lock:
        return _group_calls(group).numbers.get(family, 0)


def recent_refusals(
    group: object, add: dict[str, Any] | None = None, keep: int = 8
) -> list[dict[str, Any]]:
    """This process's last ``keep`` refusals on ``group`` (agree.py), newest last; ``add`` one
    first."""
    with _counter_lock:
        recent = _group_calls(group).refusals
        if add is not None:
            recent.append(add)
            del recent[:-keep]
        return list(recent)


class Call:
    """The identity, clock and store keys of one call on this rank."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        ranks: Sequence[int],
        me: int,
        caller: str,
        timeout: float,
        plan_digest: str,
    ) -> None:
        self.start = time.monotonic()
        self.wall = time.time()
        self.group = group
        self.ranks = tuple(ranks)
        self.me = me
        self.caller = caller
        self.timeout = timeout
        self.store = store_of(group)
        self.family = family_of(self.ranks, plan_digest)
        self.step = next_step(group)
        with _counter_lock:
            numbers = _group_calls(group).numbers
            self.number = numbers.get(self.family, 0)
            numbers[self.family] = self.number + 1
        self.key = f"meshcast/c/{self.family}/{self.number}"
        self._lock = threading.Lock()
        self._noted = False

    def renumber(self) -> None:
        """Take the next number of this call's plan: the current name was used by peers at
        another step, in a call this rank did not make (it made another call at that step)."""
        with _counter_lock:
            numbers = _group_calls(self.group).numbers
            self.number = numbers[self.family]
            numbers[self.family] = self.number + 1
        self.key = f"meshcast/c/{self.family}/{self.number}"

    def elapsed(self) -> float:
        """Seconds since the call started on this rank."""
        return time.monotonic() - self.start

    def fault(self, kind: str, peer: int | None, what: str, detail: str = "") -> Fault:
        """A fault of this rank, now."""
        return Fault(self.me, kind, peer, what, round(self.elapsed(), 3), time.time(), detail)

    @staticmethod
    def at_key(rank: int) -> str:
        """Where ``rank`` says which call it is in."""
        return f"meshcast/at/{rank}"

    # -- the error board -------------------------------------------------------------------
    def report(self, fault: Fault) -> bool:
        """Put ``fault`` on the board; False if the store could not be reached."""
        try:
            with self._lock:
                self.store.append(f"{self.key}/board", fault.to_json() + "\n")
            return True
        except Exception:
            return False

    def note_waiting(self, fault: Fault | None) -> None:
        """Say which peer this rank is waiting for (None: it is not waiting any more)."""
        if fault is None and not self._noted:
            return
        with contextlib.suppress(Exception):
            key = f"{self.key}/waiting/{self.me}"
            if fault is None:  # deleted, not emptied: a long job's store stays bounded
                self.store.delete_key(key)
            else:
                self.store.set(key, fault.to_json())
            self._noted = fault is not None

    def flagged(self) -> bool:
        """Whether any rank has reported a fault in this call (raises if the store is gone)."""
        return self.store.check([f"{self.key}/board"])

    def faults(self) -> tuple[list[Fault], list[Fault]]:
        """Every fault on the board, and the ranks' current waiting notes."""
        faults: list[Fault] = []
        notes: list[Fault] = []
        try:
            if self.store.check([f"{self.key}/board"]):
                text = self.store.get(f"{self.key}/board").decode()
                faults = [Fault.from_json(line) for line in text.splitlines() if line]
            for r in self.ranks:
                key = f"{self.key}/waiting/{r}"
                if self.store.check([key]):
                    text = self.store.get(key).decode()
                    if text:
                        notes.append(Fault.from_json(text))
        except Exception:
            pass
        return faults, notes
