"""The large path of "auto" on shared NICs (issue 14): the phased order with g groups per NIC and
its cost model, the pruning of the slower order, and the first-holder and ``order`` fixed plans'
time floors computed without building the plans."""

from __future__ import annotations

import gc
import hashlib
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import tasks

import meshcast as mc
from meshcast.planning.auto import auto_plan, collector_paused
from meshcast.planning.fixed import STRATEGIES, fixed_plan
from meshcast.planning.floors import first_holder_floor
from meshcast.planning.large import _large_sends, large_plan
from meshcast.planning.order import order_floor, order_plan
from meshcast.planning.phased import bipartite_components, epoch_cuts, phase_model, phased_sends

LAT = 30e-6


def _all_to_all(hosts: int, shape: tuple[int, int]) -> mc.ReshardTask:
    """Every rank of a ``hosts x 8`` mesh sends one slice to every rank of another."""
    src = mc.Layout(mc.Mesh.from_range(0, (hosts, 8)), "S01R")
    dst = mc.Layout(mc.Mesh.from_range(hosts * 8, (hosts, 8)), "RS01")
    return mc.ReshardTask(shape, "float32", src, dst)


def test_phase_model_values():
    """Closed form: Latin rounds ``rounds * (lat + per_nic * transfer)``; g groups ``rounds *
    (lat + per_nic / g * transfer) + (2 g - 2) lat`` where the g turns fit in a round (the
    fewest groups within 1 % of the least); the least divisor of per_nic (with the NIC as the
    bottleneck) where none fit."""
    g, phased, latin = phase_model(8, 64, LAT, 4e-6)  # g = 8 is modelled 0.6 % faster
    assert g == 4
    assert phased == pytest.approx(64 * (LAT + 2 * 4e-6) + 6 * LAT, rel=1e-12)
    assert latin == pytest.approx(64 * (LAT + 8 * 4e-6), rel=1e-12)
    assert phase_model(8, 8, LAT, 4e-6)[0] == 2  # few rounds: extra start-ups do not pay
    g, phased, _ = phase_model(4, 16, LAT, 20e-6)  # 80 us of transfers > 30 + 20 us: no fit
    assert g == 2 and phased == pytest.approx(16 * 80e-6 + 2 * LAT, rel=1e-12)
    g, phased, _ = phase_model(3, 3, LAT, 20e-6)  # 60 us > 30 + 20 us, and 2 does not divide 3
    assert g == 3 and phased == pytest.approx(3 * 60e-6 + 4 * LAT, rel=1e-12)


def test_phased_order_where_no_group_count_fits():
    """Three ranks per NIC whose transfers do not fit in a start-up: the phased order takes
    three groups, the least divisor (two groups raised an IndexError before), and the plan
    moves the data exactly."""
    src = mc.Layout(mc.Mesh.from_range(3, (3,)), "S0R")
    dst = mc.Layout(mc.Mesh.from_range(0, (3,)), "RS0")
    task = mc.ReshardTask((16384, 3), "int32", src, dst)
    topo = mc.Topology(hosts=((3, 4, 5), (0, 1, 2)), nic_in_gbps=(10.0, 10.0),
                       nic_out_gbps=(10.0, 10.0), nics_per_host=(1, 1), intra_gbps=800.0,
                       latency_us=30.0)
    phased = large_plan(task, topo)[2]
    assert phased is not None
    x = np.arange(16384 * 3, dtype=np.int32).reshape(16384, 3)
    for plan in (phased, mc.plan(task, topo)):
        out = mc.execute_local(plan, mc.scatter(x, task.src))
        assert mc.gather(out, task.dst).tobytes() == x.tobytes()


def test_phased_order_with_four_groups():
    """8 ranks per NIC, 5 KB slices (4 us at 10 Gbit/s), 64 rounds: the model picks four groups;
    the plan moves the data exactly, has the lead pieces of epoch_cuts, and beats Latin-square
    rounds by the modelled factor (within 1 %)."""
    task = _all_to_all(8, (1600, 3200))
    topo = mc.Topology.uniform(16, 8, nic_gbps=10)
    assert epoch_cuts(4).tolist() == [[0, 1, 2, 3], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 1]]
    latin, exact, phased = large_plan(task, topo)
    assert exact is None
    x = np.arange(1600 * 3200, dtype=np.float32).reshape(1600, 3200)
    out = mc.execute_local(phased, mc.scatter(x, task.src))
    assert np.array_equal(mc.gather(out, task.dst, task.shape), x)
    # lead pieces: group a of each NIC (2 senders) a in the first epoch, group 3 one in each
    # of the 3 others (8 NICs)
    assert len(phased.ops) == 64 * 64 + 8 * 2 * (0 + 1 + 2 + 3 + 3)
    _, model_phased, model_latin = phase_model(8, 64, LAT, 5000 / (10e9 / 8))
    ratio = mc.simulate(latin).time_s / mc.simulate(phased).time_s
    assert ratio == pytest.approx(model_latin / model_phased, rel=0.01)
    assert ratio > 1.1


@pytest.mark.parametrize("rows, kept", [(1024, "phased"), (64, "rounds")])
def test_prune_builds_only_the_predicted_faster_order(rows, kept):
    """Four ranks per NIC. 16 KiB slices: the model predicts the phased order 37 % faster, so
    only it is built; 64-byte slices: Latin rounds 24 % faster. Whichever is built is the same
    plan as without pruning, and it is the faster one in the simulator."""
    src = mc.Layout(mc.Mesh.from_range(0, (2, 8)), "S01R")
    dst = mc.Layout(mc.Mesh.from_range(16, (2, 8)), "RS01")
    task = mc.ReshardTask((rows, rows), "float32", src, dst)
    topo = mc.Topology.uniform(8, 4, nic_gbps=10)
    both = large_plan(task, topo)
    pruned = large_plan(task, topo, prune=True)
    assert pruned.exact is None
    assert (pruned.rounds is None, pruned.phased is None) == (kept == "phased", kept == "rounds")
    plan = getattr(pruned, kept)
    assert plan.ops == getattr(both, kept).ops
    other = both.rounds if kept == "phased" else both.phased
    assert mc.simulate(plan).time_s < mc.simulate(other).time_s
    assert auto_plan(task, topo, None, sim_limit=2).ops == plan.ops


@settings(max_examples=40, deadline=None)
@given(tasks())
def test_first_holder_floor_is_time_floor_of_the_none_plan(task):
    """Computed from the task without building the plan, the floor is the same number."""
    topo = mc.Topology.preset_for_meshes("p3.8xlarge", task.src.mesh, task.dst.mesh)
    plan = fixed_plan(task, topo, "send_recv", "none")
    assert first_holder_floor(task, topo) == mc.time_floor(plan, topo)


@settings(max_examples=40, deadline=None)
@given(tasks(), st.sampled_from(STRATEGIES))
def test_order_floor_is_time_floor_of_the_order_plan(task, strategy):
    """Computed without building the plan's operations, the ``order`` plan's floor is the same
    number as :func:`meshcast.time_floor` of the plan (None where a job is a broadcast or feeds
    an all-gather), so it is never above the plan's simulated time (up to float rounding: the
    two add the same durations in different orders; one example was 1 ulp above)."""
    topo = mc.Topology.preset_for_meshes("p3.8xlarge", task.src.mesh, task.dst.mesh)
    plan = order_plan(task, topo, strategy)
    floor = order_floor(task, topo, strategy)
    if any(op.kind in ("broadcast", "allgather") for op in plan.ops):
        assert floor is None
    else:
        assert floor == mc.time_floor(plan, topo)
        assert floor <= mc.simulate(plan, topo).time_s * (1 + 1e-12)


def test_order_floor_rules_out_the_order_plan_of_the_large_path():
    """On shared NICs the large path keeps its phased plan; the ``order`` plan's floor, computed
    without building it, is above that plan's simulated time (so it is not built), and equals
    the floor of the built plan."""
    task, topo = _all_to_all(8, (1600, 320)), mc.Topology.uniform(16, 8, nic_gbps=10)
    kept = mc.simulate(auto_plan(task, topo, None, sim_limit=2), topo).time_s
    floor = order_floor(task, topo, "send_recv")
    assert floor == mc.time_floor(order_plan(task, topo, "send_recv"), topo) > kept


def test_collector_paused_restores_the_collector():
    """The large path pauses Python's cyclic garbage collector and leaves it as it found it,
    also when the block raises."""
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="planning failed"), collector_paused():
        raise RuntimeError("planning failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    auto_plan(_all_to_all(2, (64, 32)), mc.Topology.uniform(8, 4, nic_gbps=10), None, sim_limit=2)
    assert gc.isenabled()


def test_large_shared_nic_plan_same_in_two_processes():
    """The large path on shared NICs (phased order, pruning, floors) is deterministic: the same
    plan in a fresh process."""
    code = (
        "import hashlib, sys; sys.path.insert(0, 'tests'); import meshcast as mc;"
        "from test_large_plans import _all_to_all;"
        "from meshcast.planning.auto import auto_plan;"
        "t = _all_to_all(8, (1600, 320)); topo = mc.Topology.uniform(16, 8, nic_gbps=10);"
        "p = auto_plan(t, topo, None, sim_limit=2);"
        "print(hashlib.sha256(p.to_json().encode()).hexdigest())"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    here = auto_plan(_all_to_all(8, (1600, 320)), mc.Topology.uniform(16, 8, nic_gbps=10), None,
                     sim_limit=2)
    assert other == hashlib.sha256(here.to_json().encode()).hexdigest()


def test_phased_order_with_three_ranks_per_nic():
    """An odd number of ranks per NIC: three groups of one (halves would differ in size). The
    data arrive exactly and the plan beats Latin-square rounds, which start the three transfers
    of a NIC together."""
    task = _all_to_all(3, (768, 3072))  # 16 KiB slices: 13 us each on the NIC
    topo = mc.Topology.uniform(16, 3, nic_gbps=10)
    latin, _, phased = large_plan(task, topo)
    x = np.arange(768 * 3072, dtype=np.float32).reshape(768, 3072)
    out = mc.execute_local(phased, mc.scatter(x, task.src))
    assert np.array_equal(mc.gather(out, task.dst, task.shape), x)
    assert mc.simulate(phased).time_s < 0.8 * mc.simulate(latin).time_s


@pytest.mark.parametrize("k", [2, 3])
def test_phased_order_with_k_boxes_per_rank(k):
    """A strided source (``S01[k]R``: k boxes per rank) sends k slices on every pair: the sends
    are still a complete bipartite graph (with multiplicity k), a pair's k sends go in k
    consecutive rank-disjoint rounds (a sender's receivers come k times in a row), and the
    phased order applies. The data arrive exactly, and ``auto`` is as close to the lower bound
    as on the one-box task (within 1 %; before the multiplicity, first-fit rounds left it 9-14 %
    above)."""
    src = mc.Layout(mc.Mesh.from_range(0, (2, 4)), f"S01[{k}]R")
    dst = mc.Layout(mc.Mesh.from_range(8, (2, 4)), "RS01")
    task = mc.ReshardTask((3072, 1024), "float32", src, dst)
    topo = mc.Topology.uniform(4, 4, nic_gbps=10)
    rounds, _, phased = large_plan(task, topo)
    assert phased is not None
    x = np.arange(3072 * 1024, dtype=np.float32).reshape(3072, 1024)
    for plan in (rounds, phased):
        out = mc.execute_local(plan, mc.scatter(x, task.src))
        assert np.array_equal(mc.gather(out, task.dst, task.shape), x)
    for sender in src.mesh.devices:  # its receivers in plan order: each k times in a row
        seq = [op.dst for op in rounds.ops if op.src == sender]
        assert seq == [r for r in seq[::k] for _ in range(k)] and len(set(seq)) == 8
    plan = mc.plan(task, topo, cache=False)
    assert mc.simulate(plan).time_s <= 1.01 * mc.lower_bound(task, topo)


@pytest.mark.parametrize("dst, k, nic_disjoint", [
    ("2x4@8:S01R", 4, True),   # half a of the source -> half a of the destination: 2 x K(4, 4)
    ("2x4@8:S01R", 8, True),   # the same, each pair's data in 2 boxes
    ("4@8:S0R", 8, False),     # 2 x K(4, 2), both halves received on one NIC
])
def test_exchanging_groups_get_latin_rounds_and_the_phased_order(dst, k, nic_disjoint):
    """A strided source whose ranks exchange in disjoint groups (a k-to-k shuffle, not an
    all-to-all): each group is a complete bipartite graph, so the rounds are a Latin square per
    group (rank-disjoint, as few as the busiest rank needs) and the phased order applies to each
    group. The data arrive exactly, and ``auto``'s first plan is within 1 % of the lower bound
    (first-fit rounds alone left it 1.3-3.3 % above, and ``auto`` ran its trials)."""
    src = mc.Layout(mc.Mesh.from_range(0, (2, 4)), f"S01[{k}]R")
    task = mc.ReshardTask((4096, 1024), "float32", src, mc.Layout.parse(dst))
    topo = mc.Topology.uniform(4, 4, nic_gbps=10)
    rounds, _, phased = large_plan(task, topo)
    assert phased is not None
    ls = _large_sends(task)
    groups = bipartite_components(ls.senders, ls.remotes)
    assert groups is not None and len(groups.k) == 2
    slot = groups.latin_rounds()
    busy = {(int(r), x) for r, a, (b,) in zip(slot, ls.senders, ls.remotes) for x in (a, b)}
    assert len(busy) == 2 * len(slot)  # no rank twice in a round
    busiest = max(np.bincount(ls.senders).max(), np.bincount([r[0] for r in ls.remotes]).max())
    assert slot.max() + 1 == busiest
    x = np.arange(4096 * 1024, dtype=np.float32).reshape(4096, 1024)
    for plan in (rounds, phased):
        out = mc.execute_local(plan, mc.scatter(x, task.src))
        assert np.array_equal(mc.gather(out, task.dst, task.shape), x)
    gain = phased_sends(ls.senders, ls.remotes, [ls.boxes[i] for i in ls.keep],
                        ls.sizes[ls.keep] * 4, topo).gain
    assert (gain is not None) == nic_disjoint
    first = mc.plan(task, topo, cache=False)
    assert mc.simulate(first).time_s <= 1.01 * mc.lower_bound(task, topo)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3)), min_size=1,
                max_size=4), st.randoms(use_true_random=False), st.booleans())
def test_bipartite_components_of_random_groups(groups, rnd, extra):
    """Disjoint complete bipartite groups (senders x receivers x multiplicity), sends shuffled:
    found with their sizes, Latin rounds rank-disjoint and per group ``k x`` its larger side;
    one send more between two groups (they are then one component, not complete): None."""
    sends, rank = [], 0
    for ns, nr, k in groups:
        s, r = list(range(rank, rank + ns)), list(range(rank + ns, rank + ns + nr))
        sends += [(a, b) for a in s for b in r for _ in range(k)]
        rank += ns + nr
    if extra and len(groups) > 1:
        sends.append((0, rank - 1))
    rnd.shuffle(sends)
    found = bipartite_components([a for a, _ in sends], [(b,) for _, b in sends])
    if extra and len(groups) > 1:
        assert found is None
        return
    assert found is not None
    assert sorted(zip(found.n_senders, found.n_receivers, found.k)) == sorted(groups)
    slot = found.latin_rounds()
    for r in np.unique(slot).tolist():
        ranks = [x for (a, b), s in zip(sends, slot) if s == r for x in (a, b)]
        assert len(ranks) == len(set(ranks))
    for b in range(len(found.k)):
        mine = slot[found.component == b]
        assert len(np.unique(mine)) == found.k[b] * max(found.n_senders[b], found.n_receivers[b])
