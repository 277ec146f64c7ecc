"""Gathered tiles (``meshcast.planning.gathered``): the ranks of a host that need one destination
tile take a part each and re-join it in one all-gather; the lower bound for all-gathers that
re-join several unit slices; the simulator's all-gathers inside one host (issue 14, point 3)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import specs, tasks

import meshcast as mc
from meshcast.core.ops import AllGather, Copy, Send
from meshcast.planning.dispatch import dispatched, phase_rounds
from meshcast.planning.gathered import Group, _parts, gathered, tile_groups
from meshcast.planning.local_search import local_search


def _tile(rows: list[int], cols: list[int]) -> Group:
    """A tile whose unit slices are the grid of ``rows`` x ``cols`` boundaries, 8 receivers."""
    slices = tuple(((slice(a, b), slice(c, d)), (0,))
                   for a, b in itertools.pairwise(rows) for c, d in itertools.pairwise(cols))
    return Group((slice(rows[0], rows[-1]), slice(cols[0], cols[-1])), tuple(range(8)), slices)


def test_parts_are_whole_slices_where_the_grid_allows():
    """5 x 2 slices for 8 receivers: 4 x 2 cells at the slices' boundaries (each part meets
    whole slices, so one send per slice). 3 x 1 slices cannot make 8 cells: each run of rows
    between boundaries gets parts by its length (3, 3, 2), none across a boundary (each part
    inside one slice: one send); a tile of one slice too short for 8 parts: none."""
    parts = _parts(_tile([0, 60, 120, 180, 240, 297], [0, 43, 86]))
    assert parts is not None and len(parts) == 8
    assert {p[1].start for p in parts} == {0, 43}
    # 297 rows in 4 at the boundaries nearest to 74.25, 148.5 and 222.75: 60, 120 and 240
    assert sorted({(p[0].start, p[0].stop) for p in parts}) == [(0, 60), (60, 120), (120, 240),
                                                                (240, 297)]
    parts = _parts(_tile([0, 10, 20, 30], [0, 5]))
    assert parts == tuple((slice(a, b), slice(0, 5)) for a, b in
                          [(0, 4), (4, 7), (7, 10), (10, 14), (14, 17), (17, 20), (20, 25),
                           (25, 30)])
    assert _parts(_tile([0, 3, 6], [0, 1])) is None


@st.composite
def shared_tile_tasks(draw) -> mc.ReshardTask:
    """Tasks whose destination tiles are needed by every rank of a host: a random source layout
    on ``a x b`` ranks, a destination on ``c x d`` other ranks (a host per mesh row) split along
    mesh axis 0 at most, so each host's ``d`` ranks share their tile."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 40), min_size=ndim, max_size=ndim)))
    a, b, c, d = (draw(st.integers(lo, 4)) for lo in (1, 1, 1, 2))
    src_mesh, dst_mesh = mc.Mesh.from_range(0, (a, b)), mc.Mesh.from_range(a * b, (c, d))
    dim = draw(st.integers(-1, ndim - 1))  # the dimension mesh axis 0 splits (-1: none)
    dst_spec = "".join("S0" if k == dim else "R" for k in range(ndim))
    return mc.ReshardTask(shape, "int32", mc.Layout(src_mesh, draw(specs(src_mesh, ndim))),
                          mc.Layout(dst_mesh, dst_spec))


@settings(max_examples=40, deadline=None)
@given(st.one_of(shared_tile_tasks(), tasks()), st.sampled_from(["p3.8xlarge", "h100x8"]),
       st.sampled_from([1, 4096]))
def test_gathered_plans_deliver_and_never_beat_the_bound(task, preset, scale):
    """Every fixed broadcast plan with its tile groups gathered (a part per receiver, and
    cells replicated), in its order, in phase rounds and dispatched again, and auto's plan,
    pass the plan check and simulate at or above the lower bound, whose rank, group and host
    terms allow all-gathers that re-join several slices (small tensors, where start-ups bind,
    and 4096 times larger ones)."""
    task = mc.ReshardTask((task.shape[0] * scale, *task.shape[1:]) if task.shape else (),
                          task.dtype, task.src, task.dst)
    topo = mc.Topology.preset_for_meshes(preset, task.src.mesh, task.dst.mesh)
    groups = tile_groups(task, topo)
    bound = mc.lower_bound(task, topo)
    for balance in ("none", "size", "order"):
        plan = mc.plan(task, topo, strategy="broadcast", balance=balance)
        for replicate in (False, True):
            ops = gathered(plan.ops, groups, replicate=replicate)
            if ops is None:
                continue
            for order in (ops, phase_rounds(ops), dispatched(ops, topo, task.itemsize)):
                cut = mc.Plan(task, order, "broadcast", balance, topo, plan.fallbacks)
                cut.check()
                assert mc.simulate(cut).time_s >= bound
    auto = mc.plan(task, topo, cache=False)
    auto.check()
    assert mc.simulate(auto).time_s >= bound


@settings(max_examples=25, deadline=None)
@given(shared_tile_tasks(), st.sampled_from(["p3.8xlarge", "h100x8"]))
def test_local_search_keeps_all_gathers_after_what_they_rejoin(task, preset):
    """The local search over a gathered plan moves operations earlier but never an all-gather
    before an operation that delivers into its box on one of its members, and gives sends to
    other holders of their boxes: every plan it keeps passes the plan check, and it is never
    slower than where it started."""
    topo = mc.Topology.preset_for_meshes(preset, task.src.mesh, task.dst.mesh)
    plan = mc.plan(task, topo, strategy="broadcast", balance="none")
    ops = gathered(plan.ops, tile_groups(task, topo))
    if ops is None:
        return
    start = mc.simulate(mc.Plan(task, ops, "broadcast", "auto", topo)).time_s
    found, time_s = local_search(task, topo, ops, "broadcast")
    searched = mc.Plan(task, found, "broadcast", "auto", topo)
    searched.check()
    assert mc.simulate(searched).time_s == time_s <= start


def test_replicated_cells_broadcast_each_slice_to_one_rank_of_each_set():
    """4 slices of one tile for the 8 ranks of a host (4 source ranks per host, 4 hosts): a part
    per receiver cuts every slice in two (8 sends of half slices); replicated, the 8 ranks form
    2 sets of 4, each slice goes to one rank of each set in one broadcast, and each set re-joins
    the tile in its own all-gather. The pieces leave from the least busy holders: 7 hosts' 4
    slices from 16 holders, at most 2 operations each. Prime receiver counts have no such
    cells."""
    src = mc.Layout(mc.Mesh.from_range(0, (4, 4)), "S1R")
    dst = mc.Layout(mc.Mesh.from_range(16, (7, 8)), "RS0")
    task = mc.ReshardTask((1082, 74), "int32", src, dst)
    topo = mc.Topology.preset_for_meshes("p3.8xlarge", src.mesh, dst.mesh)
    plan = mc.plan(task, topo, strategy="broadcast", balance="none")
    ops = gathered(plan.ops, tile_groups(task, topo), replicate=True)
    cut = mc.Plan(task, ops, "broadcast", "auto", topo)
    cut.check()
    gathers = [op for op in ops if isinstance(op, AllGather)]
    assert len(gathers) == 14 and all(len(g.group) == 4 and len(g.parts) == 4 for g in gathers)
    pieces = [op for op in ops if not isinstance(op, AllGather)]
    assert len(pieces) == 28 and all(len(op.dsts) == 2 for op in pieces)
    assert max(Counter(op.src for op in pieces).values()) == 2
    assert mc.simulate(cut).time_s >= mc.lower_bound(task, topo)
    three = mc.Layout(mc.Mesh.from_range(16, (7, 3)), "RS0")
    task = mc.ReshardTask((1082, 74), "int32", src, three)
    topo = mc.Topology.preset_for_meshes("p3.8xlarge", src.mesh, three.mesh)
    plan = mc.plan(task, topo, strategy="broadcast", balance="none")
    assert gathered(plan.ops, tile_groups(task, topo), replicate=True) is None


def _many_small_slices() -> tuple[mc.ReshardTask, mc.Topology]:
    """20 one-GPU shards of a 480 KB vector go to the 4 GPUs of one host, each of which needs
    all of it (h100x8 links: a NIC per GPU, 10 us start-ups)."""
    src = mc.Layout(mc.Mesh.from_range(0, (5, 4)), "S10")
    dst = mc.Layout(mc.Mesh.from_range(20, (1, 4)), "S0")
    task = mc.ReshardTask((239698,), "bfloat16", src, dst)
    return task, mc.Topology.preset_for_meshes("h100x8", src.mesh, dst.mesh)


def test_auto_gathers_a_tile_of_many_slices():
    """Each of the 4 receivers takes 5 of the 20 slices over its own NIC, then one all-gather:
    63 us against 210 us for the best fixed plan (20 broadcasts, one start-up each on every
    receiver). The bound before issue 14 counted a start-up per slice on every receiver
    (210 us): this plan runs below it, so the bound now lets an all-gather re-join many slices
    (60 us here: the group's 5 sends and its all-gather on one rank)."""
    task, topo = _many_small_slices()
    plan = mc.plan(task, topo, cache=False)
    plan.check()
    gathers = [op for op in plan.ops if isinstance(op, AllGather)]
    assert len(gathers) == 1 and sorted(gathers[0].group) == [20, 21, 22, 23]
    assert sum(isinstance(op, Send) for op in plan.ops) == 20
    time_s = mc.simulate(plan).time_s
    best_fixed = min(mc.simulate(mc.plan(task, topo, strategy=s, balance=b)).time_s
                     for s in mc.STRATEGIES for b in ("none", "size", "order"))
    assert time_s < best_fixed / 3
    lat = topo.latency_us * 1e-6
    assert time_s < 20 * lat  # below the old per-slice count
    bound = mc.lower_bound(task, topo)
    assert bound <= time_s < 1.1 * bound
    assert bound >= 6 * lat * (1 - 1e-8)  # ceil(20 / 4) sends and the all-gather on one rank


def test_simulator_refuses_an_all_gather_across_hosts():
    """An all-gather is modelled on a host's fast links; one whose members sit on two hosts
    would move bytes between hosts without a NIC (and beat the lower bound), so the simulator
    refuses it, naming the operation, the group and the hosts."""
    src = mc.Layout(mc.Mesh.from_range(0, (1, 2)), "S0")
    dst = mc.Layout(mc.Mesh.from_range(0, (2, 1)), "R")
    task = mc.ReshardTask((8,), "float32", src, dst)
    topo = mc.Topology(hosts=((0,), (1,)))
    ops = (Copy(0, (slice(0, 4),)), Copy(1, (slice(4, 8),)),
           AllGather((0, 1), (slice(0, 8),), ((slice(0, 4),), (slice(4, 8),))))
    plan = mc.Plan(task, ops, "allgather", "none", topo)
    with pytest.raises(ValueError, match=r"plan operation 2: an AllGather .* spans hosts \[0, 1\]"):
        mc.simulate(plan)
