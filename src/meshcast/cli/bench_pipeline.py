"""``meshcast bench pipeline``: step time of GPipe, 1F1B and eager-1F1B, with and without overlap.

    meshcast bench pipeline --simulate [--stages 4] [--microbatches 16] [--tflops 40]
    meshcast bench pipeline --cluster N     # real runs: comes with the pipeline runtime

``--simulate`` prints two tables from :func:`meshcast.pipeline.simulate_pipeline`:

1. A sweep of communication against compute: every stage takes 1 (forward) and 2 (backward)
   units of time per microbatch, every boundary transfer (activation forward, gradient backward)
   takes ``ratio`` units.
2. Two models split into stages, one p3.8xlarge-like host (4 GPUs, tensor-parallel over them)
   per stage, at several NIC speeds. Boundary times: each tensor a stage sends
   (:class:`meshcast.pipeline.StageGraph`) is a resharding task from the sending stage's mesh
   (replicated, as after Megatron's row-parallel layer) to the receiving stage's mesh (replicated),
   planned with the broadcast strategy and timed by :func:`meshcast.simulate.simulate` (or, where
   that module is missing, a bandwidth model: busiest host NIC bytes / NIC speed + latency).
   Compute times: FLOPs of each stage's forward and backward counted by
   ``torch.utils.flop_counter`` on the meta device (no memory, no compute), divided by
   ``--tflops`` per GPU times the GPUs of a stage. An estimate, not a measurement.

A benchmark, not a test: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..layout import Layout
from ..mesh import Mesh
from ..pipeline import SCHEDULES, Link, StageGraph, chain_links, schedule, simulate_pipeline
from ..planner import plan
from ..task import ReshardTask
from ..topology import Topology

COLUMNS: tuple[tuple[str, bool], ...] = (
    ("gpipe", True),
    ("1f1b", False),
    ("1f1b", True),
    ("eager_1f1b", False),
    ("eager_1f1b", True),
)
"""(schedule, overlap of forward sends) pairs shown; 1F1B without overlap is the baseline."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast bench pipeline``."""
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--simulate", action="store_true",
                      help="simulated step times (compute and transfer times from models)")
    mode.add_argument("--cluster", type=int, metavar="N",
                      help="real runs on N emulated hosts (needs the pipeline runtime: to come)")
    parser.add_argument("--stages", type=int, default=4, help="stages of the sweep (default 4)")
    parser.add_argument("--microbatches", type=int, default=16,
                        help="microbatches per step (default 16)")
    parser.add_argument("--ratios", default="0,0.25,0.5,1,1.5,2",
                        help="transfer time / forward time in the sweep")
    parser.add_argument("--tflops", type=float, default=40.0,
                        help="sustained TFLOP/s per GPU for the model rows (default 40, a V100)")
    parser.add_argument("--gbps", default="10,25,100",
                        help="NIC speeds (Gbit/s) of the model rows (default 10,25,100)")


def _label(name: str, overlap: bool) -> str:
    return {"gpipe": "GPipe", "1f1b": "1F1B", "eager_1f1b": "eager-1F1B"}[name] + (
        " +overlap" if overlap else ""
    )


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


# -- boundary transfer times from real plans ------------------------------------------------------
def _bandwidth_time(p, topology: Topology) -> float:
    """Fallback model: bytes through the busiest host NIC direction / its speed, plus latency."""
    worst = 0.0
    for h, (out, inn) in p.bytes_per_host().items():
        out_bw = topology.nic_out_gbps[h] * topology.nics_per_host[h] * 1e9 / 8
        in_bw = topology.nic_in_gbps[h] * topology.nics_per_host[h] * 1e9 / 8
        worst = max(worst, out / out_bw, inn / in_bw)
    return worst + topology.latency_us * 1e-6


def _timer() -> tuple[str, Callable]:
    try:
        from ..simulate import simulate
    except ImportError:
        return "bandwidth model (meshcast.simulate missing)", _bandwidth_time
    return "meshcast.simulate of broadcast plans", lambda p, top: simulate(p, top).time_s


def boundary_links(graph: StageGraph, devices_per_stage: int, topology: Topology,
                   timer: Callable) -> tuple[Link, ...]:
    """Links of ``graph`` for stages placed on consecutive meshes of ``(1, devices_per_stage)``
    ranks; each edge timed by planning its resharding (replicated to replicated) and ``timer``."""
    meshes = [Mesh.from_range(i * devices_per_stage, (1, devices_per_stage))
              for i in range(graph.num_stages)]

    def seconds(edge) -> float:
        spec = "R" * len(edge.shape)
        task = ReshardTask(edge.shape, edge.dtype, Layout(meshes[edge.src], spec),
                           Layout(meshes[edge.dst], spec))
        return timer(plan(task, topology, strategy="broadcast"), topology)

    return graph.links(seconds)


@dataclass(frozen=True)
class ModelCase:
    """A model split into pipeline stages, one host of ``devices`` GPUs per stage."""

    label: str  # "<model> <stages>x<GPUs per stage>"
    num_stages: int
    devices: int
    build: Callable  # () -> (stages, graph, example inputs per stage)
    note: str = ""


def _gpt_case(num_stages: int) -> ModelCase:
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


def _utransformer_case() -> ModelCase:
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


# -- output ---------------------------------------------------------------------------------------
def _table(title: str, first: Sequence[str]):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for name in first:
        table.add_column(name, justify="right")
    for name, ov in COLUMNS:
        table.add_column(_label(name, ov), justify="right")
    table.add_column("eager+ov vs 1F1B", justify="right")
    return table


def _cells(times: dict[tuple[str, bool], float], scale: float, fmt: str) -> list[str]:
    base = times[("1f1b", False)]
    best = times[("eager_1f1b", True)]
    return [format(times[c] * scale, fmt) for c in COLUMNS] + [f"{base / best:.2f}x"]


def run(args: argparse.Namespace) -> int:
    """Print the tables."""
    if not args.simulate:
        raise ValueError(
            f"--cluster {args.cluster}: real pipeline runs need the pipeline runtime "
            "(issue 6, point 3), which is not written yet; use --simulate"
        )
    from rich.console import Console

    n, m = args.stages, args.microbatches
    if n < 1 or m < 1:
        raise ValueError("--stages and --microbatches must be at least 1")
    console = Console(width=160)
    peaks = {name: schedule(name, n, m).peak_inflight(0) for name in SCHEDULES}
    ratios = [float(r) for r in args.ratios.split(",")]
    sweep = _table(
        f"Sweep: {n} stages, {m} microbatches; forward 1, backward 2, each transfer = ratio "
        f"(step time in forward units; peak microbatches in flight on stage 0: GPipe "
        f"{peaks['gpipe']}, 1F1B {peaks['1f1b']}, eager-1F1B {peaks['eager_1f1b']})",
        ["transfer / forward"],
    )
    for r in ratios:
        times = step_times(n, m, 1.0, 2.0, chain_links(n, r))
        sweep.add_row(f"{r:g}", *_cells(times, 1.0, ".2f"))
    console.print(sweep)

    how, timer = _timer()
    models = _table(
        f"Models, {m} microbatches, one host of 4 GPUs per stage, {args.tflops:g} TFLOP/s per "
        f"GPU; boundary times: {how} (step time in ms)",
        ["model", "NIC Gbit/s", "fwd ms/mb", "xfer ms/mb"],
    )
    notes = []
    for case in (_gpt_case(4), _utransformer_case()):
        fwd_flops, bwd_flops, graph, params = stage_flops(case)
        sends = "; ".join(
            f"stage {i} sends " + ", ".join(f"{e.name}{list(e.shape)}" for e in graph.sends(i))
            for i in range(graph.num_stages - 1)
        )
        notes.append(f"{case.label}: {params / 1e9:.2f}B parameters, {case.note}; per microbatch "
                     f"(bfloat16): {sends}")
        per_stage = case.devices * args.tflops * 1e12
        fwd = [f / per_stage for f in fwd_flops]
        bwd = [f / per_stage for f in bwd_flops]
        rows = [(f"{float(g):g}", float(g)) for g in args.gbps.split(",")] + [("free", None)]
        for text, gbps in rows:
            if gbps is None:
                links = graph.links(lambda e: 0.0)
            else:
                top = Topology.uniform(case.num_stages, case.devices, nic_gbps=gbps,
                                       intra_gbps=800.0, latency_us=30.0)
                links = boundary_links(graph, case.devices, top, timer)
            per_pair: dict[tuple[int, int], float] = {}
            for link in links:
                per_pair[(link.src, link.dst)] = per_pair.get((link.src, link.dst), 0.0) + \
                    link.activation_s
            times = step_times(case.num_stages, m, fwd, bwd, links)
            models.add_row(
                case.label, text, f"{max(fwd) * 1e3:.1f}",
                f"{max(per_pair.values(), default=0.0) * 1e3:.1f}", *_cells(times, 1e3, ".0f"),
            )
    console.print(models)
    console.print(
        "fwd ms/mb: forward of the slowest stage per microbatch (backward: about 2x); xfer ms/mb: "
        "transfer time of one microbatch over the busiest stage pair (all its tensors).\n"
        + "\n".join(notes)
        + "\nOverlap: forward sends run in the background (only the consumer waits); without it "
        "the sender blocks. Gradient sends always block. Links serialise their transfers."
    )
    return 0
