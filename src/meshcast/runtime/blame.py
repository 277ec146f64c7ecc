"""What went wrong in a failed call, from the faults its ranks reported: which ranks failed first.

Every rank that sees a failure reports a :class:`Fault` (a connection to a peer closed, a wait
for a peer timed out, an exception on the rank itself); a rank still waiting for a peer after a
while leaves a note of it. :func:`diagnose` follows "waited for" from every fault to the ranks at
the end of the chain: a rank with an error of its own, or a rank that reported nothing while
others waited for it (it died, stopped or hangs). Pure data, no torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

__all__ = ["Diagnosis", "Fault", "diagnose"]

KINDS = ("closed", "timeout", "error", "waiting")


@dataclass(frozen=True)
class Fault:
    """One rank's report: ``kind`` is ``"closed"`` (its connection with ``peer`` closed),
    ``"timeout"`` (it waited the whole timeout for ``peer``), ``"error"`` (an exception on the
    rank, ``detail``) or ``"waiting"`` (a note: still waiting for ``peer``). ``what`` is the
    operation, ``at`` the seconds into the rank's call, ``wall`` the time (``time.time()``)."""

    rank: int
    kind: str
    peer: int | None
    what: str
    at: float
    wall: float
    detail: str = ""

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Fault:
        """Inverse of :meth:`to_json`."""
        return Fault(**json.loads(text))

    def describe(self) -> str:
        """What this rank saw, in words."""
        where = f"{self.what}, {self.at:.2f} s into its call"
        if self.peer is None and self.kind in ("closed", "timeout", "waiting"):  # a collective
            seen = {"closed": "lost a connection of", "timeout": "timed out in",
                    "waiting": "was still waiting in"}[self.kind]
            return f"rank {self.rank} {seen} a collective (which member failed is unknown) in " \
                   f"{where}"
        if self.kind == "closed":
            return f"rank {self.rank} lost its connection with rank {self.peer} in {where}"
        if self.kind == "timeout":
            return f"rank {self.rank} waited {self.detail or 'the whole timeout'} for rank " \
                   f"{self.peer} in {where}"
        if self.kind == "waiting":
            return f"rank {self.rank} was still waiting for rank {self.peer} in {where}"
        return f"rank {self.rank} raised {self.detail} in {where}"


@dataclass(frozen=True)
class Diagnosis:
    """The ranks that failed first (``first``), and a sentence about each."""

    first: tuple[int, ...]
    text: str


def _edges(faults: list[Fault]) -> dict[int, set[int]]:
    """rank -> peers it waited for or lost. A connection lost with a peer that timed out waiting
    for this very rank points the other way only (that peer's wait closed it); one lost with a
    peer that timed out on another rank leads on to that peer's wait (a gloo wait that times out
    closes every connection of its rank)."""
    timed_out = {(f.rank, f.peer) for f in faults if f.kind == "timeout"}
    edges: dict[int, set[int]] = {}
    for f in faults:
        if f.peer is None or f.kind == "error":
            continue
        if f.kind == "closed" and (f.peer, f.rank) in timed_out:
            continue
        edges.setdefault(f.rank, set()).add(f.peer)
    return edges


def _ends(start: int, edges: dict[int, set[int]], errors: set[int]) -> set[int]:
    """The ranks where the chains of waits from ``start`` end (a cycle ends at its ranks)."""
    ends: set[int] = set()
    stack, seen = [start], {start}
    while stack:
        x = stack.pop()
        nxt = [] if x in errors else [p for p in edges.get(x, ()) if p not in seen]
        if x in errors or not edges.get(x):
            ends.add(x)
        for p in nxt:
            seen.add(p)
            stack.append(p)
    return ends or {start}


def diagnose(faults: Iterable[Fault], notes: Iterable[Fault] = ()) -> Diagnosis:
    """The ranks that failed first, given every rank's ``faults`` and current waiting
    ``notes``. Chains start at faults only (a note just extends a chain)."""
    faults, notes = _earliest(faults), list(notes)
    if not faults:
        return Diagnosis((), "no rank reported a failure")
    everything = faults + notes
    edges = _edges(everything)
    errors = {f.rank for f in faults if f.kind == "error"}
    reporters = {f.rank for f in everything}
    roots: set[int] = set()
    for f in faults:
        roots |= _ends(f.rank, edges, errors)
    parts = []
    for r in sorted(roots, key=lambda r: (_first_seen(r, faults), r)):
        parts.append(_sentence(r, faults, everything, r in errors, r in reporters))
    return Diagnosis(tuple(sorted(roots)), "; ".join(parts))


def _earliest(faults: Iterable[Fault]) -> list[Fault]:
    """Each rank's first fault with each peer (the later ones follow from it), and its errors."""
    first: dict[tuple[int, int], Fault] = {}
    out = []
    for f in sorted(faults, key=lambda f: f.wall):
        if f.peer is None:
            out.append(f)
        elif (f.rank, f.peer) not in first:
            first[(f.rank, f.peer)] = f
    return out + list(first.values())


def _first_seen(rank: int, faults: list[Fault]) -> float:
    times = [f.wall for f in faults if f.rank == rank or f.peer == rank]
    return min(times) if times else float("inf")


def _sentence(rank: int, faults: list[Fault], everything: list[Fault], error: bool,
              reported: bool) -> str:
    if error:
        own = min((f for f in faults if f.rank == rank and f.kind == "error"),
                  key=lambda f: f.wall)
        return f"rank {rank} failed first: it raised {own.detail} in {own.what}, " \
               f"{own.at:.2f} s into its call"
    seen = sorted((f for f in everything if f.peer == rank), key=lambda f: f.wall)
    if not seen:  # a cycle of waits without an end
        own = min((f for f in everything if f.rank == rank), key=lambda f: f.wall)
        return f"rank {rank} failed first: {own.describe()}"
    closed = [f for f in seen if f.kind == "closed"]
    if closed and not reported:
        how = "its connections closed (the process died or left the process group)"
        witness = closed[0]
    elif not reported:
        how = "it stopped responding (stopped, hung or busy outside this call)"
        witness = seen[0]
    else:
        how = "its peers could not complete their transfers with it"
        witness = seen[0]
    return f"rank {rank} failed first: {how}; {witness.describe()}"
