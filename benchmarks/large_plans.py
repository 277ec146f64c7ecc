"""The vectorised plans of ``auto`` on NICs shared by several ranks (simulator only, no processes).

    .venv/bin/python benchmarks/large_plans.py [--skip-large]

1. Phased order vs Latin-square rounds: every source rank sends one slice to every destination
   rank (``S01RR -> RS01R``, 12 x 8 ranks each side, so 9,216 slices), on
   ``Topology.uniform`` clusters with 2, 3, 4 or 8 ranks per host, 1 or 2 NICs per host, 1-100
   Gbit/s NICs and 30 us start-up. Prints simulated time / lower bound of both orders of
   ``meshcast.planning.large.large_plan`` (and the phased order's groups per NIC, as the cost
   model picks them where it applies), which of them the large path of ``auto`` builds
   (``prune=True``), and checks the phased plan's data exactly.
2. The 64x8 -> 64x8 case of the planner-speed target (4096 x 4096 x 64 float32, 262,144 slices)
   on ``Topology.uniform(256, 4, nic_gbps=10)`` (four ranks per NIC, so no certificate): the time
   ``meshcast.plan`` takes and the plan it keeps, then the parts timed one by one, and the
   ``tracemalloc`` peak of ``meshcast.plan``. Slow (about a minute); ``--skip-large`` leaves it
   out.

Planning times on a shared machine are noisy; the ratios are deterministic.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

import meshcast as mc
from meshcast.planning.floors import first_holder_floor
from meshcast.planning.large import large_plan
from meshcast.planning.phased import phase_model


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
        pruned = large_plan(task, topo, prune=True)
        kept = "both" if pruned.rounds is not None and pruned.phased is not None else (
            "phased" if pruned.phased is not None else "latin")
        slice_s = np.prod(shape) * 4 / (n_src * n_dst * 64) / (gbps * 1e9 / 8)
        groups = phase_model(per_host // nics, max(n_src, n_dst) * 8, 30e-6, slice_s)[0]
        print(head, f"phased {mc.simulate(phased).time_s / bound:.3f} ({groups} groups),"
              f" latin {mc.simulate(latin).time_s / bound:.3f}; large path builds {kept}")


def large_case() -> None:
    print("64x8 -> 64x8 S01RR -> RS01R, 4096x4096x64 float32, Topology.uniform(256, 4)")
    task = all_to_all(64, 64, (4096, 4096, 64))
    topo = mc.Topology.uniform(256, 4, nic_gbps=10)
    clock = time.perf_counter
    t0 = clock()
    kept = mc.plan(task, topo, cache=False)
    print(f"  mc.plan: {clock() - t0:.1f} s, {len(kept.ops)} operations")
    t0 = clock()
    pruned = large_plan(task, topo, prune=True)
    t1 = clock()
    bound = mc.lower_bound(task, topo)
    t2 = clock()
    built = pruned.phased if pruned.phased is not None else pruned.rounds
    t_built = mc.simulate(built, topo).time_s
    t3 = clock()
    floor = first_holder_floor(task, topo)
    t4 = clock()
    order = mc.plan(task, topo, strategy="send_recv", balance="order", cache=False)
    t5 = clock()
    order_floor = mc.time_floor(order, topo)
    t6 = clock()
    which = "phased" if pruned.phased is not None else "rounds"
    print(f"  large plans (pruned: {which} only: {pruned.rounds is None or pruned.phased is None})"
          f" {t1 - t0:.1f} s, bound {t2 - t1:.1f} s, its simulation {t3 - t2:.1f} s"
          f" ({t_built / bound:.3f} x bound; kept: {kept.ops == built.ops});"
          f" first-holder floor {floor / bound:.3f} x bound ({t4 - t3:.1f} s, plan not built);"
          f" order plan {t5 - t4:.1f} s, its floor {order_floor / bound:.3f} x bound"
          f" ({t6 - t5:.1f} s)")
    tracemalloc.start()
    mc.plan(task, topo, cache=False)
    print(f"  tracemalloc peak of mc.plan: {tracemalloc.get_traced_memory()[1] / 2**20:.0f} MiB")
    tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-large", action="store_true", help="leave out the 262k case")
    args = parser.parse_args()
    compare_orders()
    if not args.skip_large:
        large_case()


if __name__ == "__main__":
    main()
