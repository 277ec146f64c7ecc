"""The planner-quality benchmark: a seeded suite of random tasks (meshes up to 8 hosts x 8
devices, random layouts, shapes and dtypes; hosts are mesh rows with the links of a preset) plus
the eight paper cases, each planned with every (strategy, balance) of :data:`METHODS` and scored as
``simulate(plan).time_s / lower_bound``. ``meshcast bench planner`` prints :func:`measure_suite`.
The suite is the one tests/test_plan_identity.py pins: :func:`random_task` must keep drawing the
same sequence from a seeded generator."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.cases import PAPER_CASES
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask
from ..core.topology import PRESETS, Topology
from ..estimate.lower_bound import lower_bound
from ..estimate.simulate import simulate
from ..planning.planner import plan

__all__ = [
    "METHODS",
    "SuiteScores",
    "geomean",
    "measure_suite",
    "mesh_rows_topology",
    "random_task",
    "suite_rows",
]

METHODS: tuple[tuple[str | None, str], ...] = (
    ("send_recv", "none"),
    ("allgather", "none"),
    ("broadcast", "none"),
    ("broadcast", "size"),
    ("broadcast", "order"),
    (None, "auto"),
)
"""(strategy, balance) pairs measured; ``None`` = auto chooses the strategy."""


def _spec(rng: np.random.Generator, mesh_ndim: int, ndim: int) -> str:
    dims: list[list[int]] = [[] for _ in range(ndim)]
    for axis in rng.permutation(mesh_ndim).tolist():
        target = int(rng.integers(-1, ndim))
        if target >= 0:
            dims[target].append(axis)
    return "".join("S" + "".join(map(str, d)) if d else "R" for d in dims)


def random_task(rng: np.random.Generator) -> ReshardTask:
    """One random task: two disjoint (hosts, devices) meshes of at most 8 x 8."""
    ndim = int(rng.integers(1, 4))
    dtype = str(rng.choice(["int32", "float32", "bfloat16"]))
    log_elems = rng.uniform(16, 27)  # 64 Ki .. 128 Mi elements
    per_dim = [rng.uniform(0.5, 1.5) for _ in range(ndim)]
    scale = log_elems / sum(per_dim)
    shape = tuple(max(1, int(2 ** (p * scale))) for p in per_dim)
    meshes = []
    start = 0
    for _ in range(2):
        shape_m = (int(rng.integers(1, 9)), int(rng.choice([1, 2, 4, 8])))
        meshes.append(Mesh.from_range(start, shape_m))
        start += math.prod(shape_m)
    src = Layout(meshes[0], _spec(rng, 2, ndim))
    dst = Layout(meshes[1], _spec(rng, 2, ndim))
    return ReshardTask(shape, dtype, src, dst)


def mesh_rows_topology(task: ReshardTask, preset: str) -> Topology:
    """The topology of ``task`` whose hosts are its meshes' rows, with the links of ``preset``."""
    _, _, nic, intra, lat = PRESETS[preset]
    return Topology.from_meshes(
        task.src.mesh,
        task.dst.mesh,
        nic_in_gbps=nic,
        nic_out_gbps=nic,
        intra_gbps=intra,
        latency_us=lat,
        name=preset,
    )


def geomean(values: list[float]) -> float:
    """Geometric mean (NaN of no values)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def suite_rows(tasks: int, seed: int, preset: str
               ) -> list[tuple[str, ReshardTask, Topology, bool]]:
    """(name, task, topology, is a paper case) of ``tasks`` random tasks drawn from ``seed``, then
    the paper cases on as many ``preset`` hosts as they need."""
    rng = np.random.default_rng(seed)
    suite = [(f"random{i}", random_task(rng)) for i in range(tasks)]
    dph = PRESETS[preset][0]
    rows = [(name, task, mesh_rows_topology(task, preset), False) for name, task in suite]
    for case in PAPER_CASES:
        task = case.task()
        hosts = (max(task.dst.mesh.devices) // dph) + 1
        rows.append((case.name, task, Topology.preset(preset, hosts), True))
    return rows


@dataclass
class SuiteScores:
    """Simulated / lower bound per method label (``strategy/balance``), for the random tasks
    and the paper cases apart; planning seconds per label; (ratio, task) of auto for each task."""

    ratios: dict[str, list[float]] = field(default_factory=dict)
    paper_ratios: dict[str, list[float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    worst: list[tuple[float, str]] = field(default_factory=list)


def measure_suite(rows: list[tuple[str, ReshardTask, Topology, bool]],
                  advance: Callable[[int], None] | None = None) -> SuiteScores:
    """Plan every row with every method of :data:`METHODS`, simulate, score; ``advance(1)``
    after each row."""
    scores = SuiteScores()
    for name, task, topo, is_paper in rows:
        lb = lower_bound(task, topo)
        for strategy, balance in METHODS:
            label = f"{strategy or 'any'}/{balance}"
            t0 = time.perf_counter()
            p = plan(task, topo, strategy=strategy, balance=balance)
            scores.seconds[label] = scores.seconds.get(label, 0.0) + time.perf_counter() - t0
            sim = simulate(p, topo).time_s
            ratio = sim / lb if lb > 0 else 1.0
            (scores.paper_ratios if is_paper else scores.ratios).setdefault(label, []).append(ratio)
            if balance == "auto":
                scores.worst.append((ratio, f"{name}: {task.describe()}"))
        if advance:
            advance(1)
    return scores
