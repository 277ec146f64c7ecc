"""Numbers: 0-d tensors plan and run like any other; sizes are exact for tensors up to 2^63 - 1
bytes (and larger ones are refused at ReshardTask); no silent int64 overflow in the planner,
the simulator, the lower bound or the summaries."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import meshes, specs

import meshcast as mc
from meshcast.core.layout import box_size
from meshcast.core.task import MAX_BYTES

R = mc.Replicate()


def _scalar_tasks() -> list[mc.ReshardTask]:
    one = mc.Mesh([0, 1])
    return [
        mc.ReshardTask((), "float32", mc.Layout(one, [R]), mc.Layout(mc.Mesh([2, 3, 4]), [R])),
        mc.ReshardTask((), "int64", mc.Layout(one, [R]), mc.Layout(mc.Mesh([1, 2]), [R])),
        mc.ReshardTask((), "bfloat16", mc.Layout(mc.Mesh([[0], [2]]), [R, R]),
                       mc.Layout(mc.Mesh([[1, 3], [4, 5]]), "")),
        mc.ReshardTask((), "bool", mc.Layout(one, ""), mc.Layout(one, "")),
    ]


@pytest.mark.parametrize("task", _scalar_tasks(), ids=lambda t: t.describe())
@pytest.mark.parametrize("strategy", [*mc.STRATEGIES, None])
@pytest.mark.parametrize("balance", mc.BALANCES)
def test_zero_d_tensor_every_strategy_and_balance(task, strategy, balance):
    topo = mc.Topology.uniform(3, 2)
    plan = mc.plan(task, topo, strategy, balance)
    plan.check()
    assert mc.Plan.from_json(plan.to_json()) == plan
    x = np.array(3, dtype=task.numpy_dtype)
    out = mc.execute_local(plan, mc.scatter(x, task.src))
    assert sorted(out) == task.dst.mesh.devices
    for shard in out.values():
        assert shard.shape == () and shard.dtype == x.dtype and shard == x
    assert mc.gather(out, task.dst).shape == ()
    rep = mc.simulate(plan)
    bound = mc.lower_bound(task, topo)
    assert math.isfinite(rep.time_s) and 0 <= bound <= rep.time_s
    moved = {r for op in plan.ops if op.kind != "copy" for r in op.ranks()}
    assert (bound > 0) == bool(moved)
    assert f"tensor={task.itemsize} B" in plan.summary()


def test_zero_d_unit_slice_and_layouts():
    task = _scalar_tasks()[0]
    (unit,) = task.unit_slices()
    assert unit == mc.UnitSlice((), (0, 1), (2, 3, 4))
    assert task.nbytes == 4 and task.decomposition.sizes().tolist() == [1]
    assert mc.Layout(mc.Mesh([0, 1]), "").ndim == 0
    assert mc.Layout.from_json(mc.Layout(mc.Mesh([0, 1]), "").to_json()).ndim == 0
    with pytest.raises(ValueError, match=r"shape \(4,\) has 1 dimensions but layout spec ''"):
        mc.ReshardTask((4,), "int8", mc.Layout(mc.Mesh([0]), ""), mc.Layout(mc.Mesh([0]), ""))


def test_too_large_tensors_are_refused_at_construction():
    layout = mc.Layout(mc.Mesh([0, 1]), [mc.Shard(0)])
    for shape, dtype in [((2**31,) * 3, "float32"), ((2**40, 2**40), "int8"),
                         ((2**62, 2), "int8"), ((2**61,), "float32"), ((0, 2**63), "int8")]:
        with pytest.raises(ValueError, match=r"is too large: .* at most 2\^63 - 1 bytes"):
            mc.ReshardTask(shape, dtype, layout, layout)
    big = mc.ReshardTask((2**63 - 1,), "bool", layout, layout)
    assert big.nbytes == MAX_BYTES
    assert mc.ReshardTask((0, 2**63 - 1), "float64", layout, layout).nbytes == 0
    with pytest.raises(ValueError, match=r"is too large: 2417851639229258349412352 elements"):
        mc.ReshardTask((2**81,), "int8", layout, layout)


def test_lower_bound_of_a_2_to_the_60_task_is_exact_and_large():
    """The issue's (2^31)^3 float32 case is refused; (2^30)^2 float32 (4 EiB) plans exactly."""
    src = mc.Layout(mc.Mesh.from_range(0, (2, 2)), "S0S1")
    dst = mc.Layout(mc.Mesh.from_range(4, (2, 2)), "S1R")
    task = mc.ReshardTask((2**30, 2**30), "float32", src, dst)
    topo = mc.Topology.uniform(4, 2, nic_gbps=10)
    lb = mc.lower_bound_details(task, topo)
    # host 2 (ranks 4, 5) needs the whole tensor and holds none of it: 2^62 bytes at 10 Gbit/s
    assert lb.host_in_bytes.tolist() == [0, 0, 2**62, 2**62]
    assert lb.seconds == pytest.approx(2**62 / 1.25e9, rel=1e-6)
    assert sum(lb.group_bytes) == 2**62 and all(isinstance(b, int) for b in lb.group_bytes)
    plan = mc.plan(task, topo, "send_recv", "none")
    rep = mc.simulate(plan)
    assert rep.host_bytes_in.tolist() == [0, 0, 2**62, 2**62]
    assert rep.time_s >= lb.seconds
    assert "4.00 EiB" in plan.summary()


@st.composite
def large_tasks(draw) -> mc.ReshardTask:
    """Tasks with dimensions up to 2^62 and at most 2^63 - 1 bytes in all."""
    dtype = draw(st.sampled_from(["bool", "int8", "float16", "float32", "complex128"]))
    room = 63 - int(math.log2(np.dtype(mc.core.task.numpy_dtype(dtype)).itemsize))
    ndim = draw(st.integers(0, 3))
    shape: list[int] = []
    for _ in range(ndim):
        bits = draw(st.integers(0, room))
        room -= bits
        shape.append(draw(st.integers(max(0, 2 ** (bits - 1)), 2**bits - 1)) if bits else 1)
    src_mesh = draw(meshes(max_devices=8))
    dst_mesh = draw(st.one_of(meshes(max_devices=8), st.just(src_mesh)))
    src = mc.Layout(src_mesh, draw(specs(src_mesh, ndim)) if ndim else "")
    dst = mc.Layout(dst_mesh, draw(specs(dst_mesh, ndim)) if ndim else "")
    return mc.ReshardTask(tuple(shape), dtype, src, dst)


@given(large_tasks(), st.sampled_from([*mc.STRATEGIES, None]), st.sampled_from(mc.BALANCES))
def test_large_shapes_are_exact(task, strategy, balance):
    shape, itemsize = task.shape, task.itemsize
    assert task.nbytes == math.prod(shape) * itemsize <= MAX_BYTES
    dec = task.decomposition
    sizes = dec.sizes()
    assert int(sizes.sum()) == math.prod(shape)
    assert sizes.tolist() == [box_size(b) for b in dec.boxes()]
    got = dict.fromkeys(task.dst.mesh.devices, 0)
    for unit in task.unit_slices():
        for r in unit.receivers:
            got[r] += box_size(unit.box)
    assert got == {r: box_size(task.dst_box(r)) for r in got}

    topo = mc.Topology.from_meshes(task.src.mesh, task.dst.mesh)
    plan = mc.plan(task, topo, strategy, balance)
    plan.check()
    need = sum(task.box_nbytes(task.dst_box(r)) for r in task.dst.mesh.devices)
    delivered = sum(
        task.box_nbytes(op.box) * (len(op.dsts) if op.kind == "broadcast" else 1)
        for op in plan.ops
        if op.kind != "allgather"
    ) + sum(
        task.box_nbytes(p) * (len(op.group) - 1)
        for op in plan.ops if op.kind == "allgather" for p in op.parts
    )
    assert delivered == need  # every element to every receiver once, counted exactly
    rep = mc.simulate(plan)
    bound = mc.lower_bound(task, topo)
    assert math.isfinite(rep.time_s) and math.isfinite(bound)
    assert 0 <= bound <= rep.time_s
    remote = any(sl.remote for sl in mc.core.task.iter_slices(task))
    assert (bound > 0) == remote
    per_host = plan.bytes_per_host()
    assert rep.host_bytes_in.tolist() == [per_host[h][1] for h in range(topo.num_hosts)]
    assert rep.host_bytes_out.tolist() == [per_host[h][0] for h in range(topo.num_hosts)]
    assert plan.summary().startswith(f"plan: {task.describe()}")
