"""``meshcast bench weights --jobs 2``: weight sync between a trainer job and an inference-engine
job launched separately (:mod:`meshcast.bench.weight_jobs`), meshcast against what RL frameworks
do and against the joint lower bound. Prints figures; every engine weight is checked exactly."""

from __future__ import annotations

import argparse
import statistics

from ..bench.weight_fp8 import fp8_tasks
from ..bench.weight_jobs import METHODS, engine_layout, model_tasks, run_two_jobs, size_config
from ..core.topology import Topology
from ..estimate.lower_bound import joint_lower_bound
from .common import working

__all__ = ["run_two", "summary"]


def summary(method: str, ranks: list[dict], reps: int) -> tuple[float, int | None, int]:
    """(median time of a sync on the slowest rank, NIC bytes of all hosts per sync (None:
    unknown), peak extra memory of the busiest rank) of ``method``; raises on a wrong weight."""
    bad = sorted({n for r in ranks for n in r[method]["bad"]})
    if bad:
        raise RuntimeError(f"{method}: wrong weights {bad[:5]}")
    per_rep = [max(r[method]["times"][i] for r in ranks) for i in range(reps)]
    nics = [r[method]["nic"] for r in ranks if r[method]["nic"] is not None]
    return (statistics.median(per_rep), sum(nics) if nics else None,
            max(r[method]["peak"] for r in ranks))


def run_two(args: argparse.Namespace) -> int:
    """Run the two jobs and print the table."""
    cfg = {**size_config(args.size), "bucket_mib": args.bucket_mib}
    tasks = model_tasks(cfg)
    nbytes = sum(t.nbytes for t in tasks.values())
    topology = Topology.uniform(4, 2, nic_gbps=args.nic_gbit, latency_us=0.0)
    bound = joint_lower_bound(list(tasks.values()), topology)
    methods = args.methods or list(METHODS)
    bounds = {m: bound for m in methods}
    if "meshcast-fp8" in methods:  # its own bound: the bytes that cross in FP8
        engine = {n: engine_layout(t.dst) for n, t in tasks.items()}
        bounds["meshcast-fp8"] = joint_lower_bound(list(fp8_tasks(tasks, engine).values()),
                                                   topology)
    with working(f"meshcast bench weights --jobs 2: {len(methods)} methods, 4 + 4 ranks"):
        trainer, engine, where = run_two_jobs(methods, cfg, args.reps, args.nic_gbit,
                                              args.loopback)
    rows = {m: summary(m, trainer + engine, args.reps) for m in methods}
    print(f"model: GPT {cfg['layers']} layers, n_embd {cfg['embd']}, vocab {cfg['vocab']}: "
          f"{nbytes / 2**20:.1f} MiB bfloat16, {len(tasks)} tensors")
    print("trainer job: 2 stages x TP2 (4 ranks, hosts 0-1) -> engine job: TP4 (4 ranks, "
          "hosts 2-3); joined by meshcast.connect")
    print(f"ran on: {where}")
    print(f"joint lower bound at {args.nic_gbit:g} Gbit/s NICs: {bound * 1e3:.1f} ms"
          + (f" (meshcast-fp8: {bounds['meshcast-fp8'] * 1e3:.1f} ms, its bytes in FP8)"
             if "meshcast-fp8" in bounds else ""))
    base = rows[methods[0]][0]
    print(f"{'method':<18}{'time ms':>10}{'bound/t':>9}{'x ' + methods[0]:>12}"
          f"{'MiB across hosts':>18}{'peak extra MiB':>16}")
    for m in methods:
        t, nic, peak = rows[m]
        nic_text = f"{nic / 2**20:.1f}" if nic is not None else "n/a"
        print(f"{m:<18}{t * 1e3:>10.1f}{bounds[m] / t:>9.2f}{t / base:>12.2f}{nic_text:>18}"
              f"{peak / 2**20:>16.1f}")
    print("every engine weight checked exactly after the last sync of each method (meshcast-fp8:"
          " dequantized, within FP8's rounding; its bits are tested)")
    return 0
