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
from meshcast.core.layout import box_size
from meshcast.core.plan import Broadcast, broadcast_chain
from meshcast.runtime.broadcast import chain_role
from meshcast.runtime.chunks import boxes_overlap, chunk_boxes, relative
from meshcast.runtime.groups import canonical_order


def test_import_meshcast_does_not_import_torch() -> None:
    """Nor ml_dtypes (most of a second to import): planning a bfloat16 task needs only sizes;
    the first numpy array of such a type imports it."""
    code = ("import sys, meshcast as mc; assert 'torch' not in sys.modules\n"
            "task = mc.ReshardTask((8, 8), 'bfloat16', mc.Layout.parse('2:S0R'),"
            " mc.Layout.parse('2@2:RS0'))\n"
            "plan = mc.plan(task); assert 'ml_dtypes' not in sys.modules\n"
            "import ml_dtypes; assert task.numpy_dtype == ml_dtypes.bfloat16")
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
    chain = broadcast_chain(op, top.hosts_by_rank)
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


# -- dtypes and byte views ---------------------------------------------------------------------
def test_every_torch_dtype_with_an_element_size_has_a_name() -> None:
    import torch

    from meshcast.core.dtypes import dtype_name, itemsize, known_dtypes

    seen = {getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    quantized = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
    for dtype in seen - quantized:
        name = dtype_name(dtype)
        assert getattr(torch, name) is dtype and itemsize(name) == dtype.itemsize
    assert len(known_dtypes()) == len(seen - quantized)
    for dtype in quantized:
        with pytest.raises(ValueError, match="quantized type"):
            dtype_name(dtype)
    assert dtype_name("chalf") == "complex32" and dtype_name("bit") == "uint1"


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_numpy_equivalents_hold_the_same_bytes() -> None:
    import ml_dtypes
    import torch

    from meshcast.core.dtypes import numpy_dtype

    values = [0.5, -2.0, 4.0, 0.25]
    for name in ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                 "float8_e5m2fnuz", "float8_e8m0fnu"):
        t = torch.tensor([abs(v) for v in values]).to(getattr(torch, name))
        a = np.array([abs(v) for v in values], dtype=np.float32).astype(numpy_dtype(name))
        assert t.view(torch.uint8).numpy().tobytes() == a.view(np.uint8).tobytes(), name
    c = torch.tensor([1 + 2j, -3.5 + 0.25j]).to(torch.complex32)
    a = np.array([1 + 2j, -3.5 + 0.25j]).astype(ml_dtypes.complex32)
    assert c.view(torch.uint8).numpy().tobytes() == a.view(np.uint8).tobytes()
    for name in ("uint4", "bits8", "float4_e2m1fn_x2"):
        with pytest.raises(ValueError, match="no numpy equivalent"):
            numpy_dtype(name)


def test_byte_views_of_odd_layouts() -> None:
    import torch

    from meshcast.runtime.tensors import as_bytes, as_carrier

    storage = torch.arange(8, dtype=torch.float32)
    one = storage.as_strided((1, 1), (1, 4), 3)  # is_contiguous(), but stride(-1) == 4
    assert as_bytes(one).tolist() == list(torch.tensor([3.0]).view(torch.uint8).tolist())
    empty = torch.zeros(0, 3).t()
    assert as_bytes(empty).numel() == 0
    z = torch.tensor([1 + 2j, 3 - 1j])
    assert torch.equal(as_carrier(z.conj()).view(torch.complex64), z.conj().resolve_conj())
    assert torch.equal(as_carrier(torch._neg_view(z)).view(torch.complex64), -z)
    u4 = torch.arange(12, dtype=torch.uint8).view(torch.uint4).reshape(3, 4).t()
    assert as_carrier(u4).dtype == torch.uint8 and as_carrier(u4).stride() == (1, 4)
    with pytest.raises(ValueError, match="contiguous"):
        as_bytes(torch.zeros(3, 4).t())


# -- blame ---------------------------------------------------------------------------------------
def _f(rank, kind, peer, wall, what="op 0 (broadcast from 0)", detail=""):
    from meshcast.runtime.blame import Fault

    return Fault(rank, kind, peer, what, wall, wall, detail)


def test_diagnosis_names_a_dead_rank() -> None:
    from meshcast.runtime.blame import diagnose

    d = diagnose([_f(2, "closed", 0, 1.0), _f(1, "closed", 0, 1.1)])
    assert d.first == (0,)
    assert d.text.startswith("rank 0 failed first: its connections closed (the process died")


def test_diagnosis_follows_waits_to_a_stopped_rank() -> None:
    from meshcast.runtime.blame import diagnose

    # 5 timed out on 4 first; 4 was waiting for 2 (a note); 2 never reported: it stopped.
    # 6 saw its connection with 5 close: 5 timed out, and gloo then closes all of 5's pairs
    faults = [_f(5, "timeout", 4, 6.0, detail="6 s"), _f(6, "closed", 5, 6.01),
              _f(0, "timeout", 2, 6.2, detail="6 s")]
    d = diagnose(faults, [_f(4, "waiting", 2, 1.0)])
    assert d.first == (2,)
    assert d.text.startswith("rank 2 failed first: it stopped responding")


def test_diagnosis_names_a_rank_that_raised() -> None:
    from meshcast.runtime.blame import Fault, diagnose

    raised = Fault(3, "error", None, "op 2 (send 3->4)", 0.5, 0.5, "MemoryError: out of memory")
    d = diagnose([_f(4, "closed", 3, 0.6), raised])
    assert d.first == (3,)
    assert d.text == ("rank 3 failed first: it raised MemoryError: out of memory in op 2 "
                      "(send 3->4), 0.50 s into its call")


def test_runtime_caches_are_bounded_listed_and_cleared(tmp_path) -> None:
    # the sub-groups, the detected topology and the last reshard_many counters are BoundedCaches;
    # a detected topology is not answered again once its default group is destroyed
    import os

    import torch.distributed as dist

    import meshcast
    from meshcast.runtime import detect_topology, last_many_stats
    from meshcast.runtime.many import ManyStats

    info = meshcast.cache_info()
    for name in ("runtime.groups", "runtime.detected_topology", "runtime.last_many_stats"):
        assert name in info and info[name].maxsize >= 1
    assert last_many_stats() == ManyStats()
    old = os.environ.get("MESHCAST_HOST")
    try:
        seen = []
        for k, label in enumerate(("host-a", "host-b")):
            os.environ["MESHCAST_HOST"] = label
            store = dist.FileStore(str(tmp_path / f"store{k}"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
            try:
                seen.append(detect_topology())
                assert detect_topology() is seen[-1]  # kept for this default group
            finally:
                dist.destroy_process_group()
        assert seen[0] is not seen[1]  # gathered again on the new default group
    finally:
        if old is None:
            os.environ.pop("MESHCAST_HOST", None)
        else:
            os.environ["MESHCAST_HOST"] = old
    meshcast.clear_caches(["runtime.detected_topology"])
    assert meshcast.cache_info()["runtime.detected_topology"].size == 0


def test_call_counts_live_and_die_with_their_process_group(tmp_path) -> None:
    # board.py counts calls per process group (the numbers name store keys all ranks share): a
    # group made after another is destroyed starts from zero, whatever id() its object gets
    code = f"""
import gc
import torch.distributed as dist
from meshcast.runtime.board import calls_made, next_step, recent_refusals

def world(n):
    dist.init_process_group("gloo", init_method="file://{tmp_path}/store" + str(n), rank=0,
                            world_size=1)
    return dist.group.WORLD

g = world(0)
assert [next_step(g) for _ in range(3)] == [0, 1, 2]
assert recent_refusals(g, {{"step": 2}}, keep=2) == [{{"step": 2}}]
assert recent_refusals(g, {{"step": 3}}, keep=2) == [{{"step": 2}}, {{"step": 3}}]
assert recent_refusals(g, {{"step": 4}}, keep=2) == [{{"step": 3}}, {{"step": 4}}]
dist.destroy_process_group()
del g
gc.collect()
g = world(1)
assert next_step(g) == 0 and calls_made(g, "any") == 0 and recent_refusals(g) == []
dist.destroy_process_group()
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_launch_without_hosts_is_one_host_whatever_its_parent_job_says() -> None:
    import meshcast
    from meshcast.runtime.detect import TOPOLOGY_ENV
    from meshcast.runtime.launch import rank_environment

    env = rank_environment(1, 2, 29500, None, 60.0)
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env[TOPOLOGY_ENV]) == ("0", "1", "")
    assert meshcast.job_topology(env).hosts == ((0, 1),)


def test_a_rank_whose_function_returned_is_shown_after_the_cause() -> None:
    from meshcast.runtime.ranks import AFTER_RETURN, _failure_order

    raised = "ValueError: boom\nTraceback ..."
    consequence = f"RuntimeError: rank 0: {AFTER_RETURN} (Connection reset by peer)"
    assert _failure_order(raised) < _failure_order(consequence)


def test_plan_amax_keeps_its_plans_in_a_listed_bounded_cache() -> None:
    import meshcast

    layout = meshcast.Layout(meshcast.Mesh([0, 1]), "S0R")
    meshcast.plan_amax((256, 256), (128, 128), layout)
    assert meshcast.cache_info()["planning.plan_amax"].size >= 1
    meshcast.clear_caches(["planning.plan_amax"])
    assert meshcast.cache_info()["planning.plan_amax"].size == 0
