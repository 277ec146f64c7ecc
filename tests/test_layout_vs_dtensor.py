"""Our boxes equal DTensor's local shapes and offsets for every rank (uneven sizes included).

Uses torch's in-process "fake" process group so that every rank's view can be computed in one
process; skipped where that testing helper is unavailable.
"""

import pytest

import meshcast as mc

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard  # noqa: E402
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: E402

PLACEMENTS = {
    (3, 4): [
        [Shard(0), Shard(0)],
        [Shard(0), Shard(1)],
        [Shard(1), Shard(0)],
        [Replicate(), Shard(1)],
        [Shard(1), Shard(1)],
    ],
    (2, 2, 3): [
        [Shard(0), Shard(0), Shard(0)],
        [Shard(1), Replicate(), Shard(1)],
        [Shard(0), Shard(1), Shard(0)],
    ],
}
SHAPES = [(10, 7), (13, 5), (3, 2), (0, 4), (1, 1), (25, 9), (5, 11)]


def _ours(placements):
    return [mc.Shard(p.dim) if isinstance(p, Shard) else mc.Replicate() for p in placements]


def test_boxes_match_dtensor():
    for rank in range(12):
        dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=rank, world_size=12)
        try:
            for mesh_shape, cases in PLACEMENTS.items():
                device_mesh = init_device_mesh("cpu", mesh_shape)
                for placements in cases:
                    layout = mc.Layout(mc.Mesh.from_range(0, mesh_shape), _ours(placements))
                    for shape in SHAPES:
                        size, offset = compute_local_shape_and_global_offset(
                            shape, device_mesh, placements
                        )
                        box = layout.box(rank, shape)
                        assert tuple(size) == mc.core.layout.box_shape(box)
                        # DTensor puts empty shards at offset n; only non-empty offsets matter
                        assert all(o == b.start for n, o, b in zip(size, offset, box) if n)
        finally:
            dist.destroy_process_group()
