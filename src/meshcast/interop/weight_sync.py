"""``meshcast.WeightSync``: every RL step, the trainer job pushes its new weights and the engine job
receives them into its existing parameter tensors, over a joint group of the two jobs
(:func:`meshcast.connect`). docs/weight-sync.md tells the workflow.

Built once on every rank of both jobs from what the rank holds (sync_spec.py): the descriptions
are exchanged through the joint group's store, matched, and planned once (:func:`meshcast.
plan_many`, cached), so the engine never needs stand-ins of the trainer's tensors. Each
:meth:`WeightSync.push` / :meth:`WeightSync.receive` pair is one :func:`meshcast.reshard_many` call
on the joint group, followed by a commit: every rank writes whether its part succeeded, and an
engine rank exposes the new version only once every rank of both jobs has (see
:meth:`WeightSync.receive`, ``atomic``). FP8 engine parameters: sync_fp8.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.names import Rule
from ..planning.many import DEFAULT_BUCKET_BYTES, plan_many
from ..runtime.errors import ReshardError
from ..runtime.interrupt import Deferral, deferred_interrupts
from ..runtime.joint import JointGroup
from ..runtime.many import last_many_stats, run_many
from .sync_fp8 import Fp8Block, combine, plan_fp8, scale_names, scale_targets, trainer_maker
from .sync_spec import (
    NameMap,
    Route,
    describe_record,
    dtensor_layout_problem,
    engine_whole,
    match_mapping,
    match_sides,
    merge_side,
    params_problem,
    shared_targets_problem,
    trainer_shard_problem,
)
from .sync_store import WeightSyncError, begin, commit, exchange, forget, version_problem

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


def _local(value: Any) -> Any:
    """This rank's local tensor of ``value`` (a tensor, an ``nn.Parameter`` or a DTensor), detached
    (the same storage); anything else as it is (the checks name it)."""
    if value is None or not isinstance(value, torch.Tensor):
        return value
    if not hasattr(value, "to_local"):
        return value.detach()
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
    (``name_map``: trainer name -> engine name; default the same names; or ``mapping``: engine
    name -> rule, :func:`meshcast.map_weights`'s, for fused and stacked engine tensors such as
    :func:`meshcast.llama_mapping`, the same on every rank) and planned once; any
    mismatch raises ``ValueError`` on every rank of both jobs, listing every problem. The wire
    carries the engine's dtype: each trainer shard is converted by ``convert`` (default: a cast);
    into an engine parameter in FP8 (``float8_e4m3fn``, ``float8_e5m2``) meshcast converts it,
    scaled per ``fp8_block`` (a block size such as ``(128, 128)``, None per tensor, or ``{engine
    name: block or None}``), exactly as the whole tensor, the engine declaring the scales as
    parameter ``name + "_scale_inv"`` in :func:`meshcast.scale_layout`'s layout (sync_fp8.py).
    ``bucket_bytes`` bounds each rank's staging of packed messages; ``timeout`` every wait;
    ``atomic`` (default) stages received shards and copies them into the parameters only once the
    sync succeeded everywhere (costs one copy of this engine rank's parameters, kept between
    syncs); ``version``: what the engine's parameters hold now (None: unknown; every push's
    version must be greater: docs/weight-sync.md, "Versions and atomicity").
    """

    def __init__(
        self, group: JointGroup, params: Mapping[str, Any], *, name_map: NameMap = None,
        mapping: Mapping[str, Rule] | None = None, convert: Convert | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float | None = None,
        atomic: bool = True, version: int | None = None, strategy: str | None = None,
        balance: str | None = None, fp8_block: Fp8Block = (128, 128),
    ) -> None:
        if not isinstance(group, JointGroup):
            raise TypeError(f"group must be a meshcast JointGroup (meshcast.connect), got "
                            f"{type(group).__name__}")
        self.group, self.role = group, group.role
        self.timeout = group.timeout if timeout is None else float(timeout)
        self.bucket_bytes, self.atomic, self.version = bucket_bytes, bool(atomic), version
        self.convert = _cast if convert is None else convert
        self.index = group.next_sync()  # this WeightSync's number on the group
        self.key = f"sync/{self.index}"
        self.steps = self._tidy = 0  # syncs begun; the first whose records are kept
        self._staging: dict[str, torch.Tensor] = {}
        records = exchange(group, f"{self.key}/describe",
                           describe_record(params, name_map, mapping, group.sizes[group.role]),
                           self.timeout)
        bad = [(j, r["error"]) for j, r in records.items() if "error" in r]
        if not bad:
            rules = {r["mapping"] for r in records.values()}
            bad = [] if len(rules) == 1 else [(min(records), _MAPPINGS_DIFFER)]
        if bad:
            raise ValueError(f"meshcast.WeightSync on {group.role} rank {group.rank}: "
                             f"{group.describe([bad[0][0]])}: {bad[0][1]}")
        self._described = records[group.me]["params"]  # this rank's, for its DTensors' layouts
        self._layouts: dict[tuple, str | None] = {}
        sides = {role: merge_side({j: records[j]["params"] for j in group.ranks(role)}, role)
                 for role in ("trainer", "engine")}
        offset, scales = group.offset("engine"), scale_names(sides["engine"])
        engine = {n: e for n, e in sides["engine"].items() if n not in scales}
        self.routes: list[Route] = self._agreed_routes(sides["trainer"], engine, offset,
                                                        name_map, mapping)
        self.dtypes = {n: spec["dtype"] for n, spec in sides["trainer"].items()}
        self.fp8 = plan_fp8(self.routes, sides["engine"], offset, fp8_block)
        self.plans = plan_many([r.task for r in self.routes], group.topology,
                               strategy=strategy, balance=balance)

    def _agreed_routes(self, trainer: dict, engine: dict, offset: int, name_map: NameMap,
                       mapping: Mapping[str, Rule] | None) -> list[Route]:
        """The routes (trainer tensor -> engine tensor), matched on every rank and compared
        through the store: name maps that differ between ranks (a function, or a dict given
        differently) would feed engine tensors from different trainer tensors, silently."""
        import hashlib

        routes, error = [], None
        try:
            routes = (match_sides(trainer, engine, offset, name_map) if mapping is None
                      else match_mapping(trainer, engine, offset, mapping))
        except (TypeError, ValueError) as exc:
            error = str(exc)
        digest = hashlib.sha256(repr([(r.source, r.target, r.piece) for r in routes])
                                .encode()).hexdigest()
        got = exchange(self.group, f"{self.key}/routes", {"routes": digest, "error": error},
                       self.timeout)
        if error is not None:  # (the same on every rank given the same mappings)
            raise ValueError(error)
        bad = [(j, r["error"]) for j, r in got.items() if r["error"]]
        if not bad and len({r["routes"] for r in got.values()}) > 1:
            differ = [j for j, r in got.items() if r["routes"] != got[min(got)]["routes"]]
            bad = [(differ[0], f"matched the trainer's tensors to the engine's differently "
                               f"from {self.group.describe([min(got)])}: {_MAPPINGS_DIFFER}")]
        if bad:
            raise ValueError(f"meshcast.WeightSync on {self.group.role} rank {self.group.rank}: "
                             f"{self.group.describe([bad[0][0]])}: {bad[0][1]}")
        return routes

    @property
    def names(self) -> list[str]:
        """The engine's tensor names, in sync order (each once)."""
        return list(dict.fromkeys(r.target for r in self.routes))

    def push(self, params: Mapping[str, Any], version: int) -> SyncResult:
        """Trainer ranks: send ``params`` (``{name: DTensor, or this rank's local shard}``, the
        names this rank holds) as ``version`` (an int, the same on every trainer rank, greater
        than the last version synced). Returns when every rank of both jobs has its part; raises
        :class:`WeightSyncError` (every rank) when the sync failed, ``ValueError`` (every rank,
        nothing sent) for bad inputs, a version against the rule included; Ctrl-C on any rank
        fails the sync on every rank at once (``KeyboardInterrupt`` on that rank)."""
        self._check_role("trainer", "push")
        me, local, errors = self.group.me, {}, params_problem(params, self.group.rank)
        readable = not errors  # a mapping: every shard's problem is found
        for k, route in enumerate(self.routes):
            if route.task.src_region(me) is not None and readable:
                local[k] = _local(params.get(route.source))
                why = trainer_shard_problem(local[k], route, self.dtypes[route.source], me) \
                    or self._layout_problem(params.get(route.source), route.source)
                if why is not None:
                    errors.append(f"params[{route.source!r}] {why} on trainer rank "
                                  f"{self.group.rank}")
        fp8, amax = {f.index: f for f in self.fp8}, {}
        shards = [None if local.get(k) is None
                  else trainer_maker(fp8[k], local[k], me, amax) if k in fp8
                  else self._maker(r.source, local[k], _dtype(r.task))
                  for k, r in enumerate(self.routes)]

        def prepare() -> None:  # the FP8 tensors' amax, before the weights move
            amax.update(combine(self.fp8, local, self.group, self.timeout)[0])

        return self._run(shards, [None] * len(shards), errors, version, "push", prepare)[0]

    def _maker(self, name: str, shard: torch.Tensor, dtype: torch.dtype):
        """The shard converted to the wire's dtype when the transfer first needs it (so the
        conversion of the next bucket overlaps the transfer of the current one)."""
        return lambda: self.convert(name, shard, dtype)

    def receive(self, params: Mapping[str, Any] | None = None) -> SyncResult:
        """Engine ranks: receive the next version into ``params`` (``{engine name: DTensor or
        this rank's local tensor}``) in place, or into fresh tensors when ``params`` is None
        (a fused or stacked tensor's fresh shard is made on the CPU).
        With ``atomic`` the parameters change only once every rank of both jobs succeeded: they
        hold the previous version or the new one, never a mix; a failed sync raises
        :class:`WeightSyncError` on every rank, saying which version the parameters hold."""
        self._check_role("engine", "receive")
        me, targets = self.group.me, {}
        errors = [] if params is None else params_problem(params, self.group.rank)
        params = params if not errors else None  # (reported: fresh tensors, never filled)
        for route in self.routes:
            if route.task.dst_region(me) is None or route.target in targets:
                continue
            target = None if params is None else _local(params.get(route.target))
            why = None if params is None else self._layout_problem(params.get(route.target),
                                                                   route.target)
            if params is not None and target is None:
                errors.append(f"params[{route.target!r}] is missing on engine rank "
                              f"{self.group.rank}, which receives part of it")
            elif why is not None:
                errors.append(f"params[{route.target!r}] {why}")
            elif route.piece is not None:
                target = engine_whole(route, target, me, self.group.rank, errors)
            targets[route.target] = target
        scales = scale_targets(self.fp8, params, me, self.group.rank, _local, errors)
        targets.update(scales)
        if params is not None:
            errors += shared_targets_problem(targets, self.routes, self.group.rank)
        into = self._stage(targets) if self.atomic and params is not None else targets

        def prepare() -> None:  # the FP8 tensors' scales, from the amax exchange
            fp8 = {f.index: f for f in self.fp8}
            for k, value in combine(self.fp8, {}, self.group, self.timeout)[1].items():
                if into.get(fp8[k].scale) is not None:
                    fp8[k].view(into[fp8[k].scale], me).copy_(value)

        outs = [None if r.task.dst_region(me) is None or into.get(r.target) is None
                else into[r.target] if r.piece is None else r.piece.dst_view(into[r.target], me)
                for r in self.routes]
        def apply() -> None:  # the commit: every rank of both jobs succeeded (SIGINT deferred)
            for name, target in targets.items():
                if params is not None and target is not None and into[name] is not target:
                    target.copy_(into[name])

        result, got = self._run([None] * len(outs), outs, errors, None, "receive", prepare,
                                apply)
        for route, fresh in zip(self.routes, got):
            if route.target in targets:  # the caller's own object (a DTensor stays one)
                result.tensors[route.target] = (
                    params[route.target] if params is not None else
                    fresh if route.piece is None else targets[route.target])
        for name in scales:
            result.tensors[name] = targets[name] if params is None else params[name]
        return result

    def _layout_problem(self, value: Any, name: str) -> str | None:
        """Why DTensor ``value`` cannot be this rank's ``name`` as described (None: it can);
        found once per name, mesh, placements and shape (the same DTensors every sync)."""
        if not hasattr(value, "device_mesh"):
            return None
        key = (name, value.device_mesh, tuple(value.placements), tuple(value.shape))
        if key not in self._layouts:
            why = dtensor_layout_problem(value, self._described.get(name), self.group.rank)
            self._layouts[key] = None if why is None else \
                f"{why} on {self.role} rank {self.group.rank}"
        return self._layouts[key]

    def _stage(self, targets: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        """Staging buffers for ``targets`` (made once, kept between syncs)."""
        def same(name: str, t: torch.Tensor | None) -> bool:
            s = self._staging.get(name)
            return t is None or (s is not None and s.shape == t.shape and s.dtype == t.dtype
                                 and s.device == t.device)

        if not all(same(n, t) for n, t in targets.items()):
            self._staging = {n: torch.empty_like(t, memory_format=torch.contiguous_format)
                             for n, t in targets.items() if t is not None}
        return {n: None if t is None else self._staging[n] for n, t in targets.items()}

    def _run(self, shards: list, outs: list, errors: list[str], version: object,
             what: str, prepare: Callable[[], None], apply: Callable[[], None] | None = None,
             ) -> tuple[SyncResult, list[torch.Tensor | None]]:
        """One sync on this rank: begin, the transfer, the commit, then ``apply`` (the engine's
        copy into its parameters), SIGINT deferred throughout: Ctrl-C fails the sync on every
        rank (unless it had succeeded everywhere) and raises ``KeyboardInterrupt`` here."""
        step, self.steps = self.steps, self.steps + 1
        caller = f"meshcast.WeightSync.{what}"
        with deferred_interrupts() as sigint:
            try:
                result, results = self._sync(step, shards, outs, errors, version, caller,
                                             prepare, sigint)
            except (ValueError, WeightSyncError) as exc:
                self.group.failed.update(getattr(exc, "failed", ()))  # (disconnect skips them)
                if sigint.hit:
                    raise KeyboardInterrupt(str(exc)) from exc
                raise
            if apply is not None:
                apply()
            self.version = result.version  # what the engine's parameters hold now
            if sigint.hit:
                raise KeyboardInterrupt(
                    f"{caller} on {self.role} rank {self.group.rank} was interrupted (SIGINT, "
                    f"Ctrl-C) once the sync of version {result.version} had succeeded on every "
                    f"rank of both jobs: the engine's parameters hold version {result.version}")
        return result, results

    def _sync(self, step: int, shards: list, outs: list, errors: list[str], version: object,
              caller: str, prepare: Callable[[], None], sigint: Deferral,
              ) -> tuple[SyncResult, list[torch.Tensor | None]]:
        key, me = f"{self.key}/step/{step}", self.group.describe([self.group.me])
        bad = isinstance(version, bool) or not isinstance(version, int)
        mine = {"last": self.version, "version": None if bad else version,
                "sync": [self.index, step], "error": f"version must be an int, got "
                f"{type(version).__name__}" if bad and self.role == "trainer" else None}
        number, first = self.group.next_begin()  # met by any WeightSync of the group
        records = begin(self.group, f"sync/begin/{number}", mine, self.timeout, self._kept(),
                        caller, lambda: sigint.hit)
        for old in range(first, number):  # every rank is done with the syncs before
            forget(self.group, f"sync/begin/{old}", ("decision",))
        for old in range(self._tidy, step):
            forget(self.group, f"{self.key}/step/{old}")
        self.group.begun_tidy(number)
        self._tidy = step
        # another WeightSync or step on some rank: refused by the transfer's agreement, named
        alike = len({tuple(r["sync"]) for r in records.values()}) == 1
        problem = version_problem(self.group, records) if alike else None
        if problem is not None:
            raise ValueError(f"{caller} on {self.role} rank {self.group.rank}: {problem}; "
                             f"nothing was sent: {self._kept()}")
        failure: ReshardError | None = None
        started = time.perf_counter()
        try:
            if self.fp8:
                prepare()
            if sigint.hit:  # refused on every rank: nothing moves
                errors.insert(0, f"{me} was interrupted (KeyboardInterrupt: SIGINT, Ctrl-C) "
                                 f"before the transfer")
            results = run_many(shards, self.plans, bucket_bytes=self.bucket_bytes,
                               timeout=self.timeout, names=[r.label for r in self.routes],
                               errors=errors, out=outs, group=self.group, caller=caller,
                               overlap=True,
                               sync=f"WeightSync #{self.index} of the group, sync #{step}")
        except ValueError as exc:  # refused on every rank before anything moved
            raise ValueError(f"{exc} (the engine's parameters keep version {self.version}; "
                             f"{self.group.legend()})") from None
        except ReshardError as exc:
            failure, results = exc, outs
        except KeyboardInterrupt as exc:  # interrupted in the transfer: its failure, on the board
            if not isinstance(exc.__cause__, ReshardError):
                raise
            failure, results = exc.__cause__, outs
        if failure is None and sigint.hit:
            failure = ReshardError(f"{me} was interrupted (KeyboardInterrupt: SIGINT, Ctrl-C) "
                                   f"at the end of its transfers", (self.group.me,),
                                   (self.group.me,))
        moved = time.perf_counter()
        version = commit(self.group, key, mine["version"], failure, self.timeout, self._kept(),
                         caller, lambda: sigint.hit)
        staged = sum(t.numel() * t.element_size() for t in self._staging.values())
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


_MAPPINGS_DIFFER = ("the ranks were given different name mappings (WeightSync's mapping must be "
                    "the same on every rank of both jobs)")


def _dtype(task: Any) -> torch.dtype:
    from ..runtime.tensors import torch_dtype

    return torch_dtype(task.dtype)

