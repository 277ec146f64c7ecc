"""Ordered (one operation at a time per rank) vs concurrent posting in ``meshcast.reshard``.

Runs paper cases 2, 3, 5 and 8 (32 MiB int32) on a 4-host x 4-rank emulated cluster at
1 Gbit/s with a naive and a balanced plan each, and prints the median of two timed runs (after
a warm-up) in both modes next to the simulated time and the lower bound. Needs root.

    sudo .venv/bin/python benchmarks/runtime_ordered.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

import meshcast as mc
from meshcast.cluster import Cluster
from meshcast.core.cases import PAPER_CASES

CASES = (2, 3, 5, 8)
COMBOS = (("send_recv", "none"), ("broadcast", "none"), ("broadcast", "order"), (None, None))


def _task(case: int) -> mc.ReshardTask:
    return PAPER_CASES[case - 1].task("int32", scale=64)


def rank_fn(rank: int) -> dict:
    """Every rank: time each plan in both modes; check the data exactly."""
    topology = mc.detect_topology()
    times = {}
    for case in CASES:
        task = _task(case)
        full = torch.arange(torch.Size(task.shape).numel(), dtype=torch.int32).reshape(task.shape)
        src, dst = task.src_box(rank), task.dst_box(rank)
        local = None if src is None else full[src].clone()
        for strategy, balance in COMBOS:
            p = mc.plan(task, topology, strategy=strategy, balance=balance)
            for ordered in (True, False):
                runs = []
                for _ in range(3):
                    dist.barrier()
                    start = time.perf_counter()
                    out = mc.reshard(local, p, ordered=ordered)
                    dist.barrier()
                    runs.append(time.perf_counter() - start)
                    assert (out is None) == (dst is None)
                    assert out is None or torch.equal(out, full[dst])
                times[case, strategy, balance, ordered] = statistics.median(runs[1:])
    return times


def main() -> None:
    with Cluster.up(4, nic_gbit=1.0, name="mc-ordered") as cluster:
        times = mc.launch(rank_fn, 16, cluster=cluster, timeout=900)[0]
        topology = cluster.topology(4)
    print("case  plan                 ordered  concurrent  simulated  lower bound  (seconds)")
    for case in CASES:
        task = _task(case)
        bound = mc.lower_bound(task, topology)
        for strategy, balance in COMBOS:
            name = f"{strategy}/{balance}" if strategy else "auto"
            sim = mc.simulate(
                mc.plan(task, topology, strategy=strategy, balance=balance), topology
            ).time_s
            print(
                f"{case:>4}  {name:<18} {times[case, strategy, balance, True]:>9.3f} "
                f"{times[case, strategy, balance, False]:>11.3f} {sim:>10.3f} {bound:>12.3f}"
            )


if __name__ == "__main__":
    main()
