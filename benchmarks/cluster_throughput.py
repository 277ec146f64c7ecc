"""Cross-host vs intra-host torch.distributed (gloo) throughput on the emulated cluster.

    sudo .venv/bin/python benchmarks/cluster_throughput.py [--nic-gbit 1] [--mib 64] [--reps 5]

Brings up a 2-host x 2-rank cluster (namespaces mc-bench-<pid>-*), runs this file as the worker in
every rank, prints MB/s (10^6 bytes per second, median of --reps) and brings the cluster down.
Each measurement: the sender starts a clock, sends --mib MiB with dist.send, the receiver answers
with a one-element ack, the clock stops. Cases: rank 0 -> 1 (same host, loopback), rank 0 -> 2
(other host, through both shaped links) and ranks 0,1 -> 2,3 at once (two flows sharing the NICs;
aggregate figure). A timing tool, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta


def worker(mib: int, reps: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    data = torch.ones(mib << 18, dtype=torch.float32)  # mib MiB
    buf = torch.empty_like(data)
    ack = torch.zeros(1)

    def transfer(pairs: list[tuple[int, int]]) -> float | None:
        """Each (src, dst) pair moves the tensor at once; returns src's seconds (None elsewhere)."""
        dist.barrier()
        for src, dst in pairs:
            if rank == src:
                t0 = time.perf_counter()
                dist.send(data, dst)
                dist.recv(ack, dst)
                return time.perf_counter() - t0
            if rank == dst:
                dist.recv(buf, src)
                dist.send(ack, src)
        return None

    cases = {
        "intra-host (rank 0 -> 1)": [(0, 1)],
        "cross-host (rank 0 -> 2)": [(0, 2)],
        "cross-host, 2 flows (0->2, 1->3), aggregate": [(0, 2), (1, 3)],
    }
    for label, pairs in cases.items():
        transfer(pairs)  # warm-up: connections, allocation
        times = [transfer(pairs) for _ in range(reps)]
        mine = [t for t in times if t is not None]
        gathered: list[list[float]] = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            per_flow = [statistics.median(g) for g in gathered if g]
            nbytes = len(per_flow) * data.numel() * data.element_size()
            mbps = nbytes / max(per_flow) / 1e6
            print(f"{label:48s} {mbps:8.1f} MB/s   (median of {reps}, {mib} MiB per flow)",
                  flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nic-gbit", type=float, default=1.0)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.mib, args.reps)
        return 0

    from meshcast.cluster import Cluster, available, start_job, wait_job

    ok, reason = available()
    if not ok:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    name = f"mc-bench-{os.getpid()}"
    with Cluster.up(2, nic_gbit=args.nic_gbit, latency_ms=0.0, name=name) as cluster:
        print(f"cluster {name}: 2 hosts x 2 ranks, {cluster.nic_gbit:g} Gbit/s per host and "
              f"direction (tbf), latency {cluster.latency_ms:g} ms", flush=True)
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "--mib", str(args.mib),
                "--reps", str(args.reps)]
        procs = start_job(cluster, argv, 2, stderr=subprocess.DEVNULL)
        codes = wait_job(procs, args.timeout)
    if any(codes):
        print(f"workers failed: exit codes {codes}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
