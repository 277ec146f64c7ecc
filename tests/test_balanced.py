"""Sender-balanced pieces (``meshcast.planning.balanced``): a send whose box has holders behind
other NICs is cut so the sending NICs carry equal loads (issue 14, point 3)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import tasks
from test_gathered import shared_tile_tasks

import meshcast as mc
from meshcast.core.boxes import box_size
from meshcast.core.ops import Send
from meshcast.planning.balanced import balanced
from meshcast.planning.gathered import gathered, tile_groups

CASE6 = mc.ReshardTask((3072, 1024, 170), "int32", mc.Layout(mc.Mesh.from_range(0, (2, 4)), "S0RR"),
                       mc.Layout(mc.Mesh.from_range(8, (3, 4)), "S0RR"))
"""Paper case 6: two groups of four ranks hold the halves, three groups of four need thirds."""
EIGHTH = 3072 * 1024 * 170 * 4 // 8


def _sent(ops: tuple, itemsize: int) -> Counter:
    """Bytes each rank sends."""
    out: Counter = Counter()
    for op in ops:
        if isinstance(op, Send):
            out[op.src] += box_size(op.box) * itemsize
    return out


def test_case6_on_h100_hosts_levels_the_eight_nics():
    """On ``h100x8`` hosts (a NIC per GPU) the gathered plan sends the middle third's four parts
    over four of the eight NICs, which carry twice the others' bytes (1.56 x the bound): the
    balanced plan cuts the four parts of the outer thirds that those NICs send in two, half of
    each from a less loaded holder, so every NIC sends exactly an eighth of the tensor; auto
    keeps it (dispatched again), 1.226 x the bound."""
    topo = mc.Topology.preset_for_meshes("h100x8", CASE6.src.mesh, CASE6.dst.mesh)
    base = mc.plan(CASE6, topo, strategy="broadcast", balance="none")
    ops = gathered(base.ops, tile_groups(CASE6, topo))
    assert ops is not None
    assert sorted(_sent(ops, 4).values()) == [2 * EIGHTH // 3] * 4 + [4 * EIGHTH // 3] * 4
    cut = balanced(ops, CASE6, topo)
    assert cut is not None
    assert _sent(cut, 4) == {r: EIGHTH for r in range(8)}
    mc.Plan(CASE6, cut, "broadcast", "auto", topo).check()
    auto = mc.plan(CASE6, topo, cache=False)
    assert auto.balance == "auto"
    assert round(mc.simulate(auto).time_s / mc.lower_bound(CASE6, topo), 3) == 1.226
    assert _sent(auto.ops, 4) == {r: EIGHTH for r in range(8)}


def test_nothing_to_balance_is_none():
    """One holder per slice (a permutation): no other NIC can send anything."""
    task = mc.ReshardTask((64, 8), "float32", mc.Layout(mc.Mesh.from_range(0, (4,)), "S0R"),
                          mc.Layout(mc.Mesh.from_range(4, (4,)), "S0R"))
    topo = mc.Topology.preset_for_meshes("h100x8", task.src.mesh, task.dst.mesh)
    assert balanced(mc.plan(task, topo, strategy="send_recv").ops, task, topo) is None


@settings(max_examples=60, deadline=None)
@given(st.one_of(shared_tile_tasks(), tasks()), st.sampled_from(["p3.8xlarge", "h100x8"]),
       st.sampled_from([1, 4096]))
def test_balanced_plans_deliver_exactly(task, preset, scale):
    """Every fixed broadcast plan and its gathered form, balanced, passes the plan check, moves
    the same bytes to the same receivers (the pieces of an operation partition its box, each
    from a holder) and simulates at or above the lower bound; on the small tensors (with no
    start-ups, so that small pieces are cut too) it delivers every element exactly
    (``execute_local``)."""
    task = mc.ReshardTask((task.shape[0] * scale, *task.shape[1:]) if task.shape else (),
                          task.dtype, task.src, task.dst)
    topo = mc.Topology.preset_for_meshes(preset, task.src.mesh, task.dst.mesh)
    if scale == 1:
        topo = dataclasses.replace(topo, latency_us=0.0)
    bound = mc.lower_bound(task, topo)
    groups = tile_groups(task, topo)
    for balance in ("none", "order"):
        plan = mc.plan(task, topo, strategy="broadcast", balance=balance)
        for ops in (plan.ops, gathered(plan.ops, groups)):
            cut = None if ops is None else balanced(ops, task, topo)
            if cut is None:
                continue
            out = mc.Plan(task, cut, "broadcast", balance, topo, plan.fallbacks)
            out.check()
            assert _received(cut, task.itemsize) == _received(ops, task.itemsize)
            assert mc.simulate(out).time_s >= bound
            if scale == 1:
                rng = np.random.default_rng(0)
                full = rng.integers(-99, 99, size=task.shape).astype(task.dtype)
                got = mc.execute_local(out, mc.scatter(full, task.src))
                want = mc.scatter(full, task.dst)
                assert got.keys() == want.keys()
                assert all(np.array_equal(got[r], want[r]) for r in want)


def _received(ops: tuple, itemsize: int) -> Counter:
    """Bytes each rank receives."""
    out: Counter = Counter()
    for op in ops:
        for r in op.ranks():
            if r != getattr(op, "src", None):
                out[r] += box_size(op.box) * itemsize
    return out


def test_case6_pieces_deliver_every_element():
    """Case 6's layouts on a small tensor (no start-ups, so the pieces are cut as on the large
    one): the balanced plan's pieces from the less loaded holders deliver every element."""
    task = mc.ReshardTask((96, 4, 3), "int32", CASE6.src, CASE6.dst)
    topo = dataclasses.replace(
        mc.Topology.preset_for_meshes("h100x8", task.src.mesh, task.dst.mesh), latency_us=0.0)
    ops = gathered(mc.plan(task, topo, strategy="broadcast", balance="none").ops,
                   tile_groups(task, topo))
    cut = balanced(ops, task, topo)
    assert cut is not None and len(cut) == len(ops) + 4
    full = np.arange(96 * 4 * 3, dtype=np.int32).reshape(96, 4, 3)
    plan = mc.Plan(task, cut, "broadcast", "auto", topo)
    got = mc.execute_local(plan, mc.scatter(full, task.src))
    want = mc.scatter(full, task.dst)
    assert all(np.array_equal(got[r], want[r]) for r in want)
