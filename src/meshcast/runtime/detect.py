"""Which host each rank sits on: read from the launcher's environment, or gathered once."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Mapping

import torch.distributed as dist

from ..core.cache import BoundedCache
from ..core.job import TOPOLOGY_ENV, read_job_hosts, with_link_rates
from ..core.topology import Topology
from .stats import set_hosts_source

__all__ = ["TOPOLOGY_ENV", "detect_topology", "real_host_map"]

_detected: BoundedCache[tuple, tuple[object, Topology]] = BoundedCache(
    "runtime.detected_topology", 8,
    "detect_topology() by link-rate arguments, with the default group it was gathered on")


def detect_topology(
    *,
    nic_gbps: float | None = None,
    intra_gbps: float | None = None,
    nics_per_host: int | None = None,
) -> Topology:
    """The topology of the running job, in global ranks; computed once per set of arguments.

    In order: what the job's environment says (:func:`meshcast.job_topology`:
    ``$MESHCAST_TOPOLOGY`` from :func:`meshcast.launch`, torchrun's ``LOCAL_WORLD_SIZE`` x
    ``GROUP_WORLD_SIZE`` when every node runs the same number of ranks, one host when
    ``LOCAL_WORLD_SIZE == WORLD_SIZE``); otherwise each rank's ``$MESHCAST_HOST`` label
    (emulated clusters) or hostname, gathered once with ``all_gather_object`` on the default
    group (a collective: then every rank must call). Ranks are always global. The answer is
    kept per default group (a new ``init_process_group`` gathers again).

    Link rates: ``nic_gbps`` (per NIC and direction), ``intra_gbps`` and ``nics_per_host``; when
    not given, ``$MESHCAST_NIC_GBPS``, ``$MESHCAST_INTRA_GBPS``, ``$MESHCAST_NICS_PER_HOST``;
    else 10 Gbit/s NICs, one per host, and 800 Gbit/s inside a host.
    """
    rates = {"nic_gbps": nic_gbps, "intra_gbps": intra_gbps, "nics_per_host": nics_per_host}
    key = (nic_gbps, intra_gbps, nics_per_host)
    hit = _detected.get(key)
    if hit is not None and hit[0] is dist.group.WORLD:  # not from a destroyed default group
        return hit[1]
    world = dist.get_world_size()
    found = read_job_hosts(**rates)
    topology = found.topology
    if topology is None:
        names: list[str | None] = [None] * world
        dist.all_gather_object(names, os.environ.get("MESHCAST_HOST") or socket.gethostname())
        hosts = Topology.from_host_map(dict(enumerate(names)), name="detected host names")
        topology = with_link_rates(hosts, **rates)
    topology.covers(range(world))
    _detected.put(key, (dist.group.WORLD, topology))
    return topology


def real_host_map(
    ranks: Iterable[int], fallback: Mapping[int, int], to_global: Callable[[int], int] = int
) -> dict[int, int]:
    """``{plan rank: host}`` for the byte counters: the real hosts (the job's environment, else
    a topology :func:`detect_topology` already gathered), else ``fallback`` (the plan's
    topology). :attr:`TransferStats.hosts_from` says which was used."""
    ranks = list(ranks)
    found = read_job_hosts()
    real = found.topology
    source = found.source
    if real is None:
        world = dist.group.WORLD
        real = next((t for w, t in _detected.values() if w is world), None)
        source = "meshcast.detect_topology()"
    if real is not None and all(to_global(r) in real.hosts_by_rank for r in ranks):
        set_hosts_source(source)
        return {r: real.host_of(to_global(r)) for r in ranks}
    set_hosts_source(
        "the plan's topology (the real hosts are unknown: " + (found.problem or
        "the job's topology does not hold these ranks") + ")"
    )
    return {r: fallback[r] for r in ranks if r in fallback}
