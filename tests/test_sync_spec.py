"""The description half of meshcast.WeightSync (interop/sync_spec.py), pure data: merging the
ranks' records of one side (pipeline stages, data-parallel replicas, conflicts), matching the two
sides into tasks in joint ranks, and the order that keeps every trainer host sending."""

from __future__ import annotations

import pytest

from meshcast import Layout, Mesh, ParamSpec, Replicate, Shard
from meshcast.interop.sync_spec import describe_params, match_sides, merge_side


def _desc(name: str, ranks: list[int], shape=(8, 4), dtype="float32", dim: int = 0) -> dict:
    return describe_params({name: ParamSpec(shape, dtype, Layout(Mesh(ranks), [Shard(dim)]))})


def test_stages_merge_by_name_and_replicas_merge_into_a_replicated_axis() -> None:
    stages = merge_side({0: _desc("a", [0, 1]), 1: _desc("a", [0, 1]),
                         2: _desc("b", [2, 3]), 3: _desc("b", [2, 3])}, "trainer")
    assert list(stages) == ["a", "b"]
    assert Layout.from_json(stages["b"]["layout"]) == Layout(Mesh([2, 3]), [Shard(0)])
    replicas = merge_side({r: _desc("w", [0, 1] if r < 2 else [2, 3]) for r in range(4)},
                          "trainer")  # a DTensor on world_mesh["tp"] with data parallelism
    assert Layout.from_json(replicas["w"]["layout"]) == Layout(Mesh([[0, 1], [2, 3]]),
                                                               [Replicate(), Shard(0)])


def test_strided_replicas_merge_into_a_replicated_axis() -> None:
    # FSDP2 + TP on a (dp, fsdp, tp) mesh: a column-parallel weight is
    # (_StridedShard(0, sf=2), Shard(0)) on each data-parallel member's (fsdp, tp) sub-mesh, a
    # layout with no plain placements
    members = {0: [[0, 1], [2, 3]], 1: [[4, 5], [6, 7]]}
    spec = "S0[2]1R"
    merged = merge_side({m: describe_params({"w": ParamSpec((9, 4), "bfloat16", Layout(
        Mesh(ranks), spec))}) for m, ranks in members.items()}, "trainer")
    layout = Layout.from_json(merged["w"]["layout"])
    assert layout == Layout(Mesh([[[0, 1], [2, 3]], [[4, 5], [6, 7]]]), "S1[2]2R")
    for ranks in members.values():  # each rank holds what it held on its member
        member = Layout(Mesh(ranks), spec)
        for r in member.mesh.devices:
            assert layout.region(r, (9, 4)) == member.region(r, (9, 4))


def test_ranks_that_disagree_are_named() -> None:
    with pytest.raises(ValueError, match=r"trainer ranks 0 and 1 describe 'w' differently "
                                         r"\(shape \(8, 4\), float32"):
        merge_side({0: _desc("w", [0, 1]), 1: _desc("w", [0, 1], shape=(8, 8))}, "trainer")


def test_matching_maps_names_and_shifts_the_engine() -> None:
    trainer = merge_side({0: {**_desc("t.a", [0]), **_desc("t.b", [0])},
                          1: {**_desc("t.c", [1]), **_desc("t.d", [1])}}, "trainer")
    engine = {n: _desc(n, [0, 1], dtype="bfloat16")[n] for n in ("a", "b", "c", "d")}
    routes = match_sides(trainer, engine, 2, lambda n: n.removeprefix("t."))
    assert [r.target for r in routes] == ["a", "b", "c", "d"]  # the engine's order
    assert routes[0].task.dst == Layout(Mesh([2, 3]), [Shard(0)])  # engine ranks after trainer's
    assert routes[0].task.dtype == "bfloat16"  # the wire carries the engine's dtype
    same = match_sides(trainer, engine, 2, {"t.a": "a", "t.b": "b", "t.c": "c", "t.d": "d"})
    assert [r.task for r in same] == [r.task for r in routes]
