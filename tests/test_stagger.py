"""Staggered starts (``meshcast.planning.stagger``): lead pieces for any plan, tried by
``"auto"`` on its best candidate (issue 14, point 3: quality)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from strategies import tasks

import meshcast as mc
from meshcast.core.ops import Broadcast, Send
from meshcast.planning.stagger import STAGGERS, lead_pieces, staggered


def _cells(box) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(s.start, s.stop) for s in box)))


def test_lead_pieces_cover_the_box_once():
    """``cut`` one-row pieces along the longest dimension, then the rest: the same elements
    between the same ranks, each once; fewer pieces where the rows run out; a 0-d box whole."""
    op = Broadcast(3, (5, 6), (slice(2, 4), slice(10, 15)))
    pieces = lead_pieces(op, 2)
    assert pieces == [op._replace(box=(slice(2, 4), slice(10, 11))),
                      op._replace(box=(slice(2, 4), slice(11, 12))),
                      op._replace(box=(slice(2, 4), slice(12, 15)))]
    cells = [_cells(p.box) for p in pieces]
    assert set().union(*cells) == _cells(op.box) and sum(map(len, cells)) == len(_cells(op.box))
    assert len(lead_pieces(op, 9)) == 5  # five columns: four one-column pieces and the last
    send = Send(0, 1, ())
    assert lead_pieces(send, 3) == [send]


@settings(max_examples=25, deadline=None)
@given(tasks())
def test_staggered_plans_deliver_the_destination_layout(task):
    """Every stagger of every fixed plan passes the plan check (each receiver gets exactly its
    destination shard) or cuts nothing (None)."""
    topo = mc.Topology.preset_for_meshes("p3.8xlarge", task.src.mesh, task.dst.mesh)
    for strategy in ("send_recv", "broadcast", "allgather"):
        plan = mc.plan(task, topo, strategy=strategy, balance="none")
        for side, groups in STAGGERS:
            ops = staggered(plan.ops, topo, side, groups)
            if ops is None:
                continue
            assert len(ops) > len(plan.ops)
            mc.Plan(task, ops, strategy, "none", topo, plan.fallbacks).check()


def _shared_nic_task() -> tuple[mc.ReshardTask, mc.Topology]:
    """4 ranks on one host send to 7 ranks on another, one 400 Gbit/s NIC per host, 10 us
    start-ups, 190 KB per send (15 us on a quarter of the NIC): every sender to every receiver."""
    src = mc.Layout(mc.Mesh.from_range(0, (1, 4)), "S01RR")
    dst = mc.Layout(mc.Mesh.from_range(4, (1, 8)), "S0S1R")
    task = mc.ReshardTask((184, 49, 145), "float32", src, dst)
    topo = mc.Topology(hosts=((0, 1, 2, 3), tuple(range(4, 12))), nic_in_gbps=(400.0, 400.0),
                       nic_out_gbps=(400.0, 400.0), nics_per_host=(1, 1), intra_gbps=3600.0,
                       latency_us=10.0)
    return task, topo


def test_auto_staggers_senders_that_share_a_nic():
    """Without staggering, the four senders start every round together and the NIC idles in
    each round's start-ups: the best plan without it (every candidate of ``"auto"`` before)
    is 1.52 x the lower bound, the fixed plans 1.79-1.96 x. Two groups a start-up apart take
    turns on the NIC: 1.155 x, with lead pieces in the plan; the same plan every time."""
    task, topo = _shared_nic_task()
    bound = mc.lower_bound(task, topo)
    plan = mc.plan(task, topo, cache=False)
    assert mc.simulate(plan).time_s / bound < 1.2
    assert len(plan.ops) > 28  # 28 sends, some cut into lead pieces
    plan.check()
    again = mc.plan(mc.ReshardTask.from_json(task.to_json()), topo, cache=False)
    assert again.ops == plan.ops
    for balance in ("none", "order"):
        fixed = mc.plan(task, topo, strategy="send_recv", balance=balance)
        assert mc.simulate(fixed).time_s / bound > 1.7


def test_staggered_groups_by_nic_and_first_operation():
    """The k-th sender of a NIC (in the order of first operations) is delayed k mod groups
    start-ups: with two groups, senders 1 and 3 of the shared NIC have their first send cut in
    two; nothing else changes."""
    task, topo = _shared_nic_task()
    plan = mc.plan(task, topo, strategy="send_recv", balance="none")
    ops = staggered(plan.ops, topo, "src", 2)
    assert ops is not None
    firsts = {}
    for i, op in enumerate(plan.ops):
        firsts.setdefault(op.src, i)
    order = sorted(firsts, key=firsts.__getitem__)
    cut = {firsts[r] for k, r in enumerate(order) if k % 2}
    expected = list(itertools.chain.from_iterable(
        lead_pieces(op, 1) if i in cut else [op] for i, op in enumerate(plan.ops)))
    assert list(ops) == expected
    assert np.all([len(lead_pieces(plan.ops[i], 1)) == 2 for i in cut])
