"""Meshes and layouts: notation, placements, boxes with torch.chunk / DTensor semantics."""

import re

import numpy as np
import pytest
import torch

import meshcast as mc


def test_mesh_basics():
    mesh = mc.Mesh([[0, 1, 2, 3], [4, 5, 6, 7]])
    assert mesh.shape == (2, 4) and mesh.ndim == 2 and mesh.size == 8
    assert mesh.devices == list(range(8))
    assert mesh == mc.Mesh.from_range(0, (2, 4))
    assert hash(mesh) == hash(mc.Mesh.from_range(0, (2, 4)))
    assert mesh.coords(6) == (1, 2) and mesh.coords(9) is None
    assert 5 in mesh and 8 not in mesh
    assert mc.Mesh.from_range(8, (2, 4)).notation() == "2x4@8"
    assert mc.Mesh([[3, 1]]).notation() == "1x2[3, 1]"


def test_layout_notations_agree():
    mesh = mc.Mesh.from_range(0, (2, 4))
    a = mc.Layout(mesh, "S0RR")
    assert a == mc.Layout(mesh, "S0,R,R") == mc.Layout(mesh, " S0, R, R ")
    assert a.placements == (mc.Shard(0), mc.Replicate())
    b = mc.Layout(mesh, [mc.Shard(0), mc.Replicate()])
    assert b.spec == "S0" and b.ndim is None
    for rank in mesh.devices:
        assert a.box(rank, (10, 3, 3)) == b.box(rank, (10, 3, 3))
    assert mc.Layout(mesh, "RS01R").placements == (mc.Shard(1), mc.Shard(1))
    assert mc.Layout(mesh, "S10R").spec == "S10R"
    assert mc.Layout.parse("2x4@8:RRS0") == mc.Layout(mc.Mesh.from_range(8, (2, 4)), "RRS0")


def test_box_examples():
    mesh = mc.Mesh.from_range(0, (2, 4))
    layout = mc.Layout(mesh, "S0RR")
    assert layout.box(5, (8, 3, 2)) == (slice(4, 8), slice(0, 3), slice(0, 2))
    assert layout.box(99, (8, 3, 2)) is None
    # S01: axis 0 major, so rank (1, 0) = rank 4 holds the fifth of eight chunks
    assert mc.Layout(mesh, "S01").box(4, (16,)) == (slice(8, 10),)
    # S10: axis 1 major
    assert mc.Layout(mesh, "S10").box(4, (16,)) == (slice(2, 4),)


def _torch_boxes(n, sizes):
    """Nested torch.chunk, padded with empty chunks as DTensor does."""
    pieces = [(0, n)]
    for k in sizes:
        nxt = []
        for start, length in pieces:
            chunks = list(torch.arange(length).chunk(k)) if length else []
            offset = 0
            for i in range(k):
                size = len(chunks[i]) if i < len(chunks) else 0
                nxt.append((start + offset, size))
                offset += size
        pieces = nxt
    return [slice(s, s + size) for s, size in pieces]


@pytest.mark.parametrize("n", [0, 1, 3, 5, 7, 10, 13])
@pytest.mark.parametrize("spec", ["S0", "S1", "S01", "S10"])
def test_uneven_boxes_follow_torch_chunk(n, spec):
    mesh = mc.Mesh.from_range(0, (3, 4))
    layout = mc.Layout(mesh, spec)
    axes = [int(c) for c in spec[1:]]
    expected = _torch_boxes(n, [mesh.shape[a] for a in axes])
    for rank in mesh.devices:
        coords = mesh.coords(rank)
        flat = 0
        for a in axes:
            flat = flat * mesh.shape[a] + coords[a]
        assert layout.box(rank, (n,)) == (expected[flat],)


@pytest.mark.parametrize("spec", ["S10R", "S0[2]1R", "S1[3]S0", "{a=3:S0+b=4:S1[2]}R"])
def test_dim_runs_partition(spec):
    layout = mc.Layout(mc.Mesh.from_range(0, (2, 3)), spec)
    for (starts, stops, tiles), n in zip(layout.dim_runs((7, 4)), (7, 4)):
        assert starts[0] == 0 and stops[-1] == n
        assert np.array_equal(starts[1:], stops[:-1])
        assert (stops > starts).all() and (tiles < layout.num_tiles(2)[0 if n == 7 else 1]).all()


@pytest.mark.parametrize("text, needle", [
    ("2x2:S0[0]R", "split factor 0"),
    ("2x2:S0[2R", "is not a layout"),
    ("2x2:S00R", "uses mesh axis 0 twice"),
    ("2x2:{a=2:S0+a=2:S1}R", "repeats a part name"),
    ("2x2:{a=2:S00}R", "uses mesh axis 0 twice"),
    ("2x2:{a=2:S0+b=2:S1}S0", "uses mesh axis 0 twice"),
    ("2x2:{a2:S0}R", "is not NAME=SIZE:SPLIT"),
    ("2x2:S2R", "the mesh has 2 axes"),
])
def test_bad_strided_and_fused_specs_name_the_rule(text, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        mc.Layout.parse(text)


def test_fused_parts_must_add_up_to_the_dimension():
    src = mc.Layout.parse("2:{q=4:S0+k=2:R}R")
    with pytest.raises(ValueError, match=re.escape("has parts of 4 + 2 = 6")):
        mc.ReshardTask((7, 3), "float32", src, mc.Layout.parse("2@2:S0R"))


def test_strided_and_fused_layouts_round_trip_and_compare():
    for text in ["2x2:S0[2]1R", "4:S0[3]", "2x2@4:{q=8:S01+k=4:S0+v=4:S0}R",
                 "2x2:S0{a=3:S1+b=5:R}"]:
        layout = mc.Layout.parse(text)
        assert mc.Layout.parse(layout.notation()) == layout
        assert mc.Layout.from_json(layout.to_json()) == layout
    assert mc.Layout.parse("2x2:S0[1]1R") == mc.Layout.parse("2x2:S01R")
    # a mesh of other ranks, a 0-d tensor, placement-style layouts (any tensor rank): the
    # notation says each, and reads back equal
    for layout in (mc.Layout(mc.Mesh([[3, 1], [0, 2]]), "S0R"),
                   mc.Layout(mc.Mesh.from_range(0, (2, 2)), ""),
                   mc.Layout(mc.Mesh.from_range(0, (2, 4)), [mc.Shard(0), mc.Replicate()]),
                   mc.Layout(mc.Mesh.from_range(0, (2, 4)), [mc.Replicate(), mc.Replicate()]),
                   mc.Layout(mc.Mesh.from_range(0, (2, 4)), [mc.StridedShard(0, 2),
                                                             mc.Shard(0)])):
        assert mc.Layout.parse(layout.notation()) == layout, layout.notation()
    assert mc.Layout.parse("2x2[3,1,0,2]:S0R").mesh == mc.Mesh([[3, 1], [0, 2]])
    with pytest.raises(ValueError, match="a 2x2 mesh needs 4 ranks, got 3"):
        mc.Layout.parse("2x2[3,1,0]:S0R")
    mesh = mc.Mesh.from_range(0, (2, 2))
    placed = mc.Layout(mesh, [mc.StridedShard(0, 2), mc.Shard(0)])
    assert placed.region(1, (8, 4)) == mc.Layout.parse("2x2:S0[2]1R").region(1, (8, 4))
    assert mc.Layout.from_json(placed.to_json()) == placed
    with pytest.raises(ValueError, match="no DTensor-style placements"):
        _ = mc.Layout.parse("2x2:S10").placements
    with pytest.raises(ValueError, match="several boxes"):
        mc.Layout.parse("4:S0[2]").box(0, (13,))
