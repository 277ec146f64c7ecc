"""Properties of layouts whose shards are several boxes (strided steps, fused dimensions), mixed
with plain ones, over random meshes (disjoint, overlapping, identical) and uneven shapes with
empty pieces: notation and JSON round trips, regions that tile the tensor, exact plans for every
strategy x balance, ``[1]`` steps that are plain ``Shard``, and torch's own ``_StridedShard`` /
``Shard`` splits. All byte-exact; one process, no process group.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from strategies import meshes, rich_specs, rich_tasks, sample_array, specs

import meshcast as mc


def _index_array(shape: tuple[int, ...]) -> np.ndarray:
    """Every element its own flat index (int64), so any misplaced element shows."""
    return np.arange(math.prod(shape), dtype=np.int64).reshape(shape)


# -- (a) notation, placements and JSON round trips ----------------------------------------------
@settings(max_examples=80, deadline=None)
@given(rich_tasks())
def test_layouts_tasks_and_plans_round_trip(task: mc.ReshardTask) -> None:
    for layout in (task.src, task.dst):
        mesh, spec = layout.mesh, layout.spec
        assert mc.Layout(mesh, spec) == layout and mc.Layout(mesh, spec).spec == spec
        assert eval(repr(layout), {"Layout": mc.Layout, "Mesh": mc.Mesh}) == layout
        consecutive = mc.Layout(mc.Mesh.from_range(3, mesh.shape), spec)
        assert mc.Layout.parse(consecutive.notation()) == consecutive
        assert mc.Layout.from_json(json.loads(json.dumps(layout.to_json()))) == layout
        try:
            placements = layout.placements
        except ValueError:  # fused, or split in an order other than the mesh axes
            continue
        by_placements = mc.Layout(mesh, list(placements))
        assert mc.Layout.from_json(by_placements.to_json()) == by_placements
        for r in mesh.devices:
            assert by_placements.region(r, task.shape) == layout.region(r, task.shape)
    assert mc.ReshardTask.from_json(json.loads(json.dumps(task.to_json()))) == task
    plan = mc.plan(task, mc.Topology.from_meshes(task.src.mesh, task.dst.mesh), "allgather")
    again = mc.Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan and again.to_json() == plan.to_json()


# -- (b) scatter / gather, and the regions tile the tensor --------------------------------------
def _held_masks(layout: mc.Layout, shape: tuple[int, ...], x: np.ndarray) -> dict[int, np.ndarray]:
    """Per rank, where it holds elements; checks its region against scatter on the way."""
    shards = mc.scatter(x, layout)
    assert np.array_equal(mc.gather(shards, layout, shape), x)
    masks = {}
    for r in layout.mesh.devices:
        region = layout.region(r, shape)
        assert region.shape == layout.shard_shape(r, shape) == shards[r].shape
        assert region.size == sum(math.prod(mc.core.layout.box_shape(b)) for b, _ in
                                  region.boxes())
        for box, local in region.boxes():  # local order is global order, box by box
            assert np.array_equal(shards[r][local], x[box])
            assert region.local(box) == local
        if layout.is_plain:
            assert region == mc.Region.of_box(layout.box(r, shape))  # empty runs dropped
        mask = np.zeros(shape, dtype=bool)
        mask[np.ix_(*region.indices())] = True
        masks[r] = mask
    return masks


@settings(max_examples=120, deadline=None)
@given(rich_tasks())
def test_regions_tile_the_tensor_as_the_unit_slices_say(task: mc.ReshardTask) -> None:
    x = _index_array(task.shape)
    src = _held_masks(task.src, task.shape, x)
    dst = _held_masks(task.dst, task.shape, x)
    cover = np.zeros(task.shape, dtype=np.int64)
    for unit in task.unit_slices():
        assert unit.holders and unit.receivers
        cover[unit.box] += 1
        for masks, ranks in ((src, unit.holders), (dst, unit.receivers)):
            for r, mask in masks.items():
                held = mask[unit.box]
                assert held.all() if r in ranks else not held.any(), (unit, r)
    assert (cover == 1).all()


# -- (c) every strategy x balance is exact; simulate >= lower bound ------------------------------
@settings(max_examples=50, deadline=None)
@given(rich_tasks())
@example(  # as many boxes as ranks, one rank empty: the plan check once took them one a rank
    mc.ReshardTask((3,), "int32", mc.Layout.parse("3:R"), mc.Layout.parse("3:S0[2]")))
def test_every_strategy_and_balance_is_exact(task: mc.ReshardTask) -> None:
    x = sample_array(task)
    src, want = mc.scatter(x, task.src), mc.scatter(x, task.dst)
    topology = mc.Topology.from_meshes(task.src.mesh, task.dst.mesh)
    bound = mc.lower_bound(task, topology)
    for strategy in mc.STRATEGIES:
        for balance in mc.BALANCES:
            plan = mc.plan(task, topology, strategy=strategy, balance=balance)
            got = mc.execute_local(plan, src)
            assert sorted(got) == sorted(want)
            for r, shard in got.items():
                assert shard.dtype == want[r].dtype and np.array_equal(shard, want[r]), (
                    strategy, balance, r)
            seconds = mc.simulate(plan, topology).time_s
            assert seconds >= bound * (1 - 1e-9), (strategy, balance, seconds, bound)


@settings(max_examples=50, deadline=None)
@given(rich_tasks())
def test_auto_plans_classes_of_slices_exactly(task: mc.ReshardTask) -> None:
    """``"auto"`` plans slices with equal holders and receivers as one and cuts its operations
    back into their boxes (planning/classes.py): still every element exactly once; a one-box
    layout has no class of two slices."""
    from meshcast.core.task import iter_slices
    from meshcast.planning.classes import SliceClasses

    x = sample_array(task)
    plan = mc.plan(task, cache=False)
    got = mc.execute_local(plan, mc.scatter(x, task.src))
    want = mc.scatter(x, task.dst)
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[r], want[r]) for r in want)
    one_box = all(len(list(region.boxes())) == 1
                  for layout in (task.src, task.dst)
                  for region in layout.regions(task.shape).values())
    if one_box:
        assert not SliceClasses(list(iter_slices(task))).merged


def test_classes_expand_in_passes_and_auto_searches_one_pass() -> None:
    """Operations on classes expand in passes (the j-th box of every operation, pass after
    pass); where ``"auto"``'s own plan is far above the lower bound (start-ups dominate: k = 8
    boxes per rank, meshes sharing ranks) its local search reorders one pass and repeats it:
    the plan is still exact and the same on every call."""
    from meshcast.core.plan import Plan
    from meshcast.core.task import iter_slices
    from meshcast.estimate.lower_bound import lower_bound_details
    from meshcast.planning.classes import SliceClasses
    from meshcast.planning.local_search import search_in_passes
    from meshcast.planning.own import OwnMethod

    task = mc.ReshardTask((64, 16), "int32", mc.Layout.parse("2x4:S01[8]R"),
                          mc.Layout.parse("2x4@4:RS01"))
    topology = mc.Topology.from_meshes(task.src.mesh, task.dst.mesh)
    classes = SliceClasses(list(iter_slices(task)))
    assert classes.merged and len(classes.virtual) * 8 == len(task.unit_slices())
    own = OwnMethod(task, topology, lower_bound_details(task, topology), None, 4096)
    position, label, _, expanded, _ = own.variant_stages()[0]()[0]
    virtual = own.virtual_ops(position)
    kept, first = classes.first_pass(virtual)
    assert kept == list(range(len(virtual))) and expanded[: len(first)] == first
    assert len(expanded) == 8 * len(first)  # every class part covers its 8 boxes
    searched = search_in_passes(task, topology, classes, virtual, label)
    assert sorted(map(repr, searched)) == sorted(map(repr, expanded))  # reordered only
    Plan(task, searched, label, "auto", topology).check()

    plan = mc.plan(task, topology, cache=False)
    assert mc.simulate(plan).time_s > 1.2 * mc.lower_bound(task, topology)  # searched
    assert plan.to_json() == mc.plan(task, topology, cache=False).to_json()
    x = sample_array(task)
    got = mc.execute_local(plan, mc.scatter(x, task.src))
    want = mc.scatter(x, task.dst)
    assert all(np.array_equal(got[r], want[r]) for r in want)


# -- (d) steps of split factor 1 are plain Shard -------------------------------------------------
def _with_unit_factors(spec: str, draw) -> str:
    """``spec`` with ``[1]`` written after some of its mesh-axis digits."""
    return "".join(c + "[1]" if c.isdigit() and draw(st.booleans()) else c for c in spec)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_split_factor_one_is_the_plain_layout(data) -> None:
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    mesh = data.draw(meshes(max_devices=8, rank_pool=12))
    plain_spec = data.draw(specs(mesh, ndim))
    stepped = mc.Layout(mesh, _with_unit_factors(plain_spec, data.draw))
    plain = mc.Layout(mesh, plain_spec)
    assert stepped == plain and stepped.spec == plain_spec and stepped.is_plain
    assert hash(stepped) == hash(plain)
    if _in_axis_order(plain):  # StridedShard(d, 1) placements are Shard(d)
        ones = [mc.StridedShard(p.dim, 1) if isinstance(p, mc.Shard) else p
                for p in plain.placements]
        assert mc.Layout(mesh, ones) == mc.Layout(mesh, list(plain.placements))
    for r in mesh.devices:
        assert stepped.box(r, shape) == plain.box(r, shape)
    other = mc.Layout(mc.Mesh(mesh.array + 12), "R" * ndim)
    for a, b in ((stepped, other), (other, stepped)):
        p = mc.plan(mc.ReshardTask(shape, "int32", a, b), strategy="allgather")
        q = mc.plan(mc.ReshardTask(shape, "int32", plain if a is stepped else a,
                                   plain if b is stepped else b), strategy="allgather")
        assert json.dumps(p.to_json()) == json.dumps(q.to_json())


def _in_axis_order(layout: mc.Layout) -> bool:
    try:
        return bool(layout.placements) or True
    except ValueError:
        return False


# -- (e) regions are what torch's own _StridedShard / Shard splits give --------------------------
def _torch_indices(torch, split, size: int, coords: tuple[int, ...], mesh_shape) -> list[int]:
    """The global indices a mesh position holds of a dimension, by torch's ``_split_tensor`` of
    ``_StridedShard`` / ``Shard`` applied step by step to ``arange`` (each part of a fused
    dimension on its own, offset)."""
    from torch.distributed.tensor.placement_types import Shard, _StridedShard

    out: list[int] = []
    offset = 0
    pieces = [(p.size, p.steps) for p in split.parts] if split.parts else [(size, split.steps)]
    for n, steps in pieces:
        held = torch.arange(n) + offset
        for axis, f in steps:
            placement = Shard(0) if f == 1 else _StridedShard(0, split_factor=f)
            chunks, _ = placement._split_tensor(held, mesh_shape[axis], with_padding=False)
            held = chunks[coords[axis]]
        out += held.tolist()
        offset += n
    return out


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_regions_match_torch_strided_shard_splits(data) -> None:
    torch = pytest.importorskip("torch")
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(0, 16), min_size=ndim, max_size=ndim)))
    mesh = data.draw(meshes(max_devices=8, rank_pool=12))
    layout = mc.Layout(mesh, data.draw(rich_specs(mesh, shape)))
    splits = layout.splits(ndim)
    for r in mesh.devices:
        region = layout.region(r, shape)
        coords = mesh.coords(r)
        for d, (split, got) in enumerate(zip(splits, region.indices())):
            want = _torch_indices(torch, split, shape[d], coords, mesh.shape)
            assert got.tolist() == want, (layout.spec, shape, r, d)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_pipeline_takes_each_ranks_shard_as_scatter_does(data) -> None:
    """The pipeline's sending side (``shard_of``: a region's elements of a whole torch tensor)
    gives every rank what :func:`meshcast.scatter` gives it, in local order."""
    torch = pytest.importorskip("torch")

    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(0, 12), min_size=ndim, max_size=ndim)))
    mesh = data.draw(meshes(max_devices=8, rank_pool=12))
    layout = mc.Layout(mesh, data.draw(rich_specs(mesh, shape)))
    x = _index_array(shape)
    want = mc.scatter(x, layout)
    for r in mesh.devices:
        got = mc.shard_of(torch.from_numpy(x), layout.region(r, shape))
        assert got.shape == want[r].shape and np.array_equal(got.numpy(), want[r])
