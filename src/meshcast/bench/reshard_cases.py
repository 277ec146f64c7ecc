"""The resharding benchmark's cases: the paper's 1-to-m and n-to-m suites as :class:`BenchCase`
values (hosts = mesh rows), the constants of the suite, and the preset topologies for simulation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.cases import ONE_TO_M_MESHES, PAPER_CASES
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask
from ..core.topology import Topology, preset_links

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




def preset_topology(name: str) -> Callable[[BenchCase], Topology]:
    """Hosts = mesh rows (as emulated), links of the preset ``name`` (e.g. ``p3.8xlarge``)."""
    preset_links(name)  # an unknown name raises here, naming the known ones

    def topo(case: BenchCase) -> Topology:
        return Topology.preset(name, case.hosts, devices_per_host=case.devices_per_host)

    return topo
