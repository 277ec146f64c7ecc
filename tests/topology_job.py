"""One rank of a job that checks the default plan uses the real hosts (issue 11, point 7).

Run by tests/test_cluster_torchrun.py under the real ``torchrun`` (one node per emulated host,
``python topology_job.py OUT_DIR``) and, as :func:`measure`, under ``meshcast.launch``. The job
has 4 ranks on 2 hosts of 2. The task: a tensor held whole by ranks 0 and 1 (host 0), wanted
whole by a destination mesh ``[[0, 2], [1, 3]]`` spanning both hosts. The planner's old
convention (last mesh axis = one host) takes 2 and 3 for two hosts and sends two copies across;
the real hosts need one copy into host 1. Each rank plans with no topology, reshards, checks the
result byte for byte, and reports its counters and its host's NIC counter as JSON; then the same
with a plan made for a wrong topology (all on one host), whose bytes must still be counted by
the real hosts.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import meshcast as mc

SHAPE = (512, 1024)  # 2 MiB of float32
TASK = mc.ReshardTask(
    SHAPE, "float32", mc.Layout(mc.Mesh([0, 1]), "RR"), mc.Layout(mc.Mesh([[0, 2], [1, 3]]), "RR")
)


def _global() -> np.ndarray:
    return np.random.default_rng(11).standard_normal(SHAPE).astype(np.float32)


ONE_HOST = mc.Topology.uniform(1, 4)  # a wrong idea of the hosts, given explicitly


def _run(rank: int, plan: mc.Plan, x) -> dict:
    import torch.distributed as dist

    from meshcast.cluster import nic_tx_bytes

    box = TASK.src_box(rank)
    dist.barrier()
    nic_before = nic_tx_bytes()
    mc.reset_transfer_stats()
    out = mc.reshard(None if box is None else x[box].clone(), plan, timeout=120)
    stats = mc.transfer_stats()
    dist.barrier()
    nic_after = nic_tx_bytes()
    want = x[TASK.dst_box(rank)] if TASK.dst_box(rank) is not None else None
    exact = (out is None) == (want is None) and (
        out is None or out.numpy().tobytes() == want.numpy().tobytes())
    return {
        "hosts": [list(h) for h in plan.topology.hosts],
        "plan_cross_host_bytes": plan.cross_host_bytes(),
        "exact": bool(exact),
        "cross_host_bytes": stats.cross_host_bytes,
        "sent_bytes": stats.sent_bytes,
        "hosts_from": stats.hosts_from,
        "nic_tx_delta": None if nic_before is None else nic_after - nic_before,
    }


def measure(rank: int) -> dict:
    """This rank's report for the default plan (no topology: the job's real hosts) and for a
    plan made with a wrong topology (the counters must still count by the real hosts)."""
    import torch

    x = torch.from_numpy(_global())
    return {
        "rank": rank,
        "host_label": os.environ.get("MESHCAST_HOST"),
        "group_rank": os.environ.get("GROUP_RANK"),
        "default": _run(rank, mc.plan(TASK), x),
        "one_host": _run(rank, mc.plan(TASK, ONE_HOST, strategy="broadcast"), x),
    }


def main() -> int:
    import torch.distributed as dist

    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    try:
        report = measure(dist.get_rank())
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{report['rank']}.json"), "w") as f:
        json.dump(report, f)
    return 0 if report["default"]["exact"] and report["one_host"]["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
