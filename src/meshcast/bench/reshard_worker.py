"""One rank of a resharding benchmark job: the link probe, every method timed and checked exactly,
and the merge of the ranks' results (:func:`check_results`)."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster import nic_tx_bytes
from ..core.boxes import Box, box_shape, relative
from ..core.plan import Plan
from .call_probe import probe_call
from .reshard_cases import BASELINES, BenchCase
from .reshard_methods import gather_steps


@dataclass
class JobSpec:
    """Everything one case's job needs; identical on every rank."""

    case: BenchCase
    methods: list[str]  # methods to run, in order (duplicates of plans removed)
    plans: dict[str, Plan]
    reps: int
    warmup: int
    corrupt: str | None = None
    progress_path: str | None = None
    probe_bytes: int = 16 * 2**20
    timeout: float = 300.0
    extra: dict[str, Any] = field(default_factory=dict)


def _values(box: Box, shape: tuple[int, ...]):
    """The benchmark tensor's values on ``box``: the linear element index, as int32."""
    import torch

    strides = np.cumprod((*shape[1:], 1)[::-1])[::-1]
    idx = torch.zeros((), dtype=torch.int64)
    for d, (s, st) in enumerate(zip(box, strides)):
        ar = torch.arange(s.start, s.stop, dtype=torch.int64) * int(st)
        view = [1] * len(box)
        view[d] = -1
        idx = idx + ar.view(view)
    return idx.to(torch.int32).contiguous()


def _probe(rank: int, spec: JobSpec, intra: list[str] | None = None) -> dict[str, float]:
    """Link speeds seen by the job: host 0 -> host 1 and rank 0 -> 1 (payload Gbit/s of a plain
    ``dist.send``, median of 3 after a warm-up: ``cross_gbps``, ``intra_socket_gbps``), the
    runtime's own intra-host rate (:func:`_probe_runtime_intra`: ``intra_gbps``, or
    ``intra_gbps+MODE`` per mode of ``intra``), the one-way latency of a 4-byte message
    (ping-pong / 2, median of 20) and the fixed cost of a call over the case's ranks
    (:func:`~meshcast.bench.call_probe.probe_call`: ``call_s``)."""
    import torch
    import torch.distributed as dist

    dph, hosts, nbytes = spec.case.devices_per_host, spec.case.hosts, spec.probe_bytes
    out: dict[str, float] = {}
    pairs = []
    if hosts > 1:
        pairs.append(("cross_gbps", 0, dph))
    if dph > 1:
        pairs.append(("intra_socket_gbps", 0, 1))
    buf = torch.zeros(nbytes // 4, dtype=torch.int32)
    for name, a, b in pairs:
        dist.barrier()
        times = []
        for i in range(4):
            if rank == a:
                t0 = time.monotonic()
                dist.send(buf, b)
                dist.recv(buf[:1], b)
                if i:
                    times.append(time.monotonic() - t0)
            elif rank == b:
                dist.recv(buf, a)
                dist.send(buf[:1], a)
        if rank == a:
            out[name] = nbytes * 8 / statistics.median(times) / 1e9
    if dph > 1:
        for mode in intra or [None]:
            key = "intra_gbps" if mode is None else f"intra_gbps{INTRA_SEP}{mode}"
            rate = _probe_runtime_intra(rank, nbytes, mode)
            if rank == 0:
                out[key] = rate
    if hosts > 1:
        dist.barrier()
        small = torch.zeros(1, dtype=torch.int32)
        times = []
        for _ in range(21):
            if rank == 0:
                t0 = time.monotonic()
                dist.send(small, dph)
                dist.recv(small, dph)
                times.append((time.monotonic() - t0) / 2)
            elif rank == dph:
                dist.recv(small, 0)
                dist.send(small, 0)
        if rank == 0:
            out["latency_us"] = statistics.median(times[1:]) * 1e6
    call_s = probe_call(rank, spec.case.task, spec.timeout)
    if rank == 0:
        out["call_s"] = call_s
    return out


def _probe_runtime_intra(rank: int, nbytes: int, mode: str | None) -> float:
    """Gbit/s of ``meshcast.reshard`` Sends from rank 0 to rank 1 (host 0) on the intra-host
    path ``mode`` (None: the default): the rate of ``nbytes`` with a 4-byte call's time (the
    fixed cost of a call: its agreement, one operation, the end check) taken off; medians of 3
    after a warm-up (rank 0's are the probe's)."""
    import torch
    import torch.distributed as dist

    from ..core.layout import Layout
    from ..core.mesh import Mesh
    from ..core.task import ReshardTask
    from ..planning.planner import plan
    from ..runtime import reshard

    if mode is not None:
        os.environ["MESHCAST_INTRA"] = mode
    times = {}
    for n in (1, nbytes // 4):
        task = ReshardTask((n,), "int32", Layout(Mesh([[0]]), "R"), Layout(Mesh([[1]]), "R"))
        p = plan(task, strategy="send_recv")
        local = torch.zeros(n, dtype=torch.int32) if rank == 0 else None
        got = []
        for i in range(4):
            dist.barrier()
            t0 = time.monotonic()
            if rank in (0, 1):
                reshard(local, p)
            dist.barrier()
            if i:
                got.append(time.monotonic() - t0)
        times[n] = statistics.median(got)
    if mode is not None:
        os.environ.pop("MESHCAST_INTRA")
    spent = max(times[nbytes // 4] - times[1], 1e-6)
    return nbytes * 8 / spent / 1e9


class _Baselines:
    """The two baselines on ``torch.distributed``, set up once per job (groups made in order)."""

    def __init__(self, spec: JobSpec, rank: int, host_of: Callable[[int], int]) -> None:
        import torch.distributed as dist

        self.task = spec.case.task
        self.rank = rank
        self.host_of = host_of
        self.steps = []
        if "gather-scatter" in spec.methods:
            for step in gather_steps(self.task):
                made = []
                for members, parts, union in step:
                    group = dist.new_group(list(members))  # every rank calls, in the same order
                    made.append((members, parts, union, group))
                self.steps.append(made)
        self.cross_bytes = 0

    def _count(self, dst: int, nbytes: int) -> None:
        if self.host_of(dst) != self.host_of(self.rank):
            self.cross_bytes += nbytes

    def per_rank_p2p(self, local):
        import torch
        import torch.distributed as dist

        task, me = self.task, self.rank
        src, dst = list(task.src.mesh.devices), list(task.dst.mesh.devices)
        works, out = [], None
        if me in src:
            peer = dst[src.index(me)]
            works.append(dist.isend(local, peer))
            self._count(peer, local.numel() * local.element_size())
        if me in dst:
            peer = src[dst.index(me)]
            sbox = task.src_box(peer)
            buf = torch.empty(box_shape(sbox), dtype=torch.int32)
            dist.recv(buf, peer)
            out = buf[relative(task.dst_box(me), sbox)].contiguous()
        for w in works:
            w.wait()
        return out

    def gather_scatter(self, local):
        import torch
        import torch.distributed as dist

        task, me = self.task, self.rank
        root = task.src.mesh.devices[0]
        cur = local
        for step in self.steps:
            for members, parts, union, group in step:
                if me not in members:
                    continue
                bufs = [torch.empty_like(cur) for _ in members]
                dist.all_gather(bufs, cur.contiguous(), group=group)
                for o in members:
                    if o != me:
                        self._count(o, cur.numel() * cur.element_size())
                full = torch.empty(box_shape(union), dtype=cur.dtype)
                for b, part in zip(parts, bufs):
                    full[relative(b, union)] = part
                cur = full
        out = None
        if me == root:
            works = []
            for d in task.dst.mesh.devices:
                works.append(dist.isend(cur, d))
                self._count(d, cur.numel() * cur.element_size())
            for w in works:
                w.wait()
        if me in task.dst.mesh.devices:
            buf = torch.empty(task.shape, dtype=torch.int32)
            dist.recv(buf, root)
            out = buf[task.dst_box(me)].contiguous()
        return out


RunRecord = tuple[float, float, bool | None, int, int | None, float]
"""One run on one rank: (start, end, exact (None: receives nothing), cross-host bytes, NIC
bytes, CPU seconds of the process (user + system, all its threads) from start to end)."""

INTRA_SEP = "+"
"""``METHOD+MODE``: the method run with ``$MESHCAST_INTRA=MODE`` (runtime/shm.py)."""


def split_intra(method: str) -> tuple[str, str | None]:
    """``(method, intra mode or None)`` of a run's name (:data:`INTRA_SEP`)."""
    base, _, mode = method.partition(INTRA_SEP)
    return base, (mode or None)


def _cpu_s() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def case_worker(rank: int, spec: JobSpec) -> dict[str, Any]:
    """One rank of a case's job: the link probe, then every method ``warmup + reps`` times.

    Returns ``{"probe": {...}, "runs": {method: [(t0, t1, ok, cross_bytes, nic_bytes), ...]}}``
    where ``ok`` is ``None`` on ranks that receive nothing, else whether the shard was exact."""
    task = spec.case.task
    dph = spec.case.devices_per_host
    intra = sorted({m for m in map(lambda x: split_intra(x)[1], spec.methods) if m})
    probe = _probe(rank, spec, intra)
    sbox, dbox = task.src_box(rank), task.dst_box(rank)
    local = _values(sbox, task.shape) if sbox is not None else None
    expect = _values(dbox, task.shape) if dbox is not None else None
    baselines = _Baselines(spec, rank, lambda r: r // dph)
    done = 0
    runs: dict[str, list[RunRecord]] = {}
    for method in spec.methods:
        runs[method] = []
        for _ in range(spec.warmup + spec.reps):
            runs[method].append(_timed_run(rank, spec, method, local, expect, baselines))
            done += 1
            if rank == 0 and spec.progress_path:
                with open(spec.progress_path, "w") as f:
                    f.write(str(done))
    return {"probe": probe, "runs": runs}


def _timed_run(
    rank: int, spec: JobSpec, method: str, local: Any, expect: Any, baselines: _Baselines
) -> RunRecord:
    """One run of ``method`` between barriers: its times, whether it was exact, its bytes."""
    import torch.distributed as dist

    from ..runtime import reset_transfer_stats, reshard, transfer_stats

    nic_reader = rank % spec.case.devices_per_host == 0
    name = method
    method, intra = split_intra(method)
    if intra is not None:
        os.environ["MESHCAST_INTRA"] = intra
    reset_transfer_stats()
    baselines.cross_bytes = 0
    dist.barrier()
    tx0 = nic_tx_bytes() if nic_reader else None
    c0 = _cpu_s()
    t0 = time.monotonic()
    if method == "gather-scatter":
        out = baselines.gather_scatter(local)
    elif method == "per-rank-p2p":
        out = baselines.per_rank_p2p(local)
    else:
        out = reshard(local, spec.plans[name], timeout=spec.timeout)
    t1 = time.monotonic()
    cpu = _cpu_s() - c0
    dist.barrier()  # every byte of this run has left this host
    tx1 = nic_tx_bytes() if nic_reader else None
    cross = baselines.cross_bytes if method in BASELINES else transfer_stats().cross_host_bytes
    corrupt = rank == spec.case.task.dst.mesh.devices[0] and spec.corrupt in (method, "*")
    ok = _check_output(out, expect, corrupt)
    nic = tx1 - tx0 if tx0 is not None and tx1 is not None else None
    return (t0, t1, ok, cross, nic, cpu)


def _check_output(out: Any, expect: Any, corrupt: bool) -> bool | None:
    """Whether ``out`` is exactly ``expect`` (None where nothing is expected); ``corrupt`` first
    flips one byte of it (the test hook). ``out`` is then poisoned with -1."""
    import torch

    ok: bool | None = None
    if expect is not None:
        if out is not None and corrupt and out.numel():
            out.view(torch.uint8).view(-1)[0] ^= 1  # the test hook
        ok = (
            out is not None
            and tuple(out.shape) == tuple(expect.shape)
            and bool(torch.equal(out, expect))
        )
    elif out is not None:
        ok = False
    if out is not None:
        out.fill_(-1)  # a later run reusing this memory cannot find correct data in it
    return ok


def check_results(spec: JobSpec, results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: timings of the timed runs (median etc.) and byte counts, or
    ``{"error": ...}`` when any run (warm-ups included) delivered wrong data on any rank."""
    out: dict[str, dict[str, Any]] = {}
    for method in spec.methods:
        per_rank = [r["runs"][method] for r in results]
        n = spec.warmup + spec.reps
        bad = sorted(
            {
                (i, rank)
                for rank, rr in enumerate(per_rank)
                for i, rec in enumerate(rr)
                if rec[2] is False
            }
        )
        if bad:
            runs = sorted({i for i, _ in bad})
            ranks = sorted({r for _, r in bad})
            out[method] = {
                "error": f"wrong data on ranks {ranks} in runs {runs} (of {n}, warm-ups first)"
            }
            continue
        times, cross, nic, cpu = [], [], [], []
        for i in range(spec.warmup, n):
            recs = [rr[i] for rr in per_rank]
            times.append(max(r[1] for r in recs) - min(r[0] for r in recs))
            cross.append(sum(r[3] for r in recs))
            nics = [r[4] for r in recs if r[4] is not None]
            nic.append(sum(nics) if nics else None)
            cpu.append(sum(r[5] for r in recs) if all(len(r) > 5 for r in recs) else None)
        out[method] = _cpu_fields(spec, cpu) | {
            "time_s": statistics.median(times),
            "times_s": times,
            "cross_host_bytes": int(statistics.median(cross)),
            "nic_tx_bytes": (
                int(statistics.median(nic)) if all(x is not None for x in nic) else None
            ),
        }
    return out


def merge_probe(results: list[dict[str, Any]]) -> dict[str, float]:
    """The probe's numbers (each measured on one rank)."""
    probe: dict[str, float] = {}
    for r in results:
        probe.update(r["probe"])
    return probe


def delivered_bytes(spec: JobSpec) -> int:
    """Bytes a run delivers: every destination rank's shard (what "moved" counts per GiB)."""
    task = spec.case.task
    return sum(
        math.prod(s.stop - s.start for s in box) * task.itemsize
        for r in task.dst.mesh.devices
        if (box := task.dst_box(r)) is not None
    )


def _cpu_fields(spec: JobSpec, cpu: list[float | None]) -> dict[str, Any]:
    """Median CPU seconds of a run (all ranks' user + system time) and per GiB delivered."""
    if not cpu or any(c is None for c in cpu):
        return {}
    med = statistics.median(cpu)
    return {"cpu_s": med, "cpu_s_per_gib": med / (delivered_bytes(spec) / 2**30)}
