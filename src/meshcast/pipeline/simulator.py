"""Step time of a pipeline schedule when compute and communication take real time.

The model (plain, deterministic, no randomness):

- Stage ``i`` runs the actions of the schedule in the schedule's order (:meth:`ClockTable.actions`);
  a forward takes ``forward_s[i]``, a backward ``backward_s[i]``. An action starts when its stage
  is free and its inputs are there.
- Tensors between stages travel over :class:`Link` s. A link from stage ``src`` to a later stage
  ``dst`` carries the activation of every microbatch forward (``activation_s`` each) and its
  gradient backward (``gradient_s`` each). Adjacent stages usually share one link per boundary
  (:func:`chain_links`); skip connections add links between non-adjacent stages.
- Each direction of each (src, dst) stage pair is one resource that serialises its transfers in
  the order they are issued (links are full duplex: activations and gradients do not queue behind
  each other). Several :class:`Link` s with the same (src, dst) share that resource.
- A forward output is sent when the forward ends. Without ``overlap`` the sending stage blocks
  until its sends are done (sends of one action go one after another); with ``overlap`` the send
  runs in the background and only delays its consumer. Gradients are sent when the backward ends
  and block the sender unless ``overlap_backward`` (the paper overlaps forward sends only: the
  consumer of a gradient is on the critical path anyway).
- The receiver is not blocked by a transfer beyond waiting for its data (the receive is posted
  ahead of time), and transfers do not slow down compute.
- Data dependencies are those of :mod:`meshcast.pipeline.schedules`: ``F b`` on stage ``i`` after
  ``F b`` on stage ``i-1`` and after every activation of ``b`` arriving at ``i``; ``B b`` on stage
  ``i`` after ``B b`` on ``i+1``, after ``F b`` on ``i`` and after every gradient of ``b`` arriving
  at ``i``.

The step time is the end of the last action or transfer. With free communication and
``forward_s == backward_s == 1`` every action starts exactly at its clock in the table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .schedules import Action, ClockTable

__all__ = ["Link", "PipelineTiming", "TransferTiming", "chain_links", "simulate_pipeline"]


class Link(NamedTuple):
    """Stage ``src`` sends a tensor to the later stage ``dst`` for every microbatch: the forward
    transfer takes ``activation_s`` seconds, the gradient transfer back ``gradient_s``."""

    src: int
    dst: int
    activation_s: float
    gradient_s: float
    name: str = ""


class TransferTiming(NamedTuple):
    """When one transfer ran: ``kind`` is ``"F"`` (activation) or ``"B"`` (gradient)."""

    link: int
    kind: str
    microbatch: int
    start: float
    end: float


def _per_stage(value: float | Sequence[float], count: int, argument: str) -> tuple[float, ...]:
    values = [value] * count if isinstance(value, (int, float)) else list(value)
    if len(values) != count:
        raise ValueError(f"{argument} must be one number or {count} numbers, got {value!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
            raise ValueError(f"{argument} must be finite non-negative numbers, got {v!r}")
    return tuple(float(v) for v in values)


def chain_links(
    num_stages: int,
    activation_s: float | Sequence[float],
    gradient_s: float | Sequence[float] | None = None,
) -> tuple[Link, ...]:
    """One link per boundary ``i -> i+1`` (``num_stages - 1`` of them); ``gradient_s`` defaults to
    ``activation_s`` (the gradient of an activation has its shape)."""
    act = _per_stage(activation_s, num_stages - 1, "activation_s")
    grad = act if gradient_s is None else _per_stage(gradient_s, num_stages - 1, "gradient_s")
    return tuple(Link(i, i + 1, a, g, f"boundary {i}") for i, (a, g) in enumerate(zip(act, grad)))


@dataclass(frozen=True)
class PipelineTiming:
    """Result of :func:`simulate_pipeline`: the step time and when everything ran."""

    schedule: ClockTable
    overlap: bool
    overlap_backward: bool
    step_s: float
    starts: tuple[tuple[float, ...], ...]
    """``starts[i][k]``: start of the ``k``-th action of stage ``i`` (``schedule.actions(i)``)."""
    ends: tuple[tuple[float, ...], ...]
    links: tuple[Link, ...]
    transfers: tuple[TransferTiming, ...]

    def compute_s(self, stage: int) -> float:
        """Seconds ``stage`` spends computing."""
        return sum(e - s for s, e in zip(self.starts[stage], self.ends[stage]))

    def bubble(self, stage: int) -> float:
        """Fraction of the step during which ``stage`` does not compute."""
        return 1.0 - self.compute_s(stage) / self.step_s if self.step_s else 0.0

    def start_of(self, stage: int, action: Action) -> float:
        """When ``stage`` starts ``action``."""
        return self.starts[stage][self.schedule.actions(stage).index(Action(*action))]

    def summary(self) -> str:
        """One line per stage: compute time and bubble."""
        lines = [
            f"{self.schedule.name} overlap={self.overlap}: step {self.step_s:.6g} s "
            f"({self.schedule.num_stages} stages, {self.schedule.num_microbatches} microbatches)"
        ]
        for i in range(self.schedule.num_stages):
            lines.append(
                f"  stage {i}: compute {self.compute_s(i):.6g} s, bubble {self.bubble(i):.1%}"
            )
        return "\n".join(lines)


def _checked_links(links: Sequence[Link], n: int) -> tuple[Link, ...]:
    links = tuple(Link(*link) for link in links)
    for link in links:
        if not (0 <= link.src < link.dst < n):
            raise ValueError(
                f"link {link}: need 0 <= src < dst < {n} (forward goes to later stages)"
            )
        _per_stage((link.activation_s, link.gradient_s), 2, f"link {link.name or link[:2]} times")
    return links


class _LinkClock:
    """When each link is free, when each tensor arrives, and every transfer made so far."""

    def __init__(self, links: tuple[Link, ...]) -> None:
        self.links = links
        self.arrival: dict[tuple[int, str, int], float] = {}  # (link, kind, microbatch)
        self.free: dict[tuple[int, int, str], float] = {}
        self.transfers: list[TransferTiming] = []

    def send(self, ks: list[int], kind: str, b: int, issue: float, blocking: bool) -> float:
        """Issue the transfers of ``ks``; returns when the sender is free again."""
        free = issue
        for k in ks:
            link = self.links[k]
            key = (link.src, link.dst, kind)
            duration = link.activation_s if kind == "F" else link.gradient_s
            start = max(free if blocking else issue, self.free.get(key, 0.0))
            finish = start + duration
            self.free[key] = finish
            self.arrival[(k, kind, b)] = finish
            self.transfers.append(TransferTiming(k, kind, b, start, finish))
            if blocking:
                free = finish
        return free


def simulate_pipeline(
    schedule: ClockTable,
    forward_s: float | Sequence[float],
    backward_s: float | Sequence[float],
    links: Sequence[Link] = (),
    *,
    overlap: bool = False,
    overlap_backward: bool = False,
) -> PipelineTiming:
    """Simulate one training step of ``schedule`` (see the module docstring for the model).

    ``forward_s`` / ``backward_s``: compute seconds per microbatch, one number or one per stage.
    ``links``: the tensors exchanged between stages with their transfer times, e.g.
    ``chain_links(n, activation_s)``; the transfer times usually come from simulating the
    resharding plan of each boundary tensor.
    """
    if not isinstance(schedule, ClockTable):
        raise TypeError(f"schedule must be a meshcast.pipeline.ClockTable, got {schedule!r}")
    n = schedule.num_stages
    fwd = _per_stage(forward_s, n, "forward_s")
    bwd = _per_stage(backward_s, n, "backward_s")
    links = _checked_links(links, n)
    into = [[k for k, link in enumerate(links) if link.dst == i] for i in range(n)]
    out_of = [[k for k, link in enumerate(links) if link.src == i] for i in range(n)]
    clock = _LinkClock(links)
    arrival = clock.arrival
    end: dict[tuple[int, Action], float] = {}
    stage_free = [0.0] * n
    starts: list[list[float]] = [[] for _ in range(n)]
    ends: list[list[float]] = [[] for _ in range(n)]
    for row in schedule.clocks:  # clock order respects every dependency of a valid table
        for i, a in enumerate(row):
            if a is None:
                continue
            b = a.microbatch
            ready = stage_free[i]
            if a.is_forward:
                if i > 0:
                    ready = max(ready, end[(i - 1, a)])
                ready = max([ready] + [arrival[(k, "F", b)] for k in into[i]])
                finish = ready + fwd[i]
                stage_free[i] = clock.send(out_of[i], "F", b, finish, blocking=not overlap)
            else:
                ready = max(ready, end[(i, Action("F", b))])
                if i < n - 1:
                    ready = max(ready, end[(i + 1, a)])
                ready = max([ready] + [arrival[(k, "B", b)] for k in out_of[i]])
                finish = ready + bwd[i]
                stage_free[i] = clock.send(into[i], "B", b, finish,
                                           blocking=not overlap_backward)
            end[(i, a)] = finish
            starts[i].append(ready)
            ends[i].append(finish)
    transfers = clock.transfers
    step = max([e for stage in ends for e in stage] + [t.end for t in transfers], default=0.0)
    return PipelineTiming(
        schedule=schedule, overlap=overlap, overlap_backward=overlap_backward, step_s=step,
        starts=tuple(tuple(s) for s in starts), ends=tuple(tuple(e) for e in ends), links=links,
        transfers=tuple(transfers),
    )
