"""Runtime pieces that need no processes: chunking, group order, lazy import, argument checks."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshcast import Layout, Mesh, ReshardTask, Topology, plan
from meshcast.layout import box_size
from meshcast.plan import Broadcast, broadcast_chain
from meshcast.runtime.broadcast import chain_role
from meshcast.runtime.chunks import boxes_overlap, chunk_boxes, relative
from meshcast.runtime.groups import canonical_order


def test_import_meshcast_does_not_import_torch() -> None:
    code = "import sys, meshcast; assert 'torch' not in sys.modules; meshcast.plan"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lazy_exports() -> None:
    import meshcast
    from meshcast import runtime

    assert meshcast.reshard is runtime.reshard
    assert meshcast.launch is runtime.launch
    with pytest.raises(AttributeError):
        _ = meshcast.no_such_name


@settings(max_examples=200, deadline=None)
@given(
    extents=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    offsets=st.lists(st.integers(0, 5), min_size=4, max_size=4),
    itemsize=st.sampled_from([1, 2, 4, 8]),
    chunk=st.integers(8, 600),
)
def test_chunks_tile_the_box_in_order(extents, offsets, itemsize, chunk) -> None:
    box = tuple(slice(o, o + e) for o, e in zip(offsets, extents))
    chunks = chunk_boxes(box, itemsize, chunk)
    if 0 in extents:
        assert chunks == []
        return
    cover = np.zeros(extents, dtype=np.int64)
    order = []
    for c in chunks:
        assert box_size(c) >= 1
        assert box_size(c) * itemsize <= max(chunk, itemsize)
        rel = relative(c, box)
        cover[rel] += 1
        order.append(tuple(s.start for s in rel))
    assert (cover == 1).all()
    assert order == sorted(order)  # row-major


def test_chunk_of_contiguous_box_is_contiguous() -> None:
    import torch

    shard = torch.arange(10 * 6 * 4).reshape(10, 6, 4)
    box = (slice(0, 10), slice(0, 6), slice(0, 4))
    for c in chunk_boxes(box, 8, 100):
        assert shard[relative(c, box)].is_contiguous()
    with pytest.raises(ValueError, match="chunk_bytes"):
        chunk_boxes(box, 8, 4)


def test_boxes_overlap() -> None:
    a = (slice(0, 4), slice(0, 4))
    assert boxes_overlap(a, (slice(3, 5), slice(1, 2)))
    assert not boxes_overlap(a, (slice(4, 5), slice(0, 4)))


def test_groups_are_created_in_one_canonical_order() -> None:
    sets = [(5, 1), (0, 1, 2), (1, 5), (3, 1)]
    assert canonical_order(sets) == [(1, 3), (1, 5), (0, 1, 2)]
    assert canonical_order(reversed(sets)) == canonical_order(sets)


def test_chain_roles() -> None:
    top = Topology.uniform(3, 2)
    op = Broadcast(0, (1, 2, 3, 4), (slice(0, 4),))
    chain = broadcast_chain(op, top._host_of)
    assert chain == [(0, [1]), (2, [3]), (4, [])]
    assert chain_role(chain, 0) == ("sender", None, [2, 1])
    assert chain_role(chain, 2) == ("leader", 0, [4, 3])
    assert chain_role(chain, 3) == ("member", 2, [])
    assert chain_role(chain, 4) == ("leader", 2, [])
    with pytest.raises(ValueError):
        chain_role(chain, 5)


def test_reshard_rejects_bad_arguments_before_communicating() -> None:
    import meshcast

    task = ReshardTask((4,), "float32", Layout(Mesh([0]), "R"), Layout(Mesh([1]), "R"))
    p = plan(task)
    with pytest.raises(TypeError, match="plan must be"):
        meshcast.reshard(None, "plan")
    with pytest.raises(ValueError, match="timeout"):
        meshcast.reshard(None, p, timeout=0)
    with pytest.raises(ValueError, match="chunk_bytes"):
        meshcast.reshard(None, p, chunk_bytes=-1)
    with pytest.raises(RuntimeError, match="init_process_group"):
        meshcast.reshard(None, p)


def test_launch_rejects_bad_arguments() -> None:
    import meshcast

    with pytest.raises(ValueError, match="world_size"):
        meshcast.launch(print, 0)
    with pytest.raises(ValueError, match="divide"):
        meshcast.launch(print, 6, hosts=4)
    assert math.isfinite(meshcast.runtime.DEFAULT_TIMEOUT)
