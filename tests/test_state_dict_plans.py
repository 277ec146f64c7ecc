"""Joint planning of many tensors, the plan cache and bucketed schedules (numpy only, no processes).

The schedule is checked with a numpy executor that follows the runtime's rule: in a phase every
message reads what its sender held *before* the phase, and writes land after it.
"""

from __future__ import annotations

import numpy as np
import pytest

import meshcast as mc
from meshcast.core.layout import box_shape
from meshcast.planning.many import build_schedule, clear_plan_cache, plan_many

M24A, M24B = mc.Mesh.from_range(0, (2, 4)), mc.Mesh.from_range(8, (2, 4))


def _tasks() -> list[mc.ReshardTask]:
    m14 = mc.Mesh.from_range(4, (1, 4))
    return [
        mc.ReshardTask((16, 12, 8), "float32", mc.Layout(M24A, "RS0R"), mc.Layout(M24B, "S0RR")),
        mc.ReshardTask((13, 7), "bfloat16", mc.Layout(M24A, "S0S1"), mc.Layout(M24B, "RS01")),
        mc.ReshardTask((9,), "int64", mc.Layout(M24A, "R"), mc.Layout(M24B, "S1")),
        mc.ReshardTask((6, 10), "int32", mc.Layout(M24A, "RR"), mc.Layout(m14, "S1R")),  # overlap
        mc.ReshardTask((5, 4), "float16", mc.Layout(M24A, "S1R"), mc.Layout(M24A, "RS0")),  # same
        mc.ReshardTask((3, 3), "bool", mc.Layout(mc.Mesh([[0]]), "RR"), mc.Layout(M24B, "RR")),
    ]


def _global(task: mc.ReshardTask, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if task.dtype == "bool":
        return rng.integers(0, 2, size=task.shape).astype(bool)
    return rng.normal(0, 100, size=task.shape).astype(task.numpy_dtype)


def _rel(box, shard_box):
    return tuple(slice(b.start - s.start, b.stop - s.start) for b, s in zip(box, shard_box))


def _run_schedule(plans, xs, bucket_bytes=4096):
    srcs = [mc.scatter(x, p.task.src) for x, p in zip(xs, plans)]
    outs = [
        {r: np.zeros(box_shape(p.task.dst_box(r)), dtype=p.task.numpy_dtype)
         for r in p.task.dst.mesh.devices}
        for p in plans
    ]
    sched = build_schedule(plans, bucket_bytes)
    for k, r, box in sched.copies:
        t = plans[k].task
        outs[k][r][_rel(box, t.dst_box(r))] = srcs[k][r][_rel(box, t.src_box(r))]
    for bucket in sched.buckets:
        for phase in bucket:
            writes = []
            for (s, d), segs in phase.messages.items():
                for seg in segs:
                    t = plans[seg.tensor].task
                    if seg.from_out:
                        data = outs[seg.tensor][s][_rel(seg.box, t.dst_box(s))].copy()
                    else:
                        data = srcs[seg.tensor][s][_rel(seg.box, t.src_box(s))].copy()
                    writes.append((seg.tensor, d, seg.box, data))
            for k, d, box, data in writes:
                outs[k][d][_rel(box, plans[k].task.dst_box(d))] = data
    return outs, sched


@pytest.mark.parametrize(
    "options",
    [{}, {"strategy": "send_recv"}, {"strategy": "allgather", "balance": "none"},
     {"strategy": "broadcast", "balance": "size"}, {"balance": "auto"}],
)
def test_plans_and_schedule_are_exact(options):
    tasks = _tasks()
    topo = mc.Topology.uniform(4, 4)
    plans = plan_many(tasks, topo, cache=False, **options)
    xs = [_global(t, k) for k, t in enumerate(tasks)]
    for p, x in zip(plans, xs):
        assert p.task in tasks
        got = mc.gather(mc.execute_local(p, mc.scatter(x, p.task.src)), p.task.dst)
        assert got.tobytes() == x.tobytes()
    outs, sched = _run_schedule(plans, xs)
    for p, x, out in zip(plans, xs, outs):
        assert mc.gather(out, p.task.dst).tobytes() == x.tobytes(), p.task.describe()
    assert len(sched.buckets) > 1  # 4 KiB buckets: the big tensor is cut
    if options.get("strategy") != "allgather":  # all-gathers are never cut
        assert max(sched.staging.values()) <= 4096


def test_joint_planning_shares_source_nics():
    # 8 tensors replicated on two source hosts, each one unit slice: planned one by one, every
    # tensor's sender is the first holder; planned jointly, the two hosts send half each
    src = mc.Layout(mc.Mesh.from_range(0, (2, 2)), "RR")
    dst = mc.Layout(mc.Mesh.from_range(4, (1, 2)), "RR")
    tasks = [mc.ReshardTask((64, 32), "float32", src, dst) for _ in range(8)]
    topo = mc.Topology.uniform(3, 2)
    alone = plan_many(tasks, topo, strategy="broadcast", balance="size", cache=False)
    joint = plan_many(tasks, topo, cache=False)
    out = np.zeros(3, dtype=np.int64)
    for p in joint:
        out += [o for o, _ in p.bytes_per_host().values()]
    assert out[0] == out[1] == 4 * 64 * 32 * 4
    out_alone = sum(p.bytes_per_host()[0][0] for p in alone)
    assert out_alone == 8 * 64 * 32 * 4
    assert all(p.balance == "joint" and p.strategy == "broadcast" for p in joint)


@pytest.mark.parametrize("bucket_bytes", [4096, 32768])
def test_every_stage_host_sends_in_every_bucket(bucket_bytes):
    """Two pipeline stages on hosts 0 and 1, each with a big first tensor (an embedding, a head)
    and small ones after. Taken plan by plan, the first buckets held stage 0's big tensor alone
    and host 1 idled; with the bound near one message per receiver, a bucket held one sender's.
    In lanes by hosts (meshcast.planning.buckets), parts of an eighth of the bound at most, both
    hosts send in every bucket, every rank stages within the bound, and the data stay exact."""
    dst = mc.Layout(mc.Mesh.from_range(4, (2, 2)), "S0R")
    tasks = []
    for stage in range(2):
        src = mc.Layout(mc.Mesh.from_range(2 * stage, (1, 2)), "RS1")
        tasks += [mc.ReshardTask((256, 64), "float32", src, dst)]
        tasks += [mc.ReshardTask((32, 64), "float32", src, dst) for _ in range(6)]
    plans = plan_many(tasks, mc.Topology.uniform(4, 2), cache=False)
    xs = [_global(t, k) for k, t in enumerate(tasks)]
    outs, sched = _run_schedule(plans, xs, bucket_bytes)
    for p, x, out in zip(plans, xs, outs):
        assert mc.gather(out, p.task.dst).tobytes() == x.tobytes()
    assert max(sched.staging.values()) <= bucket_bytes
    for bucket in sched.buckets:
        assert {s // 2 for phase in bucket for s, _ in phase.messages if s < 4} == {0, 1}


def test_plan_cache_hits():
    clear_plan_cache()
    tasks = _tasks()
    first = plan_many(tasks)
    info = mc.plan_cache_info()
    assert (info["hits"], info["misses"]) == (0, 1)
    again = plan_many([mc.ReshardTask.from_json(t.to_json()) for t in tasks])  # equal, new objects
    assert all(a is b for a, b in zip(first, again))
    assert mc.plan_cache_info()["hits"] == 1
    assert build_schedule(again) is build_schedule(first)
    plan_many(tasks, strategy="send_recv")
    assert mc.plan_cache_info()["misses"] == 2


def test_plan_many_errors():
    with pytest.raises(TypeError, match=r"tasks\[1\]"):
        plan_many([_tasks()[0], "x"])
    with pytest.raises(ValueError, match="balance='joint'"):
        plan_many(_tasks(), strategy="allgather")
    with pytest.raises(ValueError, match=r"tasks\[0\].*ranks"):
        plan_many(_tasks()[:1], mc.Topology.uniform(1, 4))


def test_import_meshcast_stays_free_of_torch():
    import subprocess
    import sys

    code = (
        "import sys, meshcast as mc; mc.plan_many; mc.plan_cache_info(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
