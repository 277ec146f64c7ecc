"""One rank of the 2-host x 2-rank gloo job run by tests/test_cluster.py inside the namespaces.

Plain torch.distributed, env:// (MASTER_ADDR = host 0's address, set by spawn_in_host). Checks,
exactly: the all_reduce sum; a cross-host ring and an intra-host pair exchange by send/recv; and
that the ranks of one host share a network namespace while different hosts do not. Exit status 0
and a line "OK rank R" on success, 1 and a message otherwise.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta


def main() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    per_host = int(os.environ["LOCAL_WORLD_SIZE"])
    host = int(os.environ["MESHCAST_HOST"])
    errors = []
    if host != rank // per_host:
        errors.append(f"rank {rank} runs on host {host}, expected {rank // per_host}")

    # all_reduce: sum over ranks of (rank + 1) * [0, 1, ..., 15]
    t = torch.arange(16, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t)
    expect = torch.arange(16, dtype=torch.int64) * (world * (world + 1) // 2)
    if not torch.equal(t, expect):
        errors.append(f"all_reduce gave {t.tolist()}, expected {expect.tolist()}")

    # send/recv across hosts (ring over hosts) and inside a host (pairs), at once
    def payload(src: int, dst: int) -> torch.Tensor:
        return torch.arange(1000, dtype=torch.int64) + 1_000_000 * src + 1000 * dst

    peers = {
        "cross": ((rank + per_host) % world, (rank - per_host) % world),
        "intra": (host * per_host + (rank % per_host + 1) % per_host,
                  host * per_host + (rank % per_host - 1) % per_host),
    }
    for kind, (to, frm) in peers.items():
        buf = torch.empty(1000, dtype=torch.int64)
        reqs = [dist.isend(payload(rank, to), to), dist.irecv(buf, frm)]
        for r in reqs:
            r.wait()
        if not torch.equal(buf, payload(frm, rank)):
            errors.append(f"{kind} recv from {frm} gave wrong data")

    # placement: same host <=> same network namespace
    ino = torch.tensor([os.stat("/proc/self/ns/net").st_ino], dtype=torch.int64)
    inos = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(inos, ino)
    for r in range(world):
        same_host = r // per_host == host
        if (inos[r].item() == ino.item()) != same_host:
            errors.append(f"rank {r} namespace {inos[r].item()} vs mine {ino.item()}")

    dist.barrier()
    dist.destroy_process_group()
    if errors:
        print(f"FAIL rank {rank}: " + "; ".join(errors), flush=True)
        return 1
    print(f"OK rank {rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
