"""The resharding benchmark's methods: which apply to a case, the plans of the meshcast methods,
the steps of the gather-scatter baseline, and the bandwidth model of the two baselines."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..core.boxes import Box, box_shape, box_size
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..core.units import GBIT
from ..planning.planner import plan as make_plan
from .reshard_cases import BASELINES, METHODS, BenchCase


def _box_inside(inner: Box, outer: Box) -> bool:
    return all(o.start <= i.start and i.stop <= o.stop for i, o in zip(inner, outer))


def gather_steps(task: ReshardTask) -> list[list[tuple[tuple[int, ...], tuple[Box, ...], Box]]]:
    """The all-gathers of ``full_tensor()`` on the source mesh: per sharded mesh axis (last
    first), the lines of the mesh along it as (members, each member's box, the union box).

    Raises ``ValueError`` when the parts are unequal (gloo's all-gather needs equal sizes) or do
    not tile their union."""
    mesh = task.src.mesh
    arr = np.asarray(mesh.devices).reshape(mesh.shape)
    full = tuple(slice(0, n) for n in task.shape)
    boxes = {r: task.src.box(r, task.shape) for r in mesh.devices}
    steps = []
    for axis in reversed(range(arr.ndim)):
        lines = np.moveaxis(arr, axis, -1).reshape(-1, arr.shape[axis])
        step = []
        for line in lines:
            members = tuple(int(r) for r in line)
            parts = tuple(boxes[r] for r in members)
            distinct = {tuple((s.start, s.stop) for s in b) for b in parts}  # slices: unhashable
            if len(distinct) == 1:
                continue  # replicated along this axis: nothing to gather
            if len(distinct) != len(parts):
                raise ValueError("a mesh line mixes replicas and shards")
            shapes = {box_shape(b) for b in parts}
            if len(shapes) != 1:
                raise ValueError("uneven shards: gloo's all-gather needs equal parts")
            union = tuple(
                slice(min(b[d].start for b in parts), max(b[d].stop for b in parts))
                for d in range(len(task.shape))
            )
            if sum(box_size(b) for b in parts) != box_size(union):
                raise ValueError("the shards of a mesh line do not tile a box")
            step.append((members, parts, union))
            for r in members:
                boxes[r] = union
        if step:
            steps.append(step)
    if any(boxes[r] != full for r in mesh.devices):
        raise ValueError("the all-gathers do not assemble the full tensor")
    return steps


def applies(case: BenchCase, method: str) -> str | None:
    """Why ``method`` does not apply to ``case`` (None: it applies)."""
    task = case.task
    if method == "per-rank-p2p":
        if task.src.mesh.shape != task.dst.mesh.shape:
            return (
                f"meshes differ ({task.src.mesh.notation()} -> {task.dst.mesh.notation()}): "
                "no matching destination rank"
            )
        for s, d in zip(task.src.mesh.devices, task.dst.mesh.devices):
            if not _box_inside(task.dst_box(d), task.src_box(s)):
                return "a destination shard is not inside the matching source shard"
        return None
    if method == "gather-scatter":
        try:
            gather_steps(task)
        except ValueError as exc:
            return str(exc)
        return None
    if method not in METHODS:
        raise ValueError(f"method {method!r} is unknown; choose from {', '.join(METHODS)}")
    return None


def build_plans(
    task: ReshardTask, topology: Topology, methods: Sequence[str]
) -> tuple[dict[str, Plan], dict[str, str]]:
    """Plans of the meshcast methods among ``methods``, and ``{method: earlier method}`` for
    methods whose plan equals an earlier one's (run once, reported for both)."""
    plans: dict[str, Plan] = {}
    same: dict[str, str] = {}
    for m in methods:
        if m in BASELINES:
            continue
        if m == "auto":
            p = make_plan(task, topology)
        else:
            strategy, balance = m.split("/")
            p = make_plan(task, topology, strategy=strategy, balance=balance)
        for earlier, q in plans.items():
            if earlier not in same and q.ops == p.ops:
                same[m] = earlier
                break
        plans[m] = p
    return plans, same


# -- the bandwidth model of the baselines (the simulator cannot express them as plans) -----------
def baseline_model(case: BenchCase, method: str, topology: Topology) -> tuple[float, int]:
    """(seconds, bytes across hosts) of a baseline in a bandwidth model: each phase takes its
    busiest NIC direction's bytes at the NIC rate (intra-host copies at ``intra_gbps``, per
    receiving rank), plus one latency; gather-scatter's phases (each all-gather axis, then the
    sends) run one after another."""
    task = case.task
    host_of = topology.host_of
    nic = topology.nic_in_gbps[0] * GBIT
    intra = topology.intra_gbps * GBIT
    lat = topology.latency_us * 1e-6
    item = task.itemsize
    across = 0

    def phase(flows: list[tuple[int, int, int]]) -> float:
        nonlocal across
        out = np.zeros(topology.num_hosts)
        inn = np.zeros(topology.num_hosts)
        per_rank: dict[int, int] = {}
        for s, d, nbytes in flows:
            if host_of(s) != host_of(d):
                out[host_of(s)] += nbytes
                inn[host_of(d)] += nbytes
                across += nbytes
            else:
                per_rank[d] = per_rank.get(d, 0) + nbytes
        local = max(per_rank.values(), default=0) / intra
        return lat + max(float(max(out.max(), inn.max())) / nic, local)

    if method == "per-rank-p2p":
        flows = [
            (s, d, box_size(task.src_box(s)) * item)
            for s, d in zip(task.src.mesh.devices, task.dst.mesh.devices)
        ]
        return phase(flows), across
    if method != "gather-scatter":
        raise ValueError(f"{method!r} is not a baseline")
    total = 0.0
    for step in gather_steps(task):
        flows = []
        for members, parts, _ in step:
            for m, b in zip(members, parts):
                flows += [(m, o, box_size(b) * item) for o in members if o != m]
        total += phase(flows)
    root = task.src.mesh.devices[0]
    total += phase([(root, d, task.nbytes) for d in task.dst.mesh.devices])
    return total, across


def baseline_model_s(case: BenchCase, method: str, topology: Topology) -> float:
    """Seconds of :func:`baseline_model`."""
    return baseline_model(case, method, topology)[0]
