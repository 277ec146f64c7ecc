"""``meshcast bench planner``: plan quality, as simulated time / lower bound, per balance method.

A seeded suite of random tasks (meshes up to 8 hosts x 8 devices, random layouts, shapes and
dtypes; hosts are mesh rows with the links of the chosen preset) plus the eight paper cases on the
preset. For each method: geometric mean and worst of ``simulate(plan).time_s / lower_bound``.
A benchmark, not a test: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from ..core.cases import PAPER_CASES
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask
from ..core.topology import PRESETS, Topology
from ..estimate.lower_bound import lower_bound
from ..estimate.simulate import simulate
from ..planning.planner import plan
from .common import choice, integer, progress

METHODS: tuple[tuple[str | None, str], ...] = (
    ("send_recv", "none"),
    ("allgather", "none"),
    ("broadcast", "none"),
    ("broadcast", "size"),
    ("broadcast", "order"),
    (None, "auto"),
)
"""(strategy, balance) pairs measured; ``None`` = auto chooses the strategy."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast bench planner``."""
    parser.add_argument("--tasks", type=integer(0), default=200,
                        help="random tasks (default 200; 0: the paper cases only)")
    parser.add_argument("--seed", type=integer(0), default=0, help="suite seed (default 0)")
    parser.add_argument("--preset", type=choice(tuple(PRESETS)), default="p3.8xlarge",
                        help=" | ".join(PRESETS))
    parser.add_argument("--worst", type=integer(0), default=5,
                        help="list the N worst tasks of auto")


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


def topology_for(task: ReshardTask, preset: str) -> Topology:
    """Hosts = mesh rows, links of ``preset``."""
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


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def run(args: argparse.Namespace) -> int:
    """Run the suite and print the quality table."""
    rng = np.random.default_rng(args.seed)
    suite = [(f"random{i}", random_task(rng)) for i in range(args.tasks)]
    dph = PRESETS[args.preset][0]
    paper = []
    for case in PAPER_CASES:
        task = case.task()
        hosts = (max(task.dst.mesh.devices) // dph) + 1
        paper.append((case.name, task, Topology.preset(args.preset, hosts)))
    ratios: dict[str, list[float]] = {}
    paper_ratios: dict[str, list[float]] = {}
    worst: list[tuple[float, str]] = []
    seconds: dict[str, float] = {}
    rows = [(name, task, topology_for(task, args.preset), False) for name, task in suite]
    rows += [(name, task, topo, True) for name, task, topo in paper]
    with progress("meshcast bench planner: tasks planned", len(rows)) as advance:
        for name, task, topo, is_paper in rows:
            lb = lower_bound(task, topo)
            for strategy, balance in METHODS:
                label = f"{strategy or 'any'}/{balance}"
                t0 = time.perf_counter()
                p = plan(task, topo, strategy=strategy, balance=balance)
                seconds[label] = seconds.get(label, 0.0) + time.perf_counter() - t0
                sim = simulate(p, topo).time_s
                ratio = sim / lb if lb > 0 else 1.0
                (paper_ratios if is_paper else ratios).setdefault(label, []).append(ratio)
                if balance == "auto":
                    worst.append((ratio, f"{name}: {task.describe()}"))
            advance(1)
    print(f"suite: {args.tasks} random tasks (seed {args.seed}) + 8 paper cases, "
          f"preset {args.preset}")
    print(f"{'strategy/balance':<20} {'geomean':>8} {'worst':>8} {'paper max':>10} "
          f"{'plan s':>8} {'min':>7}")
    for label in paper_ratios:
        r, pr = ratios.get(label, []), paper_ratios[label]
        print(f"{label:<20} {_geomean(r):>8.3f} {max(r, default=float('nan')):>8.3f} "
              f"{max(pr):>10.3f} {seconds[label]:>8.1f} {min(r + pr):>7.3f}")
    print("(min: the smallest ratio of any task, paper cases included; below 1 would mean a plan "
          "beat the lower bound)")
    print("\npaper cases, simulated / lower bound:")
    print(f"{'case':<24}" + "".join(f"{lab:>16}" for lab in paper_ratios))
    for k, (name, _, _) in enumerate(paper):
        print(f"{name:<24}" + "".join(f"{v[k]:>16.3f}" for v in paper_ratios.values()))
    if args.worst:
        print(f"\nworst {args.worst} tasks for auto:")
        for ratio, what in sorted(worst, reverse=True)[: args.worst]:
            print(f"  {ratio:.3f}  {what}")
    return 0
