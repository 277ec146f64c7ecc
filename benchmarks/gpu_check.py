"""What only a GPU can exercise, on one GPU in a few minutes (docs/runtime.md, "Transports").

    python benchmarks/gpu_check.py          # on a machine with CUDA
    python benchmarks/gpu_check.py --cpu    # the same checks on CPU with gloo (a dry run)

Checks, each printed as it passes (the script stops at the first failure, exit status 1):

1. pack/unpack of CUDA shards: every dtype's carrier view, chunks of non-contiguous CUDA shards
   packed into contiguous buffers and unpacked into strided views, byte-exact against CPU;
2. a real process group of world size 1 (NCCL; gloo with ``--cpu``), initialised on a file
   store: ``meshcast.reshard`` with ``transport="collectives"`` (the CUDA default) on plans whose
   operations are local copies, from strided CUDA shards, byte-exact against
   :func:`meshcast.execute_local`, the result on the GPU and complete when the call returns;
3. the collectives transport's own moves on an NCCL sub-group of that world (group creation
   through groups.py, the backend's broadcast from a packed strided shard and its all-gather,
   one round per chunk), with the runtime's budget, reaper and end-of-call device
   synchronisation.

On a machine without CUDA (and without ``--cpu``) it says so and exits with status 0. A
point-to-point send needs a second rank, so it is not exercised here (one GPU cannot host two
NCCL ranks); neither is a pipeline step, whose runtime runs its stages on gloo groups.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time

import numpy as np


def _say(what: str, started: float) -> None:
    print(f"ok  {what}  ({time.perf_counter() - started:.2f} s)", flush=True)


def check_pack_unpack(device) -> None:
    """Carrier views and chunk packing of strided shards on ``device``, against CPU."""
    import torch

    from meshcast.runtime.chunks import chunk_boxes, relative
    from meshcast.runtime.tensors import as_bytes, as_carrier

    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool,
              torch.complex64, torch.float8_e4m3fn)
    for dtype in dtypes:
        raw = torch.randint(0, 256, (24 * 16 * 8 * 16,), dtype=torch.uint8, generator=gen)
        size = torch.empty((), dtype=dtype).element_size()
        cpu = raw[: 24 * 16 * 8 * size].view(dtype).reshape(24, 16, 8)
        shard = cpu.to(device).transpose(0, 2)  # (8, 16, 24), strided, on the device
        carrier = as_carrier(shard)
        shard_box = (slice(0, 8), slice(0, 16), slice(0, 24))
        box = (slice(1, 7), slice(2, 14), slice(3, 20))
        out = torch.zeros((17, 12, 6), dtype=carrier.dtype, device=device).permute(2, 1, 0)
        for chunk in chunk_boxes(box, size, 96):
            packed = carrier[relative(chunk, shard_box)].contiguous()
            wire = as_bytes(packed).clone()  # what a message carries
            view = out[relative(chunk, box)]  # strided: unpacked by a copy
            view.copy_(wire.view(view.dtype).reshape(view.shape))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        want = as_carrier(cpu.transpose(0, 2))[1:7, 2:14, 3:20]
        if not torch.equal(out.cpu(), want):
            raise AssertionError(f"pack/unpack of a strided {dtype} shard differs")
    _say(f"pack/unpack of strided shards on {device}: {len(dtypes)} dtypes, 96-byte chunks",
         started)


def check_reshard(device) -> None:
    """``meshcast.reshard(transport="collectives")`` on world size 1, byte-exact."""
    import torch

    import meshcast
    from meshcast import Layout, Mesh, ReshardTask, Topology, execute_local, plan, scatter

    started = time.perf_counter()
    mesh = Mesh([[0]])
    topology = Topology.uniform(1, 1)
    cases = [("float32", "RR", "RR"), ("float16", "S0R", "RS1"), ("int32", "RS1", "S0R")]
    for dtype, src, dst in cases:
        shape = (32, 24)
        task = ReshardTask(shape, dtype, Layout(mesh, src), Layout(mesh, dst))
        p = plan(task, topology)
        whole = np.random.default_rng(1).integers(0, 100, size=shape).astype(task.numpy_dtype)
        local = torch.from_numpy(np.ascontiguousarray(whole.T)).to(device).T  # strided
        want = execute_local(p, scatter(whole, task.src))[0].tobytes()
        for transport in ("collectives", None):
            out = meshcast.reshard(local, p, chunk_bytes=256, transport=transport)
            if out.device != local.device:
                raise AssertionError(f"the result is on {out.device}, not {local.device}")
            if out.cpu().contiguous().view(torch.uint8).numpy().tobytes() != want:
                raise AssertionError(f"meshcast.reshard({dtype} {src}->{dst}, "
                                     f"transport={transport!r}) differs")
    _say(f"meshcast.reshard(transport='collectives' and the default) on {device}, world size 1:"
         f" {len(cases)} plans byte-exact", started)


def check_collective_moves(device) -> None:
    """The collectives transport's broadcast and all-gather on a sub-group of world size 1."""
    import torch
    import torch.distributed as dist

    from meshcast import Layout, Mesh, ReshardTask, Topology, plan
    from meshcast.core.plan import AllGather, Broadcast
    from meshcast.runtime.board import Call
    from meshcast.runtime.groups import group_cache
    from meshcast.runtime.p2p import Failures, Links
    from meshcast.runtime.runner import Runner
    from meshcast.runtime.tensors import as_carrier, empty_out
    from meshcast.runtime.transport_collectives import Collectives

    started = time.perf_counter()
    task = ReshardTask((64, 48), "float32", Layout(Mesh([[0]]), "RR"), Layout(Mesh([[0]]), "RR"))
    p = plan(task, Topology.uniform(1, 1))
    whole = torch.arange(64 * 48, dtype=torch.float32).reshape(48, 64).to(device).T  # strided
    out = empty_out(task.dst_region(0), 4, device)
    world = dist.group.WORLD
    call = Call(world, [0], 0, "gpu_check", 60.0, "gpu-check")
    failures = Failures(call, 60.0)
    moves = Collectives(world, lambda r: r)
    runner = Runner(p, 0, as_carrier(whole), out, Links(world, 0, int, {0: 0}, 60.0), moves,
                    failures, 1024, 4096)
    moves.start(runner)
    box = (slice(0, 64), slice(0, 48))
    moves.broadcast(runner, 0, Broadcast(0, (), box))
    out.copy_(as_carrier(whole))
    moves.allgather(runner, 1, AllGather((0,), box, (box,)))
    runner.drain()
    if failures.faults:
        raise AssertionError(f"the moves failed: {[f.describe() for f in failures.faults]}")
    if not torch.equal(out.view(torch.float32).cpu(), whole.cpu()):
        raise AssertionError("the all-gather changed this rank's own part")
    kind = "NCCL" if device.type == "cuda" else "gloo"
    _say(f"collectives moves on a {kind} sub-group ({len(group_cache)} cached): a broadcast of "
         f"a strided shard in 1 KiB chunks, an all-gather in rounds, budget 4 KiB", started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run the checks on CPU with gloo")
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False): nothing "
              "checked; run it on a machine with a GPU, or with --cpu for a dry run")
        return 0
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        print(f"gpu_check on {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    check_pack_unpack(device)
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store,
                                rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
        try:
            check_reshard(device)
            check_collective_moves(device)
        finally:
            dist.destroy_process_group()
    print("gpu_check: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
