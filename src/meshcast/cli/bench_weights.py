"""``meshcast bench weights``: RL-style weight sync, meshcast against what trainers do today.

A GPT's weights move from a training layout (2 pipeline stages x tensor-parallel 2, ranks 0-3)
to an inference layout (tensor-parallel 4, ranks 4-7), 2 ranks per emulated host, on the emulated
cluster (root) or loopback. Methods, each in a fresh job:

* ``meshcast``: :func:`meshcast.reshard_state_dict` (joint plan, buckets, packed messages);
* ``gather-broadcast``: every training rank sends its shards to rank 0, which assembles each
  full tensor and broadcasts it to the inference ranks, which slice their shard (several RL
  trainers do this);
* ``full-tensor``: per tensor, the stage's ranks all-gather it (DTensor ``full_tensor()``), the
  stage's first rank sends the full tensor to every inference rank, which slices its shard.

Reported: time per sync (median of ``--reps``, slowest rank), bytes across hosts (NIC counters of
the emulated hosts; loopback: n/a), peak extra memory of the busiest rank (VmHWM during the
syncs minus VmRSS before), and the joint lower bound. Every result is checked byte for byte.
``--jobs 2``: a trainer job and an engine job launched separately (bench_weight_jobs.py).
A benchmark, not a test: it prints figures. The library code is in
:mod:`meshcast.bench.weight_sync`; this module parses arguments and prints.
"""

from __future__ import annotations

import argparse
import sys

from ..bench.weight_jobs import METHODS as JOB_METHODS
from ..bench.weight_sync import METHODS, N_HEAD, build, joint_lower_bound, summarise, weights_worker
from .common import comma_list, integer, number, working

__all__ = ["add_arguments", "joint_lower_bound", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast bench weights``."""
    parser.add_argument("--layers", type=integer(1), default=8, help="GPT blocks (default 8)")
    parser.add_argument("--embd", type=_embd, default=256,
                        help=f"hidden size, a multiple of {N_HEAD} (default 256)")
    parser.add_argument("--vocab", type=integer(1), default=4096,
                        help="vocabulary (default 4096)")
    parser.add_argument("--nic-gbit", type=number(0.0), default=1.0, help="emulated NIC rate")
    parser.add_argument("--reps", type=integer(1), default=3, help="timed syncs per method")
    parser.add_argument("--methods", type=comma_list(JOB_METHODS), default=None,
                        help="comma-separated: " + ",".join(JOB_METHODS) + " (tp-broadcast, "
                             "meshcast-fp8: --jobs 2 only; default all)")
    parser.add_argument("--loopback", action="store_true", help="no emulated cluster")
    parser.add_argument("--jobs", type=integer(1, 2), default=1,
                        help="1: one job of 8 ranks (reshard_state_dict); 2: a trainer job and "
                             "an engine job launched separately (meshcast.WeightSync)")
    parser.add_argument("--size", type=number(0.0), default=1536.0,
                        help="--jobs 2: model size in MiB of bfloat16 (default 1536)")
    parser.add_argument("--bucket-mib", type=integer(1), default=64,
                        help="--jobs 2: meshcast's bucket_bytes in MiB (default 64)")


def _embd(text: str) -> int:
    value = integer(N_HEAD)(text)
    if value % N_HEAD:
        raise argparse.ArgumentTypeError(f"must be a multiple of {N_HEAD} (heads), got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Run every method in its own job and print the comparison."""
    if args.jobs == 2:
        from .bench_weight_jobs import run_two

        return run_two(args)
    from ..cluster.job import run_on_emulated_hosts
    from ..core.topology import Topology

    cfg = {"layers": args.layers, "embd": args.embd, "vocab": args.vocab}
    methods = args.methods or list(METHODS)
    if any(m not in METHODS for m in methods):
        print(f"meshcast bench weights: error: --methods: {', '.join(METHODS)} with --jobs 1",
              file=sys.stderr)
        return 2
    import torch  # noqa: F401  (fail early without torch)

    _, tasks = build(cfg)
    topo = Topology.uniform(4, 2, nic_gbps=args.nic_gbit, latency_us=0.0)
    bound = joint_lower_bound(list(tasks.values()), topo)
    rows = []
    where = ""
    for k, m in enumerate(methods):
        with working(f"meshcast bench weights: {m} ({k + 1}/{len(methods)}), 8 ranks"):
            results, where = run_on_emulated_hosts(
                weights_worker, 8, 2, nic_gbit=args.nic_gbit, args=(m, cfg, args.reps),
                timeout=600, loopback=args.loopback,
            )
        rows.append(summarise(m, results, args.reps))
    model = rows[0][4]
    print(f"model: GPT {args.layers} layers, n_embd {args.embd}, vocab {args.vocab}: "
          f"{model / 2**20:.1f} MiB float32, {len(tasks)} tensors")
    print("train 2 stages x TP2 (ranks 0-3) -> inference TP4 (ranks 4-7), 2 ranks per host")
    print(f"ran on: {where}")
    print(f"joint lower bound at {args.nic_gbit:g} Gbit/s NICs: {bound * 1e3:.1f} ms")
    print(f"{'method':<18}{'time ms':>10}{'x bound':>9}{'MiB across hosts':>18}"
          f"{'peak extra MiB':>16}")
    for m, t, nic, peak, _ in rows:
        nic_text = f"{nic / 2**20:.1f}" if nic is not None else "n/a"
        print(f"{m:<18}{t * 1e3:>10.1f}{t / bound:>9.2f}{nic_text:>18}{peak / 2**20:>16.1f}")
    print("all weights checked byte for byte")
    return 0
