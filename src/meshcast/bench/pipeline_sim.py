"""The simulated pipeline benchmark: step times of GPipe, 1F1B and eager-1F1B, with and without
overlap (:func:`step_times`), boundary transfer times from real plans timed by the simulator
(:func:`boundary_links`), and two models split into stages with their FLOPs counted on the meta
device (:func:`stage_flops`, :func:`model_rows`). ``meshcast bench pipeline --simulate`` prints
them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..estimate.simulate import simulate
from ..pipeline import Link, StageGraph, schedule, simulate_pipeline
from ..planning.planner import plan

__all__ = [
    "COLUMNS",
    "TIMER",
    "ModelCase",
    "boundary_links",
    "gpt_case",
    "model_rows",
    "stage_flops",
    "step_times",
    "utransformer_case",
]

COLUMNS: tuple[tuple[str, bool], ...] = (
    ("gpipe", True),
    ("1f1b", False),
    ("1f1b", True),
    ("eager_1f1b", False),
    ("eager_1f1b", True),
)
"""(schedule, overlap of forward sends) pairs shown; 1F1B without overlap is the baseline."""
TIMER = "meshcast.simulate of broadcast plans"
"""How :func:`boundary_links` times a boundary transfer (shown in the table title)."""


def step_times(
    num_stages: int,
    num_microbatches: int,
    forward_s: float | Sequence[float],
    backward_s: float | Sequence[float],
    links: Sequence[Link],
) -> dict[tuple[str, bool], float]:
    """Simulated step time of every (schedule, overlap) pair of :data:`COLUMNS`."""
    return {
        (name, ov): simulate_pipeline(
            schedule(name, num_stages, num_microbatches), forward_s, backward_s, links,
            overlap=ov,
        ).step_s
        for name, ov in COLUMNS
    }


def boundary_links(graph: StageGraph, devices_per_stage: int, topology: Topology
                   ) -> tuple[Link, ...]:
    """Links of ``graph`` for stages placed on consecutive meshes of ``(1, devices_per_stage)``
    ranks; each edge timed by planning its resharding (replicated to replicated, broadcast) and
    simulating the plan on ``topology``."""
    meshes = [Mesh.from_range(i * devices_per_stage, (1, devices_per_stage))
              for i in range(graph.num_stages)]

    def seconds(edge) -> float:
        spec = "R" * len(edge.shape)
        task = ReshardTask(edge.shape, edge.dtype, Layout(meshes[edge.src], spec),
                           Layout(meshes[edge.dst], spec))
        return simulate(plan(task, topology, strategy="broadcast"), topology).time_s

    return graph.links(seconds)


@dataclass(frozen=True)
class ModelCase:
    """A model split into pipeline stages, one host of ``devices`` GPUs per stage."""

    label: str  # "<model> <stages>x<GPUs per stage>"
    num_stages: int
    devices: int
    build: Callable  # () -> (stages, graph, example inputs per stage)
    note: str = ""


def gpt_case(num_stages: int) -> ModelCase:
    """GPT (24 blocks, 2048 wide, 1024 tokens) in ``num_stages`` stages of 4 GPUs."""
    from ..models import gpt

    config = gpt.GPTConfig(vocab_size=50304, block_size=1024, n_layer=24, n_head=16, n_embd=2048)
    batch, seq = 8, 1024
    # balanced by FLOPs: the head (2048 x 50304) costs about 2 blocks, so the last stage has fewer
    layers = [7, 6, 6, 5] if num_stages == 4 else None

    def build():
        import torch

        model = gpt.GPT(config, seed=None)
        graph = gpt.stage_graph(config, num_stages, batch, seq, "bfloat16")
        return gpt.split_stages(model, num_stages, layers), graph, {
            "idx": torch.zeros(batch, seq, dtype=torch.long)}

    return ModelCase(f"GPT {num_stages}x4", num_stages, 4, build,
                     f"blocks per stage {layers} (the last stage also runs the vocabulary head), "
                     f"microbatch {batch} x {seq} tokens")


def utransformer_case() -> ModelCase:
    """The U-Transformer (3 levels, 384 wide, 1024 tokens) in 2 stages of 4 GPUs."""
    from ..models import utransformer

    config = utransformer.UTransformerConfig(
        in_dim=16, dim=384, levels=3, blocks_per_level=2, n_head=6, seq_len=1024
    )
    batch = 8

    def build():
        import torch

        model = utransformer.UTransformer(config, seed=None)
        graph = utransformer.stage_graph(config, 2, batch, "bfloat16")
        return utransformer.split_stages(model, 2), graph, {
            "x": torch.zeros(batch, config.seq_len, config.in_dim)}

    return ModelCase("U-Transformer 2x4", 2, 4, build,
                     f"units per stage {utransformer.split_units(config.levels, 2)}, microbatch "
                     f"{batch} x {config.seq_len} tokens")


def stage_flops(case: ModelCase) -> tuple[list[float], list[float], StageGraph, int]:
    """Forward and backward FLOPs of each stage for one microbatch, and the graph and params."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        stages, graph, data = case.build()
        fwd, bwd = [], []
        for i, stage in enumerate(stages):
            inputs = {a: data[a] for a, s in graph.inputs if s == i}
            for e in graph.receives(i):
                inputs[e.name] = torch.zeros(e.shape, requires_grad=True)
            counter = FlopCounterMode(display=False)
            with counter:
                out = stage(inputs)
            fwd.append(float(counter.get_total_flops()))
            counter = FlopCounterMode(display=False)
            with counter:
                sum(t.float().sum() for t in out.values()).backward()
            bwd.append(float(counter.get_total_flops()))
        params = sum(p.numel() for s in stages for p in s.parameters())
    return fwd, bwd, graph, params


def model_rows(case: ModelCase, m: int, tflops: float, gbps_list: Sequence[float]
               ) -> tuple[list[dict[str, Any]], str]:
    """``case``'s rows, one per NIC speed and one of free communication (``nic``: the speed as
    text or ``"free"``; ``forward_s``: the slowest stage's forward per microbatch; ``transfer_s``:
    one microbatch's transfers over the busiest stage pair; ``times``: :func:`step_times`), and
    its note."""
    fwd_flops, bwd_flops, graph, params = stage_flops(case)
    sends = "; ".join(
        f"stage {i} sends " + ", ".join(f"{e.name}{list(e.shape)}" for e in graph.sends(i))
        for i in range(graph.num_stages - 1)
    )
    per_stage = case.devices * tflops * 1e12
    fwd = [f / per_stage for f in fwd_flops]
    bwd = [f / per_stage for f in bwd_flops]
    rows = []
    for text, gbps in [(f"{g:g}", g) for g in gbps_list] + [("free", None)]:
        if gbps is None:
            links = graph.links(lambda e: 0.0)
        else:
            top = Topology.uniform(case.num_stages, case.devices, nic_gbps=gbps,
                                   intra_gbps=800.0, latency_us=30.0)
            links = boundary_links(graph, case.devices, top)
        per_pair: dict[tuple[int, int], float] = {}
        for link in links:
            key = (link.src, link.dst)
            per_pair[key] = per_pair.get(key, 0.0) + link.activation_s
        rows.append({
            "model": case.label, "nic": text, "forward_s": max(fwd),
            "transfer_s": max(per_pair.values(), default=0.0),
            "times": step_times(case.num_stages, m, fwd, bwd, links),
        })
    return rows, (f"{case.label}: {params / 1e9:.2f}B parameters, {case.note}; per microbatch "
                  f"(bfloat16): {sends}")
