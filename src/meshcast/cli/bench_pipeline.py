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
   planned with the broadcast strategy and timed by :func:`meshcast.estimate.simulate.simulate`.
   Compute times: FLOPs of each stage's forward and backward counted by
   ``torch.utils.flop_counter`` on the meta device (no memory, no compute), divided by
   ``--tflops`` per GPU times the GPUs of a stage. An estimate, not a measurement.

``--cluster N`` runs the real pipeline runtime (:mod:`meshcast.pipeline.runtime`): ``N`` stages,
one emulated host each (docs/cluster.md: a network namespace per host, NIC shaped with ``tc`` to
``--nic-gbit``), ``--ranks-per-host`` ranks per host, tensor-parallel inside a stage. Both models
(sizes in :func:`meshcast.bench.pipeline_runs.cluster_jobs`) are trained with every strategy x
{1F1B, eager-1F1B}, GPipe (broadcast) and the free-communication bound (every boundary tensor
replaced by a 1-byte message) of each schedule; it prints samples/s and the peak activation
memory of each stage. Without root (no namespaces) it runs on loopback instead, hosts emulated
for planning only, and says so.

A benchmark, not a test: it prints figures, it asserts nothing. The library code is in
:mod:`meshcast.bench.pipeline_sim` and :mod:`meshcast.bench.pipeline_runs`; this module parses
arguments and prints.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..bench.pipeline_runs import CLUSTER_RUNS, cluster_jobs, job_notes, run_cluster_jobs
from ..bench.pipeline_sim import (
    COLUMNS,
    TIMER,
    gpt_case,
    model_rows,
    step_times,
    utransformer_case,
)
from ..pipeline import SCHEDULES, chain_links, schedule
from .common import comma_list, integer, number, numbers, working

__all__ = ["CLUSTER_RUNS", "COLUMNS", "add_arguments", "run", "run_cluster", "step_times"]

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

    models = _table(
        f"Models, {m} microbatches, one host of 4 GPUs per stage, {args.tflops:g} TFLOP/s per "
        f"GPU; boundary times: {TIMER} (step time in ms)",
        ["model", "NIC Gbit/s", "fwd ms/mb", "xfer ms/mb"],
    )
    notes = []
    with working("meshcast bench pipeline: model rows (FLOP counts, plans)"):
        for case in (gpt_case(4), utransformer_case()):
            rows, note = model_rows(case, m, args.tflops, args.gbps)
            for row in rows:
                models.add_row(row["model"], row["nic"], f"{row['forward_s'] * 1e3:.1f}",
                               f"{row['transfer_s'] * 1e3:.1f}", *_cells(row["times"], 1e3, ".0f"))
            notes.append(note)
    console.print(models)
    console.print(
        "fwd ms/mb: forward of the slowest stage per microbatch (backward: about 2x); xfer ms/mb: "
        "transfer time of one microbatch over the busiest stage pair (all its tensors).\n"
        + "\n".join(notes)
        + "\nOverlap: forward sends run in the background (only the consumer waits); without it "
        "the sender blocks. Gradient sends always block. Links serialise their transfers."
    )
    return 0


def run_cluster(args: argparse.Namespace) -> int:
    """``--cluster N``: measured samples/s of every run of :data:`CLUSTER_RUNS`."""
    import time

    from rich.console import Console

    from ..bench.pipeline_runs import summarise_runs

    hosts, per_host = args.cluster, args.ranks_per_host
    m = args.microbatches or 8
    jobs = cluster_jobs(hosts, per_host, m, args.steps, args.nic_gbit, args.models)
    start = time.monotonic()
    with working(f"meshcast bench pipeline: {len(jobs)} training runs on {hosts * per_host} "
                 "ranks"):
        results, where = run_cluster_jobs(jobs, hosts, per_host, args.nic_gbit,
                                          timeout=60.0 + 60.0 * len(jobs))
    wall = time.monotonic() - start
    rows = summarise_runs(jobs, results)
    console = Console(width=160)
    console.print(_measured_table(rows, f"Measured: {hosts} stages x {per_host} ranks "
                                        f"(tensor-parallel), {m} microbatches; {where}"))
    console.print(
        "free: every boundary tensor replaced by a 1-byte message (signal send/recv), the "
        "receivers compute on stand-in tensors.\n"
        f"Step time: median over steps 2..{args.steps} of the slowest rank, every step starting "
        "at a barrier. Peak activations: bytes autograd saves for the microbatches a stage holds "
        "at once (parameters excluded).\n"
        + "\n".join(job_notes(rows, args.models)) + f"\nWall time of the whole run: {wall:.0f} s."
    )
    return 0


def _measured_table(rows: dict, title: str):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
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
    return table
