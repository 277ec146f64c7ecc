"""Start processes inside the hosts of an emulated cluster (``ip netns exec``).

:func:`spawn_in_host` is the one primitive a launcher needs: it starts one process (one rank)
inside a host's namespace with the cluster's settings in its environment and returns the
:class:`subprocess.Popen`. :func:`rank_env`, :func:`start_job` and :func:`wait_job` are a minimal
launcher on top of it (used by the tests and the benchmark); the runtime's launcher may use them or
only :func:`spawn_in_host`.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .cluster import Cluster

__all__ = ["free_port", "rank_env", "spawn_in_host", "start_job", "wait_job"]


def spawn_in_host(
    cluster: Cluster,
    host: int,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    **popen_kwargs: Any,
) -> subprocess.Popen:
    """Start ``argv`` inside ``host``'s network namespace; return its Popen (see
    :meth:`Cluster.spawn`, which this calls)."""
    return cluster.spawn(host, argv, env, **popen_kwargs)


def rank_env(
    rank: int, world_size: int, local_rank: int, local_world_size: int, master_port: int,
    host: int,
) -> dict[str, str]:
    """The standard ``torch.distributed`` env:// variables of one rank (torchrun's names; add
    ``GROUP_WORLD_SIZE`` when every host runs ``local_world_size`` ranks, as :func:`start_job`
    does, so that :func:`meshcast.job_topology` reads the hosts)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(host),
        "MASTER_PORT": str(master_port),
    }


def free_port(cluster: Cluster, host: int = 0, timeout: float = 15.0) -> int:
    """A TCP port the kernel reports free on ``host`` (for ``MASTER_PORT``; see
    :meth:`Cluster.free_port`)."""
    return cluster.free_port(host, timeout)


def start_job(
    cluster: Cluster,
    argv: Sequence[str],
    ranks_per_host: int,
    *,
    master_port: int | None = None,
    env: Mapping[str, str] | None = None,
    **popen_kwargs: Any,
) -> list[subprocess.Popen]:
    """Start ``ranks_per_host`` copies of ``argv`` in every host; rank ``r`` runs on host
    ``r // ranks_per_host``. Each gets :func:`rank_env`, ``GROUP_WORLD_SIZE`` (the number of
    hosts, as torchrun sets it) and :meth:`Cluster.host_env`.

    Returns the Popens in rank order. If a start fails, those already started are killed.
    """
    if ranks_per_host < 1:
        raise ValueError(f"ranks_per_host must be at least 1, got {ranks_per_host}")
    port = free_port(cluster, 0) if master_port is None else master_port
    world = cluster.num_hosts * ranks_per_host
    base = dict(os.environ if env is None else env)
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(world):
            host, local = divmod(rank, ranks_per_host)
            child_env = {**base, **rank_env(rank, world, local, ranks_per_host, port, host),
                         "GROUP_WORLD_SIZE": str(cluster.num_hosts)}
            procs.append(spawn_in_host(cluster, host, argv, child_env, **popen_kwargs))
    except BaseException:
        for p in procs:
            p.kill()
            p.wait(timeout=5)
        raise
    return procs


def wait_job(procs: Sequence[subprocess.Popen], timeout: float) -> list[int]:
    """Wait for all ``procs``; return their exit codes. If any fails, or ``timeout`` seconds pass,
    the others are killed (their exit codes are then negative) and the codes are returned."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
    return [p.wait(timeout=10) for p in procs]
