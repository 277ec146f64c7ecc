"""The pipeline runtime: stages on meshes of ranks, boundary tensors moved by meshcast plans.

Imports torch (``import meshcast.pipeline`` does not import this module). Every rank of the
default ``torch.distributed`` group builds one :class:`PipelineRuntime` with the same arguments
(except ``stage_module``, its own stage or None) and calls :meth:`PipelineRuntime.train_step`
once per training step; see docs/pipeline.md ("Pipeline runtime") for the design.

In short, per rank:

- **Compute thread** (the caller's): runs the actions of its stage in the order of the clock table
  (``schedule(name, n, m).actions(stage)``). A forward takes the stage's data inputs and the
  tensors received for that microbatch (each a fresh leaf that requires grad), runs the stage
  (tensor-parallel inside, its collectives on a gloo group of the stage's mesh), and hands every
  tensor it sends to the communication thread; the last stage adds ``loss_fn(out, target) / m``.
  A backward runs autograd from the stage's outputs with the gradients received for them and
  hands the gradients of the stage's received tensors back the same way.
- **Communication threads** (two per step): one runs every activation transfer this rank takes
  part in, the other every gradient transfer, each one after another in one global order that
  every rank derives from the clock table (by the clock at which the tensor is produced). Each
  transfer is one ``meshcast.reshard`` of one tensor for one microbatch, from the sending stage's
  mesh and layout to the receiving stage's: activations forward along the graph's edges on a
  process group of their own, their gradients backward along the same edges on another. A send
  starts as soon as the tensor exists (and the transfers before it in its thread are done) and
  runs while the compute thread goes on; with ``overlap=False`` the compute thread waits for its
  forward sends instead (gradient sends are waited for unless ``overlap_backward=True``).

Process groups: tensor-parallel collectives run on one gloo group per stage mesh, activations on
one group spanning all ranks, gradients on another, all created by every rank in the same order
when the runtime is built; gloo pairs messages per group, so the three kinds of traffic never mix
even when they run at the same time. The order cannot deadlock: the earliest unfinished transfer
(by production clock, over both threads) has all its ranks' thread of its kind at it, and its
producer only waits for transfers that come earlier.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..planning.planner import STRATEGIES, plan
from ..runtime import ReshardError, reshard
from .graph import StageGraph, TensorEdge
from .schedules import schedule as make_schedule

__all__ = [
    "PipelineError",
    "PipelineRuntime",
    "StepResult",
    "tensor_parallel_group",
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


_tp_groups: dict[tuple[object, str, tuple[int, ...]], dist.ProcessGroup] = {}
_runtime_ids = itertools.count()


def tensor_parallel_group(ranks: Sequence[int], timeout: float = 120.0, purpose: str = "tp"
                          ) -> dist.ProcessGroup:
    """A gloo group of ``ranks`` for one kind of traffic (``purpose``: tensor-parallel
    collectives, activations, gradients), distinct from every other group. Every rank of the
    default group must call this with the same arguments in the same order
    (``dist.new_group``); groups are cached per (purpose, ranks)."""
    key = (dist.group.WORLD, purpose, tuple(ranks))
    if key not in _tp_groups:
        _tp_groups[key] = dist.new_group(
            list(ranks), timeout=datetime.timedelta(seconds=timeout)
        )
    return _tp_groups[key]


@dataclass
class _Slot:
    """One tensor handed between the compute and the communication thread."""

    ready: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    value: torch.Tensor | None = None


@dataclass(frozen=True)
class _Transfer:
    """One boundary tensor of one microbatch in one direction."""

    order: tuple[int, ...]
    kind: str  # "F": activation from edge.src to edge.dst; "B": its gradient back
    edge: TensorEdge
    microbatch: int
    plan: Plan
    sender: Mesh
    receiver: Mesh
    send_layout: Layout
    gather: Plan | None  # receiver side: its layout -> replicated on its mesh (None: replicated)


def _replicated(ndim: int) -> str:
    return "R" * ndim


class PipelineRuntime:
    """A model split into stages, each on its own mesh, trained with a pipeline schedule.

    Construct on every rank of the default process group, in the same order on every rank, with
    the same arguments except ``stage_module``:

    - ``stage_module``: this rank's stage (an ``nn.Module`` taking and returning ``{name:
      tensor}``, tensor-parallel over its mesh if the mesh has several ranks, each rank holding
      the full input and output tensors), or None on a rank in no mesh;
    - ``graph``: what the stages exchange, shapes per microbatch;
    - ``meshes``: one mesh per stage (disjoint); a rank's position in its mesh is its
      tensor-parallel rank;
    - ``schedule``: ``"gpipe"``, ``"1f1b"`` or ``"eager_1f1b"``; ``num_microbatches``: ``m``;
    - ``strategy``: the meshcast strategy of every boundary plan (``"send_recv"``,
      ``"allgather"``, ``"broadcast"``); ``topology``: which ranks share a host (planning);
    - ``layouts``: ``{edge name: (spec on the sender's mesh, spec on the receiver's mesh)}``,
      default replicated on both; the activation goes from the first to the second, its gradient
      from the second to the first. The sending side slices its shard out of the full tensor; a
      receiving side that is not replicated is completed by a second reshard inside its mesh;
    - ``loss_fn(output, target)``: the loss of one microbatch on the last stage;
    - ``overlap``: forward sends run in the background (False: the compute thread waits for each);
      ``overlap_backward``: same for gradient sends (default False, as in the paper);
    - ``free_communication``: replace every boundary tensor by a 1-byte message (the "signal"
      send/recv of the paper): the dependencies stay, the data does not move; receivers compute
      on stand-in tensors of the right shape. For measuring the free-communication bound only;
    - ``timeout``: seconds any wait may take before :class:`PipelineError` (or
      :class:`meshcast.ReshardError`) names the ranks waited for.
    """

    def __init__(
        self,
        stage_module: nn.Module | None,
        graph: StageGraph,
        meshes: Sequence[Mesh],
        *,
        schedule: str,
        num_microbatches: int,
        strategy: str = "broadcast",
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        topology: Topology | None = None,
        layouts: Mapping[str, tuple[str, str]] | None = None,
        overlap: bool = True,
        overlap_backward: bool = False,
        free_communication: bool = False,
        timeout: float = 60.0,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("PipelineRuntime needs torch.distributed initialised (gloo)")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy={strategy!r} is unknown; choose one of {STRATEGIES}")
        if len(meshes) != graph.num_stages:
            raise ValueError(f"got {len(meshes)} meshes for {graph.num_stages} stages")
        seen: set[int] = set()
        for i, mesh in enumerate(meshes):
            if seen & set(mesh.devices):
                raise ValueError(f"the mesh of stage {i} overlaps another stage's mesh")
            seen |= set(mesh.devices)
        world = dist.get_world_size()
        if max(seen) >= world:
            raise ValueError(f"meshes use rank {max(seen)}, the default group has {world} ranks")
        self.rank = dist.get_rank()
        self.graph = graph
        self.meshes = tuple(meshes)
        self.num_stages = graph.num_stages
        self.num_microbatches = num_microbatches
        self.table = make_schedule(schedule, graph.num_stages, num_microbatches)
        self.strategy = strategy
        self.loss_fn = loss_fn
        self.overlap = overlap
        self.overlap_backward = overlap_backward
        self.free_communication = free_communication
        self.timeout = float(timeout)
        self.topology = topology if topology is not None else Topology.uniform(1, world)
        self.stage: int | None = next(
            (i for i, m in enumerate(meshes) if self.rank in m), None
        )
        if (self.stage is None) != (stage_module is None):
            where = "in no mesh" if self.stage is None else f"on stage {self.stage}"
            raise ValueError(f"rank {self.rank}: stage_module must be given exactly on the ranks "
                             f"of a mesh (this rank is {where})")
        self.module = stage_module
        self.id = next(_runtime_ids)
        self._abort_key = f"meshcast/pipeline/{self.id}/abort"
        try:
            self._store = dist.distributed_c10d._get_default_store()
        except Exception:  # a private API: without it, failures travel through timeouts only
            self._store = None
        layouts = dict(layouts or {})
        unknown = set(layouts) - {e.name for e in graph.edges}
        if unknown:
            raise ValueError(f"layouts name edges the graph does not have: {sorted(unknown)}")
        self._layouts = layouts
        # tensor-parallel groups: every rank creates every stage's group, in stage order
        self.tp_group: dist.ProcessGroup | None = None
        for i, mesh in enumerate(meshes):
            if mesh.size > 1:
                g = tensor_parallel_group(mesh.devices, self.timeout)
                if i == self.stage:
                    self.tp_group = g
        # boundary traffic: one group (all ranks, so group ranks are global ranks) per direction
        self._groups = {
            kind: tensor_parallel_group(range(world), self.timeout, purpose)
            for kind, purpose in (("F", "activations"), ("B", "gradients"))
        }
        self._transfers = self._build_transfers()
        self._mine = {
            kind: [t for t in self._transfers if t.kind == kind and self.rank in t.plan.ranks]
            for kind in ("F", "B")
        }
        self._param_storages = (
            {p.untyped_storage().data_ptr() for p in stage_module.parameters()}
            if stage_module is not None else set()
        )
        self._standins: dict[tuple[str, str, int], torch.Tensor] = {}

    def set_module(self, stage_module: nn.Module) -> None:
        """Replace this rank's stage module (e.g. one built after the runtime, with its
        :attr:`tp_group`)."""
        if self.stage is None:
            raise ValueError(f"rank {self.rank} is in no stage's mesh")
        self.module = stage_module
        self._param_storages = {p.untyped_storage().data_ptr() for p in stage_module.parameters()}

    # -- planning ---------------------------------------------------------------------------
    @property
    def tp_rank(self) -> int:
        """This rank's position in its stage's mesh (0 on a rank in no mesh)."""
        return 0 if self.stage is None else self.meshes[self.stage].devices.index(self.rank)

    @property
    def tp_size(self) -> int:
        """Ranks of this rank's stage (1 on a rank in no mesh)."""
        return 1 if self.stage is None else self.meshes[self.stage].size

    def _specs(self, edge: TensorEdge) -> tuple[str, str]:
        default = _replicated(len(edge.shape))
        return self._layouts.get(edge.name, (default, default))

    def _build_transfers(self) -> list[_Transfer]:
        table, m = self.table, self.num_microbatches
        out: list[_Transfer] = []
        plans: dict[tuple, Plan] = {}

        def planned(task: ReshardTask) -> Plan:
            key = (task.shape, task.dtype, task.src, task.dst)
            if key not in plans:
                plans[key] = plan(task, self.topology, strategy=self.strategy)
            return plans[key]

        for index, edge in enumerate(self.graph.edges):
            src_spec, dst_spec = self._specs(edge)
            a, b = self.meshes[edge.src], self.meshes[edge.dst]
            for kind, (s_mesh, s_spec, r_mesh, r_spec) in (
                ("F", (a, src_spec, b, dst_spec)),
                ("B", (b, dst_spec, a, src_spec)),
            ):
                send_layout = Layout(s_mesh, s_spec)
                if self.free_communication:
                    task = ReshardTask((1,), "uint8", Layout(s_mesh, "R"), Layout(r_mesh, "R"))
                    gather = None
                else:
                    recv_layout = Layout(r_mesh, r_spec)
                    task = ReshardTask(edge.shape, edge.dtype, send_layout, recv_layout)
                    full = _replicated(len(edge.shape))
                    gather = None if r_spec == full else planned(
                        ReshardTask(edge.shape, edge.dtype, recv_layout, Layout(r_mesh, full)))
                producer = edge.src if kind == "F" else edge.dst
                for mb in range(m):
                    clock = table.clock_of(producer, _action(kind, mb))
                    out.append(_Transfer(
                        (clock, producer, index, 0 if kind == "F" else 1, mb), kind, edge, mb,
                        planned(task), s_mesh, r_mesh, send_layout, gather,
                    ))
        out.sort(key=lambda t: t.order)
        return out

    # -- waiting ----------------------------------------------------------------------------
    def _remote_abort(self) -> str | None:
        if self._store is None:
            return None
        try:
            if self._store.check([self._abort_key]):
                return self._store.get(self._abort_key).decode(errors="replace")
        except Exception:
            return None
        return None

    def _publish_abort(self, text: str) -> None:
        if self._store is None:
            return
        with contextlib.suppress(Exception):  # the first failure wins: later ones follow from it
            self._store.compare_set(self._abort_key, "", text)

    def _abort_reason(self) -> str | None:
        """Why this step was given up (here, or on another rank), or None: handed to the
        boundary reshards so that their input agreement stops at once."""
        if self._abort.is_set():
            return (f"rank {self.rank} (stage {self.stage}) gave up the step: "
                    f"{self._errors[0] if self._errors else 'aborted'}")
        now = time.monotonic()
        if now >= self._next_remote:
            self._next_remote = now + REMOTE_POLL_S
            remote = self._remote_abort()
            if remote is not None:
                return f"rank {self.rank} (stage {self.stage}) gave up the step, because {remote}"
        return None

    def _wait(self, event: threading.Event, what: str, ranks: Sequence[int]) -> None:
        """Wait for ``event`` at most ``timeout``; raise early if this step aborts anywhere."""
        deadline = time.monotonic() + self.timeout
        next_remote = time.monotonic() + REMOTE_POLL_S
        while not event.wait(POLL_S):
            if self._abort.is_set():
                raise PipelineError(
                    f"rank {self.rank} (stage {self.stage}): gave up waiting for {what}: "
                    f"{self._errors[0] if self._errors else 'aborted'}", ranks)
            now = time.monotonic()
            if now >= next_remote:
                next_remote = now + REMOTE_POLL_S
                remote = self._remote_abort()
                if remote is not None:
                    self._errors.append(PipelineError(remote))
                    self._abort.set()
                    raise PipelineError(
                        f"rank {self.rank} (stage {self.stage}): gave up waiting for {what}, "
                        f"because {remote}", ranks)
            if now > deadline:
                raise PipelineError(
                    f"rank {self.rank} (stage {self.stage}): waited more than {self.timeout:g} s "
                    f"for {what} (ranks involved: {sorted(ranks)})", ranks)

    # -- communication thread ---------------------------------------------------------------
    def _standin(self, kind: str, edge: TensorEdge) -> torch.Tensor:
        key = (kind, edge.name, edge.src)
        if key not in self._standins:
            g = torch.Generator().manual_seed(len(self._standins) + 1)
            self._standins[key] = torch.randn(edge.shape, generator=g).to(
                getattr(torch, edge.dtype))
        return self._standins[key]

    def _communicate(self, kind: str) -> None:
        group = self._groups[kind]
        try:
            for t in self._mine[kind]:
                key = (t.kind, t.edge.name, t.edge.src, t.microbatch)
                if self.rank in t.sender:
                    slot = self._outbox[key]
                    self._wait(slot.ready, f"its own {_what(t)} to be computed", [self.rank])
                    if self.free_communication:
                        local = torch.ones(1, dtype=torch.uint8)
                    else:
                        full = slot.value
                        assert full is not None
                        local = full[t.send_layout.box(self.rank, t.edge.shape)]
                    reshard(local, t.plan, group=group, timeout=self.timeout,
                            _abort=self._abort_reason)
                    slot.value = None
                    slot.done.set()
                else:
                    got = reshard(None, t.plan, group=group, timeout=self.timeout,
                                  _abort=self._abort_reason)
                    if self.free_communication:
                        got = self._standin(t.kind, t.edge).clone()
                    elif t.gather is not None:
                        got = reshard(got, t.gather, group=group, timeout=self.timeout,
                                      _abort=self._abort_reason)
                    slot = self._inbox[key]
                    slot.value = got
                    slot.ready.set()
                with self._lock:
                    self._count += 1
        except BaseException as exc:  # handed to the compute thread
            if not self._abort.is_set():
                text = (f"rank {self.rank} (stage {self.stage}) failed in a boundary transfer: "
                        f"{type(exc).__name__}: {exc}")
                self._errors.append(exc)
                self._publish_abort(text)
            self._abort.set()

    # -- the step ---------------------------------------------------------------------------
    def train_step(
        self,
        inputs: Mapping[str, torch.Tensor],
        target: torch.Tensor | None = None,
    ) -> StepResult:
        """Run the forward and backward of every microbatch of one batch; gradients accumulate
        in the stage's parameters (the caller zeroes them and steps its optimizer).

        ``inputs``: the whole batch of each data input of the graph (only this rank's stage's are
        used); ``target``: the whole batch's target (used on the last stage). Both are cut into
        ``num_microbatches`` equal microbatches along dimension 0.
        """
        if self.stage is None:
            return StepResult(None)
        self._abort = threading.Event()
        self._next_remote = time.monotonic() + REMOTE_POLL_S
        self._errors: list[BaseException] = []
        self._count = 0
        self._lock = threading.Lock()
        mine = self._mine["F"] + self._mine["B"]
        self._inbox = {
            (t.kind, t.edge.name, t.edge.src, t.microbatch): _Slot()
            for t in mine if self.rank in t.receiver
        }
        self._outbox = {
            (t.kind, t.edge.name, t.edge.src, t.microbatch): _Slot()
            for t in mine if self.rank in t.sender
        }
        threads = [
            threading.Thread(target=self._communicate, args=(kind,), daemon=True,
                             name=f"meshcast-pipeline-{kind}-{self.rank}")
            for kind in ("F", "B")
        ]
        for thread in threads:
            thread.start()
        try:
            result = self._run(inputs, target)
            deadline = time.monotonic() + self.timeout
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            if any(thread.is_alive() for thread in threads):
                raise PipelineError(
                    f"rank {self.rank} (stage {self.stage}): boundary transfers still running "
                    f"{self.timeout:g} s after the last action", [self.rank])
            if self._abort.is_set():
                raise PipelineError(
                    f"rank {self.rank} (stage {self.stage}): "
                    f"{self._errors[0] if self._errors else 'aborted'}", [self.rank])
        except BaseException as exc:
            if not self._abort.is_set():
                self._publish_abort(
                    f"rank {self.rank} (stage {self.stage}) failed: {type(exc).__name__}: {exc}")
            self._abort.set()
            # the communication threads stop at once (their reshards see the abort) or within
            # one transfer's timeout: none may outlive the step (clean exit)
            deadline = time.monotonic() + self.timeout
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            if isinstance(exc, ReshardError | PipelineError | ValueError | TypeError):
                raise
            raise PipelineError(
                f"rank {self.rank} (stage {self.stage}) failed: {type(exc).__name__}: {exc}",
                [self.rank]) from exc
        result.transfers = self._count
        return result

    def _run(self, inputs: Mapping[str, torch.Tensor], target: torch.Tensor | None
             ) -> StepResult:
        i, m, graph = self.stage, self.num_microbatches, self.graph
        assert i is not None and self.module is not None
        last = i == self.num_stages - 1
        data = {a: inputs[a].chunk(m) for a, s in graph.inputs if s == i}
        for name, parts in data.items():
            if len(parts) != m:
                raise ValueError(f"input {name!r} does not split into {m} microbatches")
        targets = target.chunk(m) if last and target is not None else None
        outputs = [a for a, s in graph.outputs if s == i]
        sends, receives = graph.sends(i), graph.receives(i)
        kept: dict[int, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}
        saved: dict[int, int] = {}
        result = StepResult(0.0 if last else None)
        inflight = 0
        for action in self.table.actions(i):
            b = action.microbatch
            if action.is_forward:
                t0 = time.perf_counter()
                received = {}
                for e in receives:
                    slot = self._inbox[("F", e.name, e.src, b)]
                    self._wait(slot.ready, f"{e.name} of microbatch {b} from stage {e.src} "
                               f"(ranks {self.meshes[e.src].devices})", self.meshes[e.src].devices)
                    received[e.name] = slot.value.requires_grad_()
                    slot.value = None
                t1 = time.perf_counter()
                storages: dict[int, int] = {}
                with torch.autograd.graph.saved_tensors_hooks(
                        self._packer(storages), lambda x: x):
                    out = self.module({**{a: p[b] for a, p in data.items()}, **received})
                    loss = None
                    if last:
                        if targets is None:
                            raise ValueError("the last stage needs target")
                        loss = self.loss_fn(out[outputs[0]], targets[b]) / m
                t2 = time.perf_counter()
                for e in sends:
                    tensor = out[e.name]
                    if tuple(tensor.shape) != e.shape:
                        raise ValueError(f"stage {i} produced {e.name} of shape "
                                         f"{tuple(tensor.shape)}, the graph says {e.shape}")
                    slot = self._outbox[("F", e.name, e.src, b)]
                    slot.value = tensor.detach()
                    slot.ready.set()
                if not self.overlap:
                    for e in sends:
                        slot = self._outbox[("F", e.name, e.src, b)]
                        self._wait(slot.done, f"the send of {e.name} of microbatch {b}",
                                   self.meshes[e.dst].devices)
                if loss is not None:
                    result.loss += float(loss.detach())
                kept[b] = (received, {**out, **({"loss": loss} if loss is not None else {})})
                saved[b] = sum(storages.values())
                inflight += saved[b]
                result.peak_activation_bytes = max(result.peak_activation_bytes, inflight)
                result.compute_s += t2 - t1
                result.wait_s += (t1 - t0) + (time.perf_counter() - t2)
            else:
                t0 = time.perf_counter()
                received, out = kept.pop(b)
                if last:
                    grads_for = [out["loss"]]
                    grads: list[torch.Tensor | None] = [None]
                else:
                    grads_for, grads = [], []
                    for e in sends:
                        slot = self._inbox[("B", e.name, e.src, b)]
                        self._wait(slot.ready, f"the gradient of {e.name} of microbatch {b} from "
                                   f"stage {e.dst}", self.meshes[e.dst].devices)
                        grads_for.append(out[e.name])
                        grads.append(slot.value)
                        slot.value = None
                t1 = time.perf_counter()
                torch.autograd.backward(grads_for, grads)
                t2 = time.perf_counter()
                for e in receives:
                    g = received[e.name].grad
                    slot = self._outbox[("B", e.name, e.src, b)]
                    slot.value = g if g is not None else torch.zeros(e.shape)
                    slot.ready.set()
                if not self.overlap_backward:
                    for e in receives:
                        slot = self._outbox[("B", e.name, e.src, b)]
                        self._wait(slot.done, f"the send of the gradient of {e.name} of "
                                   f"microbatch {b}", self.meshes[e.src].devices)
                inflight -= saved.pop(b)
                del received, out, grads_for, grads
                result.compute_s += t2 - t1
                result.wait_s += (t1 - t0) + (time.perf_counter() - t2)
        return result

    def _packer(self, storages: dict[int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
        params = self._param_storages

        def pack(t: torch.Tensor) -> torch.Tensor:
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if ptr not in params:
                storages[ptr] = s.nbytes()
            return t

        return pack


def _action(kind: str, microbatch: int):
    from .schedules import Action

    return Action(kind, microbatch)


def _what(t: _Transfer) -> str:
    name = t.edge.name if t.kind == "F" else f"gradient of {t.edge.name}"
    return f"{name} of microbatch {t.microbatch}"
