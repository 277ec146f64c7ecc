"""Per-rank work: ``meshcast.rank_plan`` (one rank's operations) against ``meshcast.plan`` (every
rank's) on the 64x8 -> 64x8 task of "Planner speed" (4096 x 4096 x 64 float32, 262,144 unit
slices) on ``Topology.preset("h100x8", 128)``, where the certified Latin-square path applies;
``--hosts 512``: the same family on 512x8 -> 512x8 ranks (32768 x 32768 x 64, 16.8 M slices).

    .venv/bin/python benchmarks/rank_plan.py [--hosts 64] [--ranks N] [--methods plan,rank_plan]

Each figure comes from a fresh process (a fresh task, empty caches, after the imports):

* ``plan``: ``meshcast.plan(task, topo, cache=False)``, its operations and the ``tracemalloc``
  peak and retained bytes (the plan and the task's decomposition) of that call;
* ``rank_plan``: the first call (rank 0: the task's decomposition, the lower bound and the
  certificate, then rank 0's operations), then ``--ranks`` more ranks (default all 1,023
  others) one after another (mean per rank), the operations of rank 0 and the ``tracemalloc``
  peak and retained bytes of the first call;
* ``as JSON``: the size of the operations returned (``op_to_json`` of each, one JSON list);
* ``max RSS``: the most memory the timing process held (``ru_maxrss``: imports, the task's
  decomposition and everything the call built).

Memory is measured in a second process per method (``tracemalloc`` slows the calls). The
machine is shared: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc

import meshcast as mc
from meshcast.core.ops import op_to_json


def task_and_topology(hosts: int) -> tuple[mc.ReshardTask, mc.Topology]:
    """The ``hosts`` x 8 all-to-all task and its ``2 * hosts`` ``h100x8`` hosts."""
    n = hosts * 8
    src = mc.Layout(mc.Mesh.from_range(0, (hosts, 8)), "S01RR")
    dst = mc.Layout(mc.Mesh.from_range(n, (hosts, 8)), "RS01R")
    task = mc.ReshardTask((n, n, 64), "float32", src, dst)
    return task, mc.Topology.preset("h100x8", 2 * hosts)


def _warm_up() -> None:
    """One small plan and rank_plan, so the first timed call pays no import."""
    src = mc.Layout(mc.Mesh.from_range(0, (2, 4)), "S0RR")
    dst = mc.Layout(mc.Mesh.from_range(8, (2, 4)), "RRS0")
    task = mc.ReshardTask((64, 64, 8), "float32", src, dst)
    mc.rank_plan(task, None, 0)
    mc.clear_caches()


def measure(method: str, memory: bool, ranks: int, hosts: int) -> dict[str, float]:
    """One method's figures in this process (``memory``: the tracemalloc pass only)."""
    _warm_up()
    task, topo = task_and_topology(hosts)
    if memory:
        tracemalloc.start()
    t = time.perf_counter()
    out = (mc.plan(task, topo, cache=False).ops if method == "plan"
           else mc.rank_plan(task, topo, 0))
    first = time.perf_counter() - t
    if memory:
        retained, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {"peak_mib": peak / 2**20, "retained_mib": retained / 2**20}
    res = {"first_s": first, "ops": len(out),
           "json_kib": len(json.dumps([op_to_json(op) for op in out])) / 1024,
           "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if method == "rank_plan":
        t = time.perf_counter()
        for r in range(1, ranks + 1):
            mc.rank_plan(task, topo, r)
        res["per_rank_ms"] = (time.perf_counter() - t) / max(ranks, 1) * 1e3
    return res


def main() -> None:
    """Run every measurement in its own process and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=1023, help="ranks after the first (mean)")
    ap.add_argument("--hosts", type=int, default=64, help="source hosts of 8 ranks (and dest.)")
    ap.add_argument("--methods", default="plan,rank_plan", help="comma-separated")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        method, memory = args.child[0], args.child[1] == "memory"
        print(json.dumps(measure(method, memory, args.ranks, args.hosts)))
        return
    methods = args.methods.split(",")
    if not methods or not set(methods) <= {"plan", "rank_plan"}:
        ap.error(f"--methods: a comma-separated list of plan, rank_plan; got {args.methods!r}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows: dict[str, dict[str, float]] = {}
    for method in methods:
        rows[method] = {}
        for part in ("time", "memory"):
            cmd = [sys.executable, __file__, "--ranks", str(args.ranks), "--hosts",
                   str(args.hosts), "--child", method, part]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            rows[method].update(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("| call | first call s | then per rank ms | operations | as JSON KiB | peak MiB "
          "| retained MiB | max RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for method, r in rows.items():
        per = f"{r['per_rank_ms']:.2f}" if "per_rank_ms" in r else "-"
        print(f"| {method} | {r['first_s']:.3f} | {per} | {r['ops']:,} | {r['json_kib']:,.0f} "
              f"| {r['peak_mib']:.1f} "
              f"| {r['retained_mib']:.1f} | {r['maxrss_mib']:.0f} |")


if __name__ == "__main__":
    main()
