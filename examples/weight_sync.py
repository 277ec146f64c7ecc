"""RL-style weight sync: a GPT's weights from a training layout to an inference layout.

Training: 2 pipeline stages x tensor-parallel 2 on ranks 0-3. Inference: tensor-parallel 4 on
ranks 4-7. Two ranks per emulated host (4 hosts, NICs shaped to --nic-gbit; needs root, else
loopback and it says so). Every weight is checked byte for byte; the time per sync is compared
with the joint lower bound (the busiest host NIC's inbound bytes at line rate).

    .venv/bin/python examples/weight_sync.py                 # as root: emulated cluster
    .venv/bin/python examples/weight_sync.py --loopback       # anywhere
"""

from __future__ import annotations

import argparse
import time

import meshcast
from meshcast.cluster import run_on_emulated_hosts
from meshcast.interop.weights import gpt_weight_tasks


def model_and_layouts(layers: int, embd: int, vocab: int):
    """The full model (same on every rank: seeded) and one ReshardTask per weight."""
    from meshcast.models.gpt import GPT, GPTConfig, split_layers

    config = GPTConfig(vocab_size=vocab, block_size=64, n_layer=layers, n_head=8, n_embd=embd)
    sd = {k: v.detach() for k, v in GPT(config, seed=0).state_dict().items()}
    params = {k: (tuple(v.shape), str(v.dtype)) for k, v in sd.items()}
    train = [meshcast.Mesh([0, 1]), meshcast.Mesh([2, 3])]  # stage s: TP group of 2
    infer = meshcast.Mesh([4, 5, 6, 7])  # one TP group of 4
    return sd, gpt_weight_tasks(params, train, split_layers(layers, 2), infer)


def worker(rank: int, layers: int, embd: int, vocab: int, reps: int) -> dict:
    """One rank: hold the training shards, sync `reps` times, check what arrived."""
    import torch
    import torch.distributed as dist

    sd, layouts = model_and_layouts(layers, embd, vocab)
    # what a trainer rank holds: its shard of each weight of its stage
    shards = {n: meshcast.shard_of(sd[n], t.src_region(rank)) for n, t in layouts.items()
              if t.src_region(rank) is not None}
    times = []
    for i in range(reps + 1):  # the first call plans (cached afterwards) and connects
        dist.barrier()
        t0 = time.perf_counter()
        received = meshcast.reshard_state_dict(shards, layouts)
        dist.barrier()
        if i:
            times.append(time.perf_counter() - t0)
    wrong = [n for n, t in layouts.items() if t.dst_region(rank) is not None
             and not torch.equal(received[n], meshcast.shard_of(sd[n], t.dst_region(rank)))]
    return {"times": times, "wrong": wrong, "received": len(received),
            "cache": meshcast.plan_cache_info()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--embd", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nic-gbit", type=float, default=1.0)
    parser.add_argument("--loopback", action="store_true")
    args = parser.parse_args()

    from meshcast.bench.weight_sync import joint_lower_bound

    sd, layouts = model_and_layouts(args.layers, args.embd, args.vocab)
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    topo = meshcast.Topology.uniform(4, 2, nic_gbps=args.nic_gbit, latency_us=0.0)
    bound = joint_lower_bound(list(layouts.values()), topo)
    plans = meshcast.plan_many(list(layouts.values()), topo)
    inbound = sum(p.cross_host_bytes() for p in plans)
    results, where = run_on_emulated_hosts(
        worker, 8, 2, nic_gbit=args.nic_gbit, loopback=args.loopback,
        args=(args.layers, args.embd, args.vocab, args.reps),
    )
    wrong = sorted({n for r in results for n in r["wrong"]})
    assert not wrong, f"wrong weights: {wrong}"
    assert all(r["received"] == len(layouts) for r in results[4:])
    assert all(r["cache"]["misses"] == 1 for r in results)  # planned once, then cache hits
    t = sorted(max(r["times"][i] for r in results) for i in range(args.reps))[args.reps // 2]
    print(f"ran on: {where}")
    print(f"model: {len(layouts)} tensors, {nbytes / 2**20:.1f} MiB; "
          f"{inbound / 2**20:.1f} MiB cross hosts (plan)")
    print("every weight checked byte for byte on ranks 4-7; plans made once, then cached")
    print(f"time per sync: {t * 1e3:.1f} ms (median of {args.reps}); "
          f"lower bound {bound * 1e3:.1f} ms; efficiency {bound / t:.0%}")
    print(f"effective bandwidth: {inbound * 8 / t / 1e9:.2f} Gbit/s across hosts, into 2 "
          f"receiving hosts of {args.nic_gbit:g} Gbit/s each "
          f"(at the bound: {inbound * 8 / bound / 1e9:.2f} Gbit/s)")


if __name__ == "__main__":
    main()
