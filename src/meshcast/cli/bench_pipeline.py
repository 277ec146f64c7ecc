"""``meshcast bench pipeline``: step time of GPipe, 1F1B and eager-1F1B, with and without overlap.

    meshcast bench pipeline --simulate [--stages 4] [--microbatches 16] [--tflops 40]
    meshcast bench pipeline --cluster N [--nic-gbit 1] [--ranks-per-host 2] [--steps 4]

``--simulate`` prints two tables from :func:`meshcast.pipeline.simulate_pipeline`:

1. A sweep of communication against compute: every stage takes 1 (forward) and 2 (backward)
   units of time per microbatch, every boundary transfer (activation forward, gradient backward)
   takes ``ratio`` units.
2. Two models split into stages, one p3.8xlarge-like host (4 GPUs, tensor-parallel over them)
   per stage, at several NIC speeds. Boundary times: each tensor a stage sends
   (:class:`meshcast.pipeline.StageGraph`) is a resharding task from the sending stage's mesh
   (replicated, as after Megatron's row-parallel layer) to the receiving stage's mesh (replicated),
   planned with the broadcast strategy and timed by :func:`meshcast.estimate.simulate.simulate`
   (or, where that module is missing, a bandwidth model: busiest host NIC bytes / NIC speed +
   latency).
   Compute times: FLOPs of each stage's forward and backward counted by
   ``torch.utils.flop_counter`` on the meta device (no memory, no compute), divided by
   ``--tflops`` per GPU times the GPUs of a stage. An estimate, not a measurement.

``--cluster N`` runs the real pipeline runtime (:mod:`meshcast.pipeline.runtime`): ``N`` stages,
one emulated host each (docs/cluster.md: a network namespace per host, NIC shaped with ``tc`` to
``--nic-gbit``), ``--ranks-per-host`` ranks per host, tensor-parallel inside a stage. Both models
(sizes in :func:`cluster_jobs`) are trained with every strategy x {1F1B, eager-1F1B}, GPipe
(broadcast) and the free-communication bound (every boundary tensor replaced by a 1-byte message)
of each schedule; it prints samples/s and the peak activation memory of each stage. Without root
(no namespaces) it runs on loopback instead, hosts emulated for planning only, and says so.

A benchmark, not a test: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..pipeline import SCHEDULES, Link, StageGraph, chain_links, schedule, simulate_pipeline
from ..planning.planner import plan
from .common import comma_list, integer, number, numbers, working

COLUMNS: tuple[tuple[str, bool], ...] = (
    ("gpipe", True),
    ("1f1b", False),
    ("1f1b", True),
    ("eager_1f1b", False),
    ("eager_1f1b", True),
)
"""(schedule, overlap of forward sends) pairs shown; 1F1B without overlap is the baseline."""
MODELS = ("gpt", "utransformer")
"""Models of ``--cluster``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast bench pipeline``."""
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--simulate", action="store_true",
                      help="simulated step times (compute and transfer times from models)")
    mode.add_argument("--cluster", type=integer(2), metavar="N",
                      help="real runs: N stages on N emulated hosts (NICs shaped), N >= 2")
    parser.add_argument("--stages", type=integer(1), default=4,
                        help="stages of the sweep (default 4)")
    parser.add_argument("--microbatches", type=integer(1), default=None,
                        help="microbatches per step (default 16 simulated, 8 on the cluster)")
    parser.add_argument("--nic-gbit", type=number(0.0), default=1.0,
                        help="--cluster: NIC speed of each emulated host (default 1 Gbit/s)")
    parser.add_argument("--ranks-per-host", type=integer(1), default=2,
                        help="--cluster: ranks per host = tensor-parallel degree (default 2)")
    parser.add_argument("--steps", type=integer(2), default=4,
                        help="--cluster: training steps per run, the first one not timed")
    parser.add_argument("--models", type=comma_list(MODELS), default=list(MODELS),
                        help="--cluster: models to run (default gpt,utransformer)")
    parser.add_argument("--ratios", type=numbers(0.0, strict=False),
                        default=[0, 0.25, 0.5, 1, 1.5, 2],
                        help="transfer time / forward time in the sweep (default "
                        "0,0.25,0.5,1,1.5,2)")
    parser.add_argument("--tflops", type=number(0.0), default=40.0,
                        help="sustained TFLOP/s per GPU for the model rows (default 40, a V100)")
    parser.add_argument("--gbps", type=numbers(0.0), default=[10.0, 25.0, 100.0],
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
        from ..estimate.simulate import simulate
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
        return run_cluster(args)
    from rich.console import Console

    n, m = args.stages, args.microbatches or 16
    console = Console(width=160)
    peaks = {name: schedule(name, n, m).peak_inflight(0) for name in SCHEDULES}
    ratios = args.ratios
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
    with working("meshcast bench pipeline: model rows (FLOP counts, plans)"):
        for case in (_gpt_case(4), _utransformer_case()):
            notes.append(_model_rows(models, case, m, args.tflops, args.gbps, timer))
    console.print(models)
    console.print(
        "fwd ms/mb: forward of the slowest stage per microbatch (backward: about 2x); xfer ms/mb: "
        "transfer time of one microbatch over the busiest stage pair (all its tensors).\n"
        + "\n".join(notes)
        + "\nOverlap: forward sends run in the background (only the consumer waits); without it "
        "the sender blocks. Gradient sends always block. Links serialise their transfers."
    )
    return 0


def _model_rows(table, case: ModelCase, m: int, tflops: float, gbps_list: Sequence[float],
                timer: Callable) -> str:
    """Add ``case``'s rows (one per NIC speed, and free communication) to ``table``; return its
    note."""
    fwd_flops, bwd_flops, graph, params = stage_flops(case)
    sends = "; ".join(
        f"stage {i} sends " + ", ".join(f"{e.name}{list(e.shape)}" for e in graph.sends(i))
        for i in range(graph.num_stages - 1)
    )
    per_stage = case.devices * tflops * 1e12
    fwd = [f / per_stage for f in fwd_flops]
    bwd = [f / per_stage for f in bwd_flops]
    for text, gbps in [(f"{g:g}", g) for g in gbps_list] + [("free", None)]:
        if gbps is None:
            links = graph.links(lambda e: 0.0)
        else:
            top = Topology.uniform(case.num_stages, case.devices, nic_gbps=gbps,
                                   intra_gbps=800.0, latency_us=30.0)
            links = boundary_links(graph, case.devices, top, timer)
        per_pair: dict[tuple[int, int], float] = {}
        for link in links:
            key = (link.src, link.dst)
            per_pair[key] = per_pair.get(key, 0.0) + link.activation_s
        times = step_times(case.num_stages, m, fwd, bwd, links)
        table.add_row(
            case.label, text, f"{max(fwd) * 1e3:.1f}",
            f"{max(per_pair.values(), default=0.0) * 1e3:.1f}", *_cells(times, 1e3, ".0f"),
        )
    return (f"{case.label}: {params / 1e9:.2f}B parameters, {case.note}; per microbatch "
            f"(bfloat16): {sends}")


# -- real runs on the emulated cluster ------------------------------------------------------------
CLUSTER_RUNS: tuple[tuple[str, str, bool], ...] = (
    ("send_recv", "1f1b", False),
    ("send_recv", "eager_1f1b", False),
    ("allgather", "1f1b", False),
    ("allgather", "eager_1f1b", False),
    ("broadcast", "1f1b", False),
    ("broadcast", "eager_1f1b", False),
    ("broadcast", "gpipe", False),
    ("free", "1f1b", True),
    ("free", "eager_1f1b", True),
    ("free", "gpipe", True),
)
"""(strategy, schedule, free communication) of each measured run; send_recv + 1F1B is the
baseline."""


def cluster_jobs(num_stages: int, ranks_per_host: int, microbatches: int, steps: int,
                 nic_gbit: float, models: Sequence[str]) -> list:
    """The runs of ``--cluster``: both models, sized so that on 2 shared CPU cores a boundary
    transfer at 1 Gbit/s takes about as long as a stage's compute of one microbatch."""
    from ..models import gpt, utransformer
    from ..training.training import TrainJob

    configs = {
        # 1 block per stage (n_layer = stages), 64 wide, 256 tokens: per microbatch of 8
        # sequences the hidden state is 512 KiB
        "gpt": (gpt.GPTConfig(vocab_size=64, block_size=256, n_layer=num_stages, n_head=2,
                              n_embd=64), 8),
        # 2 levels, 32 wide at 256 tokens; on 2 stages the first sends hidden (8, 64, 128) and
        # the skips (8, 256, 32), (8, 128, 64): 768 KiB per microbatch of 8
        "utransformer": (utransformer.UTransformerConfig(in_dim=16, dim=32, levels=2, n_head=2,
                                                         seq_len=256), 8),
    }
    ranks = tuple(tuple(range(i * ranks_per_host, (i + 1) * ranks_per_host))
                  for i in range(num_stages))
    jobs = []
    for model in models:
        config, per_mb = configs[model]
        for strategy, sched, free in CLUSTER_RUNS:
            jobs.append(TrainJob(
                model, config, ranks, sched, "broadcast" if free else strategy,
                batch_size=per_mb * microbatches, num_microbatches=microbatches, steps=steps,
                lr=0.01, free_communication=free, timeout=120.0, nic_gbps=nic_gbit,
                label=f"{model}|{strategy}|{sched}",
            ))
    return jobs


def _run_jobs_on_cluster(jobs: list, hosts: int, ranks_per_host: int, nic_gbit: float,
                         timeout: float) -> tuple[list[list[dict]], str]:
    """Run ``jobs`` on an emulated cluster (or on loopback without root, where communication is
    nearly free): per-rank results and a sentence saying where they ran."""
    from ..cluster.job import run_on_emulated_hosts
    from ..training.training import run_jobs

    return run_on_emulated_hosts(
        run_jobs, hosts * ranks_per_host, ranks_per_host, nic_gbit=nic_gbit,
        args=(jobs, False), timeout=timeout, name=f"mc-pipe{os.getpid() % 100000}",
    )


def run_cluster(args: argparse.Namespace) -> int:
    """``--cluster N``: measured samples/s of every run of :data:`CLUSTER_RUNS`."""
    import statistics
    import time

    from rich.console import Console
    from rich.table import Table

    hosts, per_host = args.cluster, args.ranks_per_host
    m = args.microbatches or 8
    models = args.models
    jobs = cluster_jobs(hosts, per_host, m, args.steps, args.nic_gbit, models)
    start = time.monotonic()
    with working(f"meshcast bench pipeline: {len(jobs)} training runs on {hosts * per_host} "
                 "ranks"):
        results, where = _run_jobs_on_cluster(jobs, hosts, per_host, args.nic_gbit,
                                              timeout=60.0 + 60.0 * len(jobs))
    wall = time.monotonic() - start
    rows: dict[tuple[str, str, str], dict] = {}
    for k, job in enumerate(jobs):
        per_rank = [results[r][k] for r in range(len(results))]
        # step time: the slowest rank's, each step starting at a barrier; first step not timed
        steps = [max(p["seconds"][s] for p in per_rank) for s in range(1, job.steps)]
        step_s = statistics.median(steps)
        peaks = {}
        for p in per_rank:
            peaks[p["stage"]] = max(peaks.get(p["stage"], 0), p["peak_activation_bytes"])
        model, strategy, sched = job.label.split("|")
        rows[(model, strategy, sched)] = {
            "samples": job.batch_size / step_s, "step_s": step_s,
            "peaks": [peaks[i] for i in range(job.num_stages)], "job": job,
        }
    console = Console(width=160)
    table = Table(title=f"Measured: {hosts} stages x {per_host} ranks (tensor-parallel), {m} "
                  f"microbatches; {where}", title_justify="left")
    for name in ("model", "strategy", "schedule", "samples/s", "step ms",
                 "vs send_recv+1F1B", "vs free (same schedule)",
                 "peak activations per stage (MiB)"):
        table.add_column(name, justify="right")
    for (model, strategy, sched), row in rows.items():
        base = rows[(model, "send_recv", "1f1b")]["samples"]
        free = rows[(model, "free", sched)]["samples"]
        table.add_row(
            model, strategy, sched, f"{row['samples']:.1f}", f"{row['step_s'] * 1e3:.0f}",
            f"{row['samples'] / base:.2f}x", f"{row['samples'] / free:.2f}",
            ", ".join(f"{b / 2**20:.1f}" for b in row["peaks"]),
        )
    console.print(table)
    notes = []
    for model in models:
        job = rows[(model, "send_recv", "1f1b")]["job"]
        from ..training.training import stage_graph

        graph = stage_graph(job)
        sends = "; ".join(
            f"stage {i} sends " + ", ".join(f"{e.name}{list(e.shape)}" for e in graph.sends(i))
            for i in range(graph.num_stages - 1))
        notes.append(f"{model}: {job.config}; microbatch {job.microbatch_size} sequences, "
                     f"float32: {sends}")
    console.print(
        "free: every boundary tensor replaced by a 1-byte message (signal send/recv), the "
        "receivers compute on stand-in tensors.\n"
        f"Step time: median over steps 2..{args.steps} of the slowest rank, every step starting "
        "at a barrier. Peak activations: bytes autograd saves for the microbatches a stage holds "
        "at once (parameters excluded).\n"
        + "\n".join(notes) + f"\nWall time of the whole run: {wall:.0f} s."
    )
    return 0
