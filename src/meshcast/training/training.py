"""Training jobs for the pipeline runtime: the two models, tensor-parallel stages, data, SGD.

Imports torch. A :class:`TrainJob` is plain, picklable data (model, sizes, meshes, schedule,
strategy); :func:`run_job` is what every rank of a ``meshcast.launch`` (or of a job on the
emulated cluster) runs; :func:`reference_training` trains the same model the same way in one
process, the result a pipelined run must reproduce. Used by the tests and by
``meshcast bench pipeline --cluster``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ..core.mesh import Mesh
from ..core.topology import EMULATED_INTRA_GBPS, Topology
from ..models import gpt, utransformer
from ..pipeline.graph import StageGraph
from ..pipeline.runtime import PipelineRuntime, StepResult

__all__ = [
    "TrainJob",
    "build_model",
    "build_stage",
    "job_batch",
    "parallelize",
    "reference_training",
    "run_job",
    "run_jobs",
]


@dataclass(frozen=True)
class TrainJob:
    """One pipelined training run, the same on every rank.

    ``model``: ``"gpt"`` or ``"utransformer"`` with its ``config``; ``stage_ranks``: the ranks of
    each stage's mesh (a ``(1, k)`` mesh, tensor-parallel over its ``k`` ranks);
    ``batch_size`` sequences per step cut into ``num_microbatches``; ``steps`` SGD steps of
    learning rate ``lr`` (momentum ``momentum``) from parameters seeded with ``seed``; data from
    ``data_seed``. ``layouts`` as in :class:`~meshcast.pipeline.runtime.PipelineRuntime`.
    ``fail_on``: ``(rank, microbatch)`` whose forward raises (for failure tests).
    """

    model: str
    config: Any
    stage_ranks: tuple[tuple[int, ...], ...]
    schedule: str = "1f1b"
    strategy: str = "broadcast"
    batch_size: int = 8
    num_microbatches: int = 4
    steps: int = 2
    lr: float = 0.1
    momentum: float = 0.9
    seed: int = 0
    data_seed: int = 1
    layouts: tuple[tuple[str, tuple[str, str]], ...] = ()
    overlap: bool = True
    free_communication: bool = False
    timeout: float = 60.0
    hosts: tuple[tuple[int, ...], ...] | None = None  # ranks per host (planning); None: stages
    nic_gbps: float = 1.0
    fail_on: tuple[int, int] | None = None
    label: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def num_stages(self) -> int:
        """Stages of the pipeline."""
        return len(self.stage_ranks)

    @property
    def microbatch_size(self) -> int:
        """Sequences per microbatch."""
        if self.batch_size % self.num_microbatches:
            raise ValueError(f"batch_size={self.batch_size} is not a multiple of "
                             f"num_microbatches={self.num_microbatches}")
        return self.batch_size // self.num_microbatches

    def meshes(self) -> list[Mesh]:
        """One ``(1, k)`` mesh per stage."""
        return [Mesh([list(r)]) for r in self.stage_ranks]

    def topology(self, world_size: int) -> Topology:
        """Hosts for planning: ``hosts`` if given, else one host per stage (idle ranks on one
        more host)."""
        hosts = [list(h) for h in (self.hosts or self.stage_ranks)]
        used = {r for h in hosts for r in h}
        idle = [r for r in range(world_size) if r not in used]
        if idle:
            hosts.append(idle)
        return Topology(tuple(tuple(h) for h in hosts), nic_in_gbps=self.nic_gbps,
                        nic_out_gbps=self.nic_gbps, intra_gbps=EMULATED_INTRA_GBPS)

    def with_(self, **changes: Any) -> TrainJob:
        """A copy with ``changes``."""
        return replace(self, **changes)


def _module(job: TrainJob):
    if job.model == "gpt":
        return gpt
    if job.model == "utransformer":
        return utransformer
    raise ValueError(f"model {job.model!r} is unknown: 'gpt' or 'utransformer'")


def build_model(job: TrainJob) -> nn.Module:
    """The whole model, initialised from ``job.seed`` (the same on every process)."""
    mod = _module(job)
    return mod.GPT(job.config, seed=job.seed) if job.model == "gpt" else mod.UTransformer(
        job.config, seed=job.seed)


def stage_graph(job: TrainJob) -> StageGraph:
    """What the stages exchange per microbatch."""
    if job.model == "gpt":
        return gpt.stage_graph(job.config, job.num_stages, job.microbatch_size,
                               job.config.block_size)
    return utransformer.stage_graph(job.config, job.num_stages, job.microbatch_size)


def parallelize(stage: nn.Module, tp_rank: int, tp_size: int, group=None) -> nn.Module:
    """Replace every transformer block of ``stage`` (in place) by this rank's tensor-parallel
    shard of it; returns ``stage``. ``tp_size == 1`` leaves it as it is."""
    if tp_size == 1:
        return stage
    for parent in list(stage.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, gpt.Block):
                config = stage.config  # GPTStage
                new: nn.Module = gpt.TensorParallelBlock.from_block(
                    child, config, tp_rank, tp_size, group)
            elif isinstance(child, utransformer.Block):
                new = utransformer.TensorParallelBlock.from_block(child, tp_rank, tp_size, group)
            else:
                continue
            setattr(parent, name, new) if not name.isdigit() else parent.__setitem__(
                int(name), new)
    return stage


def build_stage(job: TrainJob, model: nn.Module, index: int, tp_rank: int, tp_size: int,
                group=None) -> nn.Module:
    """Stage ``index`` of ``model`` as a new module (the model is not changed), tensor-parallel
    over ``tp_size`` ranks."""
    stage = copy.deepcopy(_module(job).split_stages(model, job.num_stages)[index])
    return parallelize(stage, tp_rank, tp_size, group)


def job_batch(job: TrainJob, step: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Inputs and target of step ``step`` (deterministic from ``job.data_seed``)."""
    g = torch.Generator().manual_seed(job.data_seed * 1000 + step)
    c = job.config
    if job.model == "gpt":
        tokens = torch.randint(0, c.vocab_size, (job.batch_size, c.block_size + 1), generator=g)
        return {"idx": tokens[:, :-1]}, tokens[:, 1:]
    x = torch.randn(job.batch_size, c.seq_len, c.in_dim, generator=g)
    return {"x": x}, torch.randn(job.batch_size, c.seq_len, c.in_dim, generator=g)


def _optimizer(job: TrainJob, params) -> torch.optim.Optimizer:
    return torch.optim.SGD(list(params), lr=job.lr, momentum=job.momentum)


def reference_training(job: TrainJob) -> tuple[list[float], nn.Module]:
    """Train the whole model in one process, whole batch at once: the losses and the model."""
    model = build_model(job)
    opt = _optimizer(job, model.parameters())
    losses = []
    loss_fn = _module(job).loss_fn
    for step in range(job.steps):
        inputs, target = job_batch(job, step)
        opt.zero_grad()
        loss = loss_fn(model(next(iter(inputs.values()))), target)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model


class _Failing(nn.Module):
    """Wraps a stage; its forward raises on microbatch ``microbatch`` (counted per step)."""

    def __init__(self, inner: nn.Module, microbatch: int) -> None:
        super().__init__()
        self.inner, self.microbatch, self.calls = inner, microbatch, 0

    def forward(self, inputs):
        self.calls += 1
        if self.calls == self.microbatch + 1:
            raise RuntimeError(f"injected failure in the forward of microbatch {self.microbatch}")
        return self.inner(inputs)


def run_job(rank: int, job: TrainJob) -> dict[str, Any]:
    """Run ``job`` on this rank (inside an initialised gloo group): returns the losses (last
    stage), the stage's final parameters (``state``), per-step seconds and statistics."""
    import torch.distributed as dist

    world = dist.get_world_size()
    meshes = job.meshes()
    stage = next((i for i, m in enumerate(meshes) if rank in m), None)
    module = None
    tp_rank = tp_size = 1
    if stage is not None:
        tp_size = meshes[stage].size
        tp_rank = meshes[stage].devices.index(rank)
    # the runtime creates the tensor-parallel groups; build the module after, with the group
    runtime = PipelineRuntime(
        _Placeholder() if stage is not None else None, stage_graph(job), meshes,
        schedule=job.schedule, num_microbatches=job.num_microbatches, strategy=job.strategy,
        loss_fn=_module(job).loss_fn, topology=job.topology(world), layouts=dict(job.layouts),
        overlap=job.overlap, free_communication=job.free_communication, timeout=job.timeout,
    )
    out: dict[str, Any] = {"rank": rank, "stage": stage, "label": job.label}
    if stage is None:
        for _ in range(job.steps):
            dist.barrier()  # the step barriers of the other ranks
        return out
    module = build_stage(job, build_model(job), stage, tp_rank, tp_size, runtime.tp_group)
    if job.fail_on is not None and job.fail_on[0] == rank:
        module = _Failing(module, job.fail_on[1])
    runtime.set_module(module)
    opt = _optimizer(job, module.parameters())
    losses, seconds, results = [], [], []
    for step in range(job.steps):
        inputs, target = job_batch(job, step)
        opt.zero_grad()
        dist.barrier()  # every rank starts the step together: step times are comparable
        t0 = time.perf_counter()
        res: StepResult = runtime.train_step(inputs, target)
        seconds.append(time.perf_counter() - t0)
        opt.step()
        losses.append(res.loss)
        results.append(res)
    out.update(
        losses=losses, seconds=seconds,
        state={k: v.detach().clone() for k, v in module.state_dict().items()},
        peak_activation_bytes=max(r.peak_activation_bytes for r in results),
        compute_s=[r.compute_s for r in results], wait_s=[r.wait_s for r in results],
    )
    return out


def run_jobs(rank: int, jobs: Sequence[TrainJob], keep_state: bool = True) -> list[dict]:
    """:func:`run_job` for each of ``jobs`` in turn (one process start for many runs)."""
    results = []
    for job in jobs:
        r = run_job(rank, job)
        if not keep_state:
            r.pop("state", None)
        results.append(r)
    return results


class _Placeholder(nn.Module):
    """Stands for the stage module until it is built (it needs the runtime's group)."""

    def forward(self, inputs):  # pragma: no cover - replaced before use
        raise RuntimeError("the stage module was not set")
