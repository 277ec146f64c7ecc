"""The fair-share dispatcher and the water-filled stripes of ``"auto"``'s own method (issue 14,
point 3: quality on the planner suite's worst tasks)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from strategies import tasks

import meshcast as mc
from meshcast.core.task import iter_slices
from meshcast.planning.dispatch import ORDERS, order_items
from meshcast.planning.fair_share import fair_share_dispatch
from meshcast.planning.items import own_items


def _items(task: mc.ReshardTask, topo: mc.Topology, stripe: bool = False):
    slices = list(iter_slices(task))
    return own_items(task, topo, slices, mc.lower_bound_details(task, topo), stripe=stripe,
                     chunk=False, p2p=True)


def _ratio(task: mc.ReshardTask, topo: mc.Topology, ops) -> float:
    plan = mc.Plan(task, tuple(ops), "broadcast", "auto", topo)
    return mc.simulate(plan).time_s / mc.lower_bound(task, topo)


@settings(max_examples=15, deadline=None)
@given(tasks())
def test_fair_share_is_a_deterministic_permutation(task):
    """Every item once, the same order twice (seeded or not), and a plan that delivers the
    destination layout."""
    topo = mc.Topology.preset_for_meshes("p3.8xlarge", task.src.mesh, task.dst.mesh)
    lat = topo.latency_us * 1e-6
    for stripe, seed in ((False, None), (True, 3)):
        items = _items(task, topo, stripe).items
        runs = [fair_share_dispatch(items, lat, None if seed is None
                                    else np.random.default_rng(seed)) for _ in range(2)]
        assert runs[0] == runs[1]
        assert sorted(map(repr, runs[0])) == sorted(repr(it.op) for it in items)
        mc.Plan(task, tuple(runs[0]), "broadcast", "auto", topo).check()


def test_fair_share_staggers_one_rank_senders_over_shared_nics():
    """8 one-rank source hosts send equal slices to 28 ranks on 7 hosts of 4 ranks (one NIC
    each): 8 senders on 7 NICs, so some NIC always carries two transfers and both senders slow
    down. Orders that hold or queue a NIC for a whole transfer collide the same senders round
    after round (1.65 x the lower bound at best); running the items forward with NICs shared
    fairly turns them on the NICs in a rotation (1.20 x)."""
    src = mc.Layout(mc.Mesh.from_range(0, (8, 1)), "RRS10")
    dst = mc.Layout(mc.Mesh.from_range(8, (7, 4)), "S1S0R")
    task = mc.ReshardTask((166, 119, 1270), "bfloat16", src, dst)
    topo = mc.Topology.preset_for_meshes("p3.8xlarge", src.mesh, dst.mesh)
    items = _items(task, topo).items
    lat = topo.latency_us * 1e-6
    ratios = {order: _ratio(task, topo, order_items(items, order, lat)) for order in ORDERS}
    fair = ratios.pop("fair_share")
    assert fair < 1.25
    assert fair < 0.75 * min(ratios.values())


def test_stripes_cut_only_what_one_nic_cannot_carry():
    """7 slices held on all 20 ranks of 5 one-NIC hosts, one slice per receiving host: five go
    whole from five hosts, the other two in two stripes each (each stripe costs its receiver a
    start-up, so no slice is cut into five): every receiver takes one or two operations, and
    the plan is within 1.3 x the lower bound (one whole slice more on two hosts: 1.33 x)."""
    src = mc.Layout(mc.Mesh.from_range(0, (5, 4)), "RR")
    dst = mc.Layout(mc.Mesh.from_range(20, (7, 1)), "RS01")
    task = mc.ReshardTask((421, 362), "float32", src, dst)
    topo = mc.Topology.preset_for_meshes("p3.8xlarge", src.mesh, dst.mesh)
    built = _items(task, topo, stripe=True)
    assert built.striped
    per_receiver: dict[int, int] = {}
    for it in built.items:
        for r in it.op.ranks()[1:]:
            per_receiver[r] = per_receiver.get(r, 0) + 1
    assert sorted(per_receiver.values()) == [1, 1, 1, 1, 1, 2, 2]
    assert len({topo.hosts_by_rank[it.op.src] for it in built.items}) == 5
    assert mc.simulate(mc.plan(task, topo)).time_s < 1.3 * mc.lower_bound(task, topo)
