"""A Partial DTensor source, reduced on its mesh by an all-reduce or by a reduce-scatter toward the
destination (``reshard_dtensor(..., reduce_partial=...)``): time of the whole reshard and bytes
meshcast then moves, same run, real gloo processes on loopback.

    .venv/bin/python benchmarks/partial_reduce.py [--rows 2048] [--reps 5]

Source: ``[Partial("sum"), Shard(1)]`` on a 2 x 2 mesh of ranks 0-3; destination: ``Shard(0)`` on
ranks 4-7 (4 emulated hosts of 2). The reduction's own bytes per source rank are 2 (n-1)/n S for
the all-reduce and (n-1)/n S for the reduce-scatter (n = 2 ranks on the Partial axis, S the bytes
each holds); after it, the all-reduced source holds every element twice, the reduce-scattered one
once, and meshcast moves the same bytes either way. Prints the median time of each and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import meshcast as mc


def _job(rank: int, rows: int, reps: int) -> dict:
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    from meshcast.runtime.many import last_many_stats

    src = DeviceMesh("cpu", [[0, 1], [2, 3]])
    dst = DeviceMesh("cpu", [4, 5, 6, 7])
    glob = torch.zeros(rows, rows)
    base = distribute_tensor(glob, src, [Replicate(), Shard(1)], src_data_rank=None)
    # every source rank holds ones: the sum over the Partial axis (2 ranks) is 2 everywhere
    partial = DTensor.from_local(torch.ones_like(base.to_local()), src,
                                 [Partial("sum"), Shard(1)], run_check=False,
                                 shape=glob.shape, stride=glob.stride())
    out: dict = {}
    for how in mc.REDUCTIONS:
        times = []
        for _ in range(reps + 1):
            torch.distributed.barrier()
            t0 = time.perf_counter()
            res = mc.reshard_dtensor(partial, dst, [Shard(0)], reduce_partial=how)
            torch.distributed.barrier()
            times.append(time.perf_counter() - t0)
            if res is not None:
                assert torch.equal(res.to_local(), torch.full_like(res.to_local(), 2.0))
        out[how] = {"time": statistics.median(times[1:]),
                    "sent": last_many_stats().bytes_sent}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048, help="the tensor is rows x rows f32")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    results = mc.launch(_job, 8, args=(args.rows, args.reps), hosts=4, timeout=900)
    mib = args.rows * args.rows * 4 / 2**20
    print(f"Partial(sum) x Shard(1) on 2x2 -> Shard(0) on 4 ranks, {mib:.0f} MiB float32")
    print(f"{'reduce_partial':<16}{'median s':>10}{'meshcast MiB sent':>20}")
    for how in mc.REDUCTIONS:
        sent = sum(r[how]["sent"] for r in results) / 2**20
        print(f"{how:<16}{results[0][how]['time']:>10.3f}{sent:>20.1f}")
    ratio = results[0]["all_reduce"]["time"] / results[0]["reduce_scatter"]["time"]
    print(f"all_reduce / reduce_scatter time: {ratio:.2f}")


if __name__ == "__main__":
    main()
