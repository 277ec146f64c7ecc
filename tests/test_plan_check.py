"""The plan check (meshcast.core.plan_check): exactly the plans that deliver their destination
layout run; a broken plan is refused by Plan.from_json, execute_local (and the runtimes, tested in
test_runtime.py) with a ValueError naming the first wrong region."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import meshes, rich_tasks, sample_array, specs, tasks

import meshcast as mc
from meshcast.core.layout import box_shape


def _places(layout: mc.Layout, shape: tuple[int, ...], rank: int):
    """``(local shape, [(box, its slices of the local tensor), ...])`` of ``rank``'s shard, or
    None off the mesh: one box for a plain layout, the region's boxes otherwise (an empty region:
    one empty box at the origin, as the plan check takes it)."""
    if rank not in layout.mesh:
        return None
    if layout.is_plain:
        box = layout.box(rank, shape)
        return box_shape(box), [(box, tuple(slice(0, n) for n in box_shape(box)))]
    region = layout.region(rank, shape)
    empty = (tuple(slice(0, 0) for _ in shape), tuple(slice(0, 0) for _ in shape))
    return region.shape, list(region.boxes()) or [empty]


def reference_ok(plan: mc.Plan) -> bool:
    """Element by element, in plan order: what every rank holds; True if the plan reads only
    held data and ends with every destination element delivered exactly once. An operation's
    box must lie inside one box of a shard (a region's boxes for strided and fused layouts)."""
    task = plan.task
    src = {r: _places(task.src, task.shape, r) for r in task.src.mesh}
    dst = {r: _places(task.dst, task.shape, r) for r in task.dst.mesh}
    count = {r: np.zeros(shape, dtype=np.int64) for r, (shape, _) in dst.items()}

    def where(box, places):
        for shard, local in places[1] if places is not None else ():
            if all(s.start <= b.start <= b.stop <= s.stop for b, s in zip(box, shard)):
                return (*(slice(lo.start + b.start - s.start, lo.start + b.stop - s.start)
                          for b, s, lo in zip(box, shard, local)), ...)
        return None

    def inside(box, places):
        return where(box, places) is not None

    def deliver(r, box):
        at = where(box, dst.get(r))
        if at is None:
            return False
        count[r][at] += 1
        return True

    for op in plan.ops:
        if isinstance(op, (mc.Copy, mc.Send, mc.Broadcast)):
            source = op.rank if isinstance(op, mc.Copy) else op.src
            dsts = (
                (op.rank,) if isinstance(op, mc.Copy)
                else (op.dst,) if isinstance(op, mc.Send)
                else op.dsts
            )
            if not inside(op.box, src.get(source)) or len(set(dsts)) != len(dsts):
                return False
            if source in dsts and op.kind != "copy":  # a send to itself, a broadcast to its sender
                return False
            if not all(deliver(r, op.box) for r in dsts):
                return False
        else:
            group = op.group
            if len(op.parts) != len(group) or len(set(group)) != len(group):
                return False
            for r, part in zip(group, op.parts):
                if not inside(part, dst.get(r)) or not mc.core.layout.box_size(part):
                    return False
                if not inside(part, (None, [(op.box, op.box)])) or (
                        count[r][where(part, dst.get(r))] != 1).any():
                    return False
            total = sum(mc.core.layout.box_size(p) for p in op.parts)
            if total != mc.core.layout.box_size(op.box):
                return False  # (with the parts inside the box: overlap or gap)
            for i, part in enumerate(op.parts):
                for j, r in enumerate(group):
                    if j != i and not deliver(r, part):
                        return False
    return all((c == 1).all() for c in count.values())


def _mutations(plan: mc.Plan, seed: int) -> list[tuple[str, tuple]]:
    rng = np.random.default_rng(seed)
    ops = list(plan.ops)
    out: list[tuple[str, tuple]] = []
    if not ops:
        return out
    k = int(rng.integers(len(ops)))
    out.append(("remove", tuple(ops[:k] + ops[k + 1 :])))
    out.append(("duplicate", tuple(ops[: k + 1] + ops[k:])))
    out.append(("reverse", tuple(reversed(ops))))
    j = int(rng.integers(len(ops)))
    swapped = list(ops)
    swapped[j], swapped[k] = swapped[k], swapped[j]
    out.append(("swap", tuple(swapped)))
    op = ops[k]
    box = op.box
    if box:
        d = int(rng.integers(len(box)))
        for da, db in ((1, 0), (0, 1), (-1, 0), (0, -1)):
            s = box[d]
            new = (*box[:d], slice(s.start + da, s.stop + db), *box[d + 1 :])
            out.append((f"box{da}{db}", tuple([*ops[:k], op._replace(box=new), *ops[k + 1:]])))
    ranks = plan.task.src.mesh.devices + plan.task.dst.mesh.devices
    other = ranks[int(rng.integers(len(ranks)))]
    field = op._fields[0]
    if field != "group":
        changed = op._replace(**{field: other})
        out.append(("rank", tuple([*ops[:k], changed, *ops[k + 1:]])))
    return out


@given(tasks(), st.sampled_from(mc.STRATEGIES), st.sampled_from(mc.BALANCES), st.integers(0, 99))
def test_check_agrees_with_element_reference(task, strategy, balance, seed):
    """Planner plans pass; mutated plans (op removed, duplicated, reordered, box shifted, rank
    changed) are refused exactly when an element-by-element replay finds them wrong."""
    _check_agrees(task, strategy, balance, seed)


@settings(max_examples=100)
@given(rich_tasks(), st.sampled_from(mc.STRATEGIES), st.sampled_from(mc.BALANCES),
       st.integers(0, 99))
def test_check_agrees_with_element_reference_on_regions(task, strategy, balance, seed):
    """The same on strided, fused and plain layouts mixed (shards of several boxes)."""
    _check_agrees(task, strategy, balance, seed)


def _check_agrees(task: mc.ReshardTask, strategy: str, balance: str, seed: int) -> None:
    plan = mc.plan(task, strategy=strategy, balance=balance)
    plan.check()
    assert reference_ok(plan)
    x = sample_array(task)
    for name, ops in _mutations(plan, seed):
        bad = mc.Plan(task, ops, plan.strategy, plan.balance, plan.topology)
        if reference_ok(bad):
            bad.check()
            out = mc.execute_local(bad, mc.scatter(x, task.src))
            assert np.array_equal(mc.gather(out, task.dst, task.shape), x), name
        else:
            with pytest.raises(ValueError, match="plan check failed"):
                bad.check()
            with pytest.raises(ValueError, match="plan check failed"):
                mc.execute_local(bad, mc.scatter(x, task.src))


def _gather_mutations(plan: mc.Plan, seed: int) -> list[tuple[str, tuple]]:
    """An all-gather moved earlier, or one of its parts resized."""
    rng = np.random.default_rng(seed)
    ops = list(plan.ops)
    where = [i for i, op in enumerate(ops) if op.kind == "allgather"]
    if not where:
        return []
    k = where[int(rng.integers(len(where)))]
    j = int(rng.integers(k + 1))
    moved = [*ops[:j], ops[k], *ops[j:k], *ops[k + 1:]]
    g = ops[k]
    p = int(rng.integers(len(g.parts)))
    part = g.parts[p]
    d = max(range(len(part)), key=lambda x: part[x].stop - part[x].start)
    grown = (*part[:d], slice(part[d].start, part[d].stop + 1), *part[d + 1 :])
    parts = (*g.parts[:p], grown, *g.parts[p + 1 :])
    resized = [*ops[:k], g._replace(parts=parts), *ops[k + 1:]]
    return [("moved", tuple(moved)), ("resized", tuple(resized))]


@st.composite
def gather_tasks(draw) -> mc.ReshardTask:
    """Source on ranks 0-3, destination a mesh of ranks 4-19 (hosts of four) that replicates
    along some axis: all-gathers inside the destination hosts."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 12), min_size=ndim, max_size=ndim)))
    src_mesh = draw(meshes(max_devices=4, rank_pool=4))
    dst_shape = draw(st.sampled_from([(4,), (2, 4), (4, 4), (4, 2)]))
    dst_mesh = mc.Mesh.from_range(4, dst_shape)
    src = mc.Layout(src_mesh, draw(specs(src_mesh, ndim)))
    dst = mc.Layout(dst_mesh, draw(specs(dst_mesh, ndim)))
    return mc.ReshardTask(shape, "int16", src, dst)


@given(st.one_of(tasks(), gather_tasks()), st.integers(0, 99))
def test_check_agrees_on_allgather_plans(task, seed):
    """All-gather plans on hosts of four ranks: moved or resized all-gathers are refused exactly
    when the element replay finds them wrong."""
    topo = mc.Topology.uniform(8, 4)
    plan = mc.plan(task, topo, "allgather", "none")
    plan.check()
    for _name, ops in _mutations(plan, seed) + _gather_mutations(plan, seed):
        bad = mc.Plan(task, ops, plan.strategy, plan.balance, plan.topology)
        if reference_ok(bad):
            bad.check()
        else:
            with pytest.raises(ValueError, match="plan check failed"):
                bad.check()


def _task_2x2() -> mc.ReshardTask:
    src = mc.Layout(mc.Mesh.from_range(0, (2, 2)), "S0S1")
    dst = mc.Layout(mc.Mesh.from_range(4, (2, 2)), "S1R")
    return mc.ReshardTask((6, 5), "int32", src, dst)


def _plan(strategy="send_recv", task=None) -> mc.Plan:
    return mc.plan(task or _task_2x2(), mc.Topology.uniform(4, 2), strategy, "none")


def _json_without(plan: mc.Plan, k: int) -> dict:
    data = json.loads(plan.to_json())
    del data["ops"][k]
    return data


def test_from_json_refuses_a_plan_with_one_operation_removed():
    plan = _plan()
    assert str(plan.ops[0]) == "Send(src=0, dst=4, box=(slice(0, 3, None), slice(0, 3, None)))"
    with pytest.raises(ValueError) as err:
        mc.Plan.from_json(_json_without(plan, 0))
    assert str(err.value) == (
        "plan check failed: rank 4 never receives [0:3, 0:3] of its destination shard "
        "[0:3, 0:5]: no operation delivers element (0, 0)"
    )
    for k in range(len(plan.ops)):
        with pytest.raises(ValueError, match=r"never receives .* no operation delivers"):
            mc.Plan.from_json(_json_without(plan, k))


def test_execute_local_refuses_instead_of_filling_zeros():
    plan = _plan()
    task = plan.task
    bad = mc.Plan(task, plan.ops[1:], plan.strategy, plan.balance, plan.topology)
    x = np.arange(30, dtype=np.int32).reshape(6, 5)
    with pytest.raises(ValueError, match=r"rank 4 never receives \[0:3, 0:3\]"):
        mc.execute_local(bad, mc.scatter(x, task.src))


def _refused(plan: mc.Plan, ops) -> str:
    bad = mc.Plan(plan.task, tuple(ops), plan.strategy, plan.balance, plan.topology)
    with pytest.raises(ValueError) as err:
        bad.check()
    message = str(err.value)
    assert message.startswith("plan check failed: ")
    with pytest.raises(ValueError):  # the verdict is kept on the plan
        bad.check()
    return message.removeprefix("plan check failed: ")


S = slice


def test_messages_name_the_operation_rank_and_box():
    plan = _plan()
    ops = list(plan.ops)
    assert _refused(plan, [*ops, ops[2]]) == (
        "op 8 (send 1->4 of [0:3, 3:5]) delivers [0:3, 3:5] to rank 4 a second time "
        "(op 2 delivered it before)"
    )
    assert _refused(plan, [mc.Send(1, 4, (S(0, 3), S(0, 3))), *ops[1:]]) == (
        "op 0 (send 1->4 of [0:3, 0:3]) reads [0:3, 0:3], but rank 1 holds [0:3, 3:5] of the "
        "source layout"
    )
    assert _refused(plan, [mc.Send(0, 5, (S(0, 3), S(0, 3))), *ops[1:]]) == (
        "op 0 (send 0->5 of [0:3, 0:3]) delivers [0:3, 0:3] to rank 5, whose destination shard "
        "is [3:6, 0:5]"
    )
    assert _refused(plan, [mc.Send(0, 9, (S(0, 3), S(0, 3))), *ops[1:]]) == (
        "op 0 (send 0->9 of [0:3, 0:3]): dst rank 9 is not in the destination mesh"
    )
    assert _refused(plan, [mc.Send(0, 4, (S(0, 3), S(0, 7))), *ops[1:]]) == (
        "op 0 (send 0->4 of [0:3, 0:7]): box [0:3, 0:7] is not inside the tensor of shape "
        "(6, 5) (dimension 1: need 0 <= start <= stop <= 5)"
    )
    assert _refused(plan, [mc.Send(0, 4, (S(0, 3),)), *ops[1:]]) == (
        "op 0 (send 0->4 of [0:3]): box (slice(0, 3, None),) must be a tuple of 2 slices (one "
        "per dimension of the tensor's shape (6, 5))"
    )
    assert _refused(plan, [mc.Send(0, 4, (S(0, 3), S(0, 3, 2))), *ops[1:]]) == (
        "op 0 (send 0->4 of [0:3, 0:3]): box (slice(0, 3, None), slice(0, 3, 2)) must hold "
        "slice(start, stop) objects, got slice(0, 3, 2)"
    )
    assert _refused(plan, [mc.Send(0, 4, (S(0, 3.0), S(0, 3))), *ops[1:]]) == (
        "op 0 (send 0->4 of [0:3.0, 0:3]): box stop must be a Python int, got 3.0 (float)"
    )
    assert _refused(plan, [mc.Send(np.int64(0), 4, (S(0, 3), S(0, 3))), *ops[1:]]) == (
        "op 0 (send 0->4 of [0:3, 0:3]): src rank must be a Python int, got np.int64(0) (int64)"
    )
    assert _refused(plan, [mc.Send(0, 4, (S(0, 3), S(True, 3))), *ops[1:]]) == (
        "op 0 (send 0->4 of [0:3, True:3]): box start must be a Python int, got True (bool)"
    )
    assert _refused(plan, ["send", *ops[1:]]) == (
        "op 0 (str): an operation of unknown type str (known: Copy, Send, Broadcast, AllGather)"
    )


def test_broadcast_and_send_fields():
    plan = _plan("broadcast")
    ops = list(plan.ops)
    assert ops[0] == mc.Broadcast(0, (4, 6), (S(0, 3), S(0, 3)))
    assert _refused(plan, [mc.Broadcast(0, (4, 1), ops[0].box), *ops[1:]]) == (
        "op 0 (broadcast from 0 to [4, 1] of [0:3, 0:3]): dsts rank 1 is not in the "
        "destination mesh"
    )
    assert _refused(plan, [mc.Broadcast(0, (4,), ops[0].box), *ops[1:]]) == (
        "rank 6 never receives [0:3, 0:3] of its destination shard [0:3, 0:5]: no operation "
        "delivers element (0, 0)"
    )
    assert _refused(plan, [mc.Broadcast(0, (4, 4), ops[0].box), *ops[1:]]) == (
        "op 0 (broadcast from 0 to [4, 4] of [0:3, 0:3]): dsts [4, 4] name a rank more than once"
    )
    assert _refused(plan, [mc.Broadcast(0, 4, ops[0].box), *ops[1:]]) == (
        "op 0 (broadcast from 0 to 4 of [0:3, 0:3]): dsts must be a non-empty tuple of ranks, "
        "got 4"
    )
    assert _refused(plan, [mc.Broadcast(0, (), ops[0].box), *ops[1:]]) == (
        "op 0 (broadcast from 0 to [] of [0:3, 0:3]): dsts must be a non-empty tuple of ranks, "
        "got ()"
    )
    same = mc.ReshardTask((4,), "int8", mc.Layout(mc.Mesh([0, 1]), "R"),
                          mc.Layout(mc.Mesh([0, 1]), "S0"))
    p = mc.plan(same, mc.Topology.uniform(1, 2), "send_recv", "none")
    assert p.ops == (mc.Copy(0, (S(0, 2),)), mc.Copy(1, (S(2, 4),)))
    assert _refused(p, [mc.Send(0, 0, (S(0, 2),)), p.ops[1]]) == (
        "op 0 (send 0->0 of [0:2]): src and dst are both rank 0 (a move inside a rank is a Copy)"
    )
    assert _refused(p, [mc.Broadcast(0, (0, 1), (S(0, 2),))]) == (
        "op 0 (broadcast from 0 to [0, 1] of [0:2]): src rank 0 is among its own dsts"
    )


def _allgather_plan() -> mc.Plan:
    """One source rank, four receivers on one host: sends of parts, then an all-gather."""
    task = mc.ReshardTask((8, 3), "float32", mc.Layout(mc.Mesh([[0]]), "RR"),
                          mc.Layout(mc.Mesh([[1, 2, 3, 4]]), "RR"))
    plan = mc.plan(task, mc.Topology([[0], [1, 2, 3, 4]]), "allgather", "none")
    assert [op.kind for op in plan.ops] == ["send"] * 4 + ["allgather"]
    return plan


def test_allgather_contributions_must_arrive_first():
    plan = _allgather_plan()
    ops = list(plan.ops)
    gather = ops[4]
    assert gather.parts == ((S(0, 2), S(0, 3)), (S(2, 4), S(0, 3)), (S(4, 6), S(0, 3)),
                            (S(6, 8), S(0, 3)))
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    assert np.array_equal(mc.execute_local(plan, mc.scatter(x, plan.task.src))[3], x)
    assert _refused(plan, [gather, *ops[:4]]) == (
        "op 0 (allgather among [1, 2, 3, 4] of [0:8, 0:3]) has rank 1 contribute part "
        "[0:2, 0:3] before it holds it: op 1 delivers [0:2, 0:3] of it later"
    )
    assert _refused(plan, [*ops[:2], gather, *ops[2:4]]) == (
        "op 2 (allgather among [1, 2, 3, 4] of [0:8, 0:3]) has rank 3 contribute part "
        "[4:6, 0:3] before it holds it: op 3 delivers [4:6, 0:3] of it later"
    )
    # a contribution assembled from two earlier pieces is fine
    split = [mc.Send(0, 3, (S(4, 5), S(0, 3))), mc.Send(0, 3, (S(5, 6), S(0, 3)))]
    ok = mc.Plan(plan.task, tuple(ops[:2] + split + ops[3:]), "allgather", "none", plan.topology)
    ok.check()
    assert np.array_equal(mc.execute_local(ok, mc.scatter(x, plan.task.src))[4], x)


def test_allgather_fields():
    plan = _allgather_plan()
    ops = list(plan.ops)
    g = ops[4]
    parts = g.parts
    cases = [
        (g._replace(parts=parts[:3]),
         "parts must be a tuple of one box per member of the group (4)"),
        (g._replace(group=(1, 2, 3, 3)), "group [1, 2, 3, 3] names a rank more than once"),
        (g._replace(group=(1, 2, 3, 0)), "group rank 0 is not in the destination mesh"),
        (g._replace(parts=(parts[0], parts[1], (S(4, 7), S(0, 3)), parts[3])),
         "its parts do not tile its box exactly once: element (6, 0) lies in 2 parts [2, 3]"),
        (g._replace(parts=(parts[0], parts[1], (S(4, 5), S(0, 3)), parts[3])),
         "its parts do not tile its box exactly once: element (5, 0) lies in 0 parts []"),
        (g._replace(parts=(parts[0], parts[1], (S(4, 4), S(0, 3)), parts[3])),
         "part 2 [4:4, 0:3] (of rank 3) is empty"),
        (g._replace(box=(S(0, 6), S(0, 3))), "part 3 [6:8, 0:3] is not inside the box"),
    ]
    for op, why in cases:
        assert _refused(plan, [*ops[:4], op]) == f"op 4 ({_describe(op)}): {why}"


def _describe(op) -> str:
    box = "[" + ", ".join(f"{s.start}:{s.stop}" for s in op.box) + "]"
    return f"allgather among {list(op.group)} of {box}"


def test_plan_fields_and_topology():
    plan = _plan()
    bad = mc.Plan(plan.task, list(plan.ops), "send_recv", "none", plan.topology)
    with pytest.raises(ValueError, match=r"plan\.ops must be a tuple of operations, got list"):
        bad.check()
    small = mc.Topology.uniform(2, 2)
    bad = mc.Plan(plan.task, plan.ops, "send_recv", "none", small)
    with pytest.raises(ValueError, match=r"plan.topology: topology does not place ranks \[4, 5"):
        bad.check()


def test_from_json_refuses_malformed_operations():
    data = json.loads(_plan().to_json())
    data["ops"][2] = ["send", 0, [[0, 3], [0, 3]]]
    with pytest.raises(ValueError, match=r"plan JSON: ops\[2\] = .* a send has 3 fields, got 2"):
        mc.Plan.from_json(data)
    data["ops"][2] = ["sned", 0, 1, [[0, 3], [0, 3]]]
    with pytest.raises(ValueError, match=r"ops\[2\] .* unknown kind 'sned'"):
        mc.Plan.from_json(data)
    data["ops"][2] = ["send", 0, 1, [[0, 3, 4], [0, 3]]]
    with pytest.raises(ValueError, match=r"a box dimension must be \[start, stop\]"):
        mc.Plan.from_json(data)


def test_hand_written_boxes_off_the_unit_slice_grid():
    """Boxes need not follow the unit slices: the check is exact for any boxes."""
    task = _task_2x2()
    plan = _plan()
    # rank 4 needs [0:3, 0:5]: held by 0 ([0:3, 0:3]) and 1 ([0:3, 3:5]); cut it by rows instead
    pieces = [mc.Send(0, 4, (S(0, 1), S(0, 3))), mc.Send(1, 4, (S(0, 2), S(3, 5))),
              mc.Send(0, 4, (S(1, 3), S(0, 3))), mc.Send(1, 4, (S(2, 3), S(3, 5)))]
    rest = [op for op in plan.ops if not (isinstance(op, mc.Send) and op.dst == 4)]
    ok = mc.Plan(task, tuple(pieces + rest), "send_recv", "none", plan.topology)
    ok.check()
    x = np.arange(30, dtype=np.int32).reshape(6, 5)
    assert np.array_equal(mc.gather(mc.execute_local(ok, mc.scatter(x, task.src)), task.dst), x)
    assert _refused(plan, pieces[:3] + rest) == (
        "rank 4 never receives [2:3, 3:5] of its destination shard [0:3, 0:5]: no operation "
        "delivers element (2, 3)"
    )
    overlap = [*pieces[:2], mc.Send(0, 4, (S(0, 3), S(2, 3))), *rest]
    assert _refused(plan, overlap) == (
        "op 2 (send 0->4 of [0:3, 2:3]) delivers [0:1, 2:3] to rank 4 a second time (op 0 "
        "delivered it before)"
    )
    overlap = [*pieces, mc.Send(0, 4, (S(2, 3), S(2, 3))), *rest]
    assert _refused(plan, overlap) == (
        "op 4 (send 0->4 of [2:3, 2:3]) delivers [2:3, 2:3] to rank 4 a second time "
        "(op 2 delivered it before)"
    )


def test_check_runs_once_per_plan_object():
    plan = _plan()
    assert "error" not in plan._verdict
    plan.check()
    assert plan._verdict == {"error": None}
    again = mc.Plan.from_json(plan.to_json())
    assert again == plan and again._verdict == {"error": None}
    assert mc.check_plan(plan) is None
    with pytest.raises(TypeError, match=r"plan must be a meshcast\.Plan"):
        mc.check_plan("plan")


def test_empty_tensor_and_empty_boxes():
    task = mc.ReshardTask((0, 5), "int32", _task_2x2().src, _task_2x2().dst)
    plan = mc.plan(task, mc.Topology.uniform(4, 2), "send_recv", "none")
    assert plan.ops == ()
    plan.check()
    extra = mc.Send(0, 4, (S(0, 0), S(0, 3)))
    mc.Plan(task, (extra,), "send_recv", "none", plan.topology).check()
    outside = mc.Send(0, 4, (S(0, 0), S(4, 5)))
    with pytest.raises(ValueError, match=r"op 0 .* reads \[0:0, 4:5\], but rank 0 holds "
                                         r"\[0:0, 0:3\]"):
        mc.Plan(task, (outside,), "send_recv", "none", plan.topology).check()


def test_large_coordinates_are_exact():
    """Boxes of a tensor of 2^62 elements: coordinates beyond 2^53 (float) stay exact."""
    n = 2**31
    src = mc.Layout(mc.Mesh([0, 1]), "S0R")
    dst = mc.Layout(mc.Mesh([2, 3]), "RS0")
    task = mc.ReshardTask((n, n), "int8", src, dst)
    plan = mc.plan(task, mc.Topology.uniform(2, 2), "send_recv", "none")
    plan.check()
    h = n // 2
    ops = list(plan.ops)
    assert ops[0] == mc.Send(0, 2, (S(0, h), S(0, h)))
    shaved = [mc.Send(0, 2, (S(0, h), S(0, h - 1))), *ops[1:]]
    assert _refused(plan, shaved) == (
        f"rank 2 never receives [0:{h}, {h - 1}:{h}] of its destination shard [0:{n}, 0:{h}]: "
        f"no operation delivers element (0, {h - 1})"
    )
