"""Every bad input raises ValueError/TypeError naming the argument and the rule."""

import numpy as np
import pytest

import meshcast as mc

MESH = mc.Mesh.from_range(0, (2, 4))


def test_duplicate_ranks_in_mesh():
    with pytest.raises(ValueError, match="devices must be distinct ranks; rank 1 appears"):
        mc.Mesh([[0, 1], [1, 2]])


@pytest.mark.parametrize("devices", [[], [[0.5, 1.0]], 3])
def test_bad_mesh_devices(devices):
    with pytest.raises((ValueError, TypeError), match="devices"):
        mc.Mesh(devices)


def test_ragged_mesh():
    with pytest.raises(ValueError, match="rectangular array of ranks"):
        mc.Mesh([[0, 1], [2]])


def test_negative_rank():
    with pytest.raises(ValueError, match="non-negative"):
        mc.Mesh([0, -1])


def test_spec_length_differs_from_tensor_rank():
    with pytest.raises(ValueError, match="3 tokens"):
        mc.ReshardTask((4, 4), "float32", mc.Layout(MESH, "S0RR"), mc.Layout(MESH, "RR"))
    with pytest.raises(ValueError, match="3 tokens"):
        mc.Layout(MESH, "S0RR").box(0, (4, 4))


def test_mesh_axis_used_twice():
    with pytest.raises(ValueError, match="uses mesh axis 0 twice"):
        mc.Layout(MESH, "S0S0R")
    with pytest.raises(ValueError, match="uses mesh axis 1 twice"):
        mc.Layout(MESH, "S11")


def test_mesh_axis_out_of_range():
    with pytest.raises(ValueError, match="uses mesh axis 2, but the mesh has 2 axes"):
        mc.Layout(MESH, "S2R")


def test_bad_spec_text():
    with pytest.raises(ValueError, match="not a layout"):
        mc.Layout(MESH, "S0X")
    with pytest.raises(ValueError, match="placements but the mesh has 2 axes"):
        mc.Layout(MESH, [mc.Shard(0)])
    with pytest.raises(TypeError, match=r"spec\[1\] must be meshcast.Shard"):
        mc.Layout(MESH, [mc.Shard(0), "R"])


@pytest.mark.parametrize(
    "shape, match",
    [
        ((4, -1), r"shape\[1\] must be non-negative"),
        ((4, 2.5), r"shape\[1\] must be an integer"),
        ((True, 2), r"shape\[0\] must be an integer"),
        ("44", "shape must be a sequence of integers"),
    ],
)
def test_bad_sizes(shape, match):
    with pytest.raises((ValueError, TypeError), match=match):
        mc.ReshardTask(shape, "float32", mc.Layout(MESH, "S0R"), mc.Layout(MESH, "RS1"))


def test_bad_dtype():
    with pytest.raises(ValueError, match="dtype='float7' is not a supported element type"):
        mc.ReshardTask((4,), "float7", mc.Layout(MESH, "S0"), mc.Layout(MESH, "R"))


def test_unknown_strategy_and_balance():
    task = mc.ReshardTask((4,), "float32", mc.Layout(MESH, "S0"), mc.Layout(MESH, "R"))
    with pytest.raises(ValueError, match="strategy='multicast' is unknown; choose one of"):
        mc.plan(task, strategy="multicast")
    with pytest.raises(ValueError, match="balance='fast' is unknown"):
        mc.plan(task, balance="fast")


def test_topology_missing_rank():
    task = mc.ReshardTask((4,), "float32", mc.Layout(MESH, "S0"), mc.Layout(MESH, "R"))
    with pytest.raises(ValueError, match="topology does not place ranks"):
        mc.plan(task, mc.Topology.uniform(1, 4))


def test_execute_local_bad_shards():
    task = mc.ReshardTask((4, 6), "int32", mc.Layout(MESH, "S0R"), mc.Layout(MESH, "RS1"))
    plan = mc.plan(task)
    shards = mc.scatter(np.zeros((4, 6), np.int32), task.src)
    missing = {r: a for r, a in shards.items() if r != 3}
    with pytest.raises(ValueError, match="shards is missing rank 3"):
        mc.execute_local(plan, missing)
    with pytest.raises(ValueError, match=r"shards\[2\] has shape \(3, 6\), but layout"):
        mc.execute_local(plan, {**shards, 2: np.zeros((3, 6), np.int32)})
    with pytest.raises(ValueError, match=r"shards\[0\] has dtype float32, the plan moves int32"):
        mc.execute_local(plan, {**shards, 0: shards[0].astype(np.float32)})
    with pytest.raises(TypeError, match=r"shards\[0\] must be a numpy array"):
        mc.execute_local(plan, {**shards, 0: shards[0].tolist()})


def test_no_dtype_is_not_float64():
    with pytest.raises(TypeError, match="dtype must be a dtype name"):
        mc.ReshardTask((4, 4), None, mc.Layout(MESH, "S0R"), mc.Layout(MESH, "RS0"))


@pytest.mark.parametrize("text", ["2x2@:RR", "2x2@x:RR", "@3:R"])
def test_layout_notation_without_a_first_rank(text):
    with pytest.raises(ValueError, match="is not of the form SHAPE"):
        mc.Layout.parse(text)


def test_plan_json_with_a_missing_or_malformed_field():
    import json

    task = mc.ReshardTask((8, 8), "float32", mc.Layout(MESH, "S0R"), mc.Layout(MESH, "RS0"))
    good = json.loads(mc.plan(task, strategy="broadcast").to_json())
    for field in ("task", "ops", "strategy", "balance", "topology", "fallbacks"):
        bad = {k: v for k, v in good.items() if k != field}
        with pytest.raises(ValueError, match=f"the field '{field}' is missing"):
            mc.Plan.from_json(bad)
    for field in ("task", "topology"):
        with pytest.raises(ValueError, match="not a valid"):
            mc.Plan.from_json({**good, field: "x"})
    with pytest.raises(ValueError, match="strategy must be a string"):
        mc.Plan.from_json({**good, "strategy": None})
    with pytest.raises(ValueError, match="the field 'hosts' is missing"):
        mc.Topology.from_json({})
    with pytest.raises(TypeError, match="takes a JSON string"):
        mc.Plan.from_json(None)
    for text in ("not json", b"\xff", "{"):
        with pytest.raises(ValueError, match="not a meshcast plan: the text is not JSON"):
            mc.Plan.from_json(text)


def test_layout_mesh_and_topology_constructors_say_what_is_wrong():
    with pytest.raises(TypeError, match="a layout to parse must be a string like '2x4:S0RR', "
                                        "got NoneType"):
        mc.Layout.parse(None)
    with pytest.raises(ValueError, match="not a complete layout: the field 'mesh' is missing"):
        mc.Layout.from_json({})
    with pytest.raises(ValueError, match="not a complete mesh: the field 'shape' is missing"):
        mc.Mesh.from_json({"devices": [0, 1]})
    with pytest.raises(ValueError, match=r"fused dimension '\{\}' in spec '\{\}R' is empty"):
        mc.Layout.parse("2x2:{}R")
    with pytest.raises(ValueError, match="1,000,000,000 hosts of 1,000,000,000 ranks are "
                                         "1,000,000,000,000,000,000 ranks; meshcast plans "
                                         "meshes of at most 4,194,304"):
        mc.Topology.uniform(10**9, 10**9)
    with pytest.raises(ValueError, match=r"hosts: rank 1180591620717411303424 is not below 2\^63"):
        mc.Topology([[2**70]])


def test_a_split_factor_far_above_the_size_costs_nothing_more():
    # _StridedShard(0, sf) with sf above the dimension's size: every index is its own piece;
    # the regions are those of the size's own factor, whatever sf (it was a loop over sf)
    mesh = mc.Mesh([[0, 1], [2, 3]])
    small = mc.ReshardTask((8, 5), "float32", mc.Layout(mesh, "S0[8]1R"), mc.Layout(mesh, "RS0"))
    huge = mc.ReshardTask((8, 5), "float32", mc.Layout(mesh, "S0[99999999999999999999]1R"),
                          mc.Layout(mesh, "RS0"))
    assert [huge.src_region(r) for r in range(4)] == [small.src_region(r) for r in range(4)]
    assert [huge.src_region(r).runs[0] for r in range(4)] == [((0, 4),), ((4, 8),), (), ()]


def test_scatter_and_gather_take_the_notation():
    x = np.arange(32).reshape(8, 4)
    assert mc.gather(mc.scatter(x, "2x4:S0R"), "2x4:S0R").tolist() == x.tolist()
    with pytest.raises(TypeError, match=r"layout must be a meshcast\.Layout"):
        mc.scatter(x, 3)


def test_fused_helpers_check_their_arguments():
    layout = mc.Layout(mc.Mesh.from_range(0, (2, 2)), "{q=4:S0+k=4:S0}R")
    with pytest.raises(ValueError, match=r"local has shape \(3, 4\), but rank 0's shard"):
        mc.fused_part_views(np.zeros((3, 4)), layout, (8, 4), 0)
    with pytest.raises(TypeError, match="rank must be an int"):
        mc.fused_part_index(layout, (8, 4), "0", "q")
    with pytest.raises(TypeError, match="Fuse takes"):
        mc.Fuse(["q", "k"])
    with pytest.raises(TypeError, match="dim must be an int"):
        mc.Fuse({"q": "q"}, dim="x")
    assert mc.Fuse({"q": "a"}, dim=np.int64(1)).dim == 1


def test_gather_compares_replicas_byte_for_byte():
    layout = mc.Layout(mc.Mesh([0, 1]), "R")
    x = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    assert np.isnan(mc.gather({0: x, 1: x.copy()}, layout)[1])  # identical NaNs agree
    with pytest.raises(ValueError, match="disagrees with another replica"):
        mc.gather({0: np.zeros(3, np.float32), 1: -np.zeros(3, np.float32)}, layout)


def test_a_scalar_is_one_piece_however_small_the_buckets():
    task = mc.ReshardTask((), "float32", mc.Layout(mc.Mesh([0]), ""),
                          mc.Layout(mc.Mesh([1, 2]), ""))
    schedule = mc.build_schedule([mc.plan(task)], 1)
    assert schedule.ranks == (0, 1, 2)


@pytest.mark.parametrize("kwargs", [{"latency_us": float("nan")}, {"latency_us": float("inf")},
                                    {"nic_gbps": float("inf")}, {"nic_gbps": float("nan")},
                                    {"intra_gbps": float("nan")}])
def test_topology_refuses_what_is_not_a_finite_number(kwargs):
    with pytest.raises(ValueError, match="finite"):
        mc.Topology.uniform(2, 2, **kwargs)


def test_plan_many_names_its_own_default_balance():
    task = mc.ReshardTask((4, 4), "float32", mc.Layout.parse("2:S0R"), mc.Layout.parse("2@2:RS0"))
    with pytest.raises(ValueError, match="choose 'joint'"):
        mc.plan_many([task], balance="x")
