"""A job of 4 gloo ranks under the real ``torchrun`` (tests/test_dtensor_refusals.py): DTensor
arguments that only one rank gets wrong. Each case is a call that must be refused on every rank
at once, followed by the same call with good arguments, which must be exact; every rank writes
what it saw to ``<out>/rank<r>.json`` and the process exits 0.

``python dtensor_refusal_job.py OUT`` under ``torchrun --standalone --nproc-per-node 4``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

import meshcast

BAD = 3  # the rank whose arguments are wrong
TIMEOUT = 60.0  # refusals must come long before it


def _refused(fn: Callable[[], object]) -> list:
    """``[exception type, message, seconds]`` of ``fn()``, which must raise."""
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # the report says what was raised
        return [type(exc).__name__, str(exc), round(time.monotonic() - start, 2)]
    return ["nothing", "", round(time.monotonic() - start, 2)]


def _partial(rank: int, mesh: DeviceMesh, scale: int) -> DTensor:
    """``[Partial(sum), Partial(sum)]`` on ``mesh``: its value is ``scale * (1 + 2 + 3 + 4)``."""
    return DTensor.from_local(torch.full((7, 5), float(scale * (rank + 1))), mesh,
                              [Partial(), Partial()], run_check=False)


def _exact(out: DTensor | None, want: torch.Tensor, dst: DeviceMesh, placements: list) -> bool:
    if dst.get_coordinate() is None:
        return out is None
    local = distribute_tensor(want, dst, placements, src_data_rank=None).to_local()
    return out is not None and torch.equal(out.to_local(), local)


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    src = DeviceMesh("cpu", [[0, 1], [2, 3]])
    dst = DeviceMesh("cpu", [1, 2, 3])
    x = torch.arange(35, dtype=torch.float32).reshape(7, 5)
    wrong = [Shard(2)] if rank == BAD else [Shard(0)]
    report: dict = {}

    # 1. a plain source, the destination placements wrong on rank 3 alone
    dt = distribute_tensor(x, src, [Shard(0), Shard(1)], src_data_rank=None)
    report["plain"] = _refused(lambda: meshcast.reshard_dtensor(dt, dst, wrong, timeout=TIMEOUT))
    report["plain then"] = _exact(meshcast.reshard_dtensor(dt, dst, [Shard(0)], timeout=TIMEOUT),
                                  x, dst, [Shard(0)])

    # 2. a Partial source (reduced on its mesh first): rank 3 refuses at once and comes to its
    # next call before the others come to this one
    if rank != BAD:
        time.sleep(1.5)
    report["partial"] = _refused(lambda: meshcast.reshard_dtensor(
        _partial(rank, src, 1), dst, wrong, timeout=TIMEOUT))
    res = meshcast.reshard_dtensor(_partial(rank, src, 10), dst, [Shard(0)], timeout=TIMEOUT)
    report["partial then"] = _exact(res, torch.full((7, 5), 100.0), dst, [Shard(0)])

    # 3. the same through reshard_state_dict: a Partial entry, the other entry's layout wrong
    sd = {"w": _partial(rank, src, 1), "b": dt}
    layouts = {"w": (dst, [Shard(0)]), "b": (dst, wrong)}
    report["state dict"] = _refused(lambda: meshcast.reshard_state_dict(sd, layouts,
                                                                        timeout=TIMEOUT))
    got = meshcast.reshard_state_dict({"w": _partial(rank, src, 10), "b": dt},
                                      {"w": (dst, [Shard(0)]), "b": (dst, [Shard(1)])},
                                      timeout=TIMEOUT)
    report["state dict then"] = (
        _exact(got.get("w"), torch.full((7, 5), 100.0), dst, [Shard(0)])
        and _exact(got.get("b"), x, dst, [Shard(1)]))

    # 4. a keyword argument reshard_dtensor does not take, on rank 3 alone
    extra = {"bogus_option": 1} if rank == BAD else {"bucket_bytes": 1 << 20}
    report["keyword"] = _refused(lambda: meshcast.reshard_dtensor(dt, dst, [Shard(0)],
                                                                  timeout=TIMEOUT, **extra))
    report["keyword then"] = _exact(meshcast.reshard_dtensor(dt, dst, [Shard(0)],
                                                             timeout=TIMEOUT), x, dst, [Shard(0)])
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
