"""Runtime measurements on the emulated cluster: the chunk-size default, and the all-gather
transport (point-to-point vs gloo's all_gather).

    sudo .venv/bin/python benchmarks/runtime_chunks.py [--nic-gbit 1] [--mib 64] [--reps 3]

Brings up a 3-host x 4-rank cluster (namespaces mc-rtb<pid>-*, NICs shaped to --nic-gbit), runs
one :func:`meshcast.launch` job on it and brings the cluster down. Every time is the slowest
rank's, each run between two barriers, median of --reps after one warm-up; every result is
checked exactly. A timing tool, not a test: on a shared 2-core machine the figures are noisy.

1. Broadcast over a chain of 3 hosts: --mib MiB float32 replicated from rank 0 (host 0) to the 8
   ranks of hosts 1 and 2 (chain 0 -> 4 -> 8, leaders fan out to their host's 3 ranks), the
   runtime's host-aware broadcast with chunk sizes 64 KiB .. 8 MiB; for reference one plain
   ``dist.send`` of the tensor to one rank of host 1, and the send_recv strategy (rank 0 sends to
   all 8 receivers). ``--leaders``: the same chain with one receiver per host (ranks 4 and 8).
2. All-gather inside host 0 (ranks 0-3, loopback, not shaped): 4 parts of --ag-mib MiB each, by
   meshcast's point-to-point all-gather (a plan of one ``AllGather``, chunk sizes --ag-chunks) vs
   gloo's ``all_gather`` on a group of the 4 ranks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

KIB = 1024
CHUNKS = [64 * KIB, 128 * KIB, 256 * KIB, 512 * KIB, 1 << 20, 2 << 20, 4 << 20, 8 << 20]


def _timed(fn, reps: int) -> list[float]:
    import torch.distributed as dist

    times = []
    for i in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        if i:
            times.append(time.perf_counter() - t0)
    return times


def worker(rank: int, mib: int, ag_mib: int, reps: int, chunks: list[int], leaders: bool,
           ag_chunks: list[int]) -> dict:
    """One rank: every measurement; returns {label: (times, exact)}."""
    import torch
    import torch.distributed as dist

    import meshcast
    from meshcast import AllGather, Copy, Layout, Mesh, Plan, ReshardTask, plan

    topology = meshcast.detect_topology()
    out: dict = {}

    # 1. broadcast from rank 0 to hosts 1 and 2
    task = ReshardTask((mib << 18,), "float32", Layout(Mesh([[0]]), "R"),
                       Layout(Mesh.from_range(4, (2, 4)), "R"))
    full = torch.arange(mib << 18, dtype=torch.float32)
    local = full if rank == 0 else None
    result: list = [None]

    def run(p, chunk):
        result[0] = meshcast.reshard(local, p, chunk_bytes=chunk)

    def exact() -> bool:
        if task.dst_box(rank) is None:
            return result[0] is None
        return torch.equal(result[0], full)

    bc = plan(task, topology, strategy="broadcast")
    for chunk in chunks:
        times = _timed(lambda c=chunk: run(bc, c), reps)
        out[f"broadcast to 8, chunk {chunk // KIB} KiB"] = (times, exact())
    if leaders:  # the chain alone: one receiver per host (ranks 4 and 8)
        task_l = ReshardTask(task.shape, "float32", task.src, Layout(Mesh([[4], [8]]), "R"))
        bc_l = plan(task_l, topology, strategy="broadcast")
        for chunk in chunks:
            times = _timed(lambda c=chunk: run(bc_l, c), reps)
            ok = result[0] is None if task_l.dst_box(rank) is None else torch.equal(result[0], full)
            out[f"broadcast to 4, 8 only, chunk {chunk // KIB} KiB"] = (times, ok)
    sr = plan(task, topology, strategy="send_recv")
    times = _timed(lambda: run(sr, 1 << 20), reps)
    out["send_recv (rank 0 -> each of 8), 1 MiB chunks"] = (times, exact())
    buf = torch.empty_like(full)

    def plain() -> None:
        if rank == 0:
            dist.send(full, 4)
        elif rank == 4:
            dist.recv(buf, 0)

    times = _timed(plain, reps)
    out["one dist.send 0 -> 4 (reference)"] = (times, rank != 4 or torch.equal(buf, full))
    result[0] = None

    # 2. all-gather inside host 0
    group_ranks = [0, 1, 2, 3]
    group = dist.new_group(group_ranks)  # every rank calls it
    n = ag_mib << 18
    whole = torch.arange(4 * n, dtype=torch.float32) * 3
    mesh = Mesh([group_ranks])
    ag_task = ReshardTask((4 * n,), "float32", Layout(mesh, "S1"), Layout(mesh, "R"))
    parts = tuple((slice(k * n, (k + 1) * n),) for k in range(4))
    ag_plan = Plan(ag_task, (*(Copy(r, parts[r]) for r in group_ranks),
                             AllGather(tuple(group_ranks), ((slice(0, 4 * n),)), parts)),
                   "allgather", "none", topology)
    mine = whole[parts[rank]].clone() if rank in group_ranks else None
    got: list = [None]

    def p2p(chunk: int) -> None:
        got[0] = meshcast.reshard(mine, ag_plan, chunk_bytes=chunk)

    for chunk in ag_chunks:
        times = _timed(lambda c=chunk: p2p(c), reps)
        ok = rank not in group_ranks or torch.equal(got[0], whole)
        out[f"all-gather 4 x {ag_mib} MiB, meshcast p2p, chunk {chunk // KIB} KiB"] = (times, ok)
    target = torch.empty(4 * n, dtype=torch.float32)

    def gloo() -> None:
        if rank in group_ranks:
            dist.all_gather(list(target.chunk(4)), mine, group=group)

    times = _timed(gloo, reps)
    ok = rank not in group_ranks or torch.equal(target, whole)
    out[f"all-gather 4 x {ag_mib} MiB, gloo all_gather"] = (times, ok)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nic-gbit", type=float, default=1.0)
    parser.add_argument("--mib", type=int, default=64, help="broadcast tensor size (MiB)")
    parser.add_argument("--ag-mib", type=int, default=16, help="all-gather part size (MiB)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--chunks", default=",".join(str(c // KIB) for c in CHUNKS),
                        help="broadcast chunk sizes in KiB, comma-separated")
    parser.add_argument("--ag-chunks", default="1024",
                        help="all-gather chunk sizes in KiB, comma-separated (default 1024)")
    parser.add_argument("--leaders", action="store_true",
                        help="also broadcast to the two leaders only (the bare chain)")
    args = parser.parse_args()

    import meshcast
    from meshcast.cluster import Cluster

    chunks = [int(c) * KIB for c in args.chunks.split(",")]
    ag_chunks = [int(c) * KIB for c in args.ag_chunks.split(",")]
    start = time.monotonic()
    with Cluster.up(3, nic_gbit=args.nic_gbit, latency_ms=0.0,
                    name=f"mc-rtb{os.getpid() % 100000}") as cluster:
        results = meshcast.launch(worker, 12, cluster=cluster, timeout=900,
                                  args=(args.mib, args.ag_mib, args.reps, chunks, args.leaders,
                                        ag_chunks))
    print(f"emulated cluster: 3 hosts x 4 ranks, NICs {args.nic_gbit:g} Gbit/s; median of "
          f"{args.reps} after a warm-up, slowest rank; wall {time.monotonic() - start:.0f} s")
    for label in results[0]:
        per_rep = [max(r[label][0][i] for r in results) for i in range(args.reps)]
        t = statistics.median(per_rep)
        ok = all(r[label][1] for r in results)
        nbytes = (args.mib << 20) if "all-gather" not in label else 4 * (args.ag_mib << 20)
        print(f"{label:<52} {t:8.3f} s  {nbytes / t / 1e6:8.1f} MB/s  "
              f"(runs {', '.join(f'{x:.3f}' for x in per_rep)})  {'exact' if ok else 'WRONG'}")


if __name__ == "__main__":
    main()
