"""The weight-sync benchmark: a GPT's weights from a training layout (2 pipeline stages x
tensor-parallel 2, ranks 0-3) to an inference layout (tensor-parallel 4, ranks 4-7), with meshcast
and with what trainers do today. :func:`weights_worker` is one rank of one method's job (timed,
memory measured, checked byte for byte); :func:`summarise` turns a job's results into a row;
:func:`joint_lower_bound` is the time no sync can beat. ``meshcast bench weights`` prints them.

Methods (:data:`METHODS`):

* ``meshcast``: :func:`meshcast.reshard_state_dict` (joint plan, buckets, packed messages);
* ``gather-broadcast``: every training rank sends its shards to rank 0, which assembles each
  full tensor and broadcasts it to the inference ranks, which slice their shard;
* ``full-tensor``: per tensor, the stage's ranks all-gather it (DTensor ``full_tensor()``), the
  stage's first rank sends the full tensor to every inference rank, which slices its shard.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..cluster import nic_tx_bytes
from ..core.region import Region
from ..estimate.lower_bound import joint_lower_bound

__all__ = ["INFERENCE_RANKS", "METHODS", "N_HEAD", "build", "joint_lower_bound", "memory_mark",
           "peak_since", "summarise", "weights_worker"]

METHODS = ("meshcast", "gather-broadcast", "full-tensor")
"""The methods compared, in table order."""
N_HEAD = 8
"""Attention heads of the benchmark model (``embd`` must be a multiple)."""
INFERENCE_RANKS = (4, 5, 6, 7)
"""The ranks of the inference layout."""


def build(cfg: dict[str, int]):
    """(full state dict, {name: ReshardTask}) of the benchmark model (every rank builds the same;
    ``cfg``: ``layers``, ``embd``, ``vocab``)."""
    from ..core.mesh import Mesh
    from ..interop.weights import gpt_weight_tasks
    from ..models.gpt import GPT, GPTConfig, split_layers

    config = GPTConfig(vocab_size=cfg["vocab"], block_size=64, n_layer=cfg["layers"],
                       n_head=N_HEAD, n_embd=cfg["embd"])
    model = GPT(config, seed=0)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    params = {k: (tuple(v.shape), str(v.dtype)) for k, v in sd.items()}
    tasks = gpt_weight_tasks(params, [Mesh([0, 1]), Mesh([2, 3])],
                             split_layers(config.n_layer, 2), Mesh(list(INFERENCE_RANKS)))
    return sd, tasks


def _shard(full: Any, region: Region) -> Any:
    """:func:`meshcast.shard_of` (imported when first used: this module loads without torch)."""
    from ..runtime.tensors import shard_of as take

    return take(full, region)


def _place(full: Any, shard: Any, region: Region) -> None:
    """Write ``shard`` (a rank's local tensor of ``region``) into the whole tensor ``full``."""
    for box, local in region.boxes():
        full[box] = shard[local]


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def memory_mark() -> int:
    """Collect garbage, reset this process's peak resident memory (VmHWM) to the current one,
    and return that (bytes): the mark :func:`peak_since` measures from (Linux)."""
    gc.collect()
    rss = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:
        pass
    return rss


def peak_since(mark: int) -> int:
    """Peak extra resident memory (bytes) since :func:`memory_mark` returned ``mark``."""
    return _status("VmHWM") - mark


class _Syncs:
    """The three methods on one rank (process groups made once, by every rank in one order)."""

    def __init__(self, rank: int, tasks: dict, local: dict) -> None:
        import torch.distributed as dist

        self.rank, self.tasks, self.local = rank, tasks, local
        self.src_of = {n: list(t.src.mesh.devices) for n, t in tasks.items()}
        self.bcast_group = dist.new_group([0, *INFERENCE_RANKS])
        self.stage_groups = {tuple(m): dist.new_group(m) for m in ([0, 1], [2, 3])}

    def method(self, name: str) -> Callable[[], dict]:
        return {"meshcast": self.meshcast, "gather-broadcast": self.gather_broadcast,
                "full-tensor": self.full_tensor}[name]

    def meshcast(self) -> dict:
        from ..interop.state_dict import reshard_state_dict

        return reshard_state_dict(self.local, self.tasks, timeout=300)

    def gather_broadcast(self) -> dict:
        import torch
        import torch.distributed as dist

        rank, local, infer = self.rank, self.local, INFERENCE_RANKS
        out = {}
        for name, task in self.tasks.items():
            full = None
            if rank in (0, *infer):
                full = torch.empty(task.shape, dtype=getattr(torch, task.dtype))
            if rank == 0:
                works = []
                for r in self.src_of[name]:
                    region = task.src_region(r)
                    if r == 0:
                        _place(full, local[name], region)
                    else:
                        buf = torch.empty(region.shape, dtype=full.dtype)
                        works.append((dist.irecv(buf, src=r), region, buf))
                for w, region, buf in works:
                    w.wait()
                    _place(full, buf, region)
            elif name in local:
                dist.send(local[name].contiguous(), dst=0)
            if full is not None:
                dist.broadcast(full, src=0, group=self.bcast_group)
                if rank in infer:
                    out[name] = _shard(full, task.dst_region(rank)).clone()
        return out

    def full_tensor(self) -> dict:
        import torch
        import torch.distributed as dist

        rank, local = self.rank, self.local
        out = {}
        for name, task in self.tasks.items():
            ranks = self.src_of[name]
            if rank in ranks:
                parts = [torch.empty(task.src_region(r).shape, dtype=local[name].dtype)
                         for r in ranks]
                dist.all_gather(parts, local[name].contiguous(),
                                group=self.stage_groups[tuple(ranks)])
                full = torch.empty(task.shape, dtype=parts[0].dtype)
                for r, p in zip(ranks, parts):
                    _place(full, p, task.src_region(r))
                if rank == ranks[0]:
                    for w in [dist.isend(full, dst=r) for r in INFERENCE_RANKS]:
                        w.wait()
            elif rank in INFERENCE_RANKS:
                full = torch.empty(task.shape, dtype=getattr(torch, task.dtype))
                dist.recv(full, src=ranks[0])
                out[name] = _shard(full, task.dst_region(rank)).clone()
        return out


def weights_worker(rank: int, method: str, cfg: dict[str, int], reps: int) -> dict[str, Any]:
    """One rank of one method's job: returns its times, peak memory, NIC bytes and check."""
    sd, tasks = build(cfg)
    local = {n: _shard(sd[n], t.src_region(rank)).clone() for n, t in tasks.items()
             if t.src_region(rank) is not None}
    expect = {n: _shard(sd[n], t.dst_region(rank)).clone() for n, t in tasks.items()
              if t.dst_region(rank) is not None}
    nbytes = sum(sd[n].numel() * sd[n].element_size() for n in tasks)
    del sd
    gc.collect()
    fn = _Syncs(rank, tasks, local).method(method)
    out, times, peak, sent = _timed_syncs(fn, reps)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    nic = sent // reps if (sent is not None and local_rank == 0) else 0
    return {"times": times, "peak": peak, "nic_bytes": nic, "bad": _wrong(out, expect),
            "nic_known": sent is not None, "nbytes": nbytes}


def _timed_syncs(fn: Callable[[], dict], reps: int
                 ) -> tuple[dict, list[float], int, int | None]:
    """A warm-up, then ``reps`` syncs between barriers: (the last result, the times, the peak
    extra memory (VmHWM minus VmRSS before), the NIC bytes sent (None outside an emulated
    host))."""
    import torch.distributed as dist

    fn()  # warm-up: plans, process groups, connections
    dist.barrier()
    rss = memory_mark()
    tx0 = nic_tx_bytes()
    times = []
    out: dict = {}
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        out = fn()
        dist.barrier()  # the sync is done when the slowest rank is done
        times.append(time.perf_counter() - t0)
    tx1 = nic_tx_bytes()
    peak = peak_since(rss)
    sent = tx1 - tx0 if tx0 is not None and tx1 is not None else None
    return out, times, peak, sent


def _wrong(out: dict, expect: dict) -> list[str]:
    import torch

    return [n for n in expect if n not in out or not torch.equal(
        out[n].view(torch.uint8) if out[n].dtype == torch.bool else out[n], expect[n])]


def summarise(method: str, results: Sequence[dict[str, Any]], reps: int
              ) -> tuple[str, float, int | None, int, int]:
    """(method, median time of a sync (slowest rank), NIC bytes across hosts (None: unknown),
    peak extra memory of the busiest rank, model bytes); raises if any weight arrived wrong."""
    bad = sorted({n for r in results for n in r["bad"]})
    if bad:
        raise RuntimeError(f"{method}: wrong weights {bad[:5]}")
    per_rep = [max(r["times"][i] for r in results) for i in range(reps)]
    t = statistics.median(per_rep)
    nic = sum(r["nic_bytes"] for r in results) if results[0]["nic_known"] else None
    return (method, t, nic, max(r["peak"] for r in results), results[0]["nbytes"])
