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
A benchmark, not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import Any

from ..cluster import nic_tx_bytes
from .common import comma_list, integer, number, working

METHODS = ("meshcast", "gather-broadcast", "full-tensor")
N_HEAD = 8
"""Attention heads of the benchmark model (``--embd`` must be a multiple)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast bench weights``."""
    parser.add_argument("--layers", type=integer(1), default=8, help="GPT blocks (default 8)")
    parser.add_argument("--embd", type=_embd, default=256,
                        help=f"hidden size, a multiple of {N_HEAD} (default 256)")
    parser.add_argument("--vocab", type=integer(1), default=4096,
                        help="vocabulary (default 4096)")
    parser.add_argument("--nic-gbit", type=number(0.0), default=1.0, help="emulated NIC rate")
    parser.add_argument("--reps", type=integer(1), default=3, help="timed syncs per method")
    parser.add_argument("--methods", type=comma_list(METHODS), default=list(METHODS),
                        help="comma-separated: " + ",".join(METHODS))
    parser.add_argument("--loopback", action="store_true", help="no emulated cluster")


def _embd(text: str) -> int:
    value = integer(N_HEAD)(text)
    if value % N_HEAD:
        raise argparse.ArgumentTypeError(f"must be a multiple of {N_HEAD} (heads), got {text!r}")
    return value


# -- the model and its layouts (every rank builds the same) --------------------------------------
def build(cfg: dict[str, int]):
    """(full state dict, {name: ReshardTask}) of the benchmark model."""
    from ..core.mesh import Mesh
    from ..interop.weights import gpt_weight_tasks
    from ..models.gpt import GPT, GPTConfig, split_layers

    config = GPTConfig(vocab_size=cfg["vocab"], block_size=64, n_layer=cfg["layers"],
                       n_head=N_HEAD, n_embd=cfg["embd"])
    model = GPT(config, seed=0)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    params = {k: (tuple(v.shape), str(v.dtype)) for k, v in sd.items()}
    tasks = gpt_weight_tasks(params, [Mesh([0, 1]), Mesh([2, 3])],
                             split_layers(config.n_layer, 2), Mesh([4, 5, 6, 7]))
    return sd, tasks


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def weights_worker(rank: int, method: str, cfg: dict[str, int], reps: int) -> dict[str, Any]:
    """One rank of one method's job: returns its times, peak memory, NIC bytes and check."""
    import torch
    import torch.distributed as dist

    import meshcast

    sd, tasks = build(cfg)
    local = {n: sd[n][t.src_box(rank)].clone() for n, t in tasks.items()
             if t.src_box(rank) is not None}
    expect = {n: sd[n][t.dst_box(rank)].clone() for n, t in tasks.items()
              if t.dst_box(rank) is not None}
    src_of = {n: list(t.src.mesh.devices) for n, t in tasks.items()}
    nbytes = sum(sd[n].numel() * sd[n].element_size() for n in tasks)
    del sd
    gc.collect()
    infer = [4, 5, 6, 7]
    bcast_group = dist.new_group([0, *infer])  # every rank calls new_group, in the same order
    stage_groups = {tuple(m): dist.new_group(m) for m in ([0, 1], [2, 3])}

    def sync_meshcast() -> dict[str, torch.Tensor]:
        return meshcast.reshard_state_dict(local, tasks, timeout=300)

    def sync_gather_broadcast() -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, task in tasks.items():
            full = None
            if rank in (0, *infer):
                full = torch.empty(task.shape, dtype=getattr(torch, task.dtype))
            if rank == 0:
                works = []
                for r in src_of[name]:
                    box = task.src_box(r)
                    if r == 0:
                        full[box] = local[name]
                    else:
                        buf = torch.empty(tuple(b.stop - b.start for b in box),
                                          dtype=full.dtype)
                        works.append((dist.irecv(buf, src=r), box, buf))
                for w, box, buf in works:
                    w.wait()
                    full[box] = buf
            elif name in local:
                dist.send(local[name].contiguous(), dst=0)
            if full is not None:
                dist.broadcast(full, src=0, group=bcast_group)
                if rank in infer:
                    out[name] = full[task.dst_box(rank)].clone()
        return out

    def sync_full_tensor() -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, task in tasks.items():
            ranks = src_of[name]
            full = None
            if rank in ranks:
                parts = [torch.empty(tuple(b.stop - b.start for b in task.src_box(r)),
                                     dtype=local[name].dtype) for r in ranks]
                dist.all_gather(parts, local[name].contiguous(),
                                group=stage_groups[tuple(ranks)])
                full = torch.empty(task.shape, dtype=parts[0].dtype)
                for r, p in zip(ranks, parts):
                    full[task.src_box(r)] = p
                if rank == ranks[0]:
                    for w in [dist.isend(full, dst=r) for r in infer]:
                        w.wait()
            elif rank in infer:
                full = torch.empty(task.shape, dtype=getattr(torch, task.dtype))
                dist.recv(full, src=ranks[0])
                out[name] = full[task.dst_box(rank)].clone()
        return out

    fn = {"meshcast": sync_meshcast, "gather-broadcast": sync_gather_broadcast,
          "full-tensor": sync_full_tensor}[method]
    fn()  # warm-up: plans, process groups, connections
    dist.barrier()
    gc.collect()
    rss = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:
        pass
    tx0 = nic_tx_bytes()
    times = []
    out: dict[str, torch.Tensor] = {}
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        out = fn()
        dist.barrier()  # the sync is done when the slowest rank is done
        times.append(time.perf_counter() - t0)
    tx1 = nic_tx_bytes()
    peak = _status("VmHWM") - rss
    bad = [n for n in expect if n not in out or not torch.equal(
        out[n].view(torch.uint8) if out[n].dtype == torch.bool else out[n], expect[n])]
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    nic = (tx1 - tx0) // reps if (tx0 is not None and tx1 is not None and local_rank == 0) else 0
    return {"times": times, "peak": peak, "nic_bytes": nic, "bad": bad,
            "nic_known": tx0 is not None, "nbytes": nbytes}


def joint_lower_bound(tasks, topology) -> float:
    """Seconds no sync of ``tasks`` can beat: the busiest host NIC's inbound bytes of all tasks
    together (and no less than any one task's :func:`meshcast.lower_bound`)."""
    import numpy as np

    from ..estimate.lower_bound import lower_bound_details

    host_in = np.zeros(topology.num_hosts)
    single = 0.0
    for t in tasks:
        d = lower_bound_details(t, topology)
        host_in += d.host_in_bytes
        single = max(single, d.seconds)
    b_in = np.array(topology.nic_in_gbps) * np.array(topology.nics_per_host) * 1e9 / 8
    return max(float((host_in / b_in).max()) + topology.latency_us * 1e-6, single)


def run(args: argparse.Namespace) -> int:
    """Run every method in its own job and print the comparison."""
    from ..cluster.job import run_on_emulated_hosts
    from ..core.topology import Topology

    cfg = {"layers": args.layers, "embd": args.embd, "vocab": args.vocab}
    methods = args.methods
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
        bad = sorted({n for r in results for n in r["bad"]})
        if bad:
            raise RuntimeError(f"{m}: wrong weights {bad[:5]}")
        per_rep = [max(r["times"][i] for r in results) for i in range(args.reps)]
        t = statistics.median(per_rep)
        nic = sum(r["nic_bytes"] for r in results) if results[0]["nic_known"] else None
        rows.append((m, t, nic, max(r["peak"] for r in results), results[0]["nbytes"]))
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
