"""Topology: which host each rank sits on, and how fast hosts talk.

The planner uses the host map to keep traffic off the slow inter-host links; the simulator and the
lower bound use the bandwidths. The runtime fills the host map from the launcher.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .checks import as_index
from .mesh import MAX_MESH_RANKS, Mesh

__all__ = ["EMULATED_INTRA_GBPS", "PRESETS", "Topology", "preset_links"]

# name -> (devices per host, NICs per host, Gbit/s per NIC, intra-host Gbit/s, latency in us)
PRESETS: dict[str, tuple[int, int, float, float, float]] = {
    # The paper's cluster: AWS p3.8xlarge, 4 x V100 with NVLink, ~10 Gbit/s between hosts.
    "p3.8xlarge": (4, 1, 10.0, 800.0, 30.0),
    # A modern GPU node: 8 GPUs with NVLink/NVSwitch, 8 x 400 Gbit/s NICs (one per GPU).
    "h100x8": (8, 8, 400.0, 3600.0, 10.0),
}
PRESETS["modern"] = PRESETS["h100x8"]  # the name for the modern node

EMULATED_INTRA_GBPS = 20.0
"""Intra-host bandwidth (Gbit/s) of the emulated cluster (:mod:`meshcast.cluster`): gloo over
loopback inside one namespace, measured on the 2-core development machine (docs/cluster.md)."""


def preset_links(name: str) -> dict[str, Any]:
    """The link keywords of preset ``name`` (:data:`PRESETS`) for :class:`Topology` and
    :meth:`Topology.from_meshes`: NIC rates both ways, NICs per host, intra-host rate, latency,
    and the preset's name."""
    if name not in PRESETS:
        raise ValueError(f"topology preset {name!r} is unknown; known: {', '.join(PRESETS)}")
    _, nics, nic, intra, lat = PRESETS[name]
    return dict(nic_in_gbps=nic, nic_out_gbps=nic, nics_per_host=nics, intra_gbps=intra,
                latency_us=lat, name=name)


def _per_host(value: float | Sequence[float], num_hosts: int, argument: str) -> tuple[float, ...]:
    values = [value] * num_hosts if isinstance(value, (int, float)) else list(value)
    if len(values) != num_hosts:
        raise ValueError(
            f"{argument} must be one number or one per host ({num_hosts}), got {value!r}"
        )
    for v in values:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
            raise ValueError(f"{argument} must be positive finite numbers, got {v!r}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class Topology:
    """Hosts of ranks plus link speeds.

    ``hosts[h]`` lists the global ranks on host ``h``. Each host has ``nics_per_host[h]`` NICs,
    full duplex, each ``nic_in_gbps[h]`` inbound and ``nic_out_gbps[h]`` outbound (Gbit/s); the
    devices of a host are attached to its NICs in equal consecutive blocks. Inside a host, devices
    talk at ``intra_gbps``; every operation pays ``latency_us`` to start. ``hop_bytes``: what a
    broadcast relay receives before it passes it on (the runtime's chunk), so each hop of a
    broadcast chain after the first adds ``hop_bytes`` at its link's rate to the operation's
    start (0, the default: a perfect pipeline; the bench sets it to calibrate the simulator).
    """

    hosts: tuple[tuple[int, ...], ...]
    nic_in_gbps: tuple[float, ...] = ()
    nic_out_gbps: tuple[float, ...] = ()
    nics_per_host: tuple[int, ...] = ()
    intra_gbps: float = 800.0
    latency_us: float = 30.0
    name: str = ""
    hop_bytes: float = 0.0
    _host_of: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    _covered: set[Any] = field(default_factory=set, init=False, compare=False, repr=False)
    _hash: int = field(default=0, init=False, compare=False, repr=False)

    def __hash__(self) -> int:
        """Of the numbers alone (not ``name``: a string's hash differs between processes), so
        it can be computed once and kept, also in a copy sent to another process."""
        if not self._hash:
            object.__setattr__(self, "_hash", hash((
                self.hosts, self.nic_in_gbps, self.nic_out_gbps, self.nics_per_host,
                self.intra_gbps, self.latency_us, self.hop_bytes)) or 1)
        return self._hash

    def __post_init__(self) -> None:
        hosts = tuple(tuple(as_index(r, "hosts rank") for r in h) for h in self.hosts)
        if not hosts or any(not h for h in hosts):
            raise ValueError("hosts must be a non-empty list of non-empty lists of ranks")
        host_of: dict[int, int] = {}
        for h, ranks in enumerate(hosts):
            for r in ranks:
                if r >= 2**63:
                    raise ValueError(f"hosts: rank {r} is not below 2^63")
                if r in host_of:
                    raise ValueError(f"hosts: rank {r} is on host {host_of[r]} and on host {h}")
                host_of[r] = h
        n = len(hosts)
        object.__setattr__(self, "hosts", hosts)
        object.__setattr__(self, "_host_of", host_of)
        object.__setattr__(
            self, "nic_in_gbps", _per_host(self.nic_in_gbps or 10.0, n, "nic_in_gbps")
        )
        object.__setattr__(
            self, "nic_out_gbps", _per_host(self.nic_out_gbps or 10.0, n, "nic_out_gbps")
        )
        nics = self.nics_per_host or (1,) * n
        nics = tuple(
            as_index(k, "nics_per_host") for k in ([nics] * n if isinstance(nics, int) else nics)
        )
        if len(nics) != n or 0 in nics:
            raise ValueError(
                f"nics_per_host must be a positive count per host, got {self.nics_per_host!r}"
            )
        object.__setattr__(self, "nics_per_host", nics)
        for argument in ("intra_gbps", "latency_us", "hop_bytes"):
            v = getattr(self, argument)
            if (not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < math.inf
                    or (argument == "intra_gbps" and v == 0)):
                raise ValueError(f"{argument} must be a finite number >= 0 (intra_gbps > 0), "
                                 f"got {v!r}")
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a string, got {type(self.name).__name__}")

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def uniform(
        cls,
        num_hosts: int,
        devices_per_host: int,
        *,
        nic_gbps: float = 10.0,
        nics_per_host: int = 1,
        intra_gbps: float = 800.0,
        latency_us: float = 30.0,
        first_rank: int = 0,
        name: str = "",
    ) -> Topology:
        """``num_hosts`` hosts of ``devices_per_host`` consecutive ranks each."""
        num_hosts = as_index(num_hosts, "num_hosts")
        dph = as_index(devices_per_host, "devices_per_host")
        if num_hosts == 0 or dph == 0:
            raise ValueError("num_hosts and devices_per_host must be at least 1")
        if num_hosts * dph > MAX_MESH_RANKS:
            raise ValueError(f"{num_hosts:,} hosts of {dph:,} ranks are {num_hosts * dph:,} "
                             f"ranks; meshcast plans meshes of at most {MAX_MESH_RANKS:,}")
        first = as_index(first_rank, "first_rank")
        hosts = tuple(
            tuple(range(first + h * dph, first + (h + 1) * dph)) for h in range(num_hosts)
        )
        return cls(
            hosts,
            (nic_gbps,) * num_hosts,
            (nic_gbps,) * num_hosts,
            (nics_per_host,) * num_hosts,
            intra_gbps,
            latency_us,
            name,
        )

    @classmethod
    def preset(
        cls,
        name: str,
        num_hosts: int,
        *,
        first_rank: int = 0,
        devices_per_host: int | None = None,
    ) -> Topology:
        """A named cluster: ``"p3.8xlarge"`` (the paper's) or ``"h100x8"`` / ``"modern"`` (8 GPUs,
        8 x 400 Gbit/s NICs). ``devices_per_host`` overrides the preset's count (its links
        stay)."""
        if name not in PRESETS:
            raise ValueError(f"topology preset {name!r} is unknown; known: {', '.join(PRESETS)}")
        dph, nics, nic, intra, lat = PRESETS[name]
        return cls.uniform(
            num_hosts,
            dph if devices_per_host is None else devices_per_host,
            nic_gbps=nic,
            nics_per_host=nics,
            intra_gbps=intra,
            latency_us=lat,
            first_rank=first_rank,
            name=name,
        )

    @classmethod
    def preset_for_meshes(cls, name: str, *meshes: Mesh) -> Topology:
        """Hosts from ``meshes`` by the paper's convention (:meth:`from_meshes`: the last axis of
        each mesh spans one host), links of the preset ``name`` (:meth:`preset`)."""
        return cls.from_meshes(*meshes, **preset_links(name))

    @classmethod
    def from_host_map(cls, host_of: Mapping[int, Any], **kwargs: Any) -> Topology:
        """From ``{rank: host label}``; hosts are numbered in order of their smallest rank."""
        groups: dict[Any, list[int]] = {}
        for r in sorted(host_of):
            groups.setdefault(host_of[r], []).append(r)
        return cls(tuple(tuple(g) for g in groups.values()), **kwargs)

    @classmethod
    def from_meshes(cls, *meshes: Mesh, **kwargs: Any) -> Topology:
        """The paper's convention: the last axis of each mesh spans the devices of one host.

        A rank in several meshes belongs to the host of the first mesh listing it.
        """
        hosts: list[tuple[int, ...]] = []
        seen: set[int] = set()
        for mesh in meshes:
            rows = mesh.array.reshape(-1, mesh.shape[-1])
            for row in rows:
                new = tuple(int(r) for r in row if int(r) not in seen)
                if new:
                    hosts.append(new)
                    seen.update(new)
        return cls(tuple(hosts), **kwargs)

    # -- queries ----------------------------------------------------------------------------
    @property
    def num_hosts(self) -> int:
        """Number of hosts."""
        return len(self.hosts)

    @property
    def hosts_by_rank(self) -> Mapping[int, int]:
        """``{rank: host index}`` for every rank (the topology's own map: read it, do not change
        it)."""
        return self._host_of

    @property
    def ranks(self) -> list[int]:
        """All ranks, sorted."""
        return sorted(self._host_of)

    def host_of(self, rank: int) -> int:
        """Host index of ``rank``."""
        try:
            return self._host_of[rank]
        except KeyError:
            raise ValueError(f"rank {rank} is not in the topology") from None

    def global_nics(self) -> tuple[dict[int, int], list[int]]:
        """Every NIC numbered across hosts (host 0's NICs first): ``({rank: global NIC id},
        [host of each global NIC])``; the devices of a host fill its NICs in equal consecutive
        blocks."""
        nic_of: dict[int, int] = {}
        host_of_nic: list[int] = []
        for h, ranks in enumerate(self.hosts):
            k = self.nics_per_host[h]
            per_nic = -(-len(ranks) // k)
            for j, r in enumerate(ranks):
                nic_of[r] = len(host_of_nic) + j // per_nic
            host_of_nic += [h] * k
        return nic_of, host_of_nic

    def covers(self, ranks: Iterable[int]) -> None:
        """Raise ValueError naming the first rank missing from the topology."""
        missing = [r for r in ranks if r not in self._host_of]
        if missing:
            raise ValueError(f"topology does not place ranks {missing[:8]} on any host")

    def covers_meshes(self, meshes: Iterable[Any]) -> None:
        """:meth:`covers` for the ranks of ``meshes`` (:class:`~meshcast.Mesh`), remembering the
        meshes found covered (so a repeated planning call checks nothing again)."""
        meshes = tuple(meshes)
        covered = self.__dict__.get("_covered")
        if covered is None:  # a topology pickled before it kept them
            object.__setattr__(self, "_covered", covered := set())
        if all(m in covered for m in meshes):
            return
        self.covers({r for m in meshes for r in m})
        if len(covered) > 256:
            covered.clear()
        covered.update(meshes)

    def to_json(self) -> dict[str, Any]:
        """Plain-data form."""
        return {
            "hosts": [list(h) for h in self.hosts],
            "nic_in_gbps": list(self.nic_in_gbps),
            "nic_out_gbps": list(self.nic_out_gbps),
            "nics_per_host": list(self.nics_per_host),
            "intra_gbps": self.intra_gbps,
            "latency_us": self.latency_us,
            "name": self.name,
            **({"hop_bytes": self.hop_bytes} if self.hop_bytes else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Topology:
        """Inverse of :meth:`to_json`; ``ValueError`` for a missing or malformed field."""
        try:
            return cls(
                tuple(tuple(h) for h in data["hosts"]),
                tuple(data["nic_in_gbps"]),
                tuple(data["nic_out_gbps"]),
                tuple(data["nics_per_host"]),
                data["intra_gbps"],
                data["latency_us"],
                data.get("name", ""),
                data.get("hop_bytes", 0.0),
            )
        except KeyError as exc:
            raise ValueError(f"not a complete topology: the field {exc} is missing") from None
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"not a valid topology: {exc}") from None
