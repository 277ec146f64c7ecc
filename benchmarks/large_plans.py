"""The vectorised plans of ``auto`` on NICs shared by several ranks (simulator only, no processes).

    .venv/bin/python benchmarks/large_plans.py [--skip-large]

1. Phased order vs Latin-square rounds: every source rank sends one slice to every destination
   rank (``S01RR -> RS01R``, 12 x 8 ranks each side, so 9,216 slices), on
   ``Topology.uniform`` clusters with 2, 3, 4 or 8 ranks per host, 1 or 2 NICs per host, 1-100
   Gbit/s NICs and 30 us start-up. Prints simulated time / lower bound of both orders of
   ``meshcast.planning.large.large_plan`` and checks the phased plan's data exactly.
2. The 64x8 -> 64x8 case of the planner-speed target (4096 x 4096 x 64 float32, 262,144 slices)
   on ``Topology.uniform(256, 4, nic_gbps=10)`` (four ranks per NIC, so no certificate): the time
   ``meshcast.plan`` takes and the plan it keeps, then the parts timed one by one. Slow (about
   a minute); ``--skip-large`` leaves it out.

Planning times on a shared machine are noisy; the ratios are deterministic.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import meshcast as mc
from meshcast.planning.large import large_plan


def all_to_all(n_src: int, n_dst: int, shape: tuple[int, ...]) -> mc.ReshardTask:
    """Every rank of an ``n_src x 8`` mesh sends one slice to every rank of ``n_dst x 8``."""
    src = mc.Layout(mc.Mesh.from_range(0, (n_src, 8)), "S01RR")
    dst = mc.Layout(mc.Mesh.from_range(n_src * 8, (n_dst, 8)), "RS01R")
    return mc.ReshardTask(shape, "float32", src, dst)


def compare_orders() -> None:
    print("phased order vs Latin-square rounds (simulated / lower bound)")
    configs = [  # (source hosts of 8, destination hosts of 8, ranks per host, NICs, Gbit/s, shape)
        (12, 12, 4, 1, 10, (768, 768, 64)),
        (12, 12, 2, 1, 10, (768, 768, 64)),
        (12, 12, 8, 1, 10, (768, 768, 64)),
        (12, 12, 8, 2, 10, (768, 768, 64)),
        (12, 10, 4, 1, 10, (768, 640, 64)),
        (12, 12, 4, 1, 1, (768, 768, 64)),
        (12, 12, 4, 1, 100, (768, 768, 64)),
        (12, 12, 4, 1, 10, (768, 768, 8)),
        (12, 12, 4, 1, 10, (96, 96, 1)),
        (12, 12, 3, 1, 10, (768, 768, 64)),
    ]
    for n_src, n_dst, per_host, nics, gbps, shape in configs:
        task = all_to_all(n_src, n_dst, shape)
        topo = mc.Topology.uniform(
            (n_src + n_dst) * 8 // per_host, per_host, nic_gbps=gbps, nics_per_host=nics
        )
        bound = mc.lower_bound(task, topo)
        latin, _, phased = large_plan(task, topo)
        head = (f"  {n_src}x8 -> {n_dst}x8, {per_host} ranks/host, {nics} NIC(s) of {gbps} Gbit/s,"
                f" {shape}:")
        if phased is None:
            print(head, "no phased order (odd ranks per NIC)")
            continue
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        out = mc.gather(mc.execute_local(phased, mc.scatter(x, task.src)), task.dst, shape)
        assert np.array_equal(out, x)
        print(head, f"phased {mc.simulate(phased).time_s / bound:.3f},"
              f" latin {mc.simulate(latin).time_s / bound:.3f}")


def large_case() -> None:
    print("64x8 -> 64x8 S01RR -> RS01R, 4096x4096x64 float32, Topology.uniform(256, 4)")
    task = all_to_all(64, 64, (4096, 4096, 64))
    topo = mc.Topology.uniform(256, 4, nic_gbps=10)
    clock = time.perf_counter
    t0 = clock()
    kept = mc.plan(task, topo)
    print(f"  mc.plan: {clock() - t0:.1f} s, {len(kept.ops)} operations")
    t0 = clock()
    latin, _, phased = large_plan(task, topo)
    t1 = clock()
    bound = mc.lower_bound(task, topo)
    t2 = clock()
    t_latin = mc.simulate(latin, topo).time_s
    t3 = clock()
    t_phased = mc.simulate(phased, topo).time_s
    t4 = clock()
    print(f"  large plans {t1 - t0:.1f} s, bound {t2 - t1:.1f} s, simulations {t3 - t2:.1f} and"
          f" {t4 - t3:.1f} s; latin {t_latin / bound:.3f}, phased {t_phased / bound:.3f} x bound;"
          f" kept the phased plan: {kept.ops == phased.ops}")
    for b in ("none", "size", "order"):
        t0 = clock()
        p = mc.plan(task, topo, strategy="send_recv", balance=b)
        t1 = clock()
        floor = mc.time_floor(p, topo)
        print(f"  send_recv/{b}: built in {t1 - t0:.1f} s, time floor {floor / bound:.3f} x bound"
              f" ({clock() - t1:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-large", action="store_true", help="leave out the 262k case")
    args = parser.parse_args()
    compare_orders()
    if not args.skip_large:
        large_case()


if __name__ == "__main__":
    main()
