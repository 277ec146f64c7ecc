"""Time of the plan check (``Plan.check``) on the largest planner case (simulator-free, no
processes).

    .venv/bin/python benchmarks/plan_check.py

The 64x8 -> 64x8 ``S01RR -> RS01R`` 4096x4096x64 float32 task (262,144 unit slices), planned by
``meshcast.plan`` on the ``h100x8`` preset and on ``Topology.uniform(256, 4, nic_gbps=10)`` (the
second takes minutes to plan; ``--skip-uniform`` leaves it out). For each plan: the check of a
fresh ``Plan`` object, best and worst of three; the same plan with its first operation removed
(refused); and ``plan.to_json()`` for scale (the runtime digests the JSON on every call).
"""

from __future__ import annotations

import argparse
import os
import time

import meshcast as mc


def _task() -> mc.ReshardTask:
    src = mc.Layout(mc.Mesh.from_range(0, (64, 8)), "S01RR")
    dst = mc.Layout(mc.Mesh.from_range(512, (64, 8)), "RS01R")
    return mc.ReshardTask((4096, 4096, 64), "float32", src, dst)


def _fresh(plan: mc.Plan, ops: tuple | None = None) -> mc.Plan:
    """The same plan as a new object (no verdict kept yet)."""
    return mc.Plan(plan.task, plan.ops if ops is None else ops, plan.strategy, plan.balance,
                   plan.topology)


def measure(name: str, topology: mc.Topology) -> None:
    clock = time.perf_counter
    t0 = clock()
    plan = mc.plan(_task(), topology)
    print(f"{name}: mc.plan {clock() - t0:.2f} s, {len(plan.ops)} operations", flush=True)
    times = []
    for _ in range(3):
        p = _fresh(plan)
        t0 = clock()
        p.check()
        times.append(clock() - t0)
    t0 = clock()
    p.check()  # the verdict is kept
    again = clock() - t0
    broken = _fresh(plan, plan.ops[1:])
    t0 = clock()
    try:
        broken.check()
        raise AssertionError("a plan without its first operation passed the check")
    except ValueError as err:
        refused, why = clock() - t0, str(err)
    t0 = clock()
    plan.to_json()
    json_s = clock() - t0
    print(f"  check {min(times):.2f}-{max(times):.2f} s (again on the same object "
          f"{again * 1e6:.1f} us); first op removed: refused in {refused:.2f} s; "
          f"to_json {json_s:.2f} s", flush=True)
    print(f"  {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-uniform", action="store_true", help="only the h100x8 plan")
    args = parser.parse_args()
    print(os.popen("uptime").read().strip())
    measure("h100x8 preset", mc.Topology.preset("h100x8", 128))
    if not args.skip_uniform:
        measure("Topology.uniform(256, 4)", mc.Topology.uniform(256, 4, nic_gbps=10))
    print(os.popen("uptime").read().strip())


if __name__ == "__main__":
    main()
