"""DTensor across meshes on real gloo processes, checked against DTensor itself.

One launched job (8 ranks, 4 emulated hosts of 2) runs every case: for 1-D and 2-D meshes that
are disjoint, overlapping or identical, every Shard/Replicate placement combination on both sides,
on a tensor whose sizes split unevenly. Each destination rank checks, byte for byte, the result's
``full_tensor()`` against the global tensor and its local shard against the region DTensor's own
``compute_local_shape_and_global_offset`` assigns it; ranks outside the destination get None.
Partial sources (reduced on the way) and the error paths run in the same job.
"""

from __future__ import annotations

import functools
import itertools

import pytest

import meshcast as mc

pytest.importorskip("torch.distributed.tensor")

WORLD = 8
MESHES = {
    "A1": [0, 1, 2],
    "B1": [4, 5, 6, 7],
    "A2": [[0, 1], [2, 3]],
    "B2": [[4, 5], [6, 7]],
    "C2": [[2, 3], [4, 5]],
}
PAIRS = [
    ("A1", "B1", "disjoint 1-D"),
    ("A1", "A1", "identical 1-D"),
    ("A2", "B2", "disjoint 2-D"),
    ("A2", "C2", "overlapping 2-D"),
    ("A2", "A2", "identical 2-D"),
    ("A1", "C2", "overlapping 1-D -> 2-D"),
    ("B2", "A1", "disjoint 2-D -> 1-D"),
]
SHAPE = (7, 5)
# planner options, rotated over the cases so every operation kind runs (auto plans cost ~20 ms)
OPTIONS = [
    {"strategy": "broadcast", "balance": "joint"},
    {"strategy": "send_recv", "balance": "joint"},
    {"strategy": "allgather", "balance": "none"},
    {"strategy": "broadcast", "balance": "size"},
    {"strategy": "broadcast", "balance": "joint"},
    {"strategy": "allgather", "balance": "size"},
    {"strategy": "send_recv", "balance": "none"},
    {},  # auto
]
DTYPES = ("float32", "bfloat16", "int64", "float16")  # rotated over the cases
HOSTS = mc.Topology.uniform(4, 2)


@functools.cache
def _auto_plans() -> dict[int, mc.Plan]:
    """By case number, the plans of the cases with plan()'s defaults (``{}`` in OPTIONS) but
    the first, made once here and passed to ``reshard_dtensor(plan=...)``: each auto plan costs
    ~0.1 s of CPU, in every rank of the job when it planned them. The first such case still
    plans inside ``reshard_dtensor``."""
    one = [mc.Shard(0), mc.Shard(1), mc.Replicate()]
    plans: dict[int, mc.Plan] = {}
    case = 0
    for src_name, dst_name, _ in PAIRS:
        src, dst = mc.Mesh(MESHES[src_name]), mc.Mesh(MESHES[dst_name])
        for sp in itertools.product(one, repeat=src.ndim):
            for dp in itertools.product(one, repeat=dst.ndim):
                dtype = DTYPES[case % len(DTYPES)]
                case += 1
                if OPTIONS[case % len(OPTIONS)] == {} and case >= len(OPTIONS):
                    task = mc.ReshardTask(SHAPE, dtype, mc.Layout(src, list(sp)),
                                          mc.Layout(dst, list(dp)))
                    (plans[case],) = mc.plan_many([task], HOSTS, balance="auto")
    return plans


def _dtensor_job(rank: int, auto_plans: dict[int, mc.Plan]) -> list[str]:
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    meshes = {k: DeviceMesh("cpu", v) for k, v in MESHES.items()}
    one = [Shard(0), Shard(1), Replicate()]
    combos = {1: [[p] for p in one], 2: [list(c) for c in itertools.product(one, one)]}
    failures: list[str] = []
    dtypes = [getattr(torch, name) for name in DTYPES]
    case = 0

    def check(res, glob, dst, placements, what: str) -> None:
        inside = dst.get_coordinate() is not None
        if not inside:
            if res is not None:
                failures.append(f"{what}: rank {rank} is outside the destination, got {res!r}")
            return
        if not isinstance(res, DTensor):
            failures.append(f"{what}: rank {rank} got {type(res).__name__}, not a DTensor")
            return
        if res.device_mesh != dst or tuple(res.placements) != tuple(placements):
            failures.append(f"{what}: mesh/placements {res.device_mesh} {res.placements}")
        size, offset = compute_local_shape_and_global_offset(glob.shape, dst, placements)
        region = tuple(slice(o, o + n) if n else slice(0, 0) for o, n in zip(offset, size))
        local = res.to_local()
        if tuple(local.shape) != tuple(size) or (
            local.numel() and local.contiguous().view(torch.uint8).numpy().tobytes()
            != glob[region].contiguous().view(torch.uint8).numpy().tobytes()
        ):
            failures.append(f"{what}: local shard differs on rank {rank}")
        full = res.full_tensor()
        if full.view(torch.uint8).numpy().tobytes() != glob.view(torch.uint8).numpy().tobytes():
            failures.append(f"{what}: full_tensor() differs on rank {rank}")

    for src_name, dst_name, kind in PAIRS:
        src, dst = meshes[src_name], meshes[dst_name]
        for sp in combos[src.ndim]:
            for dp in combos[dst.ndim]:
                dtype = dtypes[case % len(dtypes)]
                case += 1
                glob = (torch.arange(35, dtype=torch.int64).reshape(SHAPE) * 3 + case).to(dtype)
                dt = distribute_tensor(glob, src, sp)
                what = f"{kind} {src_name}{sp} -> {dst_name}{dp} {dtype}"
                if src.get_coordinate() is not None:
                    lay = mc.layout_from_dtensor(dt)
                    want = mc.Layout(mc.Mesh(MESHES[src_name]), [
                        mc.Shard(p.dim) if isinstance(p, Shard) else mc.Replicate() for p in sp
                    ])
                    if lay != want:
                        failures.append(f"{what}: layout_from_dtensor gave {lay!r}")
                opts = OPTIONS[case % len(OPTIONS)]
                res = mc.reshard_dtensor(dt, dst, dp, timeout=60, plan=auto_plans.get(case),
                                         **opts)
                check(res, glob, dst, dp, f"{what} {opts}")

    # Partial sources: each rank of the source mesh holds a term of the sum
    for src_name, sp, dst_name, dp in [
        ("A1", [Partial()], "B1", [Shard(0)]),
        ("A2", [Partial(), Shard(1)], "C2", [Replicate(), Shard(0)]),
        ("A2", [Shard(0), Partial("max")], "B2", [Shard(1), Replicate()]),
    ]:
        src, dst = meshes[src_name], meshes[dst_name]
        base = torch.arange(35, dtype=torch.int64).reshape(SHAPE)
        full_src = distribute_tensor(base, src, [Replicate() if p.is_partial() else p
                                                 for p in sp])
        coord = src.get_coordinate()
        local = full_src.to_local()
        if coord is not None:
            # sum: rank r adds r (so the sum over an axis adds a known constant); max: rank r
            # holds base + r on the partial axis, the max is base + largest rank there
            local = local * 1 + rank
        dt = DTensor.from_local(local, src, sp, run_check=False, shape=base.shape,
                                stride=base.stride())
        if src_name == "A1":
            expect = base * 3 + (0 + 1 + 2)
        elif sp[1].is_partial():  # Shard(0) x Partial(max) over mesh axis 1 of [[0,1],[2,3]]
            expect = base.clone()
            expect[:4] += 1
            expect[4:] += 3
        else:  # Partial(sum) over mesh axis 0 of [[0,1],[2,3]], Shard(1) over axis 1
            expect = base * 2
            expect[:, :3] += 0 + 2
            expect[:, 3:] += 1 + 3
        res = mc.reshard_dtensor(dt, dst, dp, timeout=60)
        check(res, expect, dst, dp, f"partial {src_name}{sp} -> {dst_name}{dp}")

    # bad input: the same error on every rank, nothing sent
    dt = distribute_tensor(torch.zeros(SHAPE), meshes["A1"], [Shard(0)])
    for placements, needle in [([Partial("prod")], "Partial"), ([Shard(0), Shard(1)], "2 entries"),
                               ([Shard(2)], "2 dimensions")]:
        try:
            mc.reshard_dtensor(dt, meshes["B1"], placements)
            failures.append(f"no error for placements {placements}")
        except ValueError as exc:
            if needle not in str(exc) or "placements" not in str(exc):
                failures.append(f"unclear error for {placements}: {exc}")
    return failures


def test_dtensor_across_meshes():
    results = mc.launch(_dtensor_job, WORLD, hosts=HOSTS, args=(_auto_plans(),), timeout=240)
    failures = [f for r in results for f in r]
    assert not failures, "\n".join(failures[:20])


def test_layout_from_dtensor_is_lazy():
    # a lazy top-level export: `import meshcast` does not import torch, the name loads it
    assert "layout_from_dtensor" not in vars(mc)
    assert callable(mc.layout_from_dtensor)
