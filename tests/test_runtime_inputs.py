"""Any local tensor works, and anything a rank cannot use is refused on every rank at once.

One launched job of 8 ranks (4 emulated hosts of 2) runs, on real processes over gloo:

* odd strides (column-major, slices of column-major tensors, transposes of uneven shards, a
  ``(1, 1)`` view with strides ``(1, 4)``, stride-0 expanded views, zero-size and size-1
  dimensions with odd strides, storage offsets, lazy conjugate and negative views) and every
  dtype torch has, through ``reshard`` and ``reshard_many``, compared byte for byte;
* a bad input on one rank: every rank raises ``ValueError`` at once naming that rank and the
  rule, and the same process group then runs a collective and a reshard;
* rank-dependent arguments (a destination mesh that differs per rank pair, a different
  ``chunk_bytes`` on one rank, a non-plan on one rank, a DTensor sub-mesh ``["tp"]`` that differs
  per rank): refused on every rank, well within the timeout, and the group still works.
"""

from __future__ import annotations

import functools
import re
import time

import pytest

import meshcast
from meshcast import Layout, Mesh, ReshardTask, Topology
from meshcast.core.dtypes import known_dtypes

WORLD = 8
TOPOLOGY = Topology.uniform(4, 2)
TIMEOUT = 120.0  # refusals must come long before it


def _global(shape: tuple[int, ...], dtype_name: str, seed: int):
    """Deterministic bytes viewed as the dtype (any dtype, NaN patterns included)."""
    import torch

    from meshcast.core.dtypes import itemsize

    n = 1
    for s in shape:
        n *= s
    size = itemsize(dtype_name)
    raw = ((torch.arange(n * size, dtype=torch.int64) * 7919 + seed * 31) % 251).to(torch.uint8)
    return raw.view(getattr(torch, dtype_name)).reshape(shape)


def _carrier(t):
    from meshcast.runtime.tensors import as_carrier

    return as_carrier(t)


def _same(got, want) -> bool:
    import torch

    if got is None or want is None:
        return got is None and want is None
    return (got.dtype == want.dtype and got.shape == want.shape
            and torch.equal(_carrier(got), _carrier(want)))


def _odd(local, how: str):
    """``local``'s values in an unusual layout (same dtype and shape)."""
    import torch

    c = _carrier(local)
    if how == "column-major":
        out = c.transpose(0, 1).contiguous().transpose(0, 1)
    elif how == "slice of column-major":
        rows, cols = c.shape[0], c.shape[1]
        big = torch.zeros(cols + 3, rows + 2, dtype=c.dtype).t()  # column-major
        big[1:1 + rows, 2:2 + cols] = c
        out = big[1:1 + rows, 2:2 + cols]
    elif how == "odd strides":  # any size-1 / zero-size dims get strides 7, 3, ...
        storage = torch.zeros(c.numel() * 8 + 16, dtype=c.dtype)
        strides = []
        acc = 1
        for n in reversed(c.shape):
            strides.append(acc if n > 1 else 7 + len(strides))
            acc *= max(n, 1)
        out = storage.as_strided(c.shape, tuple(reversed(strides)), 5)
        out.copy_(c)
    elif how == "expanded":  # the data is constant along dim 1
        out = c[:, :1].expand(c.shape)
    elif how == "storage offset":
        big = torch.zeros((c.shape[0] + 2, *c.shape[1:]), dtype=c.dtype)
        big[2:] = c
        out = big[2:]
    else:
        raise ValueError(how)
    assert torch.equal(out, c)
    return out.view(local.dtype)


def _stride_cases() -> list[tuple[str, ReshardTask, str]]:
    m22, m22b = Mesh.from_range(0, (2, 2)), Mesh.from_range(4, (2, 2))
    m8 = Mesh.from_range(0, (2, 4))
    return [
        ("col-major float32", ReshardTask((9, 7), "float32", Layout(m22, "S0S1"),
                                          Layout(m22b, "S1R")), "column-major"),
        ("col-major slice int64", ReshardTask((10, 6), "int64", Layout(m22, "S1R"),
                                              Layout(m22b, "RS0")), "slice of column-major"),
        ("1x1 stride (1, 4)", ReshardTask((2, 2), "float32", Layout(m22, "S0S1"),
                                          Layout(m22b, "RR")), "odd strides"),
        ("uneven transpose bf16", ReshardTask((5, 3), "bfloat16", Layout(m22, "S1S0"),
                                              Layout(m8, "S0S1")), "column-major"),
        ("size-1 dims", ReshardTask((2, 1, 5, 1), "float16", Layout(m22, "S0RS1R"),
                                    Layout(m22b, "RRS0R")), "odd strides"),
        ("zero-size", ReshardTask((4, 0, 3), "int32", Layout(m22, "S0RS1"),
                                  Layout(m22b, "RS0R")), "odd strides"),
        ("expanded", ReshardTask((8, 6), "uint8", Layout(m22, "S0R"), Layout(m22b, "S1S0")),
         "expanded"),
        ("storage offset complex64", ReshardTask((6, 4), "complex64", Layout(m22, "S0R"),
                                                 Layout(m8, "RS1")), "storage offset"),
    ]


def _dtype_task(name: str) -> ReshardTask:
    m22, m22b = Mesh.from_range(0, (2, 2)), Mesh.from_range(4, (2, 2))
    return ReshardTask((6, 5), name, Layout(m22, "S0S1"), Layout(m22b, "S1R"))


def _local(task: ReshardTask, full, rank: int, how: str | None = None):
    box = task.src_box(rank)
    if box is None:
        return None
    local = full[box]
    return local if how is None else _odd(local, how)


@functools.cache
def _roundtrip_plans() -> list:
    """The plans of :func:`_roundtrips` (plan()'s defaults), made once in the parent: auto plans
    of all 49 cases cost seconds of CPU, in each of the 8 ranks when they planned them."""
    tasks = [task for _, task, _ in _stride_cases()] + [_dtype_task(n) for n in known_dtypes()]
    return [meshcast.plan(t, TOPOLOGY) for t in tasks]


def _roundtrips(rank: int, plans: list) -> list[str]:
    """Every odd-stride and every-dtype case through reshard and reshard_many (``plans`` from
    :func:`_roundtrip_plans`); mismatches."""
    import torch

    bad: list[str] = []
    tasks, locals_, fulls = [], [], []
    for k, (name, task, how) in enumerate(_stride_cases()):
        full = _global(task.shape, task.dtype, k)
        if how == "expanded":
            full = full[:, :1].expand(task.shape).contiguous()
        tasks.append((name, task))
        locals_.append(_local(task, full, rank, how))
        fulls.append(full)
    for k, name in enumerate(known_dtypes()):
        task = _dtype_task(name)
        full = _global(task.shape, name, 100 + k)
        tasks.append((f"dtype {name}", task))
        locals_.append(_local(task, full, rank, "column-major" if k % 2 else None))
        fulls.append(full)
    assert [p.task for p in plans] == [t for _, t in tasks]
    for (name, task), p, local, full in zip(tasks, plans, locals_, fulls):
        want = None if task.dst_box(rank) is None else full[task.dst_box(rank)]
        out = meshcast.reshard(local, p, chunk_bytes=64, timeout=TIMEOUT)
        if not _same(out, want):
            bad.append(f"reshard {name}")
    outs = meshcast.reshard_many(locals_, plans, bucket_bytes=512, timeout=TIMEOUT)
    for (name, task), out, full in zip(tasks, outs, fulls):
        want = None if task.dst_box(rank) is None else full[task.dst_box(rank)]
        if not _same(out, want):
            bad.append(f"reshard_many {name}")
    if rank == 0:
        assert torch.equal(_carrier(locals_[0]), _carrier(fulls[0][tasks[0][1].src_box(0)]))
    return bad


def _refused(fn) -> tuple[str, float]:
    start = time.monotonic()
    try:
        fn()
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}", time.monotonic() - start
    return "no error", time.monotonic() - start


def _group_works(rank: int) -> bool:
    """A collective and a reshard on the same default group, after a refusal."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    task = ReshardTask((8,), "int16", Layout(Mesh([0, 1]), "S0"), Layout(Mesh.from_range(2, (6,)),
                                                                          "R"))
    full = _global((8,), "int16", 5)
    out = meshcast.reshard(_local(task, full, rank), meshcast.plan(task, TOPOLOGY),
                           timeout=TIMEOUT)
    want = None if task.dst_box(rank) is None else full[task.dst_box(rank)]
    return float(t) == sum(range(WORLD)) and _same(out, want)


def _bad_inputs(rank: int) -> dict:
    """One rank's bad shard, then rank-dependent arguments; every refusal and the group after."""
    import torch

    report = {}
    m22, m22b = Mesh.from_range(0, (2, 2)), Mesh.from_range(4, (2, 2))
    task = ReshardTask((8, 6), "float32", Layout(m22, "S0R"), Layout(m22b, "RS1"))
    p = meshcast.plan(task, TOPOLOGY)
    full = _global(task.shape, "float32", 1)
    local = _local(task, full, rank)
    if rank == 3:
        local = local[:, :-1]
    report["shape"] = _refused(lambda: meshcast.reshard(local, p, timeout=TIMEOUT))
    report["after shape"] = _group_works(rank)

    local = _local(task, full, rank)
    tensors = [local, None if local is None else local.to(torch.float64 if rank == 1 else
                                                           torch.float32)]
    report["many dtype"] = _refused(lambda: meshcast.reshard_many(
        tensors, [p, p], names=["w", "b"], timeout=TIMEOUT))
    tensors = [local, local]
    if rank == 2:  # a tensor subclass whose storage is not its data (checkpointing's wrapper)
        from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper

        tensors[1] = LocalShardsWrapper([local], [(4, 0)])
    report["many wrapper"] = _refused(lambda: meshcast.reshard_many(
        tensors, [p, p], names=["w", "b"], timeout=TIMEOUT))

    # a destination mesh that differs per pair of ranks: plans differ across ranks
    k = rank // 2
    tp = ReshardTask((8, 4), "float32", Layout(Mesh.from_range(0, (4,)), "S0R"),
                     Layout(Mesh([2 * k, 2 * k + 1]), "RS0"))
    tp_local = _local(tp, _global((8, 4), "float32", 2), rank)
    report["tp"] = _refused(lambda: meshcast.reshard(tp_local, meshcast.plan(tp),
                                                     timeout=TIMEOUT))
    report["many tp"] = _refused(lambda: meshcast.reshard_many(
        [tp_local], [meshcast.plan(tp)], timeout=TIMEOUT))
    report["after tp"] = _group_works(rank)

    report["chunk"] = _refused(lambda: meshcast.reshard(
        local, p, chunk_bytes=4096 if rank == 6 else 1 << 20, timeout=TIMEOUT))
    report["not a plan"] = _refused(lambda: meshcast.reshard(
        local, "a plan" if rank == 5 else p, timeout=TIMEOUT))
    report["after args"] = _group_works(rank)
    report.update(_one_rank_arguments(rank, task, p, local))
    report["after one rank"] = _group_works(rank)
    report["dtensor tp"] = _dtensor_tp(rank)
    report["after dtensor"] = _group_works(rank)
    return report


def _one_rank_arguments(rank: int, task: ReshardTask, p, local) -> dict:
    """Arguments only one rank gets wrong (refused on every rank before it waits), results that
    would share memory with sources or each other, and ranks outside a sub-group."""
    import torch
    import torch.distributed as dist

    report = {}
    report["timeout"] = _refused(lambda: meshcast.reshard(
        local, p, timeout=float("inf") if rank == 2 else TIMEOUT))
    report["device"] = _refused(lambda: meshcast.reshard(
        local, p, device="bogus" if rank == 4 else None, timeout=TIMEOUT))
    report["names"] = _refused(lambda: meshcast.reshard_many(
        [local, local], [p, p], names=["w"] if rank == 6 else ["w", "b"], timeout=TIMEOUT))
    # a permutation onto the same 4 ranks: out=local would overwrite data still to be sent
    perm = ReshardTask((8, 6), "int32", Layout(Mesh([0, 1, 2, 3]), "S0R"),
                       Layout(Mesh([1, 2, 3, 0]), "S0R"))
    mine = None if perm.src_box(rank) is None else torch.zeros(2, 6, dtype=torch.int32)
    report["out is local"] = _refused(lambda: meshcast.reshard(
        mine, meshcast.plan(perm, TOPOLOGY), out=mine, timeout=TIMEOUT))
    box = task.dst_box(rank)
    both = None if box is None else torch.zeros((box[0].stop - box[0].start,
                                                 box[1].stop - box[1].start))
    report["one out twice"] = _refused(lambda: meshcast.reshard_many(
        [local, local], [p, p], out=[both, both], timeout=TIMEOUT))
    # arguments that are no group or no list on one rank: refused there before anything else,
    # and on every other rank at once (the calls after them stay in step: "after one rank")
    report["group"] = _refused(lambda: meshcast.reshard(
        local, p, group="bogus" if rank == 1 else None, timeout=TIMEOUT))
    report["many tensors"] = _refused(lambda: meshcast.reshard_many(
        None if rank == 3 else [local], [p], timeout=TIMEOUT))
    report["many out"] = _refused(lambda: meshcast.reshard_many(
        [local], [p], out=5 if rank == 0 else None, timeout=TIMEOUT))
    # a result no machine can hold (an exbibyte from a stride-0 view of one byte) on rank 5
    huge = ReshardTask((1 << 60,), "uint8", Layout(Mesh([0]), "R"), Layout(Mesh([5]), "R"))
    one = torch.zeros(1, dtype=torch.uint8).expand(1 << 60) if rank == 0 else None
    report["result memory"] = _refused(lambda: meshcast.reshard(
        one, meshcast.plan(huge, TOPOLOGY), timeout=TIMEOUT))
    report["many result memory"] = _refused(lambda: meshcast.reshard_many(  # 2**34 buckets
        [one], [meshcast.plan(huge, TOPOLOGY)], timeout=TIMEOUT))
    group = dist.new_group([0, 1, 2, 3])  # ranks 4-7 are outside: None at once
    inner = ReshardTask((8,), "int32", Layout(Mesh([0, 1]), "S0"), Layout(Mesh([2, 3]), "R"))
    full = torch.arange(8, dtype=torch.int32)
    got = meshcast.reshard(None if rank > 1 else full[4 * rank: 4 * rank + 4],
                           meshcast.plan(inner, TOPOLOGY), group=group, timeout=TIMEOUT)
    report["sub-group"] = got is None if rank not in (2, 3) else torch.equal(got, full)
    return report


def _dtensor_tp(rank: int) -> bool:
    """DTensor: the destination is init_device_mesh(...)["tp"], a different sub-mesh on each
    pair of ranks. Read on the root mesh (replicated over "dp"), every rank holds the same plan,
    so the reshard goes ahead and is exact."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    full = torch.arange(16.0).reshape(8, 2)
    src = DeviceMesh("cpu", list(range(WORLD)))
    dt = distribute_tensor(full, src, [Shard(0)])
    tp = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))["tp"]
    out = meshcast.reshard_dtensor(dt, tp, [Replicate()], timeout=TIMEOUT)
    return torch.equal(out.to_local(), full)


def _job(rank: int, plans: list) -> dict:
    return {"roundtrips": _roundtrips(rank, plans), "bad": _bad_inputs(rank)}


@pytest.fixture(scope="module")
def job() -> list[dict]:
    return meshcast.launch(_job, WORLD, hosts=TOPOLOGY, args=(_roundtrip_plans(),), timeout=400)


def _messages(job: list[dict], key: str) -> list[str]:
    out = []
    for rank in range(WORLD):
        text, seconds = job[rank]["bad"][key]
        assert seconds < TIMEOUT / 4, f"{key}: rank {rank} took {seconds:.1f} s"
        out.append(text)
    return out


@pytest.mark.timeout(600)
def test_odd_strides_and_every_dtype_are_byte_exact(job: list[dict]) -> None:
    assert len(known_dtypes()) >= 40
    for rank in range(WORLD):
        assert job[rank]["roundtrips"] == [], f"rank {rank}"


@pytest.mark.timeout(600)
def test_bad_shard_on_one_rank_is_refused_everywhere_and_the_group_works(job) -> None:
    got = _messages(job, "shape")
    want3 = ("ValueError: meshcast.reshard on rank 3: local has shape (4, 5) on rank 3; the "
             "source layout 2x2:S0R of global shape (8, 6) gives this rank (4, 6); nothing was "
             "sent")
    for rank in range(WORLD):
        if rank == 3:
            assert got[rank] == want3
        else:
            assert got[rank] == (
                f"ValueError: meshcast.reshard on rank {rank}: ranks [3] passed inputs that do "
                f"not fit the plans (rank 3: local has shape (4, 5) on rank 3; the source layout "
                f"2x2:S0R of global shape (8, 6) gives this rank (4, 6)); nothing was sent")
    for rank in range(WORLD):
        assert job[rank]["bad"]["after shape"] is True
    many = _messages(job, "many dtype")
    assert many[1].startswith("ValueError: meshcast.reshard_many on rank 1: b has dtype "
                              "torch.float64 on rank 1; the plan moves torch.float32")
    assert all("ranks [1] passed inputs that do not fit the plans (rank 1: b has dtype "
               "torch.float64" in many[r] for r in range(WORLD) if r != 1)
    wrapper = ("b is a LocalShardsWrapper (a tensor subclass with its own __torch_dispatch__: "
               "its memory is not its elements) on rank 2; meshcast moves plain dense tensors")
    texts = _messages(job, "many wrapper")
    assert texts[2] == f"ValueError: meshcast.reshard_many on rank 2: {wrapper}; nothing was sent"
    assert all(f"ranks [2] passed inputs that do not fit the plans (rank 2: {wrapper})" in t
               for r, t in enumerate(texts) if r != 2), texts


@pytest.mark.timeout(600)
def test_rank_dependent_plans_are_refused_on_every_rank(job) -> None:
    for key in ("tp", "many tp"):
        for rank, text in enumerate(_messages(job, key)):
            assert text.startswith("ValueError: meshcast.reshard"), (key, rank, text)
            assert "nothing was sent" in text, (key, rank, text)
            assert ("with another plan" in text or "called with different plans than rank"
                    in text), (key, rank, text)
    tp = _messages(job, "tp")
    # which peers a rank sees first, and in which of their calls (peers that refused this call
    # may already wait in their next one, the reshard_many of "many tp"), depends on timing;
    # what it says does not
    many = r"(1 plans \(digest [0-9a-f]{16}\), the first )?"
    plan = (r"\(8, 4\) float32: 4:S0R -> 2(@2)?:RS0"
            r"(, broadcast/auto on 4 hosts \(digest [0-9a-f]{16}\))?")
    assert re.match(r"ValueError: meshcast.reshard on rank 0: (rank [0-3] called the call off: )?"
                    r"ranks \[[0-3, ]+\] called with different plans than rank [0-3] \(rank "
                    rf"[0-3]: {many}{plan}; rank [0-3]: {many}{plan}\); every "
                    r"rank must pass the same plans in the same order; nothing was sent$",
                    tp[0]), tp[0]
    assert re.search(r"while rank [45]'s plan \(\(8, 4\) float32: 4:S0R -> 2@4:RS0, "
                     r"broadcast/auto on 4 hosts \(digest [0-9a-f]{16}\) over ranks 0..5\)",
                     tp[4]), tp[4]
    for rank in range(WORLD):
        assert job[rank]["bad"]["after tp"] is True
        assert job[rank]["bad"]["dtensor tp"] is True
        assert job[rank]["bad"]["after dtensor"] is True


@pytest.mark.timeout(600)
def test_rank_dependent_options_and_arguments_are_refused_on_every_rank(job) -> None:
    chunk = _messages(job, "chunk")
    for rank in range(WORLD):
        if rank == 6:
            assert "ranks [0, 1, 2, 3, 4, 5, 7] passed chunk_bytes=1048576 where rank 6 passed " \
                   "4096: it must be the same on every rank" in chunk[rank]
        else:
            assert f"on rank {rank}: ranks [6] passed chunk_bytes=4096 where rank {rank} passed " \
                   f"1048576: it must be the same on every rank; nothing was sent" in chunk[rank]
    args = _messages(job, "not a plan")
    assert args[5] == "TypeError: plan must be a meshcast.Plan, got str"
    for rank in range(WORLD):
        if rank != 5:
            assert args[rank].startswith(f"ValueError: meshcast.reshard on rank {rank}: ")
            assert ("rank 5 refused its call before joining it (an argument error: plan must be "
                    "a meshcast.Plan, got str)") in args[rank]
        assert job[rank]["bad"]["after args"] is True


@pytest.mark.timeout(600)
def test_what_one_rank_gets_wrong_is_refused_on_every_rank(job) -> None:
    for key, culprit, rule in (
        ("timeout", 2, "timeout must be at most 1e+07 seconds (every wait is bounded), got inf"),
        ("device", 4, "device='bogus' is not a torch device"),
        ("names", 6, "names must be a sequence of 2 strings, one per plan, got ['w']"),
    ):
        for rank, text in enumerate(_messages(job, key)):
            assert text.startswith("ValueError: ") and rule in text, (key, rank, text)
            assert rank == culprit or f"rank {culprit}" in text, (key, rank, text)


@pytest.mark.timeout(600)
def test_a_bad_group_or_list_or_a_result_that_cannot_be_allocated_is_refused_everywhere(job
                                                                                      ) -> None:
    for key, culprit, error, rule in (
        ("group", 1, "TypeError", "group must be a torch.distributed.ProcessGroup, a meshcast "
                                  "JointGroup or None (the default group), got str"),
        ("many tensors", 3, "TypeError", "tensors must be a sequence with one entry per plan, "
                                         "got NoneType"),
        ("many out", 0, "TypeError", "out must be a sequence with one entry per plan, got int"),
    ):
        for rank, text in enumerate(_messages(job, key)):
            if rank == culprit:
                assert text == f"{error}: {rule}", (key, text)
            else:
                assert text.startswith("ValueError: ") and (
                    f"rank {culprit} refused its call before joining it (an argument error: "
                    f"{rule})") in text, (key, rank, text)
    for key in ("result memory", "many result memory"):
        texts = _messages(job, key)
        for rank in (0, 5):
            assert texts[rank].startswith("ValueError: ") and (
                "its result (1,152,921,504,606,846,976 bytes on cpu) cannot be allocated: "
                in texts[rank]) and "nothing was sent" in texts[rank], (key, rank, texts[rank])
        assert "ranks [5] passed inputs that do not fit the plans" in texts[0], texts[0]
        assert [texts[r] for r in (1, 2, 3, 4, 6, 7)] == ["no error"] * 6


@pytest.mark.timeout(600)
def test_results_that_share_memory_are_refused_and_sub_groups_leave_outsiders_out(job) -> None:
    for rank, text in enumerate(_messages(job, "out is local")):
        if rank < 4:
            assert "out shares memory with local on rank" in text, (rank, text)
            assert "nothing was sent" in text, (rank, text)
        else:
            assert text == "no error"
    for text in _messages(job, "one out twice"):
        assert "out[0] (tensors[0]) shares memory with out[1] (tensors[1]) on rank" in text, text
    assert [job[r]["bad"]["sub-group"] for r in range(WORLD)] == [True] * WORLD
    assert [job[r]["bad"]["after one rank"] for r in range(WORLD)] == [True] * WORLD


def _agreement_keys_left(rank: int, calls: int) -> list[str]:
    """Make ``calls`` agreed calls of one plan, then (after every rank has returned) the
    agreement keys of those calls still in the group's store."""
    import torch
    import torch.distributed as dist

    from meshcast.runtime.board import family_of, store_of
    from meshcast.runtime.execute import plan_digest

    task = ReshardTask((8,), "float32", Layout(Mesh.from_range(0, (2,)), "S0"),
                       Layout(Mesh.from_range(2, (2,)), "S0"))
    p = meshcast.plan(task, Topology.uniform(2, 2))
    local = torch.arange(4.0) + 4 * rank if rank < 2 else None
    for _ in range(calls):
        out = meshcast.reshard(local, p, timeout=TIMEOUT)
        assert rank < 2 or torch.equal(out, torch.arange(4.0) + 4 * (rank - 2))
    dist.barrier()
    store, family = store_of(dist.group.WORLD), family_of(p.ranks, plan_digest(p))
    keys = [f"meshcast/c/{family}/{k}/{suffix}" for k in range(calls)
            for suffix in ("records", "joined", "verdict", "read")]
    return [key for key in keys if store.check([key])]


def test_agreed_calls_leave_no_agreement_keys_in_the_store() -> None:
    """Each call that goes ahead deletes its agreement's keys once every rank has read the
    verdict: a long job does not grow the store by a record per rank and call."""
    assert meshcast.launch(_agreement_keys_left, 4, hosts=Topology.uniform(2, 2),
                           args=(3,), timeout=TIMEOUT) == [[], [], [], []]
