"""On real processes (gloo): 0-d tensors reshard like any other, and a plan that fails the plan
check is refused by meshcast.reshard and meshcast.reshard_many on every rank before any byte
moves (the process group stays usable)."""

from __future__ import annotations

import pytest

import meshcast
from meshcast import Layout, Mesh, Plan, Replicate, ReshardTask, Topology, plan

WORLD = 6
TOPOLOGY = Topology.uniform(3, 2)
STRATEGIES = ("send_recv", "allgather", "broadcast", None)  # None: plan()'s defaults
R = [Replicate()]


def _scalar_tasks() -> dict[str, tuple[ReshardTask, float]]:
    """0-d tasks and the value every holder has."""
    return {
        "disjoint": (
            ReshardTask((), "float32", Layout(Mesh([0, 1]), R), Layout(Mesh([2, 3, 4, 5]), R)),
            2.5,
        ),
        "overlapping": (
            ReshardTask((), "int64", Layout(Mesh([0, 1]), R), Layout(Mesh([1, 2, 3]), R)),
            -7,
        ),
        "2-D meshes": (
            ReshardTask(
                (), "bfloat16", Layout(Mesh([[0], [2]]), R * 2),
                Layout(Mesh([[1, 3], [4, 5]]), R * 2),
            ),
            0.375,
        ),
    }


def _broken() -> Plan:
    """A good plan with its first operation removed: rank 4 would never get [0:4, 0:4]."""
    task = ReshardTask(
        (8, 8), "float32", Layout(Mesh([[0, 1]]), "RS1"), Layout(Mesh([[4, 5]]), "S1R")
    )
    good = plan(task, TOPOLOGY, "send_recv", "none")
    return Plan(task, good.ops[1:], good.strategy, good.balance, good.topology)


def _job(rank: int) -> dict:
    import torch

    out: dict = {"scalar": {}, "errors": {}}
    for name, (task, value) in _scalar_tasks().items():
        dtype = getattr(torch, task.dtype)
        local = torch.tensor(value, dtype=dtype) if rank in task.src.mesh else None
        for strategy in STRATEGIES:
            got = meshcast.reshard(local, plan(task, TOPOLOGY, strategy=strategy), timeout=60)
            out["scalar"][name, strategy] = None if got is None else (tuple(got.shape), got.item())
        p = plan(task, TOPOLOGY)
        (many,) = meshcast.reshard_many([local], [p], timeout=60)
        out["scalar"][name, "many"] = None if many is None else (tuple(many.shape), many.item())

    bad = _broken()
    local = torch.ones(8, 4) if rank in (0, 1) else None
    for caller in ("reshard", "reshard_many"):
        try:
            if caller == "reshard":
                meshcast.reshard(local, bad, timeout=60)
            else:
                meshcast.reshard_many([local], [bad], timeout=60)
            out["errors"][caller] = None
        except ValueError as exc:
            out["errors"][caller] = str(exc)
    # nothing was sent: the default group still works
    good = plan(bad.task, TOPOLOGY)
    got = meshcast.reshard(local, good, timeout=60)
    out["after"] = None if got is None else got.tolist()
    torch.distributed.barrier()
    return out


@pytest.fixture(scope="module")
def job() -> list[dict]:
    return meshcast.launch(_job, WORLD, hosts=TOPOLOGY, timeout=240)


@pytest.mark.timeout(300)
def test_zero_d_tensors_reshard_exactly(job: list[dict]) -> None:
    for name, (task, value) in _scalar_tasks().items():
        for key in (*STRATEGIES, "many"):
            for rank in range(WORLD):
                want = ((), value) if rank in task.dst.mesh else None
                assert job[rank]["scalar"][name, key] == want, (name, key, rank)


@pytest.mark.timeout(300)
def test_broken_plan_is_refused_on_every_rank(job: list[dict]) -> None:
    expected = (
        "plan check failed: rank 4 never receives [0:4, 0:4] of its destination shard "
        "[0:4, 0:8]: no operation delivers element (0, 0)"
    )
    for rank in range(WORLD):
        assert job[rank]["errors"]["reshard"] == expected
        assert job[rank]["errors"]["reshard_many"] == f"meshcast.reshard_many: plans[0]: {expected}"
        want = [[1.0] * 8] * 4 if rank in (4, 5) else None
        assert job[rank]["after"] == want
