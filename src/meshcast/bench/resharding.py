"""The resharding benchmark: the paper's suites, every method, real runs checked byte for byte.

Cases (:func:`suite_cases`): the 1-to-m suite (one source device to each mesh of
:data:`meshcast.core.cases.ONE_TO_M_MESHES`, layout ``R -> R``) and the eight n-to-m cases of
:data:`meshcast.core.cases.PAPER_CASES`, int32, scaled to ``nbytes`` (default 64 MiB). Each case
runs on an emulated cluster whose hosts are the meshes' rows: ``devices_per_host`` = the meshes'
column count, source rows first, then destination rows. A 1-to-m source is one device, alone on
host 0; that host gets ``devices_per_host - 1`` idle ranks so that every host has as many ranks
(idle ranks only join the barriers).

Methods (:data:`METHODS`): ``STRATEGY/BALANCE`` for the three strategies x ``none``, ``size``,
``order``; ``auto`` (``plan(task, topology)``, defaults); and two baselines written directly on
``torch.distributed``:

* ``gather-scatter`` (what DTensor users do today): the source mesh all-gathers the full tensor
  (``full_tensor()``: one all-gather per sharded mesh axis, last axis first, on sub-groups), its
  first rank sends the full tensor to every destination rank (all sends at once), which slices
  its part;
* ``per-rank-p2p`` (pipeline libraries when layouts agree): the source rank at each mesh position
  sends its whole shard to the destination rank at the same position, which slices its part. It
  applies only where both meshes have the same shape and every destination box lies inside the
  matching source box (:func:`applies`): the n-to-m cases 1 and 2 and the 1-to-m mesh (1,1).

Every run (warm-ups included) is checked exactly on every destination rank against the expected
shard (values = linear element index, unique per element); a run whose data is wrong on any rank
is reported as a failure and never timed (:class:`DataError` from :func:`check_results`).
Test hook: ``corrupt=METHOD`` (``"*"``: every method; the CLI reads ``$MESHCAST_BENCH_CORRUPT``)
flips one byte of the received shard on the first destination rank after each run of that method,
before the check.

Time of one run: all ranks leave a barrier, each notes ``time.monotonic()`` before and after the
method, and the run takes ``max(end) - min(start)`` over all ranks (every rank is on this
machine, so they share one monotonic clock; network namespaces do not change clocks).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster import nic_tx_bytes
from ..core.cases import ONE_TO_M_MESHES, PAPER_CASES
from ..core.layout import Box, Layout
from ..core.mesh import Mesh
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import EMULATED_INTRA_GBPS, Topology, preset_links
from ..core.units import GBIT
from ..estimate.lower_bound import lower_bound
from ..estimate.simulate import simulate
from ..planning.planner import plan as make_plan

__all__ = [
    "BASELINES",
    "CORRUPT_ENV",
    "METHODS",
    "BenchCase",
    "DataError",
    "applies",
    "baseline_model",
    "baseline_model_s",
    "build_plans",
    "case_worker",
    "check_results",
    "estimate_s",
    "parse_size",
    "run_suite",
    "simulated_rows",
    "suite_cases",
]

FIXED = tuple(
    f"{s}/{b}" for s in ("send_recv", "allgather", "broadcast") for b in ("none", "size", "order")
)
BASELINES = ("gather-scatter", "per-rank-p2p")
METHODS: tuple[str, ...] = (*FIXED, "auto", *BASELINES)
"""Every method, in table order."""
CORRUPT_ENV = "MESHCAST_BENCH_CORRUPT"
"""Environment variable of the corruption test hook (a method name, or ``*``)."""
PAPER_NBYTES = 2**31
"""Bytes of the paper's n-to-m tensor (1024 x 1024 x 512 int32)."""
PAPER_ONE_TO_M_NBYTES = 2**30
"""Bytes of the paper's 1-to-m tensor (2^28 int32)."""
PLAN_LATENCY_US = 100.0
"""Per-operation latency the planner assumes for the emulated cluster (gloo on this machine)."""
PAYLOAD_FRACTION = 1448 / 1514
"""TCP payload per byte on the wire (tbf counts headers): 1 Gbit/s carries 119.6 MB/s of data."""


class DataError(RuntimeError):
    """A benchmark run delivered wrong data; its timings must not be reported."""


def parse_size(text: str) -> int:
    """``"64MiB"`` / ``"1GiB"`` / ``"512KiB"`` / ``"4096"`` -> bytes."""
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "k": 2**10, "m": 2**20, "g": 2**30, "b": 1}
    t = text.strip().lower()
    for unit in sorted(units, key=len, reverse=True):
        if t.endswith(unit):
            number = t[: -len(unit)]
            break
    else:
        unit, number = "b", t
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise ValueError(f"size {text!r}: give bytes or a number with KiB, MiB or GiB") from None
    if value <= 0 or value != int(value):
        raise ValueError(f"size {text!r} must be a positive whole number of bytes")
    return int(value)


@dataclass(frozen=True)
class BenchCase:
    """One benchmark case: a task laid out on ``hosts`` x ``devices_per_host`` ranks."""

    suite: str
    key: str
    label: str
    task: ReshardTask
    hosts: int
    devices_per_host: int
    receivers: int = 0
    note: str = ""

    @property
    def world(self) -> int:
        """Ranks of the job (idle padding ranks included)."""
        return self.hosts * self.devices_per_host

    def topology(self, nic_gbps: float, intra_gbps: float, latency_us: float) -> Topology:
        """The emulated cluster's topology with the given link speeds."""
        return Topology.uniform(
            self.hosts,
            self.devices_per_host,
            nic_gbps=nic_gbps,
            intra_gbps=intra_gbps,
            latency_us=latency_us,
        )


def _one_to_m_case(dst: tuple[int, int], nbytes: int) -> BenchCase:
    rows, cols = dst
    if nbytes % 4:
        raise ValueError(f"1-to-m size {nbytes} must be a multiple of 4 bytes (int32)")
    src = Layout(Mesh.from_range(0, (1, 1)), "R")
    dst_layout = Layout(Mesh.from_range(cols, dst), "R")  # host 0 = the source + idle ranks
    task = ReshardTask((nbytes // 4,), "int32", src, dst_layout)
    return BenchCase(
        "1-to-m",
        f"{rows}x{cols}",
        f"1x1 -> {rows}x{cols}",
        task,
        1 + rows,
        cols,
        receivers=rows * cols,
        note=f"host 0: the source + {cols - 1} idle ranks" if cols > 1 else "",
    )


def _n_to_m_case(number: int, nbytes: int) -> BenchCase:
    case = PAPER_CASES[number - 1]
    scale = PAPER_NBYTES // nbytes  # case 6 (3072 x 1024 x 170) is 2.04 GiB: scaled alike
    if PAPER_NBYTES % nbytes or case.shape[0] % scale:
        raise ValueError(
            f"n-to-m size {nbytes} bytes: the paper's tensors must shrink by a power of two "
            f"dividing their first dimension (2 MiB .. 2 GiB, e.g. 64MiB)"
        )
    task = case.task("int32", scale)
    hosts = case.src_mesh[0] + case.dst_mesh[0]
    return BenchCase(
        "n-to-m",
        f"case{number}",
        case.name,
        task,
        hosts,
        case.src_mesh[1],
        receivers=case.dst_mesh[0] * case.dst_mesh[1],
        note=case.note,
    )


def suite_cases(
    suite: str,
    nbytes: int | None = None,
    keys: Sequence[str] | None = None,
    *,
    paper_scale: bool = False,
) -> list[BenchCase]:
    """The cases of ``suite`` (``1-to-m``, ``n-to-m`` or ``all``), optionally only ``keys``
    (``1x1`` .. ``4x2``, ``case1`` .. ``case8``). ``paper_scale``: the paper's sizes (1 GiB for
    1-to-m, 2 GiB for n-to-m) instead of ``nbytes`` (default 64 MiB)."""
    if suite not in ("1-to-m", "n-to-m", "all"):
        raise ValueError(f"suite {suite!r}: choose 1-to-m, n-to-m or all")
    nbytes = 64 * 2**20 if nbytes is None else nbytes
    cases: list[BenchCase] = []
    if suite in ("1-to-m", "all"):
        size = PAPER_ONE_TO_M_NBYTES if paper_scale else nbytes
        cases += [_one_to_m_case(m, size) for m in ONE_TO_M_MESHES]
    if suite in ("n-to-m", "all"):
        size = PAPER_NBYTES if paper_scale else nbytes
        cases += [_n_to_m_case(c.number, size) for c in PAPER_CASES]
    if keys:
        known = {c.key for c in cases}
        unknown = [k for k in keys if k not in known]
        if unknown:
            raise ValueError(f"cases {unknown} are not in suite {suite!r}: {sorted(known)}")
        cases = [c for c in cases if c.key in keys]
    return cases


# -- methods ------------------------------------------------------------------------------------
def _box_inside(inner: Box, outer: Box) -> bool:
    return all(o.start <= i.start and i.stop <= o.stop for i, o in zip(inner, outer))


def _box_volume(box: Box) -> int:
    return int(np.prod([s.stop - s.start for s in box])) if box else 1


def gather_steps(task: ReshardTask) -> list[list[tuple[tuple[int, ...], tuple[Box, ...], Box]]]:
    """The all-gathers of ``full_tensor()`` on the source mesh: per sharded mesh axis (last
    first), the lines of the mesh along it as (members, each member's box, the union box).

    Raises ``ValueError`` when the parts are unequal (gloo's all-gather needs equal sizes) or do
    not tile their union."""
    mesh = task.src.mesh
    arr = np.asarray(mesh.devices).reshape(mesh.shape)
    full = tuple(slice(0, n) for n in task.shape)
    boxes = {r: task.src.box(r, task.shape) for r in mesh.devices}
    steps = []
    for axis in reversed(range(arr.ndim)):
        lines = np.moveaxis(arr, axis, -1).reshape(-1, arr.shape[axis])
        step = []
        for line in lines:
            members = tuple(int(r) for r in line)
            parts = tuple(boxes[r] for r in members)
            distinct = {tuple((s.start, s.stop) for s in b) for b in parts}  # slices: unhashable
            if len(distinct) == 1:
                continue  # replicated along this axis: nothing to gather
            if len(distinct) != len(parts):
                raise ValueError("a mesh line mixes replicas and shards")
            shapes = {tuple(s.stop - s.start for s in b) for b in parts}
            if len(shapes) != 1:
                raise ValueError("uneven shards: gloo's all-gather needs equal parts")
            union = tuple(
                slice(min(b[d].start for b in parts), max(b[d].stop for b in parts))
                for d in range(len(task.shape))
            )
            if sum(_box_volume(b) for b in parts) != _box_volume(union):
                raise ValueError("the shards of a mesh line do not tile a box")
            step.append((members, parts, union))
            for r in members:
                boxes[r] = union
        if step:
            steps.append(step)
    if any(boxes[r] != full for r in mesh.devices):
        raise ValueError("the all-gathers do not assemble the full tensor")
    return steps


def applies(case: BenchCase, method: str) -> str | None:
    """Why ``method`` does not apply to ``case`` (None: it applies)."""
    task = case.task
    if method == "per-rank-p2p":
        if task.src.mesh.shape != task.dst.mesh.shape:
            return (
                f"meshes differ ({task.src.mesh.notation()} -> {task.dst.mesh.notation()}): "
                "no matching destination rank"
            )
        for s, d in zip(task.src.mesh.devices, task.dst.mesh.devices):
            if not _box_inside(task.dst_box(d), task.src_box(s)):
                return "a destination shard is not inside the matching source shard"
        return None
    if method == "gather-scatter":
        try:
            gather_steps(task)
        except ValueError as exc:
            return str(exc)
        return None
    if method not in METHODS:
        raise ValueError(f"method {method!r} is unknown; choose from {', '.join(METHODS)}")
    return None


def build_plans(
    task: ReshardTask, topology: Topology, methods: Sequence[str]
) -> tuple[dict[str, Plan], dict[str, str]]:
    """Plans of the meshcast methods among ``methods``, and ``{method: earlier method}`` for
    methods whose plan equals an earlier one's (run once, reported for both)."""
    plans: dict[str, Plan] = {}
    same: dict[str, str] = {}
    for m in methods:
        if m in BASELINES:
            continue
        if m == "auto":
            p = make_plan(task, topology)
        else:
            strategy, balance = m.split("/")
            p = make_plan(task, topology, strategy=strategy, balance=balance)
        for earlier, q in plans.items():
            if earlier not in same and q.ops == p.ops:
                same[m] = earlier
                break
        plans[m] = p
    return plans, same


# -- the bandwidth model of the baselines (the simulator cannot express them as plans) -----------
def baseline_model(case: BenchCase, method: str, topology: Topology) -> tuple[float, int]:
    """(seconds, bytes across hosts) of a baseline in a bandwidth model: each phase takes its
    busiest NIC direction's bytes at the NIC rate (intra-host copies at ``intra_gbps``, per
    receiving rank), plus one latency; gather-scatter's phases (each all-gather axis, then the
    sends) run one after another."""
    task = case.task
    host_of = topology._host_of
    nic = topology.nic_in_gbps[0] * GBIT
    intra = topology.intra_gbps * GBIT
    lat = topology.latency_us * 1e-6
    item = task.itemsize
    across = 0

    def phase(flows: list[tuple[int, int, int]]) -> float:
        nonlocal across
        out = np.zeros(topology.num_hosts)
        inn = np.zeros(topology.num_hosts)
        per_rank: dict[int, int] = {}
        for s, d, nbytes in flows:
            if host_of[s] != host_of[d]:
                out[host_of[s]] += nbytes
                inn[host_of[d]] += nbytes
                across += nbytes
            else:
                per_rank[d] = per_rank.get(d, 0) + nbytes
        local = max(per_rank.values(), default=0) / intra
        return lat + max(float(max(out.max(), inn.max())) / nic, local)

    if method == "per-rank-p2p":
        flows = [
            (s, d, _box_volume(task.src_box(s)) * item)
            for s, d in zip(task.src.mesh.devices, task.dst.mesh.devices)
        ]
        return phase(flows), across
    if method != "gather-scatter":
        raise ValueError(f"{method!r} is not a baseline")
    total = 0.0
    for step in gather_steps(task):
        flows = []
        for members, parts, _ in step:
            for m, b in zip(members, parts):
                flows += [(m, o, _box_volume(b) * item) for o in members if o != m]
        total += phase(flows)
    root = task.src.mesh.devices[0]
    total += phase([(root, d, task.nbytes) for d in task.dst.mesh.devices])
    return total, across


def baseline_model_s(case: BenchCase, method: str, topology: Topology) -> float:
    """Seconds of :func:`baseline_model`."""
    return baseline_model(case, method, topology)[0]


# -- the worker (one process per rank) -----------------------------------------------------------
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


def _rel(box: Box, outer: Box) -> tuple[slice, ...]:
    return tuple(slice(b.start - o.start, b.stop - o.start) for b, o in zip(box, outer))


def _probe(rank: int, dph: int, hosts: int, nbytes: int) -> dict[str, float]:
    """Link speeds seen by the job: host 0 -> host 1 and rank 0 -> 1 (payload Gbit/s, median of
    3 after a warm-up) and the one-way latency of a 4-byte message (ping-pong / 2, median of 20)."""
    import torch
    import torch.distributed as dist

    out: dict[str, float] = {}
    pairs = []
    if hosts > 1:
        pairs.append(("cross_gbps", 0, dph))
    if dph > 1:
        pairs.append(("intra_gbps", 0, 1))
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
    return out


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
            buf = torch.empty(tuple(s.stop - s.start for s in sbox), dtype=torch.int32)
            dist.recv(buf, peer)
            out = buf[_rel(task.dst_box(me), sbox)].contiguous()
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
                full = torch.empty(tuple(s.stop - s.start for s in union), dtype=cur.dtype)
                for b, part in zip(parts, bufs):
                    full[_rel(b, union)] = part
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


def case_worker(rank: int, spec: JobSpec) -> dict[str, Any]:
    """One rank of a case's job: the link probe, then every method ``warmup + reps`` times.

    Returns ``{"probe": {...}, "runs": {method: [(t0, t1, ok, cross_bytes, nic_bytes), ...]}}``
    where ``ok`` is ``None`` on ranks that receive nothing, else whether the shard was exact."""
    import torch
    import torch.distributed as dist

    import meshcast

    task = spec.case.task
    dph = spec.case.devices_per_host
    probe = _probe(rank, dph, spec.case.hosts, spec.probe_bytes)

    def host_of(r: int) -> int:
        return r // dph

    sbox, dbox = task.src_box(rank), task.dst_box(rank)
    local = _values(sbox, task.shape) if sbox is not None else None
    expect = _values(dbox, task.shape) if dbox is not None else None
    first_dst = task.dst.mesh.devices[0]
    baselines = _Baselines(spec, rank, host_of)
    nic_reader = rank % dph == 0
    done = 0
    runs: dict[str, list[tuple[float, float, bool | None, int, int | None]]] = {}
    for method in spec.methods:
        runs[method] = []
        for _ in range(spec.warmup + spec.reps):
            meshcast.reset_transfer_stats()
            baselines.cross_bytes = 0
            dist.barrier()
            tx0 = nic_tx_bytes() if nic_reader else None
            t0 = time.monotonic()
            if method == "gather-scatter":
                out = baselines.gather_scatter(local)
            elif method == "per-rank-p2p":
                out = baselines.per_rank_p2p(local)
            else:
                out = meshcast.reshard(local, spec.plans[method], timeout=spec.timeout)
            t1 = time.monotonic()
            dist.barrier()  # every byte of this run has left this host
            tx1 = nic_tx_bytes() if nic_reader else None
            cross = (
                baselines.cross_bytes
                if method in BASELINES
                else meshcast.transfer_stats().cross_host_bytes
            )
            ok: bool | None = None
            if expect is not None:
                if (
                    out is not None
                    and rank == first_dst
                    and spec.corrupt in (method, "*")
                    and out.numel()
                ):
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
            nic = tx1 - tx0 if tx0 is not None and tx1 is not None else None
            runs[method].append((t0, t1, ok, cross, nic))
            done += 1
            if rank == 0 and spec.progress_path:
                with open(spec.progress_path, "w") as f:
                    f.write(str(done))
    return {"probe": probe, "runs": runs}


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
        times, cross, nic = [], [], []
        for i in range(spec.warmup, n):
            recs = [rr[i] for rr in per_rank]
            times.append(max(r[1] for r in recs) - min(r[0] for r in recs))
            cross.append(sum(r[3] for r in recs))
            nics = [r[4] for r in recs if r[4] is not None]
            nic.append(sum(nics) if nics else None)
        out[method] = {
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


# -- simulation --------------------------------------------------------------------------------
def simulated_rows(
    cases: Sequence[BenchCase],
    methods: Sequence[str],
    topology_of: Callable[[BenchCase], Topology],
    plan_topology_of: Callable[[BenchCase], Topology] | None = None,
) -> list[dict[str, Any]]:
    """For each case and method: simulated seconds (baselines: :func:`baseline_model_s`), lower
    bound, effective bandwidth and efficiency on ``topology_of(case)``; plans are made on
    ``plan_topology_of(case)`` (default: the same topology)."""
    rows = []
    for case in cases:
        topo = topology_of(case)
        ptopo = plan_topology_of(case) if plan_topology_of else topo
        bound = lower_bound(case.task, topo)
        plans, same = build_plans(case.task, ptopo, methods)
        for m in methods:
            reason = applies(case, m)
            row: dict[str, Any] = {
                "suite": case.suite,
                "case": case.key,
                "label": case.label,
                "method": m,
                "nbytes": case.task.nbytes,
                "hosts": case.hosts,
                "devices_per_host": case.devices_per_host,
                "receivers": case.receivers,
                "lower_bound_s": bound,
            }
            if reason:
                row["skipped"] = reason
            else:
                if m in BASELINES:
                    t, across = baseline_model(case, m, topo)
                else:
                    t, across = simulate(plans[m], topo).time_s, plans[m].cross_host_bytes()
                row.update(
                    time_s=t,
                    bandwidth_gbit=case.task.nbytes * 8 / t / 1e9,
                    efficiency=bound / t,
                    cross_host_bytes=across,
                    model="bandwidth model" if m in BASELINES else "simulator",
                )
                if m in same:
                    row["same_plan_as"] = same[m]
            rows.append(row)
    return rows


def preset_topology(name: str) -> Callable[[BenchCase], Topology]:
    """Hosts = mesh rows (as emulated), links of the preset ``name`` (e.g. ``p3.8xlarge``)."""
    preset_links(name)  # an unknown name raises here, naming the known ones

    def topo(case: BenchCase) -> Topology:
        return Topology.preset(name, case.hosts, devices_per_host=case.devices_per_host)

    return topo


def dumps(data: Any) -> str:
    """JSON text of benchmark results (NaN/inf written as null)."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, np.generic):
            return x.item()
        return x

    return json.dumps(clean(data), indent=1)


def load_avg() -> list[float]:
    """The machine's 1/5/15-minute load averages."""
    try:
        return list(os.getloadavg())
    except OSError:
        return []


# -- the suite runner ----------------------------------------------------------------------------
RANK_START_S = 1.2
"""Estimated start-up seconds per rank of a job on this 2-core machine (spawn + import torch)."""
RUN_OVERHEAD_S = 0.25
"""Estimated seconds per run beyond its transfer: barriers, the check, poisoning."""


def estimate_s(
    cases: Sequence[BenchCase], methods: Sequence[str], reps: int, warmup: int, nic_gbit: float
) -> float:
    """A rough total time of a measured run: rank start-up, the probe, and every run at its
    simulated time at ``nic_gbit`` (slowed by 1.3) plus a fixed overhead."""
    total = 0.0
    for case in cases:
        topo = case.topology(nic_gbit * PAYLOAD_FRACTION, EMULATED_INTRA_GBPS, PLAN_LATENCY_US)
        sims = simulated_rows([case], methods, lambda c, t=topo: t)
        seen: set[Any] = set()
        runs = 0.0
        for row in sims:
            if "time_s" not in row:
                continue
            key = row.get("same_plan_as")
            if key in seen:
                continue
            seen.add(row["method"])
            runs += (warmup + reps) * (1.3 * row["time_s"] + RUN_OVERHEAD_S + 0.01 * case.world)
        total += RANK_START_S * case.world + 3.0 + runs
    return total


class _ProgressWatcher:
    """Polls the file rank 0 writes after each run and reports ``base + count``."""

    def __init__(self, path: str, base: int, callback: Callable[[int], None] | None) -> None:
        import threading

        self.path, self.base, self.callback = path, base, callback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        last = -1
        while not self._stop.wait(0.3):
            try:
                with open(self.path) as f:
                    n = int(f.read() or 0)
            except (OSError, ValueError):
                continue
            if n != last and self.callback:
                last = n
                self.callback(self.base + n)

    def __enter__(self) -> _ProgressWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def job_methods(
    case: BenchCase, methods: Sequence[str], plan_topology: Topology
) -> tuple[list[str], dict[str, Plan], dict[str, str], dict[str, str]]:
    """(methods to run, plans, {method: same plan as}, {method: why it does not apply})."""
    skipped = {m: r for m in methods if (r := applies(case, m))}
    usable = [m for m in methods if m not in skipped]
    plans, same = build_plans(case.task, plan_topology, usable)
    return [m for m in usable if m not in same], plans, same, skipped


def run_suite(
    cases: Sequence[BenchCase],
    methods: Sequence[str] = METHODS,
    *,
    cluster: bool = False,
    nic_gbit: float = 1.0,
    reps: int = 3,
    warmup: int = 1,
    corrupt: str | None = None,
    progress: Callable[[int], None] | None = None,
    timeout: float = 600.0,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every case (one job per case, all methods inside it) and return the results.

    ``cluster``: on emulated clusters (:mod:`meshcast.cluster`, root; one per host count, brought
    up once, links shaped to ``nic_gbit``) through ``meshcast.launch(cluster=...)``; otherwise on
    loopback (``launch(hosts=...)``, unshaped: hosts exist for planning only). ``progress`` gets
    the number of runs done so far. Returns ``{"rows": [...], "failures": [...], "probes":
    {...}}``; a method whose data was wrong in any run (or whose job failed) has no timings,
    only an entry in ``failures``."""
    import tempfile

    import meshcast

    for m in methods:
        if m not in METHODS:
            raise ValueError(f"method {m!r} is unknown; choose from {', '.join(METHODS)}")
    if corrupt is not None and corrupt != "*" and corrupt not in METHODS:
        raise ValueError(f"corrupt={corrupt!r}: give a method name or '*'")
    say = log or (lambda text: None)
    rows: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    probes: dict[str, dict[str, float]] = {}
    clusters: dict[int, Any] = {}
    done = 0
    tmp = tempfile.mkdtemp(prefix="meshcast-bench-")
    try:
        for case in cases:
            plan_topo = case.topology(
                nic_gbit * PAYLOAD_FRACTION, EMULATED_INTRA_GBPS, PLAN_LATENCY_US
            )
            run_list, plans, same, skipped = job_methods(case, methods, plan_topo)
            path = os.path.join(tmp, f"{case.key}.progress")
            spec = JobSpec(
                case,
                run_list,
                {m: plans[m] for m in run_list if m in plans},
                reps,
                warmup,
                corrupt,
                path,
                timeout=timeout,
            )
            where = "loopback"
            try:
                with _ProgressWatcher(path, done, progress):
                    if cluster:
                        cl = clusters.get(case.hosts)
                        if cl is None:
                            from ..cluster import Cluster

                            name = f"mc-rb{os.getpid() % 100000}-{case.hosts}"
                            cl = clusters[case.hosts] = Cluster.up(
                                case.hosts, nic_gbit=nic_gbit, latency_ms=0.0, name=name
                            )
                        where = f"cluster {cl.name}"
                        results = meshcast.launch(
                            case_worker, case.world, cluster=cl, args=(spec,), timeout=timeout
                        )
                    else:
                        results = meshcast.launch(
                            case_worker, case.world, hosts=case.hosts, args=(spec,), timeout=timeout
                        )
                measured = check_results(spec, results)
                probe = merge_probe(results)
            except Exception as exc:  # a failed job: no method of this case is reported
                text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                say(f"[red]{case.key}: job failed: {text}")
                measured = {m: {"error": f"job failed: {text}"} for m in run_list}
                probe = {}
            done += len(run_list) * (warmup + reps)
            if progress:
                progress(done)
            probes[case.key] = probe
            sim_topo = case.topology(
                probe.get("cross_gbps", nic_gbit * PAYLOAD_FRACTION),
                probe.get("intra_gbps", EMULATED_INTRA_GBPS),
                probe.get("latency_us", PLAN_LATENCY_US),
            )
            bound = lower_bound(case.task, sim_topo)
            for m in methods:
                row: dict[str, Any] = {
                    "suite": case.suite,
                    "case": case.key,
                    "label": case.label,
                    "method": m,
                    "hosts": case.hosts,
                    "devices_per_host": case.devices_per_host,
                    "world": case.world,
                    "receivers": case.receivers,
                    "nbytes": case.task.nbytes,
                    "where": where,
                    "lower_bound_s": bound,
                }
                if m in skipped:
                    row["skipped"] = skipped[m]
                    rows.append(row)
                    continue
                source = same.get(m, m)
                got = measured.get(source, {"error": "not run"})
                if "error" in got:
                    failures.append({"case": case.key, "method": m, "error": got["error"]})
                    say(f"[bold red]{case.key} {m}: {got['error']}: not reported")
                    row["error"] = got["error"]
                    rows.append(row)
                    continue
                sim = (
                    baseline_model_s(case, m, sim_topo)
                    if m in BASELINES
                    else simulate(plans[m], sim_topo).time_s
                )
                t = got["time_s"]
                row.update(got)
                row.update(
                    bandwidth_gbit=case.task.nbytes * 8 / t / 1e9,
                    efficiency=bound / t,
                    sim_s=sim,
                    sim_ratio=sim / t,
                    sim_model="bandwidth model" if m in BASELINES else "simulator",
                )
                if m in same:
                    row["same_plan_as"] = same[m]
                rows.append(row)
    finally:
        for cl in clusters.values():
            try:
                cl.down()
            except Exception as exc:  # report, keep taking the others down
                say(f"[red]could not take down {cl.name}: {exc}")
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return {"rows": rows, "failures": failures, "probes": probes}


def markdown_report(doc: dict[str, Any]) -> str:
    """Markdown tables (method x case) of a results document: time with efficiency, effective
    bandwidth, bytes across hosts, and (measured runs) simulated / measured."""
    rows = doc["rows"]
    measured = any("sim_ratio" in r for r in rows)
    out = []
    for suite in ("1-to-m", "n-to-m"):
        part = [r for r in rows if r["suite"] == suite]
        if not part:
            continue
        cases = list(dict.fromkeys(r["case"] for r in part))
        methods = list(dict.fromkeys(r["method"] for r in part))
        by = {(r["case"], r["method"]): r for r in part}

        def cell(r: dict[str, Any] | None, what: str) -> str:
            if r is None:
                return ""
            if "skipped" in r:
                return "n/a"
            if "error" in r:
                return "FAILED"
            if what == "time":
                return f"{r['time_s'] * 1e3:.0f} ({r['efficiency']:.2f})"
            if what == "bw":
                return f"{r['bandwidth_gbit']:.3f}"
            if what == "across":
                v = r.get("cross_host_bytes")
                return "-" if v is None else f"{v / 2**20:.0f}"
            return f"{r['sim_ratio']:.2f}"

        tables = [
            ("time", "time ms (efficiency = lower bound / time)"),
            ("bw", "effective bandwidth, Gbit/s (tensor bytes / time)"),
            ("across", "MiB across hosts"),
        ]
        if measured:
            tables.append(("sim", "simulated / measured time"))
        for what, title in tables:
            out.append(f"**{suite}: {title}**\n")
            out.append("| method | " + " | ".join(cases) + " |")
            out.append("|---|" + "---|" * len(cases))
            for m in methods:
                out.append(
                    f"| {m} | " + " | ".join(cell(by.get((c, m)), what) for c in cases) + " |"
                )
            if what == "time":
                bounds = [f"{by[c, methods[0]]['lower_bound_s'] * 1e3:.0f}" for c in cases]
                out.append("| *lower bound ms* | " + " | ".join(bounds) + " |")
            out.append("")
    return "\n".join(out)
