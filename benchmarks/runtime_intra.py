"""The intra-host path of the ``"p2p"`` transport: shared memory against loopback sockets, in one
job, time and CPU.

    .venv/bin/python benchmarks/runtime_intra.py [--mib 64] [--reps 6]

One :func:`meshcast.launch` job of 4 local ranks, all on one host (no cluster, nothing shaped):

* ``bcast3``: --mib MiB int32 replicated from rank 0 to ranks 1-3 (a broadcast fanned out inside
  the host);
* ``send1``: the same tensor from rank 0 to rank 1 (a ``Send`` inside the host);

* ``many``: ``reshard_many`` of 8 tensors of --mib/8 MiB (int32, rows of 1024) from ranks 0-1
  (split by rows) to ranks 2-3 (split by columns): whole packed messages between ranks of the
  host, through segments (runtime/shm_messages.py) or sockets;

each with a new result tensor per call and with ``out=`` (the result written in place into a
buffer the rank keeps), each run alternating ``MESHCAST_INTRA=shm`` and ``socket`` so that both
paths see the same machine. Prints, per configuration, the median over --reps (after one
warm-up) of the slowest rank's time and of the CPU seconds of all 4 ranks (user + system,
``getrusage``, every thread of the process) during the call. Every result is checked exactly.
A timing tool, not a test: on a shared 2-core machine the figures are noisy; compare the two
paths of one run, as ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def _job(rank: int, n: int, reps: int) -> dict:
    import torch

    import meshcast
    from meshcast import Layout, Mesh, ReshardTask, Topology

    full = torch.arange(n, dtype=torch.int32)
    res: dict = {}
    for name, dst in (("bcast3", [[1, 2, 3]]), ("send1", [[1]])):
        task = ReshardTask((n,), "int32", Layout(Mesh([[0]]), "R"), Layout(Mesh(dst), "R"))
        plan = meshcast.plan(task, Topology.uniform(1, 4), strategy="broadcast")
        local = full.clone() if rank == 0 else None
        keep = torch.empty(n, dtype=torch.int32) if task.dst_box(rank) is not None else None

        def run(out, plan=plan, local=local):
            got = meshcast.reshard(local, plan, out=out)
            return got is None or torch.equal(got, full)

        _alternate(rank, name, reps, keep, run, res)
    _many(rank, n, reps, res)
    return res


def _alternate(rank: int, name: str, reps: int, keep, run, res: dict) -> None:
    """``run(out)`` (True if exact) with new results and with ``out=keep``, ``reps`` + 1 times,
    alternating the two intra-host paths; ``res[key]``: (time, CPU) per run."""
    import torch.distributed as dist

    for inplace in (False, True):
        for _ in range(reps + 1):
            for mode in ("shm", "socket"):
                os.environ["MESHCAST_INTRA"] = mode
                dist.barrier()
                c, t = _cpu(), time.monotonic()
                exact = run(keep if inplace else None)
                rec = (time.monotonic() - t, _cpu() - c)
                if not exact:
                    raise AssertionError(f"rank {rank}: wrong data ({name}, {mode})")
                res.setdefault(f"{name} {'out=' if inplace else 'new'} {mode}", []).append(rec)


def _many(rank: int, n: int, reps: int, res: dict) -> None:
    import torch

    import meshcast
    from meshcast import Layout, Mesh, ReshardTask, Topology

    shape = (max(2, n // 8 // 1024), 1024)
    tasks = [ReshardTask(shape, "int32", Layout(Mesh([[0, 1]]), "S0R"),
                         Layout(Mesh([[2, 3]]), "RS0")) for _ in range(8)]
    plans = [meshcast.plan(t, Topology.uniform(1, 4)) for t in tasks]
    fulls = [torch.arange(shape[0] * shape[1], dtype=torch.int32).view(shape) + k
             for k in range(8)]
    srcs = [None if t.src_box(rank) is None else f[t.src_box(rank)].clone()
            for t, f in zip(tasks, fulls)]
    keep = [None if t.dst_box(rank) is None else torch.empty_like(f[t.dst_box(rank)])
            for t, f in zip(tasks, fulls)]

    def run(out):
        got = meshcast.reshard_many(srcs, plans, out=out)
        return all(g is None or torch.equal(g, f[task.dst_box(rank)])
                   for g, task, f in zip(got, tasks, fulls))

    _alternate(rank, "many", reps, keep, run, res)


def main() -> None:
    """Run the job and print the table."""
    import meshcast

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=6)
    args = ap.parse_args()
    n = args.mib * 2**20 // 4
    print(f"load average before: {os.getloadavg()}")
    res = meshcast.launch(_job, 4, args=(n, args.reps), timeout=900)
    print(f"load average after: {os.getloadavg()}")
    for key in res[0]:
        runs = range(1, len(res[0][key]))  # the first is a warm-up
        t = statistics.median(max(r[key][i][0] for r in res) for i in runs)
        c = statistics.median(sum(r[key][i][1] for r in res) for i in runs)
        print(f"{key:22s} time {t * 1e3:7.1f} ms   CPU {c:6.3f} s")


if __name__ == "__main__":
    main()
