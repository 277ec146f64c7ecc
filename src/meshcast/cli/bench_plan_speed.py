"""``meshcast bench plan-speed``: how fast ``meshcast.plan`` (balance ``"auto"``) answers, on the
first call and from its plan cache, with the quality of what it answers (simulated time / lower
bound). Rows: the eight paper cases, an 8x8 -> 4x8 task, the small tasks of the planner suite
(at most 64 unit slices: how many plan in under 5 ms) and, with ``--large``, the 16x8 and 64x8
all-to-all tasks of docs/scheduling.md on their topologies. A benchmark: it prints figures, it
asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from ..bench.planner_suite import suite_rows
from ..core.cache import clear_caches
from ..core.cases import PAPER_CASES
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..estimate.lower_bound import lower_bound
from ..estimate.simulate import simulate
from ..planning.planner import plan
from .common import integer, progress

__all__ = ["add_arguments", "large_rows", "run", "small_rows"]

SMALL_SLICES = 64
"""Tasks of at most this many unit slices count as small (the 5 ms target of issue 14)."""

Row = tuple[str, ReshardTask, Topology]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast bench plan-speed``."""
    parser.add_argument("--repeats", type=integer(1), default=200,
                        help="cached calls timed per task, the best taken (default 200)")
    parser.add_argument("--suite", type=integer(0), default=200,
                        help="random tasks of the planner suite drawn (default 200; its tasks "
                             f"of at most {SMALL_SLICES} unit slices are timed)")
    parser.add_argument("--large", action="store_true",
                        help="also the 16x8 and 64x8 all-to-all tasks (minutes)")
    parser.add_argument("--cpu", action="store_true",
                        help="time the first calls in this process's CPU seconds instead of wall "
                             "seconds (steadier on a loaded machine; cached calls stay wall)")


def _all_to_all(hosts: int, spec_src: str, spec_dst: str, shape: tuple[int, ...],
                dtype: str) -> ReshardTask:
    ranks = hosts * 8
    src = Layout(Mesh.from_range(0, (hosts, 8)), spec_src)
    dst = Layout(Mesh.from_range(ranks, (hosts, 8)), spec_dst)
    return ReshardTask(shape, dtype, src, dst)


def small_rows() -> list[Row]:
    """The paper cases (``p3.8xlarge`` hosts) and ``8x8:S0S1 -> 4x8@64:S1S0`` (8192, 8192)
    bfloat16 on mesh-row hosts with 100 Gbit/s NICs."""
    rows: list[Row] = []
    for case in PAPER_CASES:
        task = case.task()
        rows.append((case.name, task, Topology.preset("p3.8xlarge", max(task.dst.mesh.devices)
                                                      // 4 + 1)))
    src = Layout(Mesh.from_range(0, (8, 8)), "S0S1")
    dst = Layout(Mesh.from_range(64, (4, 8)), "S1S0")
    task = ReshardTask((8192, 8192), "bfloat16", src, dst)
    rows.append(("8x8:S0S1 -> 4x8@64:S1S0", task,
                 Topology.from_meshes(src.mesh, dst.mesh, nic_in_gbps=100, nic_out_gbps=100)))
    return rows


def large_rows() -> list[Row]:
    """``16x8:S01R -> 16x8@128:RS01`` (8192, 8192) bfloat16, 8 ranks and one 100 Gbit/s NIC per
    host; ``64x8:S01RR -> 64x8@512:RS01R`` (4096, 4096, 64) float32 with 400 Gbit/s NICs, one
    per 8 ranks, one per 2 and one per rank."""
    rows: list[Row] = [("16x8 all-to-all, 1 NIC/host", _all_to_all(16, "S01R", "RS01",
                                                                     (8192, 8192), "bfloat16"),
                        Topology.uniform(32, 8, nic_gbps=100))]
    for nics, what in ((1, "1 NIC/8 ranks"), (4, "1 NIC/2 ranks"), (8, "1 NIC/rank")):
        rows.append((f"64x8 all-to-all, {what}",
                     _all_to_all(64, "S01RR", "RS01R", (4096, 4096, 64), "float32"),
                     Topology.uniform(128, 8, nic_gbps=400, nics_per_host=nics)))
    return rows


def _seconds(fn: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> float:
    start = clock()
    fn()
    return clock() - start


def _measure(row: Row, repeats: int, clock: Callable[[], float]) -> tuple[float, float, float]:
    """(first call s on ``clock``, best cached call s, simulated / lower bound) of one task:
    the first call on a fresh task object with the cache bypassed, then the cached calls; the
    plan cache is emptied after each task (large plans held there slow every later allocation's
    garbage collection)."""
    _, task, topo = row
    fresh = ReshardTask.from_json(task.to_json())  # nothing derived from it yet
    first = _seconds(lambda: plan(fresh, topo, cache=False), clock)
    made = plan(task, topo)
    cached = min(_seconds(lambda: plan(task, topo)) for _ in range(repeats))
    ratio = simulate(made, topo).time_s / lower_bound(task, topo)
    clear_caches(["planning.plan"])
    gc.collect()
    return first, cached, ratio


def run(args: argparse.Namespace) -> int:
    """Time the rows and the suite's small tasks; print two tables and the load average."""
    rows = small_rows() + (large_rows() if args.large else [])
    suite = [(name, task, topo) for name, task, topo, paper in suite_rows(args.suite, 0,
                                                                            "p3.8xlarge")
             if not paper and len(task.decomposition) <= SMALL_SLICES]
    plan(PAPER_CASES[0].task("int32", scale=64), cache=False)  # imports and first-use set-up
    table = Table(title="meshcast.plan (auto): first call" + (" (CPU)" if args.cpu else "")
                  + ", cached call, quality")
    for col in ("task", "unit slices", "first call ms", "cached call us", "simulated / bound"):
        table.add_column(col, justify="left" if col == "task" else "right")
    firsts = []
    clock = time.process_time if args.cpu else time.perf_counter
    with progress("meshcast bench plan-speed: tasks timed", len(rows) + len(suite)) as advance:
        for row in rows:
            first, cached, ratio = _measure(row, args.repeats, clock)
            table.add_row(row[0], f"{len(row[1].decomposition):,}", f"{first * 1e3:.2f}",
                          f"{cached * 1e6:.1f}", f"{ratio:.4f}")
            advance(1)
        for _, task, topo in suite:
            fresh = ReshardTask.from_json(task.to_json())
            firsts.append(_seconds(lambda t=fresh, g=topo: plan(t, g, cache=False), clock))
            advance(1)
    console = Console(width=max(Console().width, 110))
    console.print(table)
    if firsts:
        ms = sorted(f * 1e3 for f in firsts)
        p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
        cpu = " (CPU)" if args.cpu else ""
        console.print(
            f"planner suite (seed 0), {len(ms)} tasks of at most {SMALL_SLICES} unit slices, "
            f"first call{cpu}: median {statistics.median(ms):.2f} ms, p90 {p90:.2f} ms, "
            f"max {ms[-1]:.2f} ms; under 5 ms: {sum(m < 5 for m in ms)} of {len(ms)}")
    console.print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}"
                                                               for x in os.getloadavg()))
    return 0
