"""``meshcast.WeightSync``: every RL step, the trainer job pushes its new weights and the engine job
receives them into its existing parameter tensors, over a joint group of the two jobs
(:func:`meshcast.connect`). docs/weight-sync.md tells the workflow.

Built once on every rank of both jobs from what the rank holds (sync_spec.py): the descriptions
are exchanged through the joint group's store, matched, and planned once (:func:`meshcast.
plan_many`, cached), so the engine never needs stand-ins of the trainer's tensors. Each
:meth:`WeightSync.push` / :meth:`WeightSync.receive` pair is one :func:`meshcast.reshard_many` call
on the joint group, followed by a commit: every rank writes whether its part succeeded, and an
engine rank exposes the new version only once every rank of both jobs has (see
:meth:`WeightSync.receive`, ``atomic``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..planning.many import DEFAULT_BUCKET_BYTES, plan_many
from ..runtime.errors import ReshardError
from ..runtime.joint import JointGroup
from ..runtime.many import last_many_stats, run_many
from .sync_spec import NameMap, Route, describe_params, match_sides, merge_side
from .sync_store import WeightSyncError, commit, exchange, forget

__all__ = ["Convert", "SyncResult", "WeightSync", "WeightSyncError"]

Convert = Callable[[str, torch.Tensor, torch.dtype], torch.Tensor]
"""``convert(trainer name, shard, engine dtype)`` -> the shard in the engine's dtype, on the
trainer before the wire; the default casts (exactly what casting the full tensor gives)."""


@dataclass
class SyncResult:
    """What one sync did on this rank: the ``version`` now exposed (engine) or sent (trainer),
    the engine's ``tensors`` (the objects it passed, or fresh tensors), and timings."""

    version: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    seconds: float = 0.0
    commit_seconds: float = 0.0
    staging_bytes: int = 0
    peak_bucket_bytes: int = 0


def _cast(name: str, shard: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return shard if shard.dtype == dtype else shard.to(dtype)


def _local(value: Any) -> torch.Tensor | None:
    """This rank's local tensor of ``value`` (a tensor, an ``nn.Parameter`` or a DTensor), detached
    (the same storage)."""
    if value is None or (isinstance(value, torch.Tensor) and not hasattr(value, "to_local")):
        return None if value is None else value.detach()
    from .dtensor import local_source

    local = local_source(value)
    return None if local is None else local.detach()


class WeightSync:
    """Weight sync from the trainer job to the engine job over ``group`` (a
    :class:`~meshcast.runtime.joint.JointGroup`); build it on every rank of both jobs, in the
    same order as any other object built on the group.

    ``params``: what this rank holds, ``{name: DTensor or meshcast.ParamSpec(shape, dtype,
    layout)}`` (layouts over the job's own ranks; with pipeline parallelism a rank describes its
    stage's parameters). The two sides' names, shapes and layouts are exchanged and matched
    (``name_map``: trainer name -> engine name; default the same names) and planned once; any
    mismatch raises ``ValueError`` on every rank of both jobs, listing every problem. The wire
    carries the engine's dtype: each trainer shard is converted by ``convert`` (default: a cast).
    ``bucket_bytes`` bounds each rank's staging of packed messages; ``timeout`` every wait;
    ``atomic`` (default) stages received shards and copies them into the parameters only once the
    sync succeeded everywhere (costs one copy of this engine rank's parameters, kept between
    syncs); ``version``: what the engine's parameters hold now (None: unknown).
    """

    def __init__(
        self, group: JointGroup, params: Mapping[str, Any], *, name_map: NameMap = None,
        convert: Convert | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout: float | None = None, atomic: bool = True, version: int | None = None,
        strategy: str | None = None, balance: str | None = None,
    ) -> None:
        if not isinstance(group, JointGroup):
            raise TypeError(f"group must be a meshcast JointGroup (meshcast.connect), got "
                            f"{type(group).__name__}")
        self.group, self.role = group, group.role
        self.timeout = group.timeout if timeout is None else float(timeout)
        self.bucket_bytes, self.atomic, self.version = bucket_bytes, bool(atomic), version
        self.convert = _cast if convert is None else convert
        self.key = f"sync/{group.next_sync()}"
        self.steps = 0
        self._staging: list[torch.Tensor | None] | None = None
        try:
            mine: dict[str, Any] = {"params": describe_params(params)}
        except (TypeError, ValueError) as exc:
            mine = {"error": str(exc)}
        records = exchange(group, f"{self.key}/describe", mine, self.timeout)
        bad = [(j, r["error"]) for j, r in records.items() if "error" in r]
        if bad:
            raise ValueError(f"meshcast.WeightSync on {group.role} rank {group.rank}: "
                             f"{group.describe([bad[0][0]])}: {bad[0][1]}")
        sides = {role: merge_side({j: records[j]["params"] for j in group.ranks(role)}, role)
                 for role in ("trainer", "engine")}
        self.routes: list[Route] = match_sides(sides["trainer"], sides["engine"],
                                               group.offset("engine"), name_map)
        self.plans = plan_many([r.task for r in self.routes], group.topology,
                               strategy=strategy, balance=balance)

    @property
    def names(self) -> list[str]:
        """The engine's tensor names, in sync order."""
        return [r.target for r in self.routes]

    def push(self, params: Mapping[str, Any], version: int) -> SyncResult:
        """Trainer ranks: send ``params`` (``{name: DTensor, or this rank's local shard}``, the
        names this rank holds) as ``version`` (an int, the same on every trainer rank). Returns
        when every rank of both jobs has its part; raises :class:`WeightSyncError` (every rank)
        when the sync failed, ``ValueError`` (every rank, nothing sent) for bad inputs."""
        self._check_role("trainer", "push")
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"version must be an int, got {type(version).__name__}")
        me, shards, errors = self.group.me, [], []
        for route in self.routes:
            task, value = route.task, params.get(route.source)
            if task.src_region(me) is None:
                shards.append(None)
                continue
            shard = _local(value)
            if shard is None:
                errors.append(f"params[{route.source!r}] is missing on trainer rank "
                              f"{self.group.rank}, which holds part of it")
                shards.append(None)
                continue
            shards.append(self._maker(route.source, shard, _dtype(task)))
        return self._run(shards, [None] * len(shards), errors, version, "push")[0]

    def _maker(self, name: str, shard: torch.Tensor, dtype: torch.dtype):
        """The shard converted to the wire's dtype when the transfer first needs it (so the
        conversion of the next bucket overlaps the transfer of the current one)."""
        return lambda: self.convert(name, shard, dtype)

    def receive(self, params: Mapping[str, Any] | None = None) -> SyncResult:
        """Engine ranks: receive the next version into ``params`` (``{engine name: DTensor or
        this rank's local tensor}``) in place, or into fresh tensors when ``params`` is None.
        With ``atomic`` the parameters change only once every rank of both jobs succeeded: they
        hold the previous version or the new one, never a mix; a failed sync raises
        :class:`WeightSyncError` on every rank, saying which version the parameters hold."""
        self._check_role("engine", "receive")
        me, outs, errors, targets = self.group.me, [], [], {}
        for route in self.routes:
            if route.task.dst_region(me) is None:
                outs.append(None)
                continue
            target = None if params is None else _local(params.get(route.target))
            if params is not None and target is None:
                errors.append(f"params[{route.target!r}] is missing on engine rank "
                              f"{self.group.rank}, which receives part of it")
            targets[route.target] = target
            outs.append(target)
        into = self._stage(outs) if self.atomic and params is not None else outs
        result, got = self._run([None] * len(outs), into, errors, None, "receive")
        for route, staged, target, fresh in zip(self.routes, into, outs, got):
            if target is not None and staged is not target:
                target.copy_(staged)  # the commit: every rank of both jobs succeeded
            if route.target in targets:  # the caller's own object (a DTensor stays one)
                result.tensors[route.target] = fresh if params is None else params[route.target]
        self.version = result.version
        return result

    def _stage(self, outs: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Staging buffers for ``outs`` (made once, kept between syncs)."""
        if self._staging is None or any(
                (o is None) != (s is None) or (o is not None and s.shape != o.shape)
                for o, s in zip(outs, self._staging)):
            self._staging = [None if o is None else torch.empty(o.shape, dtype=o.dtype,
                                                                device=o.device) for o in outs]
        return self._staging

    def _run(self, shards: list, outs: list, errors: list[str], version: int | None,
             what: str) -> tuple[SyncResult, list[torch.Tensor | None]]:
        step, self.steps = self.steps, self.steps + 1
        caller = f"meshcast.WeightSync.{what}"
        started = time.perf_counter()
        failure: ReshardError | None = None
        try:
            results = run_many(shards, self.plans, bucket_bytes=self.bucket_bytes,
                               timeout=self.timeout, names=self.names, errors=errors, out=outs,
                               group=self.group, caller=caller, overlap=True)
        except ValueError as exc:  # refused on every rank before anything moved
            raise ValueError(f"{exc} (the engine's parameters keep version "
                             f"{self.version})") from None
        except ReshardError as exc:
            failure, results = exc, outs
        moved = time.perf_counter()
        version = commit(self.group, f"{self.key}/step/{step}", version, failure, self.timeout,
                         self._kept(), caller)
        if step:
            forget(self.group, f"{self.key}/step/{step - 1}")
        staged = sum(t.numel() * t.element_size() for t in (self._staging or ()) if t is not None)
        return SyncResult(version, {}, moved - started, time.perf_counter() - moved, staged,
                          last_many_stats().peak_staging_bytes), results

    def _kept(self) -> str:
        if self.role == "trainer":
            return "the engine keeps its previous version"
        if self.atomic:
            return f"this engine rank's parameters keep version {self.version} (nothing changed)"
        return ("this engine rank's parameters may hold a mix of the old and the new version "
                "(atomic=False): sync again")

    def _check_role(self, role: str, what: str) -> None:
        if self.role != role:
            raise RuntimeError(f"WeightSync.{what} is for {role} ranks; this is {self.role} "
                               f"rank {self.group.rank}")


def _dtype(task: Any) -> torch.dtype:
    from ..runtime.tensors import torch_dtype

    return torch_dtype(task.dtype)

