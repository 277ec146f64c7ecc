"""The runtime on real processes (gloo): every strategy, byte-exact against execute_local.

One launched job runs every case with every strategy (process start-up costs seconds, so cases
are batched); each rank returns the bytes of its destination shards and the parent compares them
with :func:`meshcast.execute_local`. The same job counts, with the runtime's own instrumented
counters, the bytes that cross host boundaries.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest

import meshcast
from meshcast import Layout, Mesh, ReshardTask, Topology, execute_local, plan, scatter
from meshcast.core.cases import PAPER_CASES
from meshcast.core.layout import box_size
from meshcast.core.plan import Broadcast, Send

WORLD = 20
TOPOLOGY = Topology.uniform(5, 4)  # 5 emulated hosts of 4 ranks
STRATEGIES = ("send_recv", "allgather", "broadcast", "auto")  # auto: plan()'s defaults


def _plan(task: ReshardTask, topology, strategy: str):
    return plan(task, topology) if strategy == "auto" else plan(task, topology, strategy=strategy)


@functools.cache
def _plans() -> dict:
    """{(strategy, case name): plan}, made once in the parent and passed to the ranks (auto plans
    of all cases cost seconds of CPU: planned in each of 20 ranks, that was most of the job)."""
    return {(s, name): _plan(task, TOPOLOGY, s) for s in STRATEGIES for name, task, _ in _cases()}


DTYPES = ("float32", "bfloat16", "float16", "int32", "int64", "bool")


def _cases() -> list[tuple[str, ReshardTask, bool]]:
    """(name, task, pass a non-contiguous local) -- the same list on every rank."""
    out: list[tuple[str, ReshardTask, bool]] = []
    for k, c in enumerate(PAPER_CASES):
        src = Mesh.from_range(0, c.src_mesh)
        dst = Mesh.from_range(src.size, c.dst_mesh)
        shape = (24, 16, 6) if c.number == 6 else (16, 12, 8)
        dtype = DTYPES[k % len(DTYPES)]
        out.append(
            (
                c.name,
                ReshardTask(shape, dtype, Layout(src, c.src_spec), Layout(dst, c.dst_spec)),
                False,
            )
        )
    m24, m24b = Mesh.from_range(0, (2, 4)), Mesh.from_range(8, (2, 4))
    out += [
        (
            "uneven",
            ReshardTask((13, 7, 5), "float32", Layout(m24, "S0S1R"), Layout(m24b, "RS01R")),
            False,
        ),
        (
            "uneven-1d",
            ReshardTask(
                (11,),
                "int64",
                Layout(Mesh.from_range(0, (1, 3)), "S1"),
                Layout(Mesh.from_range(4, (2, 4)), "S01"),
            ),
            False,
        ),
        (
            "3-D mesh",
            ReshardTask(
                (8, 6, 4),
                "bfloat16",
                Layout(Mesh.from_range(0, (2, 2, 2)), "S0S1S2"),
                Layout(m24b, "S1RR"),
            ),
            False,
        ),
        (
            "same mesh",
            ReshardTask((16, 12, 8), "int32", Layout(m24, "S0RR"), Layout(m24, "RS1R")),
            False,
        ),
        (
            "overlapping meshes",
            ReshardTask(
                (16, 12, 8),
                "float16",
                Layout(m24, "RS0R"),
                Layout(Mesh.from_range(4, (2, 4)), "S0RR"),
            ),
            False,
        ),
        (
            "non-contiguous input",
            ReshardTask((16, 12, 8), "float32", Layout(m24, "RS1R"), Layout(m24b, "RRS0")),
            True,
        ),
        (
            "1-to-m bool",
            ReshardTask(
                (1000,), "bool", Layout(Mesh([[0]]), "R"), Layout(Mesh.from_range(4, (4, 4)), "R")
            ),
            False,
        ),
    ]
    for dtype in DTYPES:
        out.append(
            (
                f"dtype {dtype}",
                ReshardTask((16, 12, 8), dtype, Layout(m24, "RS0R"), Layout(m24b, "S0RR")),
                False,
            )
        )
    return out


def _global(task: ReshardTask) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(task.describe().encode()))
    if task.dtype == "bool":
        return rng.integers(0, 2, size=task.shape).astype(bool)
    return rng.normal(0, 100, size=task.shape).astype(task.numpy_dtype)


def _to_torch(a: np.ndarray, noncontiguous: bool = False):
    import torch

    raw = torch.frombuffer(bytearray(a.tobytes()) or bytearray(1), dtype=torch.uint8)
    dtype = getattr(torch, meshcast.core.dtypes.dtype_name(a.dtype))
    t = raw[: a.nbytes].view(dtype).reshape(a.shape)
    if noncontiguous and t.ndim >= 2:
        t = t.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
        assert not t.is_contiguous() or t.numel() == 0
    return t


def _bytes(t) -> bytes | None:
    import torch

    return None if t is None else t.contiguous().view(torch.uint8).numpy().tobytes()


def _job(rank: int, plans: dict) -> dict:
    """Runs in every rank: all cases x strategies (``plans`` from :func:`_plans`), then the
    byte-count and validation checks."""
    import torch

    from meshcast.runtime import group_cache, reset_transfer_stats, transfer_stats

    topology = meshcast.detect_topology()
    assert topology == TOPOLOGY
    report: dict = {"results": {}, "small": {}, "cross": {}, "errors": {}}
    for strategy in STRATEGIES:
        for name, task, noncontig in _cases():
            p = plans[strategy, name]
            box = task.src_box(rank)
            local = None if box is None else _to_torch(_global(task)[box], noncontig)
            # tiny chunks and budget exercise chunking, relays and packing
            out = meshcast.reshard(local, p, chunk_bytes=96, timeout=60)
            report["results"][strategy, name] = _bytes(out)
            # a budget of ~5 chunks: ranks wait for memory mid-operation (once a deadlock), with
            # every operation of a rank posted at once (ordered=False)
            out = meshcast.reshard(
                local, p, chunk_bytes=96, max_inflight_bytes=512, timeout=60, ordered=False
            )
            report["small"][strategy, name] = _bytes(out)

    # the same plan twice with default chunking: groups are cached, not re-created
    name, task, _ = _cases()[1]
    p = plan(task, topology, strategy="broadcast")
    box = task.src_box(rank)
    local = None if box is None else _to_torch(_global(task)[box])
    first = _bytes(meshcast.reshard(local, p))
    report["groups"] = (first == _bytes(meshcast.reshard(local, p)), len(group_cache))

    # the collectives transport (the GPU design) on gloo: native broadcast / all-gather on
    # sub-groups, batched sends; small chunks (several per operation) and a budget of four
    # chunks exercise chunking and the budget (each chunk of an all-gather is one round)
    report["collectives"] = {}
    for strategy in STRATEGIES:
        for name, task, noncontig in _cases():
            p = plans[strategy, name]
            box = task.src_box(rank)
            local = None if box is None else _to_torch(_global(task)[box], noncontig)
            out = meshcast.reshard(local, p, chunk_bytes=256, max_inflight_bytes=1024,
                                   timeout=60, transport="collectives")
            report["collectives"][strategy, name] = _bytes(out)

    # bytes across hosts, counted by the runtime as it sends
    for name, task in _byte_count_tasks():
        for strategy in ("send_recv", "broadcast"):
            p = plan(task, topology, strategy=strategy)
            box = task.src_box(rank)
            local = None if box is None else _to_torch(_global(task)[box])
            reset_transfer_stats()
            meshcast.reshard(local, p, chunk_bytes=4096)
            report["cross"][strategy, name] = transfer_stats().cross_host_bytes

    # one rank passes a wrong shard: every rank of the plan raises, none hangs
    task = _cases()[0][1]
    p = plan(task, topology)
    box = task.src_box(rank)
    local = None if box is None else _to_torch(_global(task)[box])
    if rank == 3:
        local = local[:-1]
    try:
        meshcast.reshard(local, p, timeout=30)
        report["errors"]["shape"] = None
    except ValueError as exc:
        report["errors"]["shape"] = str(exc)
    # ... and the group still works afterwards
    local = None if box is None else _to_torch(_global(task)[box])
    report["after"] = _bytes(meshcast.reshard(local, p, timeout=30))
    # one rank asks for another transport: refused by the agreement on every rank of the plan
    try:
        meshcast.reshard(local, p, timeout=30,
                         transport="collectives" if rank == 3 else "p2p")
        report["errors"]["transport"] = None
    except ValueError as exc:
        report["errors"]["transport"] = str(exc)
    torch.distributed.barrier()
    return report


def _byte_count_tasks() -> list[tuple[str, ReshardTask]]:
    m24 = Mesh.from_range(0, (2, 4))
    return [
        (
            "case2",
            ReshardTask(
                (64, 16, 8), "int32", Layout(m24, "RRR"), Layout(Mesh.from_range(8, (2, 4)), "S0RR")
            ),
        ),
        (
            "1-to-3-hosts",
            ReshardTask(
                (4096,),
                "float32",
                Layout(Mesh([[0]]), "R"),
                Layout(Mesh.from_range(8, (3, 4)), "R"),
            ),
        ),
    ]


@pytest.fixture(scope="module")
def job() -> list[dict]:
    return meshcast.launch(_job, WORLD, hosts=TOPOLOGY, args=(_plans(),), timeout=600)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("budget", ["default", "small", "collectives"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_case_is_byte_exact(job: list[dict], strategy: str, budget: str) -> None:
    # small: max_inflight_bytes=512 with 96-byte chunks (packing buffers wait for memory),
    # operations posted concurrently (ordered=False); default: ordered, the default budget;
    # collectives: transport="collectives" with 256-byte chunks and a 1 KiB budget
    key = {"default": "results", "small": "small", "collectives": "collectives"}[budget]
    cases = _cases()
    assert len(cases) >= 12
    for name, task, _ in cases:
        p = _plans()[strategy, name]
        expected = execute_local(p, scatter(_global(task), task.src))
        for rank in range(WORLD):
            got = job[rank][key][strategy, name]
            if rank in expected:
                assert got == expected[rank].tobytes(), f"{strategy} {name}: rank {rank} differs"
            else:
                assert got is None, f"{strategy} {name}: rank {rank} is outside yet got data"


@pytest.mark.timeout(900)
def test_gloo_path_creates_no_process_groups(job: list[dict]) -> None:
    # ranks outside a plan never take part in anything: gloo runs on the caller's group
    for rank in range(WORLD):
        same, groups = job[rank]["groups"]
        assert same and groups == 0


def test_an_unknown_transport_is_refused() -> None:
    task = _cases()[0][1]
    with pytest.raises(ValueError, match=r"transport must be one of 'p2p', 'collectives'.*'nccl'"):
        meshcast.reshard(None, plan(task, TOPOLOGY), transport="nccl")


def _cross_host_expected(p) -> int:
    host = TOPOLOGY.host_of
    total = 0
    for op in p.ops:
        nbytes = box_size(op.box) * p.task.itemsize
        if isinstance(op, Send):
            total += nbytes * (host(op.src) != host(op.dst))
        elif isinstance(op, Broadcast):
            total += nbytes * len({host(r) for r in op.dsts} - {host(op.src)})
    return total


@pytest.mark.timeout(900)
def test_broadcast_enters_each_host_once(job: list[dict]) -> None:
    for name, task in _byte_count_tasks():
        counted = {
            s: sum(job[r]["cross"][s, name] for r in range(WORLD))
            for s in ("send_recv", "broadcast")
        }
        bc = plan(task, TOPOLOGY, strategy="broadcast")
        sr = plan(task, TOPOLOGY, strategy="send_recv")
        # each unit slice: once per receiving host (broadcast), once per receiving device (p2p)
        assert counted["broadcast"] == _cross_host_expected(bc) == bc.cross_host_bytes()
        assert counted["send_recv"] == _cross_host_expected(sr)
        assert all(
            len({TOPOLOGY.host_of(r) for r in op.dsts}) < len(op.dsts)
            for op in bc.ops
            if isinstance(op, Broadcast)
        )
        assert counted["send_recv"] == 4 * counted["broadcast"]  # 4 receivers on each host


@pytest.mark.timeout(900)
def test_bad_local_on_one_rank_fails_everywhere(job: list[dict]) -> None:
    task = _cases()[0][1]
    p = plan(task, TOPOLOGY)
    for rank in range(WORLD):
        err = job[rank]["errors"]["shape"]
        if rank not in p.ranks:
            assert err is None
        elif rank == 3:
            assert "shape" in err and "rank 3" in err
        else:
            assert "ranks [3]" in err
    expected = execute_local(p, scatter(_global(task), task.src))
    for rank in range(WORLD):
        want = expected[rank].tobytes() if rank in expected else None
        assert job[rank]["after"] == want


@pytest.mark.timeout(900)
def test_ranks_asking_for_different_transports_are_refused(job: list[dict]) -> None:
    p = plan(_cases()[0][1], TOPOLOGY)
    for rank in range(WORLD):
        err = job[rank]["errors"]["transport"]
        if rank not in p.ranks:
            assert err is None
        else:
            assert "transport" in err and "collectives" in err and "p2p" in err, err
