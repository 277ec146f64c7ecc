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
from collections.abc import Sequence

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .blame import Fault

__all__ = ["Call", "calls_made", "next_step", "ranks_digest", "store_of"]

_counters: dict[tuple[int, str], int] = {}
_steps: dict[int, int] = {}
_counter_lock = threading.Lock()


def store_of(group: dist.ProcessGroup) -> dist.Store:
    """The store ``group`` was created with (its keys are private to the group)."""
    try:
        return c10d._world.pg_map[group][1]
    except (AttributeError, KeyError, IndexError, TypeError):
        return dist.PrefixStore(f"meshcast-group-{group.group_name}/", c10d._get_default_store())


def ranks_digest(ranks: Sequence[int]) -> str:
    """A short name of a rank set."""
    return hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:12]


def next_step(group: dist.ProcessGroup) -> int:
    """Count one meshcast call on ``group`` by this process, inside its plan or not; the
    call's step. In a program where every rank makes every call (SPMD), a call has the same step
    on every rank."""
    with _counter_lock:
        step = _steps.get(id(group), 0)
        _steps[id(group)] = step + 1
        return step


def calls_made(group: dist.ProcessGroup, family: str) -> int:
    """How many calls of ``family`` (ranks digest/plan digest) this process started on
    ``group``."""
    with _counter_lock:
        return _counters.get((id(group), family), 0)


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
        self.family = f"{ranks_digest(self.ranks)}/{plan_digest}"
        self.step = next_step(group)
        with _counter_lock:
            key = (id(group), self.family)
            self.number = _counters.get(key, 0)
            _counters[key] = self.number + 1
        self.key = f"meshcast/c/{self.family}/{self.number}"
        self._lock = threading.Lock()
        self._noted = False

    def renumber(self) -> None:
        """Take the next number of this call's plan: the current name was used by peers at
        another step, in a call this rank did not make (it made another call at that step)."""
        with _counter_lock:
            key = (id(self.group), self.family)
            self.number = _counters[key]
            _counters[key] = self.number + 1
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
            self.store.set(f"{self.key}/waiting/{self.me}", "" if fault is None else
                           fault.to_json())
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
