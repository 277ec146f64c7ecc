"""Some hosts of an emulated cluster as a cluster of their own, for one of several jobs sharing it
(a trainer on hosts 0-1, an inference engine on hosts 2-3): ``meshcast.launch(fn, n,
cluster=HostSubset(cluster, [2, 3]))``. Its host ``i`` is the cluster's host ``hosts[i]``; ranks
keep their real host's environment (``MESHCAST_HOST`` is the cluster's host number), and the job's
store is at its first host."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.topology import Topology
from ._net import exec_in_netns
from .cluster import Cluster

__all__ = ["HostSubset"]


class HostSubset:
    """A :class:`~meshcast.runtime.hosts.HostProvider` of ``hosts`` of ``cluster`` (see the
    module docstring)."""

    def __init__(self, cluster: Cluster, hosts: Sequence[int]) -> None:
        hosts = [int(h) for h in hosts]
        if not hosts or len(set(hosts)) != len(hosts) or \
                any(not 0 <= h < cluster.num_hosts for h in hosts):
            raise ValueError(f"hosts must be distinct hosts of cluster {cluster.name!r} "
                             f"(0..{cluster.num_hosts - 1}), got {hosts}")
        self.cluster, self.hosts = cluster, hosts
        self.name = f"{cluster.name}[{','.join(map(str, hosts))}]"
        self.num_hosts = len(hosts)

    def ensure_up(self) -> None:
        """Raise if the cluster is not up."""
        self.cluster.ensure_up()

    def topology(self, devices_per_host: int) -> Topology:
        """The job's own topology (its hosts renumbered from 0), the cluster's link rates."""
        whole = self.cluster.topology(devices_per_host)
        return Topology.uniform(self.num_hosts, devices_per_host, nic_gbps=self.cluster.nic_gbit,
                                intra_gbps=whole.intra_gbps,
                                latency_us=self.cluster.latency_ms * 1000.0, name=self.name)

    def host_addr(self, host: int) -> str:
        """The address of the job's host ``host``."""
        return self.cluster.host_addr(self.hosts[host])

    def free_port(self, host: int) -> int:
        """A TCP port free on the job's host ``host``."""
        return self.cluster.free_port(self.hosts[host])

    def spawn(self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
              **popen_kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` on the job's host ``host``, the job's store at its first host."""
        real = self.hosts[host]
        full = dict(env or {})
        full.update(self.cluster.host_env(real))
        full["MASTER_ADDR"] = self.host_addr(0)
        return exec_in_netns(self.cluster.netns(real), list(argv), full, **popen_kwargs)
