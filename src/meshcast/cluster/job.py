"""Run a job on a fresh emulated cluster when this machine can build one, else on loopback.

:func:`run_on_emulated_hosts` is what the benchmarks, examples and ``meshcast demo`` use to run
``fn(rank, *args)`` on ``world // ranks_per_host`` emulated hosts: with root and network namespaces
it brings up a cluster (NICs shaped to ``nic_gbit``) under a name unique to this process, runs
:func:`meshcast.launch` with ``cluster=`` on it and always brings it down; otherwise it runs
:func:`meshcast.launch` on loopback with the same :class:`~meshcast.Topology` (planning sees the
hosts, links are not shaped). Either way it says where the job ran.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from ..core.topology import Topology
from .cluster import Cluster
from .probe import available

__all__ = ["run_on_emulated_hosts"]


def run_on_emulated_hosts(
    fn: Callable[..., Any],
    world: int,
    ranks_per_host: int,
    *,
    nic_gbit: float = 1.0,
    args: Sequence[Any] = (),
    timeout: float = 300.0,
    loopback: bool = False,
    name: str | None = None,
) -> tuple[list[Any], str]:
    """Results of ``fn(rank, *args)`` in rank order, and where it ran (a one-line description).

    ``fn`` must be a module-level function (a script's function works too; keep the script's own
    work under ``if __name__ == "__main__":``). ``loopback=True`` skips the emulated cluster.
    ``name`` is the cluster's name (default ``mc-job<pid>``). Failures raise
    :class:`meshcast.LaunchError` (or :class:`meshcast.cluster.ClusterError` from bringing the
    cluster up).
    """
    from ..runtime.launch import launch  # loads torch: not on importing meshcast.cluster

    if ranks_per_host < 1 or world % ranks_per_host:
        raise ValueError(f"ranks_per_host={ranks_per_host} must divide world={world}")
    hosts = world // ranks_per_host
    ok, why = (False, "--loopback") if loopback else available()
    if not ok:
        topo = Topology.uniform(hosts, ranks_per_host, nic_gbps=nic_gbit)
        results = launch(fn, world, hosts=topo, args=args, timeout=timeout)
        return results, (
            f"LOOPBACK, not an emulated cluster ({why}): {hosts} hosts x {ranks_per_host} ranks "
            "emulated for planning only, links not shaped"
        )
    name = name or f"mc-job{os.getpid() % 100000}"
    with Cluster.up(hosts, nic_gbit=nic_gbit, latency_ms=0.0, name=name) as cluster:
        results = launch(fn, world, cluster=cluster, args=args, timeout=timeout)
    return results, (
        f"emulated cluster: {hosts} hosts x {ranks_per_host} ranks (network namespaces), NICs "
        f"shaped to {nic_gbit:g} Gbit/s each way with tc"
    )
