"""``meshcast bench plan-speed``: how fast decomposition and planning are on large tasks."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask
from ..planning.planner import STRATEGIES, plan
from .common import integer, progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast bench plan-speed``."""
    parser.add_argument("--repeats", type=integer(1), default=3,
                        help="best of this many runs (default 3)")


def large_task() -> ReshardTask:
    """About 100,000 unit slices: a 20x20 mesh splitting rows to a 16x16 mesh splitting columns."""
    src = Layout(Mesh.from_range(0, (20, 20)), "S01R")
    dst = Layout(Mesh.from_range(400, (16, 16)), "RS01")
    return ReshardTask((4000, 4000), "float32", src, dst)


def _best(fn, repeats: int, advance) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        advance(1)
    return min(times)


def run(args: argparse.Namespace) -> int:
    """Time decomposition and each strategy's planning on a fresh task each run."""
    n = len(large_task().unit_slices())
    table = Table(
        title=f"Planning speed: {large_task().describe()}, {n} unit slices, best of {args.repeats}"
    )
    table.add_column("step")
    table.add_column("seconds", justify="right")
    steps = (1 + len(STRATEGIES)) * args.repeats
    with progress("meshcast bench plan-speed: timed runs", steps) as advance:
        seconds = _best(lambda: large_task().unit_slices(), args.repeats, advance)
        table.add_row("decompose (unit_slices)", f"{seconds:.3f}")
        for strategy in STRATEGIES:
            seconds = _best(lambda s=strategy: plan(large_task(), strategy=s), args.repeats,
                            advance)
            table.add_row(f"plan strategy={strategy}", f"{seconds:.3f}")
    Console().print(table)
    return 0
