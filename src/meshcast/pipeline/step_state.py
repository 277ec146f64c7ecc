"""The state one pipeline step shares between its threads: the hand-over slots, the result, and
the abort flag with its waits (given up here or, through the job's store, on another rank)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.mesh import Mesh
from ..runtime.execute import timeout_problem
from ..runtime.store_keys import wait_for_keys
from ..runtime.whereabouts import chain_of, drop_wait, note_wait
from .graph import TensorEdge

__all__ = [
    "POLL_S", "REMOTE_POLL_S", "Microbatches", "PipelineError", "Slot", "StepAbort", "StepResult",
    "agree_arguments", "arguments_key", "own_stage", "refuse_arguments",
]

POLL_S = 0.05
"""How often a waiting thread looks at the abort flag."""
REMOTE_POLL_S = 0.5
"""How often a waiting thread asks the store whether another rank has aborted."""


class PipelineError(RuntimeError):
    """A pipeline step failed on this rank or on another; ``ranks`` names the ranks concerned."""

    def __init__(self, message: str, ranks: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)


@dataclass
class StepResult:
    """What one :meth:`PipelineRuntime.train_step` returns on one rank."""

    loss: float | None
    """Loss of the whole batch (mean over microbatches) on the last stage's ranks, else None."""
    compute_s: float = 0.0
    """Seconds the compute thread spent in forwards and backwards."""
    wait_s: float = 0.0
    """Seconds the compute thread waited for received tensors or for its own sends."""
    peak_activation_bytes: int = 0
    """Peak over the step of the bytes autograd saved for microbatches in flight (parameters
    excluded; tensors counted once per storage)."""
    transfers: int = 0
    """Boundary transfers (reshard calls) this rank took part in."""


@dataclass
class Slot:
    """One tensor handed between the compute and the communication thread."""

    ready: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    value: torch.Tensor | None = None


class StepAbort:
    """The abort flag of one step on one rank: set here, or found set by another
    rank under ``key`` in the job's ``store`` (None: failures travel through timeouts only)."""

    def __init__(self, rank: int, stage: int | None, store: Any, key: str,
                 timeout: float) -> None:
        self.rank, self.stage, self.store, self.key = rank, stage, store, key
        self.timeout = timeout
        self.event = threading.Event()
        self.errors: list[BaseException] = []
        self._next_remote = time.monotonic() + REMOTE_POLL_S

    @property
    def who(self) -> str:
        """``rank R (stage S)``, the start of every message."""
        return f"rank {self.rank} (stage {self.stage})"

    def first_error(self) -> str:
        """The first failure of the step, as text (``aborted`` if none was recorded)."""
        return str(self.errors[0]) if self.errors else "aborted"

    def remote(self) -> str | None:
        """Why another rank gave up the step (read from the store), or None."""
        if self.store is None:
            return None
        try:
            if self.store.check([self.key]):
                return self.store.get(self.key).decode(errors="replace")
        except Exception:
            return None
        return None

    def publish(self, text: str) -> None:
        """Tell the other ranks why this rank gives up (the first failure wins)."""
        if self.store is None:
            return
        with contextlib.suppress(Exception):  # the first failure wins: later ones follow from it
            self.store.compare_set(self.key, "", text)

    def reason(self) -> str | None:
        """Why this step was given up (here, or on another rank), or None: handed to the
        boundary reshards so that their input agreement stops at once."""
        if self.event.is_set():
            return f"{self.who} gave up the step: {self.first_error()}"
        now = time.monotonic()
        if now >= self._next_remote:
            self._next_remote = now + REMOTE_POLL_S
            remote = self.remote()
            if remote is not None:
                return f"{self.who} gave up the step, because {remote}"
        return None

    def wait(self, event: threading.Event, what: str, ranks: Sequence[int]) -> None:
        """Wait for ``event`` at most ``timeout``; raise early if this step aborts anywhere. A
        wait longer than one look leaves a note of it (runtime/whereabouts.py) while it lasts."""
        if event.wait(POLL_S):
            return
        own = list(ranks) == [self.rank]  # (its own stage's compute: the chain ends here)
        note_wait(event, self.rank, f"(stage {self.stage}) waits for {what}", [] if own else ranks,
                  time.time() - POLL_S, compute=not own)  # (the others: the compute thread's)
        try:
            self._wait(event, what, ranks)
        finally:
            drop_wait(event, self.rank)

    def _wait(self, event: threading.Event, what: str, ranks: Sequence[int]) -> None:
        deadline = time.monotonic() + self.timeout - POLL_S
        next_remote = time.monotonic() + REMOTE_POLL_S
        while not event.wait(POLL_S):
            if self.event.is_set():
                raise PipelineError(
                    f"{self.who}: gave up waiting for {what}: {self.first_error()}", ranks)
            now = time.monotonic()
            if now >= next_remote:
                next_remote = now + REMOTE_POLL_S
                remote = self.remote()
                if remote is not None:
                    self.errors.append(PipelineError(remote))
                    self.event.set()
                    raise PipelineError(
                        f"{self.who}: gave up waiting for {what}, because {remote}", ranks)
            if now > deadline:  # (where the ranks wait, as their notes say: whereabouts.py)
                notes = chain_of(sorted(ranks))
                raise PipelineError(
                    f"{self.who}: waited more than {self.timeout:g} s for {what} (ranks "
                    f"involved: {sorted(ranks)}{'; ' + notes if notes else ''})", ranks)


def arguments_key(runtime: int) -> str:
    """Where the ranks agree on the arguments of their ``runtime``-th PipelineRuntime."""
    return f"meshcast/pipeline/{runtime}/arguments"


def own_stage(
    rank: int, meshes: Sequence[Mesh], module: object, timeout: object
) -> int | None:
    """``rank``'s stage (None: in no mesh), checking that it was given a ``module`` exactly if
    it has one, and ``timeout``."""
    why = timeout_problem(timeout)
    if why is not None:
        raise ValueError(why)
    stage = next((i for i, m in enumerate(meshes) if rank in m), None)
    if (stage is None) != (module is None):
        where = "in no mesh" if stage is None else f"on stage {stage}"
        raise ValueError(f"rank {rank}: stage_module must be given exactly on the ranks of a "
                         f"mesh (this rank is {where})")
    return stage


def refuse_arguments(store: Any, key: str, rank: int, exc: BaseException) -> None:
    """Tell the ranks that wait in :func:`agree_arguments` under ``key`` that this rank refused
    its arguments (``exc``), so that they raise at once instead of waiting for it."""
    if store is not None:
        with contextlib.suppress(Exception):  # this rank raises its own error anyway
            store.set(f"{key}/{rank}", json.dumps({"error": f"{type(exc).__name__}: {exc}"}))


def agree_arguments(store: Any, key: str, rank: int, world: int, arguments: dict[str, Any],
                    timeout: float, extra: Any = None) -> list[Any]:
    """Compare ``arguments`` (plain data) with every rank's through ``store`` under ``key``:
    ``ValueError`` on every rank naming the ranks and arguments that differ from this rank's, or
    the ranks that refused theirs (:func:`refuse_arguments`); :class:`PipelineError` naming the
    ranks that did not come within ``timeout``. Returns every rank's ``extra`` (not compared),
    by rank (without a store nothing is checked: this rank's only)."""
    if store is None:
        return [extra]
    keys = [f"{key}/{r}" for r in range(world)]
    store.set(keys[rank], json.dumps({"arguments": arguments, "extra": extra}, sort_keys=True,
                                     default=str))
    if not wait_for_keys(store, keys, timeout):  # polled: Ctrl-C is seen at once
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise PipelineError(f"rank {rank}: ranks {missing} did not build the PipelineRuntime "
                            f"within {timeout:g} s (every rank builds it, in the same order)",
                            missing)
    records = [json.loads(v) for v in store.multi_get(keys)]
    refused = [r for r, rec in enumerate(records) if "error" in rec]
    if refused:
        raise ValueError(f"rank {rank}: ranks {refused} refused their PipelineRuntime arguments "
                         f"(rank {refused[0]}: {records[refused[0]]['error']:.300}); every rank "
                         f"passes the same arguments except stage_module")
    own = records[rank]["arguments"]
    differ = [r for r, rec in enumerate(records) if rec["arguments"] != own]
    if differ:
        q = differ[0]
        theirs = records[q]["arguments"]
        shown = "; ".join(f"{n}={theirs.get(n)!r:.120} on rank {q}, {own[n]!r:.120} here"
                          for n in own if theirs.get(n) != own[n])
        raise ValueError(f"rank {rank}: ranks {differ} built the PipelineRuntime with other "
                         f"arguments ({shown}); every rank passes the same arguments except "
                         f"stage_module")
    return [rec["extra"] for rec in records]


@dataclass
class Microbatches:
    """What the compute thread of one step keeps between its actions."""

    data: dict[str, tuple[torch.Tensor, ...]]
    targets: tuple[torch.Tensor, ...] | None
    outputs: list[str]
    sends: list[TensorEdge]
    receives: list[TensorEdge]
    result: StepResult
    kept: dict[int, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = field(
        default_factory=dict)
    saved: dict[int, int] = field(default_factory=dict)
    inflight: int = 0
