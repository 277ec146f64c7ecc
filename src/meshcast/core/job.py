"""The running job's hosts and link rates, read from its environment (pure: no torch, no
collective).

What the launchers set is enough to know which ranks share a host, the same way on every rank:

1. ``MESHCAST_TOPOLOGY``: a whole topology as JSON (:meth:`Topology.to_json`); set by
   :func:`meshcast.launch` with ``hosts=`` or ``cluster=``, or by the user.
2. torchrun's variables: ``WORLD_SIZE`` ranks, ``GROUP_WORLD_SIZE`` nodes, ``LOCAL_WORLD_SIZE``
   ranks on this node; when every node runs the same number of ranks (``--nproc-per-node``, the
   usual case: ``GROUP_WORLD_SIZE * LOCAL_WORLD_SIZE == WORLD_SIZE`` and this rank's ``RANK``,
   ``GROUP_RANK``, ``LOCAL_RANK`` agree), node ``g`` holds ranks ``g*L .. g*L + L-1``.
3. ``LOCAL_WORLD_SIZE == WORLD_SIZE``: one host (single-node torchrun, ``meshcast.launch``
   without ``hosts``).

Under torchrun with different ``--nproc-per-node`` per node the environment cannot tell the hosts
apart: :func:`job_topology` raises, saying to call :func:`meshcast.detect_topology` (one
``all_gather`` of host names, on every rank) and pass its result as ``topology=``, or to set
``MESHCAST_TOPOLOGY``. In a job whose launcher sets ``WORLD_SIZE`` but not ``LOCAL_WORLD_SIZE``
it warns once and returns None (the planner's convention). Outside a job (no ``WORLD_SIZE``) it
returns None.

Link rates: ``MESHCAST_NIC_GBPS`` (Gbit/s per NIC and direction, default
:data:`DEFAULT_NIC_GBPS`), ``MESHCAST_INTRA_GBPS`` (inside a host, default
:data:`DEFAULT_INTRA_GBPS`) and ``MESHCAST_NICS_PER_HOST`` (default 1) set them for every host,
overriding what ``MESHCAST_TOPOLOGY`` says; the keyword arguments override both.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace

from .cache import BoundedCache
from .mesh import Mesh
from .topology import Topology

__all__ = [
    "DEFAULT_INTRA_GBPS",
    "DEFAULT_NIC_GBPS",
    "INTRA_GBPS_ENV",
    "NICS_PER_HOST_ENV",
    "NIC_GBPS_ENV",
    "TOPOLOGY_ENV",
    "JobHosts",
    "job_topology",
    "read_job_hosts",
    "topology_for_meshes",
    "with_link_rates",
]

TOPOLOGY_ENV = "MESHCAST_TOPOLOGY"
NIC_GBPS_ENV = "MESHCAST_NIC_GBPS"
INTRA_GBPS_ENV = "MESHCAST_INTRA_GBPS"
NICS_PER_HOST_ENV = "MESHCAST_NICS_PER_HOST"
DEFAULT_NIC_GBPS = 10.0
"""Gbit/s per NIC and direction when nothing says otherwise (the paper's p3.8xlarge cluster)."""
DEFAULT_INTRA_GBPS = 800.0
"""Gbit/s between two devices of one host when nothing says otherwise (NVLink-class)."""

_VARS = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_RANK",
         TOPOLOGY_ENV, NIC_GBPS_ENV, INTRA_GBPS_ENV, NICS_PER_HOST_ENV)
_cache: dict[tuple, JobHosts] = {}
_warned: set[tuple] = set()


class JobHosts:
    """What the environment says about the job's hosts: ``topology`` (None when it does not
    say), ``source`` (where it came from) and, when the hosts are unknown, ``problem`` (why, and
    what to do)."""

    __slots__ = ("problem", "source", "topology")

    def __init__(self, topology: Topology | None, source: str, problem: str = "") -> None:
        self.topology = topology
        self.source = source
        self.problem = problem


def _int(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name)
    if text is None or text == "":
        return None
    if not text.strip().isdigit():
        raise ValueError(f"environment variable {name}={text!r} must be a non-negative integer")
    return int(text)


def _rate(env: Mapping[str, str], name: str, given: float | None, kind: type = float):
    value = given if given is not None else env.get(name)
    if value is None or value == "":
        return None
    where = f"environment variable {name}" if given is None else name.lower().replace(
        "meshcast_", "")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}={value!r} must be a positive number") from None
    if isinstance(value, bool) or not number > 0 or number != number or number == float("inf"):
        raise ValueError(f"{where}={value!r} must be a positive number")
    return number


def with_link_rates(
    topology: Topology,
    environ: Mapping[str, str] | None = None,
    *,
    nic_gbps: float | None = None,
    intra_gbps: float | None = None,
    nics_per_host: int | None = None,
) -> Topology:
    """``topology`` with the link rates the arguments, else ``environ`` (default
    ``os.environ``: ``MESHCAST_NIC_GBPS``, ``MESHCAST_INTRA_GBPS``, ``MESHCAST_NICS_PER_HOST``)
    give, for every host; unchanged where neither says."""
    env = os.environ if environ is None else environ
    nic = _rate(env, NIC_GBPS_ENV, nic_gbps)
    intra = _rate(env, INTRA_GBPS_ENV, intra_gbps)
    nics = _rate(env, NICS_PER_HOST_ENV, nics_per_host, int)
    n = topology.num_hosts
    changes: dict = {}
    if nic is not None:
        changes.update(nic_in_gbps=(nic,) * n, nic_out_gbps=(nic,) * n)
    if intra is not None:
        changes["intra_gbps"] = intra
    if nics is not None:
        changes["nics_per_host"] = (nics,) * n
    return replace(topology, **changes) if changes else topology


def _from_torchrun(env: Mapping[str, str]) -> JobHosts:
    world = _int(env, "WORLD_SIZE")
    if world is None or world == 0:
        return JobHosts(None, "no job (WORLD_SIZE is not set)")
    local = _int(env, "LOCAL_WORLD_SIZE")
    nodes = _int(env, "GROUP_WORLD_SIZE")
    fix = (
        "call topology = meshcast.detect_topology() on every rank (one all_gather of host "
        "names) and pass topology=topology, or set MESHCAST_TOPOLOGY to its JSON"
    )
    if local is None or local == 0:
        return JobHosts(None, "unknown", (
            f"WORLD_SIZE={world} is set but LOCAL_WORLD_SIZE is not, so the hosts of this job "
            f"are unknown and the planner falls back to its convention (the last axis of each "
            f"mesh spans one host); {fix}"
        ))
    if (nodes is None or nodes == 1) and local == world:
        return JobHosts(Topology.uniform(1, world, nic_gbps=DEFAULT_NIC_GBPS,
                                         intra_gbps=DEFAULT_INTRA_GBPS, name="one host"),
                        f"one host (LOCAL_WORLD_SIZE = WORLD_SIZE = {world})")
    rank, local_rank, group = (_int(env, v) for v in ("RANK", "LOCAL_RANK", "GROUP_RANK"))
    consistent = nodes is not None and nodes * local == world and (
        None in (rank, local_rank, group) or rank == group * local + local_rank)
    if consistent:
        assert nodes is not None
        return JobHosts(Topology.uniform(nodes, local, nic_gbps=DEFAULT_NIC_GBPS,
                                         intra_gbps=DEFAULT_INTRA_GBPS,
                                         name=f"torchrun {nodes}x{local}"),
                        f"torchrun: {nodes} nodes x {local} ranks")
    return JobHosts(None, "unknown", (
        f"the hosts of this job cannot be read from its environment (WORLD_SIZE={world}, "
        f"LOCAL_WORLD_SIZE={local}, GROUP_WORLD_SIZE={nodes}, RANK={rank}, "
        f"GROUP_RANK={group}: not every node runs the same number of ranks); {fix}"
    ))


def read_job_hosts(
    environ: Mapping[str, str] | None = None,
    *,
    nic_gbps: float | None = None,
    intra_gbps: float | None = None,
    nics_per_host: int | None = None,
) -> JobHosts:
    """What ``environ`` (default ``os.environ``) says about the job's hosts (module docstring);
    never raises for unknown hosts (see :attr:`JobHosts.problem`), only for malformed values."""
    env = os.environ if environ is None else environ
    key = (tuple(env.get(v) for v in _VARS), nic_gbps, intra_gbps, nics_per_host)
    if key in _cache:
        return _cache[key]
    text = env.get(TOPOLOGY_ENV)
    if text:
        try:
            found = JobHosts(Topology.from_json(json.loads(text)), f"${TOPOLOGY_ENV}")
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"environment variable {TOPOLOGY_ENV} is not a topology: {exc}") \
                from None
    else:
        found = _from_torchrun(env)
    if found.topology is not None:
        found.topology = with_link_rates(found.topology, env, nic_gbps=nic_gbps,
                                         intra_gbps=intra_gbps, nics_per_host=nics_per_host)
    _cache[key] = found
    return found


def job_topology(
    environ: Mapping[str, str] | None = None,
    *,
    nic_gbps: float | None = None,
    intra_gbps: float | None = None,
    nics_per_host: int | None = None,
) -> Topology | None:
    """The running job's :class:`Topology` read from its environment (module docstring), or None
    outside a job. Raises ``ValueError`` under torchrun when the hosts cannot be told from the
    environment (nodes of different sizes), saying what to do; warns once and returns None where
    a job's launcher does not set ``LOCAL_WORLD_SIZE``. This is what :func:`meshcast.plan` and
    the other planners use when no ``topology`` is given."""
    found = read_job_hosts(environ, nic_gbps=nic_gbps, intra_gbps=intra_gbps,
                           nics_per_host=nics_per_host)
    if found.topology is not None or not found.problem:
        return found.topology
    env = os.environ if environ is None else environ
    if _int(env, "GROUP_WORLD_SIZE") is not None:
        raise ValueError(f"topology=None: {found.problem}")
    key = tuple(env.get(v) for v in _VARS)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"meshcast: {found.problem}", UserWarning, stacklevel=3)
    return None


def _check_job_covers(topology: Topology, meshes: Sequence[Mesh]) -> None:
    outside = sorted({r for m in meshes for r in m.devices} - set(topology.ranks))
    if outside:
        raise ValueError(
            f"topology=None: the meshes use ranks {outside[:8]} outside this job, whose "
            f"{len(topology.ranks)} ranks meshcast placed on hosts from the job's environment; "
            f"pass topology= to plan for other ranks"
        )


_CONVENTION: BoundedCache[tuple[Mesh, ...], Topology] = BoundedCache(
    "core.convention_topology", 64, "Topology.from_meshes of the meshes planned outside a job"
)
"""The paper-convention topologies :func:`topology_for_meshes` made outside a job, by meshes
(a planning call with a cached plan then costs microseconds, not a new topology)."""


def topology_for_meshes(topology: Topology | None, *meshes: Mesh) -> Topology:
    """``topology``; when it is None, the running job's hosts read from its environment
    (:func:`job_topology`: torchrun, ``meshcast.launch``), else, outside a job, the paper's
    convention (:meth:`Topology.from_meshes`). Checked to place every rank of ``meshes``."""
    if topology is None:
        topology = job_topology()
        if topology is not None:
            _check_job_covers(topology, meshes)
            return topology
        return _CONVENTION.get_or_make(meshes, lambda: Topology.from_meshes(*meshes))
    elif not isinstance(topology, Topology):
        raise TypeError(f"topology must be a meshcast.Topology or None, got {topology!r}")
    topology.covers_meshes(meshes)
    return topology
