"""Whole-model resharding on real gloo processes: byte-exact, cached, bounded, clear errors.

One launched job (8 ranks, 4 emulated hosts of 2): a small GPT's weights move from 2 pipeline
stages x tensor-parallel 2 (ranks 0-3) to tensor-parallel 4 (ranks 4-7) and to an overlapping
mesh; the second call must plan nothing; small buckets keep staging under the bound; a DTensor
state dict moves in one call; bad inputs on one rank raise a ValueError on every rank naming the
tensor, and the job goes on (nothing hangs).
"""

from __future__ import annotations

import meshcast as mc

WORLD = 8


def _model_tasks(infer_first: int):
    import torch

    from meshcast.interop.weights import gpt_weight_tasks
    from meshcast.models.gpt import GPT, GPTConfig, split_layers

    config = GPTConfig(vocab_size=96, block_size=16, n_layer=4, n_head=4, n_embd=32)
    model = GPT(config, seed=0)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    sd["h.0.mlp.c_fc.weight"] = sd["h.0.mlp.c_fc.weight"].to(torch.bfloat16)  # mixed dtypes
    params = {k: (tuple(v.shape), str(v.dtype)) for k, v in sd.items()}
    stages = [mc.Mesh([0, 1]), mc.Mesh([2, 3])]
    tasks = gpt_weight_tasks(params, stages, split_layers(config.n_layer, 2),
                             mc.Mesh(list(range(infer_first, infer_first + 4))))
    return sd, tasks


def _shards(sd, tasks, rank: int) -> dict:
    out = {}
    for name, task in tasks.items():
        region = task.src_region(rank)
        if region is not None:
            out[name] = mc.shard_of(sd[name], region)
    return out


def _same(a, b) -> bool:
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    ) if a.numel() else a.shape == b.shape


def _state_dict_job(rank: int) -> list[str]:
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from meshcast.runtime.many import last_many_stats

    failures: list[str] = []

    def check(result: dict, sd: dict, tasks: dict, what: str) -> None:
        want = {n for n, t in tasks.items() if t.dst_region(rank) is not None}
        if set(result) != want:
            failures.append(f"{what}: rank {rank} got names {sorted(set(result) ^ want)} wrong")
        for name in want & set(result):
            if not _same(result[name], mc.shard_of(sd[name], tasks[name].dst_region(rank))):
                failures.append(f"{what}: {name} differs on rank {rank}")

    mc.clear_plan_cache()
    # 1. training (PP2 x TP2 on 0-3) -> inference TP4 on 4-7, twice: the second call plans nothing
    sd, tasks = _model_tasks(4)
    local = _shards(sd, tasks, rank)
    check(mc.reshard_state_dict(local, tasks, timeout=60), sd, tasks, "disjoint")
    before = mc.plan_cache_info()
    check(mc.reshard_state_dict(local, tasks, timeout=60), sd, tasks, "disjoint again")
    after = mc.plan_cache_info()
    if after["misses"] != before["misses"] or after["hits"] != before["hits"] + 1:
        failures.append(f"second call planned again: {before} -> {after}")

    # 2. overlapping destination (ranks 2-5), every strategy, small buckets
    sd2, tasks2 = _model_tasks(2)
    local2 = _shards(sd2, tasks2, rank)
    for opts in [{}, {"strategy": "send_recv"}, {"strategy": "allgather", "balance": "none"}]:
        res = mc.reshard_state_dict(local2, tasks2, bucket_bytes=4096, timeout=60, **opts)
        check(res, sd2, tasks2, f"overlapping {opts}")
        stats = last_many_stats()
        if not opts and stats.peak_staging_bytes > 4096:
            failures.append(f"staging {stats.peak_staging_bytes} B > 4096 B on rank {rank}")
        if rank in (0, 4) and not opts and stats.buckets < 2:
            failures.append(f"expected several buckets, got {stats.buckets}")

    # 3. reshard_many with plans from plan_many (non-contiguous inputs)
    plans = mc.plan_many(list(tasks.values()))
    ins = [None if (g := t.src_region(rank)) is None
           else mc.shard_of(sd[n], g).t().contiguous().t() if sd[n].ndim == 2
           else mc.shard_of(sd[n], g) for n, t in tasks.items()]
    outs = mc.reshard_many(ins, plans, timeout=60)
    for (name, t), out in zip(tasks.items(), outs):
        region = t.dst_region(rank)
        if (region is None) != (out is None) or (
                out is not None and not _same(out, mc.shard_of(sd[name], region))):
            failures.append(f"reshard_many: {name} wrong on rank {rank}")

    # 4. a DTensor state dict
    src = DeviceMesh("cpu", [[0, 1], [2, 3]])
    dst = DeviceMesh("cpu", [3, 4, 5, 6, 7])
    glob = {f"w{i}": torch.arange(i * 100, i * 100 + 77, dtype=torch.float32).reshape(7, 11)
            for i in range(4)}
    dts = {n: distribute_tensor(g, src, [Shard(i % 2), Replicate()])
           for i, (n, g) in enumerate(glob.items())}
    targets = {n: (dst, [Shard(1) if i % 2 else Replicate()]) for i, n in enumerate(glob)}
    res = mc.reshard_state_dict(dts, targets, timeout=60)
    if rank >= 3:
        for n, g in glob.items():
            if n not in res or not _same(res[n].full_tensor(), g):
                failures.append(f"DTensor state dict: {n} wrong on rank {rank}")
    elif res:
        failures.append(f"DTensor state dict: rank {rank} outside the destination got {res}")

    # 5. bad input on one rank: ValueError everywhere, naming the tensor; then the job goes on
    name = "h.1.attn.c_proj.weight"
    for kind in ("dtype", "shape", "undeclared", "missing"):
        bad = dict(local)
        if rank == 1:
            if kind == "dtype":
                bad[name] = bad[name].to(torch.float16)
            elif kind == "shape":
                bad[name] = bad[name][:, 1:]
            elif kind == "undeclared":
                bad["h.9.extra"] = torch.zeros(2)
            else:
                del bad[name]
        try:
            mc.reshard_state_dict(bad, tasks, timeout=60)
            failures.append(f"{kind}: no error on rank {rank}")
        except ValueError as exc:
            text = str(exc)
            if rank == 1:
                needle = {"dtype": "dtype torch.float16", "shape": "shape (32, 15)",
                          "undeclared": "'h.9.extra'", "missing": "must be a torch.Tensor"}[kind]
                if needle not in text or ("extra" not in text and name not in text):
                    failures.append(f"{kind}: unclear error on rank 1: {text}")
            elif "ranks [1]" not in text and kind != "undeclared":
                failures.append(f"{kind}: rank {rank} error does not name rank 1: {text}")
    # 6. rank 2 passes the plans in another order: every rank refuses before sending
    order, inputs = (plans[::-1], ins[::-1]) if rank == 2 else (plans, ins)
    try:
        mc.reshard_many(inputs, order, timeout=60)
        failures.append(f"different plans: no error on rank {rank}")
    except ValueError as exc:  # (seen from the side or, once rank 2 went on, as its refusal)
        text = str(exc)
        named = rank == 2 or "ranks [2]" in text or "rank 2 refused its call with another plan" \
            in text
        if not ("different plans" in text or "another plan" in text) or not named:
            failures.append(f"different plans: unclear error on rank {rank}: {exc}")
    # 7. rank 2 lists two tensors of the same plan in another order (the plans agree, the names
    # do not): every rank refuses before sending, where the data would have gone to the wrong one
    twins = [n for n in tasks if tasks[n] == tasks["h.0.ln_1.weight"]][:2]
    order = list(tasks)
    if rank == 2:
        i, j = order.index(twins[0]), order.index(twins[1])
        order[i], order[j] = order[j], order[i]
    try:
        mc.reshard_state_dict(local, {n: tasks[n] for n in order}, timeout=60)
        failures.append(f"twins swapped: no error on rank {rank}")
    except ValueError as exc:
        if "another order" not in str(exc) or not (rank == 2 or "ranks [2]" in str(exc)):
            failures.append(f"twins swapped: unclear error on rank {rank}: {exc}")
    check(mc.reshard_state_dict(local, tasks, timeout=60), sd, tasks, "after errors")
    return failures


def test_state_dict_across_meshes():
    results = mc.launch(_state_dict_job, WORLD, hosts=mc.Topology.uniform(4, 2), timeout=240)
    failures = [f for r in results for f in r]
    assert not failures, "\n".join(failures[:20])
