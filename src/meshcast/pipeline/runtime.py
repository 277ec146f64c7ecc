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

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..core.mesh import Mesh
from ..core.topology import Topology
from ..runtime import ReshardError
from ..runtime.board import calls_by_plan_ranks
from ..runtime.tensors import torch_dtype
from .exchange import BoundaryExchange
from .graph import StageGraph, TensorEdge, check_stages
from .process_groups import default_store, tensor_parallel_group
from .schedules import schedule as make_schedule
from .step_state import (
    Microbatches,
    PipelineError,
    StepAbort,
    StepResult,
    agree_arguments,
    arguments_key,
    own_stage,
    refuse_arguments,
)
from .transfers import build_transfers

__all__ = [
    "PipelineError",
    "PipelineRuntime",
    "StepResult",
    "tensor_parallel_group",
]

_runtime_ids = itertools.count()
_spent = [0]  # runtimes of this process that gave up a step (PipelineRuntime._make_groups)


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
        world, self.rank = dist.get_world_size(), dist.get_rank()
        # numbered first: a rank that refuses its arguments counts the runtime as its peers do
        self.id = next(_runtime_ids)
        self._store = default_store()
        try:
            layouts = dict(layouts or {})
            check_stages(graph, meshes, strategy, world, layouts)
            self.table = make_schedule(schedule, graph.num_stages, num_microbatches)
            self.stage = own_stage(self.rank, meshes, stage_module, timeout)
        except (TypeError, ValueError) as exc:  # told to the peers, which wait for this rank
            refuse_arguments(self._store, arguments_key(self.id), self.rank, exc)
            raise
        self.graph = graph
        self.meshes = tuple(meshes)
        self.num_stages = graph.num_stages
        self.num_microbatches = num_microbatches
        self.strategy = strategy
        self.loss_fn = loss_fn
        self.overlap = overlap
        self.overlap_backward = overlap_backward
        self.free_communication = free_communication
        self.timeout = float(timeout)
        self.topology = topology if topology is not None else Topology.uniform(1, world)
        self._steps = 0  # train_step calls so far (each step has its own abort key)
        self._gave_up: str | None = None  # why a step failed: the runtime is spent
        self._layouts = layouts
        self._make_groups(world, {
            "schedule": schedule, "num_microbatches": num_microbatches, "strategy": strategy,
            "free_communication": free_communication, "graph": repr(graph),
            "meshes": [m.devices for m in meshes], "layouts": sorted(layouts.items()),
            "topology": repr(self.topology)})
        self._transfers = build_transfers(graph, self.meshes, self.table, layouts, self.topology,
                                          strategy, free_communication)
        self._exchange = BoundaryExchange(
            self.rank, self._transfers, self._groups, self.timeout, free_communication)
        self.module = stage_module
        self._param_storages: set[int] = set()
        if stage_module is not None:
            self.set_module(stage_module)

    def _make_groups(self, world: int, arguments: dict) -> None:
        """Agree on ``arguments`` with every rank (:func:`agree_arguments`), then make the
        tensor-parallel groups and the boundary groups of the generation that every rank's count
        of runtimes that gave up a step gives (their boundary groups' call numbers may differ
        between ranks, so a later runtime takes new ones)."""
        generation = max(agree_arguments(self._store, arguments_key(self.id), self.rank, world,
                                         arguments, self.timeout, extra=_spent[0]))
        # tensor-parallel groups: every rank creates every stage's group, in stage order
        self.tp_group: dist.ProcessGroup | None = None
        for i, mesh in enumerate(self.meshes):
            if mesh.size > 1:
                g = tensor_parallel_group(mesh.devices, self.timeout)
                if i == self.stage:
                    self.tp_group = g
        # boundary traffic: one group (all ranks, so group ranks are global ranks) per direction
        self._groups = {
            kind: tensor_parallel_group(range(world), self.timeout, f"{purpose} #{generation}")
            for kind, purpose in (("F", "activations"), ("B", "gradients"))
        }
        for group in self._groups.values():  # each transfer is made by its stages' ranks only
            calls_by_plan_ranks(group)

    def set_module(self, stage_module: nn.Module) -> None:
        """Replace this rank's stage module (e.g. one built after the runtime, with its
        :attr:`tp_group`)."""
        if self.stage is None:
            raise ValueError(f"rank {self.rank} is in no stage's mesh")
        self.module = stage_module
        self._param_storages = {p.untyped_storage().data_ptr() for p in stage_module.parameters()}

    @property
    def tp_rank(self) -> int:
        """This rank's position in its stage's mesh (0 on a rank in no mesh)."""
        return 0 if self.stage is None else self.meshes[self.stage].devices.index(self.rank)

    @property
    def tp_size(self) -> int:
        """Ranks of this rank's stage (1 on a rank in no mesh)."""
        return 1 if self.stage is None else self.meshes[self.stage].size

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
        step, self._steps = self._steps, self._steps + 1
        abort = self._step = StepAbort(self.rank, self.stage, self._store,
                                       f"meshcast/pipeline/{self.id}/abort/{step}", self.timeout)
        if self._gave_up is not None:
            raise PipelineError(
                f"{abort.who}: this PipelineRuntime gave up an earlier step "
                f"({self._gave_up:.300}); the ranks' boundary transfers may have stopped at "
                f"different points, so they cannot be matched again: build a new "
                f"PipelineRuntime on every rank", [self.rank])
        threads = self._exchange.start(abort)
        try:
            result = self._run(inputs, target)
            self._join(threads)
            if any(thread.is_alive() for thread in threads):
                raise PipelineError(
                    f"{abort.who}: boundary transfers still running "
                    f"{self.timeout:g} s after the last action", [self.rank])
            if abort.event.is_set():
                raise PipelineError(f"{abort.who}: {abort.first_error()}", [self.rank])
        except BaseException as exc:
            if self._gave_up is None:
                _spent[0] += 1  # the next runtime of this process takes new boundary groups
            self._gave_up = f"step {step}: {type(exc).__name__}: {exc}"
            if not abort.event.is_set():
                abort.errors.append(exc)  # what this rank's threads tell their peers
                abort.publish(f"{abort.who} failed: {type(exc).__name__}: {exc}")
            abort.event.set()
            # the communication threads stop at once (their reshards see the abort) or within
            # one transfer's timeout: none may outlive the step (clean exit)
            self._join(threads)
            if isinstance(exc, ReshardError | PipelineError | ValueError | TypeError):
                raise
            raise PipelineError(f"{abort.who} failed: {type(exc).__name__}: {exc}",
                                [self.rank]) from exc
        result.transfers = self._exchange.count
        return result

    def _join(self, threads: Sequence[threading.Thread]) -> None:
        deadline = time.monotonic() + self.timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, inputs: Mapping[str, torch.Tensor], target: torch.Tensor | None
             ) -> StepResult:
        i, m, graph = self.stage, self.num_microbatches, self.graph
        assert i is not None and self.module is not None
        last = i == self.num_stages - 1
        batches = [(f"input {a!r}", inputs[a]) for a, s in graph.inputs if s == i]
        if last and target is not None:
            batches.append(("the target", target))
        for what, batch in batches:
            if batch.ndim == 0 or batch.shape[0] % m or batch.shape[0] < m:
                raise ValueError(f"{self._step.who}: {what} has a batch of "
                                 f"{batch.shape[0] if batch.ndim else 'no dimension'}, which "
                                 f"does not split into {m} equal microbatches")
        data = {a: inputs[a].chunk(m) for a, s in graph.inputs if s == i}
        mbs = Microbatches(
            data,
            target.chunk(m) if last and target is not None else None,
            [a for a, s in graph.outputs if s == i],
            graph.sends(i),
            graph.receives(i),
            StepResult(0.0 if last else None),
        )
        for action in self.table.actions(i):
            if action.is_forward:
                self._forward(action.microbatch, mbs)
            else:
                self._backward(action.microbatch, mbs)
        return mbs.result

    def _forward(self, b: int, mbs: Microbatches) -> None:
        i, m, result = self.stage, self.num_microbatches, mbs.result
        last = i == self.num_stages - 1
        t0 = time.perf_counter()
        received = {}
        for e in mbs.receives:
            slot = self._exchange.inbox[("F", e.name, e.src, b)]
            self._step.wait(slot.ready, f"{e.name} of microbatch {b} from stage {e.src} "
                            f"(ranks {self.meshes[e.src].devices})", self.meshes[e.src].devices)
            received[e.name] = slot.value.requires_grad_()
            slot.value = None
        t1 = time.perf_counter()
        storages: dict[int, int] = {}
        with torch.autograd.graph.saved_tensors_hooks(self._packer(storages), lambda x: x):
            out = self.module({**{a: p[b] for a, p in mbs.data.items()}, **received})
            loss = None
            if last:
                if mbs.targets is None:
                    raise ValueError(f"{self._step.who}: the last stage needs target")
                loss = self.loss_fn(out[mbs.outputs[0]], mbs.targets[b]) / m
        t2 = time.perf_counter()
        self._hand_over_forward(b, out, mbs.sends)
        if loss is not None:
            result.loss += float(loss.detach())
        mbs.kept[b] = (received, {**out, **({"loss": loss} if loss is not None else {})})
        mbs.saved[b] = sum(storages.values())
        mbs.inflight += mbs.saved[b]
        result.peak_activation_bytes = max(result.peak_activation_bytes, mbs.inflight)
        result.compute_s += t2 - t1
        result.wait_s += (t1 - t0) + (time.perf_counter() - t2)

    def _hand_over_forward(self, b: int, out: Mapping[str, torch.Tensor],
                           sends: Sequence[TensorEdge]) -> None:
        """Give the sent tensors of microbatch ``b`` to the communication thread (and wait for
        their sends without ``overlap``)."""
        for e in sends:
            tensor = out[e.name]
            if tuple(tensor.shape) != e.shape:
                raise ValueError(f"stage {self.stage} produced {e.name} of shape "
                                 f"{tuple(tensor.shape)}, the graph says {e.shape}")
            slot = self._exchange.outbox[("F", e.name, e.src, b)]
            slot.value = tensor.detach()
            slot.ready.set()
        if not self.overlap:
            for e in sends:
                slot = self._exchange.outbox[("F", e.name, e.src, b)]
                self._step.wait(slot.done, f"the send of {e.name} of microbatch {b}",
                                self.meshes[e.dst].devices)

    def _backward(self, b: int, mbs: Microbatches) -> None:
        result = mbs.result
        t0 = time.perf_counter()
        received, out = mbs.kept.pop(b)
        if self.stage == self.num_stages - 1:
            grads_for = [out["loss"]]
            grads: list[torch.Tensor | None] = [None]
        else:
            grads_for, grads = [], []
            for e in mbs.sends:
                slot = self._exchange.inbox[("B", e.name, e.src, b)]
                self._step.wait(slot.ready, f"the gradient of {e.name} of microbatch {b} from "
                                f"stage {e.dst}", self.meshes[e.dst].devices)
                grads_for.append(out[e.name])
                grads.append(slot.value)
                slot.value = None
        t1 = time.perf_counter()
        torch.autograd.backward(grads_for, grads)
        t2 = time.perf_counter()
        for e in mbs.receives:
            g = received[e.name].grad
            slot = self._exchange.outbox[("B", e.name, e.src, b)]
            slot.value = g if g is not None else torch.zeros(e.shape, dtype=torch_dtype(e.dtype))
            slot.ready.set()
        if not self.overlap_backward:
            for e in mbs.receives:
                slot = self._exchange.outbox[("B", e.name, e.src, b)]
                self._step.wait(slot.done, f"the send of the gradient of {e.name} of "
                                f"microbatch {b}", self.meshes[e.src].devices)
        mbs.inflight -= mbs.saved.pop(b)
        del received, out, grads_for, grads
        result.compute_s += t2 - t1
        result.wait_s += (t1 - t0) + (time.perf_counter() - t2)

    def _packer(self, storages: dict[int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
        params = self._param_storages

        def pack(t: torch.Tensor) -> torch.Tensor:
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if ptr not in params:
                storages[ptr] = s.nbytes()
            return t

        return pack
