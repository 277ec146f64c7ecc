"""``meshcast demo``: the main job.

1. Plans the paper's eight cases with each strategy (operations, bytes across hosts, busiest NIC).
2. Runs one resharding for real: two 2x4 meshes on 16 ranks, 4 hosts of 4 ranks (source on hosts
   0-1, destination on hosts 2-3), the paper's case 2 (RRR -> S0RR), with each strategy
   (send_recv, allgather, broadcast, and auto: ``plan()``'s defaults). Every rank checks its
   result exactly; the table gives the time, the effective bandwidth and the bytes that crossed
   hosts as counted by the runtime. With root and network namespaces it runs on an emulated
   cluster (:mod:`meshcast.cluster`, NICs shaped to ``--nic-gbit``, brought up under a name unique
   to this process and always brought down); otherwise on loopback (``launch(hosts=4)``, links
   not shaped) and it says so.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from ..core.cases import PAPER_CASES
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask
from ..core.units import fmt_bytes
from ..planning.planner import STRATEGIES, plan
from .common import integer, number, working

HOSTS, PER_HOST = 4, 4
WORLD = HOSTS * PER_HOST
RUN_STRATEGIES = ("send_recv", "allgather", "broadcast", "auto")
"""Strategies of the real run; ``auto`` is ``plan(task, topology)`` with no strategy given."""
CASE = PAPER_CASES[1]  # case 2: RRR -> S0RR, source fully replicated


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast demo``."""
    parser.add_argument("--scale", type=_scale, default=1,
                        help="planning table: divide the paper's tensors' first dimension by "
                        "this (default 1)")
    parser.add_argument("--mib", type=_even_mib, default=64,
                        help="real run: tensor size in MiB, even (default 64)")
    parser.add_argument("--reps", type=integer(1), default=3,
                        help="real run: timed repetitions per strategy after one warm-up (3)")
    parser.add_argument("--nic-gbit", type=number(0.0), default=1.0,
                        help="real run: NIC speed of each emulated host (default 1 Gbit/s)")
    parser.add_argument("--loopback", action="store_true",
                        help="real run on loopback even where an emulated cluster is possible")
    parser.add_argument("--plan-only", action="store_true", help="skip the real run")


def _scale(text: str) -> int:
    """``--scale``: a divisor of the first dimension of every paper case."""
    value = integer(1)(text)
    first = math.gcd(*(case.shape[0] for case in PAPER_CASES))
    if first % value:
        raise argparse.ArgumentTypeError(
            f"must divide {first} (the paper's tensors' first dimension), got {text!r}")
    return value


def _even_mib(text: str) -> int:
    """``--mib``: an even number of MiB, at least 2 (the tensor is split in halves)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 2 or value % 2:
        raise argparse.ArgumentTypeError(f"must be an even integer >= 2, got {text!r}")
    return value


def planning_table(scale: int = 1) -> Table:
    """Per case and strategy: operations, bytes across hosts, busiest NIC in and out."""
    table = Table(title="Plans for the paper's n-to-m cases (hosts = mesh rows)")
    for column in ("case", "strategy", "ops", "across hosts", "max host in", "max host out"):
        table.add_column(column, justify="left" if column in ("case", "strategy") else "right")
    for case in PAPER_CASES:
        task = case.task("int32", scale)
        for i, strategy in enumerate(STRATEGIES):
            p = plan(task, strategy=strategy)
            per_host = p.bytes_per_host().values()
            table.add_row(
                case.name if i == 0 else "",
                strategy,
                str(len(p.ops)),
                fmt_bytes(p.cross_host_bytes()),
                fmt_bytes(max(v for _, v in per_host)),
                fmt_bytes(max(o for o, _ in per_host)),
                end_section=i == len(STRATEGIES) - 1,
            )
    return table


def demo_task(mib: int) -> ReshardTask:
    """Case 2 on two 2x4 meshes of 16 ranks: ``(mib, 256, 1024)`` float32 (``mib`` MiB)."""
    src = Layout(Mesh.from_range(0, (2, 4)), CASE.src_spec)
    dst = Layout(Mesh.from_range(8, (2, 4)), CASE.dst_spec)
    return ReshardTask((mib, 256, 1024), "float32", src, dst)


def demo_rank(rank: int, mib: int, reps: int) -> dict[str, Any]:
    """One rank of the real run: each strategy once to warm up, then ``reps`` timed runs (each
    between two barriers); the result is checked against the same seeded global tensor."""
    import torch
    import torch.distributed as dist

    from ..runtime import detect_topology, reset_transfer_stats, reshard, transfer_stats

    task = demo_task(mib)
    topology = detect_topology()
    full = torch.randn(task.shape, generator=torch.Generator().manual_seed(0))
    src, dst = task.src_box(rank), task.dst_box(rank)
    local = None if src is None else full[src].clone()
    report: dict[str, Any] = {}
    for strategy in RUN_STRATEGIES:
        p = plan(task, topology, strategy=None if strategy == "auto" else strategy)
        times, cross, exact = [], 0, True
        for i in range(reps + 1):
            reset_transfer_stats()
            dist.barrier()
            t0 = time.perf_counter()
            out = reshard(local, p)
            dist.barrier()
            if i:
                times.append(time.perf_counter() - t0)
            cross = transfer_stats().cross_host_bytes
            exact = exact and (out is None if dst is None else torch.equal(out, full[dst]))
            del out
        report[strategy] = {"times": times, "cross": cross, "exact": exact, "ops": len(p.ops)}
    return report


def run_real(args: argparse.Namespace, console: Console) -> int:
    """The real run: start the 16 ranks, print the measured table."""
    from ..cluster import INTRA_GBPS
    from ..cluster.job import run_on_emulated_hosts
    from ..core.topology import Topology
    from ..estimate.lower_bound import lower_bound

    task = demo_task(args.mib)
    console.print(
        f"\nReal run: {CASE.name} of a {args.mib} MiB float32 tensor {task.shape}, source mesh "
        f"ranks 0-7 (hosts 0-1), destination ranks 8-15 (hosts 2-3), {HOSTS} hosts x {PER_HOST} "
        "ranks; starting 16 processes ..."
    )
    start = time.monotonic()
    with working(f"meshcast demo: {WORLD} ranks x {len(RUN_STRATEGIES)} strategies"):
        results, where = run_on_emulated_hosts(
            demo_rank, WORLD, PER_HOST, nic_gbit=args.nic_gbit, args=(args.mib, args.reps),
            timeout=600, loopback=args.loopback, name=f"mc-demo{os.getpid() % 100000}",
        )
    wall = time.monotonic() - start
    bound = lower_bound(task, Topology.uniform(HOSTS, PER_HOST, nic_gbps=args.nic_gbit,
                                               intra_gbps=INTRA_GBPS, latency_us=0.0))
    table = Table(title=f"Measured on {where}", title_justify="left")
    for column in ("strategy", "ops", "time (s)", "effective Gbit/s", "x lower bound",
                   "bytes across hosts", "exact"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    wrong = []
    for strategy in RUN_STRATEGIES:
        rows = [r[strategy] for r in results]
        t = statistics.median(max(r["times"][i] for r in rows) for i in range(args.reps))
        exact = all(r["exact"] for r in rows)
        if not exact:
            wrong.append(strategy)
        table.add_row(
            "auto (plan() default)" if strategy == "auto" else strategy,
            str(rows[0]["ops"]),
            f"{t:.3f}",
            f"{task.nbytes * 8 / t / 1e9:.2f}",
            f"{t / bound:.2f}",
            fmt_bytes(sum(r["cross"] for r in rows)),
            "yes" if exact else "NO",
        )
    console.print(table)
    console.print(
        f"time: median of {args.reps} runs (after a warm-up) of the slowest rank, each between "
        f"two barriers; effective Gbit/s = tensor bits ({args.mib} MiB) / time; lower bound "
        f"{bound:.3f} s (the destination hosts' NICs at {args.nic_gbit:g} Gbit/s line rate); bytes "
        "across hosts: the runtime's own counters (transfer_stats) summed over the ranks, one run. "
        f"exact: every rank compared its shard with the expected values (torch.equal). "
        f"Wall time {wall:.0f} s, including process start-up (timings on a shared machine are "
        "noisy)."
    )
    if wrong:
        console.print(f"[bold red]WRONG results with: {', '.join(wrong)}[/]")
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    """Print the planning comparison, then run the real resharding (unless ``--plan-only``)."""
    console = Console(width=max(Console().width, 110))
    console.print(planning_table(args.scale))
    if args.plan_only:
        return 0
    return run_real(args, console)
