"""Which host each rank sits on, read from the launcher (or gathered once) as a Topology."""

from __future__ import annotations

import json
import os
import socket

import torch.distributed as dist

from ..topology import Topology

__all__ = ["TOPOLOGY_ENV", "detect_topology"]

TOPOLOGY_ENV = "MESHCAST_TOPOLOGY"
"""Environment variable holding a topology as JSON (``Topology.to_json``); set by
:func:`meshcast.launch` for emulated hosts."""

_cache: dict[object, Topology] = {}


def detect_topology(group: dist.ProcessGroup | None = None) -> Topology:
    """The topology of the running job, in global ranks; computed once per default group.

    In order: ``$MESHCAST_TOPOLOGY`` (JSON, set by :func:`meshcast.launch`); torchrun's
    ``LOCAL_WORLD_SIZE`` when every host runs the same number of ranks; otherwise each rank's
    ``$MESHCAST_HOST`` label (emulated clusters) or hostname, gathered once with
    ``all_gather_object`` (a collective: every rank must call).
    """
    key = dist.group.WORLD
    if key in _cache:
        return _cache[key]
    world = dist.get_world_size()
    text = os.environ.get(TOPOLOGY_ENV)
    if text:
        topology = Topology.from_json(json.loads(text))
    elif _uniform_torchrun(world):
        per_host = int(os.environ["LOCAL_WORLD_SIZE"])
        topology = Topology.uniform(world // per_host, per_host)
    else:
        names: list[str | None] = [None] * world
        dist.all_gather_object(names, os.environ.get("MESHCAST_HOST") or socket.gethostname())
        topology = Topology.from_host_map(dict(enumerate(names)))
    topology.covers(range(world))
    _cache[key] = topology
    return topology


def _uniform_torchrun(world: int) -> bool:
    local = os.environ.get("LOCAL_WORLD_SIZE")
    nodes = os.environ.get("GROUP_WORLD_SIZE")  # torchrun: number of nodes
    if not (local and nodes and local.isdigit() and nodes.isdigit()):
        return False
    return int(local) * int(nodes) == world
