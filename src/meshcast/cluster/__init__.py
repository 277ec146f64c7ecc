"""An emulated multi-host cluster on one machine (GitHub issue 5).

One network namespace per emulated host, joined by a bridge in a namespace of its own, each host's
link shaped with ``tc`` in both directions; processes of a host run inside its namespace::

    from meshcast.cluster import Cluster, available, run_torchrun, spawn_in_host

    ok, reason = available()
    with Cluster.up(2, nic_gbit=1.0) as cluster:
        p = spawn_in_host(cluster, 1, ["python", "worker.py"], env)   # rank on host 1
        topo = cluster.topology(devices_per_host=2)                    # a meshcast.Topology
        codes = run_torchrun(cluster, 2, ["train.py"], timeout=300)    # torchrun on every host

:func:`run_on_emulated_hosts` runs ``meshcast.launch`` on a fresh cluster (loopback without root).

Needs root and iproute2; importing it loads no torch. See docs/cluster.md.
"""

from ._net import PREFIX, ClusterError
from .cluster import Cluster, ClusterWarning, down, down_all, nic_tx_bytes
from .job import run_on_emulated_hosts
from .names import DEFAULT_NAME, IFACE, INTRA_GBPS, SUBNET, list_clusters
from .probe import available, netem_available
from .shaping import LinkShaping
from .spawn import free_port, rank_env, spawn_in_host, start_job, wait_job
from .torchrun import (
    run_torchrun,
    start_torchrun,
    torchrun_command,
    torchrun_executable,
    wait_torchrun,
)

__all__ = [
    "DEFAULT_NAME",
    "IFACE",
    "INTRA_GBPS",
    "PREFIX",
    "SUBNET",
    "Cluster",
    "ClusterError",
    "ClusterWarning",
    "LinkShaping",
    "available",
    "down",
    "down_all",
    "free_port",
    "list_clusters",
    "netem_available",
    "nic_tx_bytes",
    "rank_env",
    "run_on_emulated_hosts",
    "run_torchrun",
    "spawn_in_host",
    "start_job",
    "start_torchrun",
    "torchrun_command",
    "torchrun_executable",
    "wait_job",
    "wait_torchrun",
]
