"""The fixed cost of one ``meshcast.reshard`` call over a case's ranks, as the bench times a run.

A timed run's span (first rank in to last rank out, between barriers) holds, beside the moves the
simulator models, what every call costs: the input agreement through the store among all the
plan's ranks, the end check, and the ranks' spread in leaving the barrier. These grow with the
number of ranks (docs/runtime.md, "Agreement cost"), so the bench measures them with the case's
own ranks: the span of a call that moves almost nothing between the same source and destination
ranks.
"""

from __future__ import annotations

import math
import statistics
import time

from ..core.boxes import box_shape
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask

__all__ = ["CALL_RUNS", "probe_call", "tiny_task"]

CALL_RUNS = 5
"""Timed calls of the probe (after one warm-up); their median is its figure."""


def tiny_task(task: ReshardTask) -> ReshardTask:
    """One int32 element per rank or so, ``S0`` on ``task``'s source ranks to ``S0`` on its
    destination ranks (each mesh flattened): every rank of ``task`` takes part, with as few
    operations as the two rank lists allow."""
    src, dst = task.src.mesh.devices, task.dst.mesh.devices
    n = math.lcm(len(src), len(dst))
    return ReshardTask((n,), "int32", Layout(Mesh(src), "S0"), Layout(Mesh(dst), "S0"))


def probe_call(rank: int, task: ReshardTask, timeout: float) -> float:
    """Seconds: the median span of :data:`CALL_RUNS` calls of :func:`tiny_task` (every rank of
    the job calls this; ranks outside ``task`` wait at the barriers)."""
    import torch
    import torch.distributed as dist

    from ..planning.planner import plan
    from ..runtime import reshard

    tiny = tiny_task(task)
    p = plan(tiny, strategy="send_recv")
    box = tiny.src_box(rank)
    local = torch.zeros(box_shape(box), dtype=torch.int32) if box else None
    spans = []
    for i in range(CALL_RUNS + 1):
        dist.barrier()
        t0 = time.monotonic()
        if rank in p.ranks:
            reshard(local, p, timeout=timeout)
        ends = torch.tensor([-t0, time.monotonic()], dtype=torch.float64)
        if rank not in p.ranks:
            ends[:] = -math.inf
        dist.all_reduce(ends, op=dist.ReduceOp.MAX)
        if i:
            spans.append(float(ends[0] + ends[1]))
    return statistics.median(spans)
