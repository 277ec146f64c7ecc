"""The two-job weight-sync benchmark (``meshcast bench weights --jobs 2``): a trainer job (2
pipeline stages x tensor parallel 2, 4 ranks on 2 hosts) and an inference-engine job (tensor
parallel 4, 4 ranks on 2 other hosts), launched separately and joined by :func:`meshcast.connect`;
a bfloat16 GPT of ``--size`` MiB (default 1.5 GiB) moves every sync.

Methods (:data:`METHODS`), each on the same joint group, engine parameters written in place:

* ``meshcast``: :class:`meshcast.WeightSync` (joint plan, buckets, overlap, atomic commit);
* ``gather-broadcast``: trainer rank 0 gathers each tensor's shards, assembles it and broadcasts
  it to every engine rank, which copies its shard out (what many RL frameworks do);
* ``full-tensor``: per tensor, the stage's ranks all-gather it (DTensor ``full_tensor()``) and
  the stage's first rank broadcasts it to every engine rank;
* ``tp-broadcast``: per tensor, each trainer rank holding a shard broadcasts its shard to every
  engine rank, which copies the part it needs;
* ``meshcast-fp8``: as ``meshcast``, the engine keeping its matrices in FP8 with 128 x 128 block
  scales, converted on the trainer before the wire (:mod:`meshcast.bench.weight_fp8`).

Weights are a deterministic function of each element's index and the version (exact in
bfloat16), so no rank builds the full model and every engine shard is checked exactly.
"""

from __future__ import annotations

import datetime
import math
import os
import time
from typing import Any

from ..cluster import nic_tx_bytes
from ..core.boxes import Box, box_shape
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask
from .weight_sync import N_HEAD, memory_mark, peak_since

__all__ = ["METHODS", "engine_layout", "engine_worker", "model_tasks", "run_two_jobs",
           "size_config", "trainer_worker"]

METHODS = ("meshcast", "gather-broadcast", "full-tensor", "tp-broadcast", "meshcast-fp8")
"""The methods compared, in table order."""
TRAINER, ENGINE = 4, 4
"""Ranks of each job (2 hosts x 2 each)."""


def size_config(mib: float) -> dict[str, int]:
    """A GPT config of about ``mib`` MiB in bfloat16 (n_embd 2048 and vocab 32000 from 256 MiB,
    else 256 and 4096)."""
    embd, vocab = (2048, 32000) if mib >= 256 else (256, 4096)
    params = mib * 2**20 / 2
    layers = max(2, round((params - 2 * vocab * embd) / (12 * embd * embd)))
    return {"layers": 2 * math.ceil(layers / 2), "embd": embd, "vocab": vocab}


def model_tasks(cfg: dict[str, int]) -> dict[str, ReshardTask]:
    """``{name: ReshardTask}`` in joint ranks (trainer 0-3, engine 4-7), bfloat16."""
    import torch

    from ..interop.weights import gpt_stage_of
    from ..models.gpt import GPT, GPTConfig, split_layers

    config = GPTConfig(vocab_size=cfg["vocab"], block_size=64, n_layer=cfg["layers"],
                       n_head=N_HEAD, n_embd=cfg["embd"])
    with torch.device("meta"):
        model = GPT(config, seed=None)
    stages, engine = [Mesh([0, 1]), Mesh([2, 3])], Mesh([4, 5, 6, 7])
    layers = split_layers(config.n_layer, 2)
    return {k: ReshardTask(tuple(v.shape), "bfloat16",
                           _tp_layout(k, stages[gpt_stage_of(k, layers)]), _tp_layout(k, engine))
            for k, v in model.state_dict().items()}


def _tp_layout(name: str, mesh: Mesh) -> Layout:
    """Megatron-style tensor parallelism with every shard one box (``attn.c_attn`` cut in rows,
    which the baselines slice like the others; the bytes moved are the same)."""
    from ..core.layout import Shard
    from ..interop.weights import tensor_parallel_layout

    return Layout(mesh, [Shard(0)]) if "attn.c_attn" in name else tensor_parallel_layout(name, mesh)


def values(task: ReshardTask, k: int, box: Box, version: int):
    """The bfloat16 values of ``box`` of tensor ``k`` at ``version`` (exact: multiples of 1/8
    below 16)."""
    import torch

    idx = torch.zeros((), dtype=torch.int64)
    stride = 1
    for d in reversed(range(len(task.shape))):
        r = torch.arange(box[d].start, box[d].stop, dtype=torch.int64)
        idx = idx + (r * stride).view([-1] + [1] * (len(task.shape) - 1 - d))
        stride *= task.shape[d]
    return (((idx * 7 + 13 * k + version) % 251 - 125).to(torch.float32) / 8).to(torch.bfloat16)


def engine_layout(layout: Layout) -> Layout:
    """``layout`` (joint ranks) in the engine job's own ranks."""
    data = layout.to_json()
    data["mesh"] = Mesh(layout.mesh.array - TRAINER).to_json()
    return Layout.from_json(data)


class _Joint:
    """The joint group, its sub-groups (made by their members in one order) and a barrier."""

    def __init__(self, group: Any, tasks: dict[str, ReshardTask]) -> None:
        import torch
        import torch.distributed as dist

        self.group, self.me = group, group.me
        self.pg = group.backend_group("cpu")
        engine = list(range(TRAINER, TRAINER + ENGINE))
        sets = {*((r, *engine) for r in range(TRAINER)), (0, 1), (2, 3)}
        self.subs: dict[tuple[int, ...], Any] = {}
        wait = datetime.timedelta(seconds=group.timeout)
        for ranks in sorted(sets, key=lambda s: (len(s), s)):
            if self.me in ranks:
                store = dist.PrefixStore("bench/" + "_".join(map(str, ranks)) + "/", group.store)
                self.subs[ranks] = dist.ProcessGroupGloo(store, ranks.index(self.me),
                                                         len(ranks), wait)
        self._flag = torch.zeros(1)

    def barrier(self) -> None:
        self.pg.allreduce([self._flag]).wait()

    def bcast(self, ranks: tuple[int, ...], tensor: Any, root: int) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = ranks.index(root)
        self.subs[ranks].broadcast([tensor], opts).wait()


def _meet(a: Box, b: Box) -> Box | None:
    out = tuple(slice(max(x.start, y.start), min(x.stop, y.stop)) for x, y in zip(a, b))
    return None if any(s.start >= s.stop for s in out) else out


def _within(box: Box, outer: Box) -> Box:
    return tuple(slice(s.start - o.start, s.stop - o.start) for s, o in zip(box, outer))


class _Rank:
    """One rank's part of every method: its shards (trainer) or parameters (engine)."""

    def __init__(self, group: Any, tasks: dict[str, ReshardTask]) -> None:
        import torch

        self.group, self.me, self.joint = group, group.me, _Joint(group, tasks)
        self.items = list(tasks.items())
        self.engine = tuple(range(TRAINER, TRAINER + ENGINE))
        self.local: dict[str, Any] = {}
        self.params = {n: torch.zeros(box_shape(t.dst_box(self.me)), dtype=torch.bfloat16)
                       for n, t in self.items if t.dst_box(self.me) is not None}
        self.sync: Any = None
        self.fp8: Any = None  # (WeightSync, engine weights and scales) of meshcast-fp8
        self.bucket_bytes = 64 << 20

    def shards(self, version: int) -> dict[str, Any]:
        """This trainer rank's shards of ``version`` (made outside the timed syncs)."""
        return {n: values(t, k, t.src_box(self.me), version)
                for k, (n, t) in enumerate(self.items) if t.src_box(self.me) is not None}

    def wrong(self, method: str, version: int) -> list[str]:
        """Engine parameters that differ from ``version`` after ``method``."""
        import torch

        from .weight_fp8 import wrong_fp8

        expect = {n: values(t, k, t.dst_box(self.me), version)
                  for k, (n, t) in enumerate(self.items) if n in self.params}
        if method == "meshcast-fp8":
            return wrong_fp8(self.fp8[1], expect)
        return [n for n, want in expect.items() if not torch.equal(self.params[n], want)]

    def method(self, name: str):
        return {"meshcast": self.meshcast, "gather-broadcast": self.gather_broadcast,
                "full-tensor": self.full_tensor, "tp-broadcast": self.tp_broadcast,
                "meshcast-fp8": self.meshcast_fp8}[name]

    def meshcast(self, version: int) -> None:
        from ..interop.sync_spec import ParamSpec
        from ..interop.weight_sync import WeightSync

        if self.sync is None:
            me, role = self.me, self.group.role
            desc = {n: ParamSpec(t.shape, t.dtype, t.src if role == "trainer" else
                                 engine_layout(t.dst)) for n, t in self.items
                    if (t.src_box(me) if role == "trainer" else t.dst_box(me)) is not None}
            self.sync = WeightSync(self.group, desc, bucket_bytes=self.bucket_bytes)
        if self.group.role == "trainer":
            self.sync.push(self.local, version)
        else:
            self.sync.receive(self.params)

    def meshcast_fp8(self, version: int) -> None:
        import torch

        from ..interop.sync_spec import ParamSpec
        from ..interop.weight_sync import WeightSync
        from .weight_fp8 import BLOCK, engine_specs

        if self.fp8 is None:
            me, tasks = self.me - TRAINER, dict(self.items)
            if self.group.role == "trainer":
                desc = {n: ParamSpec(t.shape, t.dtype, t.src) for n, t in self.items
                        if t.src_box(self.me) is not None}
                params = None
            else:
                specs = engine_specs(tasks, {n: engine_layout(t.dst) for n, t in self.items})
                desc = {n: s for n, s in specs.items() if s.layout.box(me, s.shape) is not None}
                params = {n: torch.zeros(box_shape(s.layout.box(me, s.shape)), dtype=s.dtype)
                          for n, s in desc.items()}
            self.fp8 = (WeightSync(self.group, desc, bucket_bytes=self.bucket_bytes,
                                   fp8_block=BLOCK), params)
        sync, params = self.fp8
        if self.group.role == "trainer":
            sync.push(self.local, version)
        else:
            sync.receive(params)

    def gather_broadcast(self, version: int) -> None:
        import torch

        pg, me, bcast = self.joint.pg, self.me, (0, *self.engine)
        for k, (name, task) in enumerate(self.items):
            holders = list(task.src.mesh.devices)
            if me == 0:
                full = torch.empty(task.shape, dtype=torch.bfloat16)
                got = []
                for r in holders:
                    if r == 0:
                        full[task.src_box(0)] = self.local[name]
                    else:
                        buf = torch.empty(box_shape(task.src_box(r)), dtype=torch.bfloat16)
                        got.append((pg.recv([buf], r, k), task.src_box(r), buf))
                for work, box, buf in got:
                    work.wait()
                    full[box] = buf
                self.joint.bcast(bcast, full, 0)
            elif me in holders:
                pg.send([self.local[name].contiguous()], 0, k).wait()
            elif me in self.engine:
                full = torch.empty(task.shape, dtype=torch.bfloat16)
                self.joint.bcast(bcast, full, 0)
                self.params[name].copy_(full[task.dst_box(me)])

    def full_tensor(self, version: int) -> None:
        import torch

        me = self.me
        for name, task in self.items:
            holders = tuple(task.src.mesh.devices)
            bcast = (holders[0], *self.engine)
            full = torch.empty(task.shape, dtype=torch.bfloat16)
            if me in holders:
                parts = [torch.empty(box_shape(task.src_box(r)), dtype=torch.bfloat16)
                         for r in holders]
                self.joint.subs[holders].allgather([parts], [self.local[name].contiguous()]).wait()
                for r, part in zip(holders, parts):
                    full[task.src_box(r)] = part
                if me == holders[0]:
                    self.joint.bcast(bcast, full, me)
            elif me in self.engine:
                self.joint.bcast(bcast, full, holders[0])
                self.params[name].copy_(full[task.dst_box(me)])

    def tp_broadcast(self, version: int) -> None:
        import torch

        me = self.me
        for name, task in self.items:
            sent: set[tuple] = set()
            for r in task.src.mesh.devices:
                box = task.src_box(r)
                key = tuple((s.start, s.stop) for s in box)
                if key in sent:  # a replicated shard goes once
                    continue
                sent.add(key)
                if me == r:
                    self.joint.bcast((r, *self.engine), self.local[name].contiguous(), r)
                elif me in self.engine:
                    buf = torch.empty(box_shape(box), dtype=torch.bfloat16)
                    self.joint.bcast((r, *self.engine), buf, r)
                    mine = task.dst_box(me)
                    both = _meet(box, mine)
                    if both is not None:
                        self.params[name][_within(both, mine)].copy_(buf[_within(both, box)])


def _timed(rank: _Rank, method: str, reps: int) -> dict[str, Any]:
    """A warm-up, then ``reps`` syncs between joint barriers: times, peak extra memory, NIC
    bytes sent by this host (host's first rank), wrong engine parameters."""
    fn = rank.method(method)
    fn(0)  # warm-up: plans, connections
    shards = [rank.shards(v) for v in range(1, reps + 1)]  # made before, not measured
    rss = memory_mark()
    tx0, times = nic_tx_bytes(), []
    for v in range(1, reps + 1):
        rank.local = shards[v - 1]
        rank.joint.barrier()
        t0 = time.perf_counter()
        fn(v)
        rank.joint.barrier()  # the sync is done when the slowest rank is done
        times.append(time.perf_counter() - t0)
    tx1 = nic_tx_bytes()
    first = int(os.environ.get("LOCAL_RANK", rank.group.rank)) == 0
    nic = (tx1 - tx0) // reps if tx0 is not None and tx1 is not None and first else None
    return {"times": times, "peak": peak_since(rss), "nic": nic,
            "bad": rank.wrong(method, reps) if rank.params else []}


def _worker(rank: int, role: str, address: str, methods: list[str], cfg: dict[str, int],
            reps: int) -> dict[str, Any]:
    from ..runtime.rendezvous import connect, disconnect

    tasks = model_tasks(cfg)
    group = connect(address, role, model=f"bench-gpt-{cfg}", timeout=900)
    me = _Rank(group, tasks)
    me.bucket_bytes = cfg.get("bucket_mib", 64) << 20
    me.local = me.shards(0)
    out = {m: _timed(me, m, reps) for m in methods}
    disconnect(group)
    return out


def trainer_worker(rank: int, address: str, methods: list[str], cfg: dict[str, int],
                   reps: int) -> dict[str, Any]:
    """One trainer rank: every method in order; ``{method: its figures}``."""
    return _worker(rank, "trainer", address, methods, cfg, reps)


def engine_worker(rank: int, address: str, methods: list[str], cfg: dict[str, int],
                  reps: int) -> dict[str, Any]:
    """One engine rank (as :func:`trainer_worker`)."""
    return _worker(rank, "engine", address, methods, cfg, reps)


def run_two_jobs(methods: list[str], cfg: dict[str, int], reps: int, nic_gbit: float,
                 loopback: bool, timeout: float = 3600.0) -> tuple[list, list, str]:
    """Launch the engine job and the trainer job separately (two :func:`meshcast.launch` calls,
    from two threads) on an emulated cluster of 4 hosts (trainer hosts 0-1, engine 2-3), or on
    loopback; (trainer results, engine results, where it ran)."""
    import socket
    import threading

    from ..cluster import Cluster, available
    from ..cluster.subset import HostSubset
    from ..core.topology import Topology
    from ..runtime.launch import launch

    ok, why = (False, "--loopback") if loopback else available()
    results: dict[str, Any] = {}

    def both(address: str, where: dict[str, dict]) -> None:
        def run(role: str, fn) -> None:
            try:
                results[role] = launch(fn, 4, args=(address, methods, cfg, reps),
                                       timeout=timeout, **where[role])
            except Exception as exc:  # reported below, after the other job
                results[role] = exc
        threads = [threading.Thread(target=run, args=a) for a in
                   (("engine", engine_worker), ("trainer", trainer_worker))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    if not ok:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{s.getsockname()[1]}"
        hosts = {"hosts": Topology.uniform(2, 2)}
        both(address, {"trainer": hosts, "engine": hosts})
        where = f"LOOPBACK, not an emulated cluster ({why}): links not shaped"
    else:
        with Cluster.up(4, nic_gbit=nic_gbit, latency_ms=0.0,
                        name=f"mc-bw{os.getpid() % 100000}") as cluster:
            address = f"{cluster.host_addr(0)}:{cluster.free_port(0)}"
            both(address, {"trainer": {"cluster": HostSubset(cluster, [0, 1])},
                           "engine": {"cluster": HostSubset(cluster, [2, 3])}})
        where = (f"emulated cluster: 4 hosts x 2 ranks (network namespaces), NICs shaped to "
                 f"{nic_gbit:g} Gbit/s each way with tc; trainer job on hosts 0-1, engine job on "
                 f"hosts 2-3, launched separately")
    for role in ("trainer", "engine"):
        if isinstance(results.get(role), Exception):
            raise results[role]
    return results["trainer"], results["engine"], where
