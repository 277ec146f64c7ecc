"""One rank of the clean-exit job that tests/test_runtime_exit.py starts with the real ``torchrun``
(8 ranks, gloo): several ``reshard`` calls (odd strides, both posting modes, host-aware
broadcasts with relays), one ``reshard_many``, one ``reshard_dtensor`` (every result checked byte
for byte) and two pipelined training steps (losses against one process's, float tolerance), then
``destroy_process_group()`` and a normal interpreter exit.

With ``core`` as the second argument, the job stops after ``reshard_many`` (no DTensor, no
pipeline: their imports, torch._dynamo and the models, cost seconds of CPU per rank), then
destroys the group and exits the same way; the test runs the whole job once and the core job on
the other launches.

The plans come from a JSON file (the first argument) that the test writes once with
:func:`write_plans`: planning with ``balance="auto"`` imports scipy for its lower bound, a second of
CPU in each of the 8 ranks of every launch. Exit status 0 only if every result is exact; 3 on a
wrong result (the test then reports it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import meshcast
from meshcast import Layout, Mesh, ReshardTask, Topology


def _global(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    raw = (torch.arange(n, dtype=torch.int64) * 2654435761 + seed) % 251
    return raw.to(torch.uint8).view(torch.uint8).to(dtype).reshape(shape)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def _pipeline_step(rank: int) -> list[str]:
    """Two training steps of a small GPT pipelined over ranks 0-1 and 2-3 (ranks 4-7 idle, as
    SPMD requires every rank to build the runtime); the losses against one process's."""
    from meshcast.models import gpt
    from meshcast.training.training import TrainJob, reference_training, run_jobs

    cfg = gpt.GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)
    job = TrainJob("gpt", cfg, ((0, 1), (2, 3)), "1f1b", "broadcast", num_microbatches=2)
    (got,) = run_jobs(rank, [job], keep_state=False)
    if rank in (2, 3):
        want, _ = reference_training(job)
        if not torch.allclose(torch.tensor(got["losses"]), torch.tensor(want), atol=1e-5,
                              rtol=1e-4):
            return [f"pipeline losses {got['losses']} != {want}"]
    return []


SRC, DST = Mesh.from_range(0, (2, 2)), Mesh.from_range(4, (2, 2))
TOPOLOGY = Topology.uniform(4, 2)  # four emulated hosts of two ranks: relays on every host
CASES = [  # shape, dtype, source and destination specs, chunk_bytes, ordered
    ((64, 48), torch.float32, "S0S1", "S1R", 1 << 20, True),
    ((33, 20), torch.int64, "S1R", "RR", 256, True),
    ((16, 12, 6), torch.bfloat16, "S0RS1", "RS0R", 96, False),
    ((40, 24), torch.complex64, "RR", "S0S1", 512, True),
]
MANY = [
    ReshardTask((24, 8), "float16", Layout(SRC, "S0R"), Layout(DST, "RS1")),
    ReshardTask((10,), "uint8", Layout(SRC, "R"), Layout(DST, "S01")),
]
DTENSOR = ReshardTask((12, 5), "float32", Layout(Mesh([0, 1, 2, 3]), [meshcast.Shard(0)]),
                      Layout(Mesh([4, 5, 6, 7]), [meshcast.Replicate()]))


def _task(shape: tuple[int, ...], dtype: torch.dtype, s_spec: str, d_spec: str) -> ReshardTask:
    return ReshardTask(shape, str(dtype).removeprefix("torch."), Layout(SRC, s_spec),
                       Layout(DST, d_spec))


def write_plans(path: Path) -> None:
    """The job's plans (plan()'s defaults, plan_many's, reshard_dtensor's) as a JSON list."""
    plans = [meshcast.plan(_task(*case[:4]), TOPOLOGY) for case in CASES]
    plans += meshcast.plan_many(MANY, TOPOLOGY)
    plans += meshcast.plan_many([DTENSOR], TOPOLOGY, balance="auto")  # reshard_dtensor's call
    path.write_text(json.dumps([json.loads(p.to_json()) for p in plans]))


def main() -> int:
    plans = [meshcast.Plan.from_json(p) for p in json.loads(Path(sys.argv[1]).read_text())]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    bad: list[str] = []
    for k, (shape, dtype, s_spec, d_spec, chunk, ordered) in enumerate(CASES):
        task = _task(shape, dtype, s_spec, d_spec)
        plan = plans[k]
        full = _global(shape, dtype, k)
        box = task.src_box(rank)
        local = None
        if box is not None:
            local = full[box].clone()
            if local.ndim >= 2:  # same values, column-major: every send is packed
                local = local.transpose(0, 1).contiguous().transpose(0, 1)
        out = meshcast.reshard(local, plan, chunk_bytes=chunk, ordered=ordered, timeout=60)
        want = None if task.dst_box(rank) is None else full[task.dst_box(rank)]
        if not _same(out, want):
            bad.append(f"reshard case {k}")

    tasks = MANY
    fulls = [_global(t.shape, getattr(torch, t.dtype), 10 + i) for i, t in enumerate(tasks)]
    locals_ = [None if t.src_box(rank) is None else f[t.src_box(rank)] for t, f in
               zip(tasks, fulls)]
    outs = meshcast.reshard_many(locals_, plans[len(CASES):-1], bucket_bytes=128, timeout=60)
    for i, (t, f, o) in enumerate(zip(tasks, fulls, outs)):
        if not _same(o, None if t.dst_box(rank) is None else f[t.dst_box(rank)]):
            bad.append(f"reshard_many tensor {i}")

    if sys.argv[2:] != ["core"]:
        bad += _dtensor_and_pipeline(rank, plans[-1])
    dist.destroy_process_group()
    if bad:
        print(f"rank {rank}: wrong results: {bad}", file=sys.stderr)
        return 3
    return 0


def _dtensor_and_pipeline(rank: int, plan: meshcast.Plan) -> list[str]:
    """One ``reshard_dtensor`` and two pipelined training steps; what was wrong."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    bad = []

    a, b = DeviceMesh("cpu", [0, 1, 2, 3]), DeviceMesh("cpu", [4, 5, 6, 7])
    glob = _global((12, 5), torch.float32, 99)
    dt = distribute_tensor(glob, a, [Shard(0)])
    res = meshcast.reshard_dtensor(dt, b, [Replicate()], timeout=60, plan=plan)
    if rank >= 4 and (res is None or not _same(res.to_local(), glob)):
        bad.append("reshard_dtensor")
    return bad + _pipeline_step(rank)


if __name__ == "__main__":
    sys.exit(main())
