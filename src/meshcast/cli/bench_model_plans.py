"""``meshcast bench model-plans``: whole-model weight syncs on paper. Plans a Llama-70B-like and a
Kimi-K2-like model's weight sync (:mod:`meshcast.bench.model_plans`) with
:func:`meshcast.plan_many`, simulates each as one job with :func:`meshcast.simulate_many`, and
prints planning times, simulated times and the joint lower bound; for Kimi-K2, beside published
figures of comparable jobs. A benchmark: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import time

from rich.console import Console
from rich.table import Table

from ..bench.model_plans import (
    ModelSync,
    MoeSizes,
    SyncFigures,
    kimi_k2_tasks,
    llama70b_tasks,
    measure,
)
from .common import choice, dtype_arg, integer, working

__all__ = ["PUBLISHED", "add_arguments", "run"]

PUBLISHED = (
    ("1.3 s", "Kimi-K2, 256 training GPUs (BF16) -> 128 inference GPUs (FP8), RDMA WRITE, static "
              "schedule (Perplexity, 'Weight Transfer for RL Post-Training in under 2 seconds')"),
    ("1.447 s", "NCCL M2N, DeepSeek-V3 on 256 GB200"),
)
"""Published weight-sync times of comparable jobs: (time, what was measured)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast bench model-plans``."""
    parser.add_argument("--model", type=choice(("both", "llama", "kimi")), default="both",
                        help="both | llama | kimi (default both)")
    parser.add_argument("--layers", type=integer(1), default=None,
                        help="transformer layers (default: the model's, 80 and 61); a smaller "
                             "number keeps every other size and the layouts")
    parser.add_argument("--dtype", type=dtype_arg, default="bfloat16",
                        help="weight dtype (default bfloat16)")
    parser.add_argument("--repeats", type=integer(1), default=5,
                        help="cached plan_many calls timed, best taken (default 5)")


def _syncs(args: argparse.Namespace) -> list[ModelSync]:
    out = []
    if args.model in ("both", "llama"):
        layers = {} if args.layers is None else {"layers": args.layers}
        out.append(llama70b_tasks(dtype=args.dtype, **layers))
    if args.model in ("both", "kimi"):
        sizes = MoeSizes() if args.layers is None else MoeSizes(
            layers=args.layers, dense_layers=min(1, args.layers))
        out.append(kimi_k2_tasks(sizes, dtype=args.dtype))
    return out


def _rows(f: SyncFigures) -> list[tuple[str, str]]:
    return [
        ("tensors (tasks)", f"{f.tasks}"),
        ("parameters", f"{f.params:.4e}"),
        ("weights GB", f"{f.nbytes / 1e9:,.1f}"),
        ("operations", f"{f.ops:,}"),
        ("plan_many first call s", f"{f.plan_s:.3f}"),
        ("plan_many cached us", f"{f.cached_us:,.0f}"),
        ("cached = same objects", "yes" if f.same_objects else "NO"),
        ("plan.check() all s", f"{f.check_s:.3f}"),
        ("plan_many sync order s", f"{f.sync_plan_s:.3f}"),
        ("simulate_many s", f"{f.simulate_s:.3f}"),
        ("joint_lower_bound s", f"{f.bound_s:.3f}"),
        ("sync, model order s", f"{f.model_order_time:.4f}"),
        ("  x bound", f"{f.model_order_time / f.bound:.3f}"),
        ("sync, sync order s", f"{f.sync_order_time:.4f}"),
        ("  x bound", f"{f.sync_order_time / f.bound:.3f}"),
        ("lower bound s", f"{f.bound:.4f}"),
    ]


def run(args: argparse.Namespace) -> int:
    """Build, plan, simulate and bound each model's sync; print one column per model."""
    started, load = time.perf_counter(), os.getloadavg()[0]
    syncs = _syncs(args)
    figures = []
    for sync in syncs:
        with working(f"meshcast bench model-plans: {sync.model}"):
            figures.append(measure(sync, args.repeats))
    table = Table(title=f"Weight sync plans ({args.dtype}, h100x8 hosts)")
    table.add_column("")
    for sync in syncs:
        hosts = sync.topology.num_hosts
        table.add_column(f"{sync.model} ({hosts} hosts)", justify="right")
    per_model = [_rows(f) for f in figures]
    for i, (label, _) in enumerate(per_model[0]):
        table.add_row(label, *(rows[i][1] for rows in per_model))
    console = Console(width=max(80, 30 + 22 * len(syncs)))
    console.print(table)
    print(f"parameters: {', '.join(f'{s.model} {f.params:,}' for s, f in zip(syncs, figures))}")
    for sync, f in zip(syncs, figures):
        if sync.model == "Kimi-K2":
            print(f"Kimi-K2 simulated {f.sync_order_time:.3f} s (lower bound {f.bound:.3f} s); "
                  "published, comparable jobs:")
            for seconds, what in PUBLISHED:
                print(f"  {seconds}: {what}")
    print(f"total {time.perf_counter() - started:.1f} s; load average (1 min) {load:.2f} at the "
          f"start, {os.getloadavg()[0]:.2f} at the end")
    return 0
