"""Pipeline schedules as clock tables: GPipe, 1F1B and eager-1F1B (PAPER.md section 4).

A schedule is built in two steps. First, each stage gets its *order*: the sequence of forwards
(``F b``) and backwards (``B b``) it runs. Then the actions are placed on clocks as soon as possible
with every action taking one clock: an action starts on the first clock at which its stage is free
and its data is there.

Data dependencies, stage ``i`` of ``n``, microbatch ``b``:

- ``F b`` on stage ``i`` needs ``F b`` on stage ``i-1`` (its input activation);
- ``B b`` on stage ``i`` needs ``B b`` on stage ``i+1`` (its output gradient) and ``F b`` on stage
  ``i`` (its saved activation).

Orders, with ``w_i`` the number of warm-up forwards of stage ``i``:

- ``gpipe``: all ``m`` forwards, then all ``m`` backwards (in microbatch order).
- ``1f1b``: ``w_i = min(n-i-1, m)`` forwards, then pairs ``F (w_i+k), B k``, then the remaining
  backwards.
- ``eager_1f1b``: ``w_i = min(m, 2(n-i)-1)`` forwards, then pairs ``B k, F (w_i+k)``, then the
  remaining backwards. The paper places ``B b`` on stage ``i`` no earlier than clock
  ``(n-1) + (2b+1) + (n-1-i)``; this is applied as a lower bound, and as-soon-as-possible placement
  meets it exactly (the tests check it).

The resulting tables take ``2(n+m-1)`` clocks for all three. The peak number of microbatches in
flight (forward done, backward not yet) on stage ``i`` is ``m`` (GPipe), ``min(m, n-i)`` (1F1B)
and ``min(m, 2(n-i)-1)`` (eager-1F1B).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

__all__ = ["SCHEDULES", "Action", "ClockTable", "Schedule", "schedule", "stage_order"]

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "eager_1f1b")
"""Names accepted by :func:`schedule`."""


class Action(NamedTuple):
    """One unit of work of a stage: the forward (``kind="F"``) or backward (``"B"``) of a
    microbatch."""

    kind: str
    microbatch: int

    @property
    def is_forward(self) -> bool:
        """True for a forward."""
        return self.kind == "F"

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


def _check_count(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{argument} must be at least 1, got {value}")
    return value


def warmup_forwards(name: str, num_stages: int, num_microbatches: int, stage: int) -> int:
    """Forwards stage ``stage`` runs before its first backward under schedule ``name``."""
    n, m, i = num_stages, num_microbatches, stage
    if name == "gpipe":
        return m
    if name == "1f1b":
        return min(n - i - 1, m)
    if name == "eager_1f1b":
        return min(m, 2 * (n - i) - 1)
    raise ValueError(f"schedule {name!r} is unknown; choose one of {', '.join(SCHEDULES)}")


def stage_order(name: str, num_stages: int, num_microbatches: int, stage: int) -> list[Action]:
    """The sequence of actions stage ``stage`` runs under schedule ``name`` (clocks aside)."""
    m = num_microbatches
    w = warmup_forwards(name, num_stages, m, stage)
    order = [Action("F", b) for b in range(w)]
    for k in range(m - w):
        pair = [Action("F", w + k), Action("B", k)]
        order += pair[::-1] if name == "eager_1f1b" else pair
    order += [Action("B", b) for b in range(m - w, m)]
    return order


def _eager_backward_bound(num_stages: int, stage: int, microbatch: int) -> int:
    """Earliest clock of ``B microbatch`` on ``stage`` in eager-1F1B (PAPER.md section 4)."""
    n = num_stages
    return (n - 1) + (2 * microbatch + 1) + (n - 1 - stage)


@dataclass(frozen=True)
class ClockTable:
    """A clock table: ``clocks[t][i]`` is what stage ``i`` does at clock ``t`` (None: idle).

    Immutable plain data; ``str(schedule)`` is a text chart, :func:`meshcast.pipeline.plot_schedule`
    draws it.
    """

    name: str
    num_stages: int
    num_microbatches: int
    clocks: tuple[tuple[Action | None, ...], ...]

    @property
    def num_clocks(self) -> int:
        """Length of the table in clocks."""
        return len(self.clocks)

    def actions(self, stage: int) -> tuple[Action, ...]:
        """The actions of ``stage`` in the order it runs them (idle clocks skipped)."""
        return self._actions[self._stage(stage)]

    def clock_of(self, stage: int, action: Action) -> int:
        """The clock at which ``stage`` runs ``action``."""
        try:
            return self._clock_of[(self._stage(stage), Action(*action))]
        except KeyError:
            raise ValueError(f"stage {stage} never runs {action}") from None

    def inflight(self, stage: int) -> tuple[int, ...]:
        """Microbatches in flight on ``stage`` (forward done, backward not) after each clock."""
        stage = self._stage(stage)
        count, out = 0, []
        for row in self.clocks:
            a = row[stage]
            if a is not None:
                count += 1 if a.is_forward else -1
            out.append(count)
        return tuple(out)

    def peak_inflight(self, stage: int) -> int:
        """Most microbatches whose activations ``stage`` holds at once."""
        return max(self.inflight(stage), default=0)

    def idle_clocks(self, stage: int) -> int:
        """Clocks at which ``stage`` does nothing (its bubble)."""
        return self.num_clocks - len(self.actions(stage))

    def to_json(self) -> dict[str, Any]:
        """Plain-data form: per clock, per stage, ``"F3"``, ``"B0"`` or None."""
        return {
            "name": self.name,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "clocks": [[None if a is None else str(a) for a in row] for row in self.clocks],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClockTable:
        """Inverse of :meth:`to_json`; ``ValueError`` for a table no pipeline can run (see
        :func:`_check_clocks`)."""
        try:
            clocks = tuple(
                tuple(None if a is None else Action(a[0], int(a[1:])) for a in row)
                for row in data["clocks"]
            )
            n = _check_count(data["num_stages"], "num_stages")
            m = _check_count(data["num_microbatches"], "num_microbatches")
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"not a valid clock table: {type(exc).__name__}: {exc}") from None
        _check_clocks(clocks, n, m)
        return cls(data["name"], n, m, clocks)

    def chart(self, max_clocks: int | None = None) -> str:
        """The table as text: one row per stage, one column per clock, ``.`` for idle."""
        width = max(len(f"F{self.num_microbatches - 1}"), len(str(self.num_clocks - 1))) + 1
        shown = self.clocks if max_clocks is None else self.clocks[:max_clocks]
        peaks = ",".join(str(self.peak_inflight(i)) for i in range(self.num_stages))
        lines = [
            f"{self.name}: {self.num_stages} stages, {self.num_microbatches} microbatches, "
            f"{self.num_clocks} clocks, peak in-flight per stage {peaks}",
            "clock   " + "".join(f"{t:>{width}}" for t in range(len(shown))),
        ]
        for i in range(self.num_stages):
            cells = ("." if row[i] is None else str(row[i]) for row in shown)
            lines.append(f"stage {i:<2}" + "".join(f"{c:>{width}}" for c in cells))
        if len(shown) < self.num_clocks:
            lines.append(f"... {self.num_clocks - len(shown)} more clocks")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.chart()

    # -- internals --------------------------------------------------------------------------
    def _stage(self, stage: int) -> int:
        if isinstance(stage, bool) or not isinstance(stage, int):
            raise TypeError(f"stage must be an integer, got {stage!r}")
        if not 0 <= stage < self.num_stages:
            raise ValueError(f"stage must be in 0..{self.num_stages - 1}, got {stage}")
        return stage

    @cached_property
    def _actions(self) -> tuple[tuple[Action, ...], ...]:
        return tuple(
            tuple(row[i] for row in self.clocks if row[i] is not None)
            for i in range(self.num_stages)
        )

    @cached_property
    def _clock_of(self) -> dict[tuple[int, Action], int]:
        return {
            (i, a): t
            for t, row in enumerate(self.clocks)
            for i, a in enumerate(row)
            if a is not None
        }


def place(
    name: str,
    orders: Sequence[Sequence[Action]],
    num_microbatches: int,
) -> ClockTable:
    """Place per-stage action orders on unit clocks, as soon as data dependencies allow.

    ``orders[i]`` is the sequence stage ``i`` runs. Raises ValueError if the orders deadlock.
    Backward placement follows the eager-1F1B lower bound when ``name == "eager_1f1b"``.
    """
    n = len(orders)
    done: dict[tuple[int, Action], int] = {}  # (stage, action) -> clock it ran at
    nxt = [0] * n
    total = sum(len(o) for o in orders)
    rows: list[tuple[Action | None, ...]] = []
    t = 0
    while len(done) < total:
        row: list[Action | None] = [None] * n
        for i in range(n):
            if nxt[i] == len(orders[i]):
                continue
            a = orders[i][nxt[i]]
            if a.is_forward:
                deps = [(i - 1, a)] if i > 0 else []
            else:
                deps = [(i, Action("F", a.microbatch))]
                if i < n - 1:
                    deps.append((i + 1, a))
                if name == "eager_1f1b" and t < _eager_backward_bound(n, i, a.microbatch):
                    continue
            if all(d in done and done[d] < t for d in deps):
                row[i] = a
        for i, a in enumerate(row):
            if a is not None:
                done[(i, a)] = t
                nxt[i] += 1
        rows.append(tuple(row))
        t += 1
        if t > 4 * (total + n) + 8:
            raise ValueError(f"schedule {name!r}: the stage orders deadlock")
    return ClockTable(name, n, num_microbatches, tuple(rows))


def schedule(name: str, num_stages: int, num_microbatches: int) -> ClockTable:
    """The clock table of schedule ``name`` (one of :data:`SCHEDULES`) for ``num_stages`` stages
    and ``num_microbatches`` microbatches.

    >>> print(schedule("1f1b", 2, 3))  # doctest: +NORMALIZE_WHITESPACE
    1f1b: 2 stages, 3 microbatches, 8 clocks, peak in-flight per stage 2,1
    clock     0  1  2  3  4  5  6  7
    stage 0  F0 F1  . B0 F2 B1  . B2
    stage 1   . F0 B0 F1 B1 F2 B2  .
    """
    if name not in SCHEDULES:
        raise ValueError(f"schedule {name!r} is unknown; choose one of {', '.join(SCHEDULES)}")
    n = _check_count(num_stages, "num_stages")
    m = _check_count(num_microbatches, "num_microbatches")
    return place(name, [stage_order(name, n, m, i) for i in range(n)], m)


Schedule = ClockTable
"""The former name of :class:`ClockTable` (kept so that code written against it still works;
``meshcast.planning.many.Schedule`` is a different thing: the bucketed operations of many
plans)."""


def _check_clocks(clocks: Sequence[Sequence[Action | None]], n: int, m: int) -> None:
    """``ValueError`` unless every stage of ``n`` runs the forward and the backward of each of
    ``m`` microbatches once, a forward after the previous stage's, a backward after the next
    stage's and after the stage's own forward."""
    at: dict[tuple[int, Action], int] = {}
    for t, row in enumerate(clocks):
        if len(row) != n:
            raise ValueError(f"not a valid clock table: clock {t} has {len(row)} stages, not {n}")
        for i, a in enumerate(row):
            if a is not None:
                if a.kind not in "FB" or not 0 <= a.microbatch < m or (i, a) in at:
                    raise ValueError(f"not a valid clock table: stage {i} runs {a} at clock {t}")
                at[(i, a)] = t
    for i in range(n):
        for b in range(m):
            f, g = (i, Action("F", b)), (i, Action("B", b))
            if f not in at or g not in at:
                raise ValueError(f"not a valid clock table: stage {i} never runs "
                                 f"{f[1] if f not in at else g[1]}")
            after = [(g, f)]  # (the later, the earlier)
            if i:
                after.append((f, (i - 1, f[1])))
            if i < n - 1:
                after.append((g, (i + 1, g[1])))
            for later, earlier in after:
                if at[later] <= at[earlier]:
                    raise ValueError(f"not a valid clock table: stage {i} runs {later[1]} at "
                                     f"clock {at[later]}, not after stage {earlier[0]}'s "
                                     f"{earlier[1]} (clock {at[earlier]})")
