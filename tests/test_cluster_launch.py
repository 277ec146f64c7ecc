"""``meshcast.launch(..., cluster=...)``: ranks inside the namespaces of an emulated cluster.

A 2-host x 2-rank job runs real ``meshcast.reshard`` calls (send_recv and broadcast) and checks
them byte for byte; the runtime's own counters show the bytes that crossed hosts, and each rank
checks where it runs (namespace, host, topology). A second job fails on one rank: ``LaunchError``
names it with its traceback and nothing hangs. Skipped, with the reason, where namespaces are
unavailable (not root, no iproute2 ...).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import meshcast
from meshcast import Layout, Mesh, ReshardTask, execute_local, plan, scatter
from meshcast.cluster import Cluster, ClusterError, available
from meshcast.runtime import LaunchError

OK, REASON = available()
needs_netns = pytest.mark.skipif(not OK, reason=f"emulated cluster unavailable: {REASON}")

# 256 KiB held by host 0 (split over its 2 ranks), wanted whole by both ranks of host 1
TASK = ReshardTask(
    (256, 256), "float32",
    Layout(Mesh.from_range(0, (1, 2)), "S1R"), Layout(Mesh.from_range(2, (1, 2)), "RR"),
)
STRATEGIES = ("send_recv", "broadcast")


def _global() -> np.ndarray:
    return np.random.default_rng(5).normal(0, 100, size=TASK.shape).astype(np.float32)


def _reshard_job(rank: int, expected_topology: meshcast.Topology) -> dict:
    """One rank: where it runs, then each strategy's result bytes and cross-host counters."""
    import torch

    from meshcast.runtime import reset_transfer_stats, transfer_stats

    topology = meshcast.detect_topology()
    report: dict = {
        "topology_ok": topology == expected_topology,
        "netns": os.stat("/proc/self/ns/net").st_ino,
        "host": os.environ.get("MESHCAST_HOST"),
        "gloo_iface": os.environ.get("GLOO_SOCKET_IFNAME"),
    }
    box = TASK.src_box(rank)
    local = None if box is None else torch.from_numpy(np.ascontiguousarray(_global()[box]))
    for strategy in STRATEGIES:
        reset_transfer_stats()
        out = meshcast.reshard(local, plan(TASK, topology, strategy=strategy), chunk_bytes=16384,
                               timeout=60)
        stats = transfer_stats()
        report[strategy] = (None if out is None else out.numpy().tobytes(),
                            stats.cross_host_bytes, stats.sent_bytes)
    return report


def _failing_job(rank: int) -> int:
    import torch.distributed as dist

    if rank == 3:
        raise RuntimeError("rank 3 gives up on purpose")
    dist.barrier()  # the others wait for rank 3, which never comes: the launcher stops them
    return rank


@pytest.fixture(scope="module")
def cluster():
    if not OK:
        pytest.skip(f"emulated cluster unavailable: {REASON}")
    c = Cluster.up(2, nic_gbit=1.0, latency_ms=0.0, name=f"mc-t{os.getpid()}-launch")
    try:
        yield c
    finally:
        c.down()


def test_cluster_arguments_are_checked_before_starting_anything() -> None:
    fake = Cluster("mc-x", 2, 1.0, 0.0)  # never built: the checks come first
    with pytest.raises(ValueError, match="multiple"):
        meshcast.launch(_failing_job, 3, cluster=fake)
    with pytest.raises(ValueError, match="conflicts"):
        meshcast.launch(_failing_job, 4, cluster=fake, hosts=4)
    with pytest.raises(TypeError, match="Cluster"):
        meshcast.launch(_failing_job, 4, cluster="mc-x")
    if OK:  # listing namespaces needs root
        with pytest.raises(ClusterError, match="not up"):
            meshcast.launch(_failing_job, 4, cluster=fake)


@needs_netns
@pytest.mark.timeout(240)
def test_reshard_across_emulated_hosts_is_exact_and_counted(cluster: Cluster) -> None:
    topology = cluster.topology(2)
    reports = meshcast.launch(_reshard_job, 4, cluster=cluster, args=(topology,), timeout=120)
    # placement: ranks r // 2 on host r // 2, one namespace per host, gloo on the cluster's NIC
    assert [r["host"] for r in reports] == ["0", "0", "1", "1"]
    assert all(r["topology_ok"] and r["gloo_iface"] == cluster.iface for r in reports)
    inos = [r["netns"] for r in reports]
    assert inos[0] == inos[1] != inos[2] == inos[3] != os.stat("/proc/self/ns/net").st_ino
    nbytes = TASK.nbytes
    for strategy in STRATEGIES:
        p = plan(TASK, topology, strategy=strategy)
        expected = execute_local(p, scatter(_global(), TASK.src))
        for rank in range(4):
            got = reports[rank][strategy][0]
            want = expected[rank].tobytes() if rank in expected else None
            assert got == want, f"{strategy}: rank {rank} differs"
        cross = sum(r[strategy][1] for r in reports)
        assert cross == p.cross_host_bytes()
        # broadcast: every byte enters host 1 once; send_recv: once per receiving rank
        assert cross == (nbytes if strategy == "broadcast" else 2 * nbytes)


@needs_netns
@pytest.mark.timeout(240)
def test_a_failing_rank_is_named_and_the_others_are_stopped(cluster: Cluster) -> None:
    with pytest.raises(LaunchError) as info:
        meshcast.launch(_failing_job, 4, cluster=cluster, timeout=60)
    failures = info.value.failures
    assert "rank 3 gives up on purpose" in failures[3] and "Traceback" in failures[3]
    assert "rank 3 gives up on purpose" in str(info.value)
    assert not any(cluster.pids().values()), "ranks left running inside the namespaces"


class LoopbackHosts:
    """A second :class:`meshcast.runtime.hosts.HostProvider`: every "host" is this machine, each
    rank a plain local process labelled with its host (runs anywhere, no root)."""

    name = "loopback-hosts"

    def __init__(self, num_hosts: int) -> None:
        self.num_hosts = num_hosts

    def ensure_up(self) -> None:
        pass

    def topology(self, devices_per_host: int) -> meshcast.Topology:
        return meshcast.Topology.uniform(self.num_hosts, devices_per_host)

    def host_addr(self, host: int) -> str:
        return "127.0.0.1"

    def free_port(self, host: int) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def spawn(self, host, argv, env=None, **popen_kwargs):
        import subprocess

        child = {**(os.environ if env is None else env), "MESHCAST_HOST": str(host)}
        return subprocess.Popen(list(argv), env=child, **popen_kwargs)


def _placement(rank: int) -> tuple[int, str, int]:
    return rank, os.environ["MESHCAST_HOST"], meshcast.detect_topology().host_of(rank)


@pytest.mark.timeout(240)
def test_launch_takes_any_host_provider() -> None:
    from meshcast.runtime.hosts import HostProvider

    hosts = LoopbackHosts(2)
    assert isinstance(hosts, HostProvider) and not isinstance("mc-x", HostProvider)
    got = meshcast.launch(_placement, 4, cluster=hosts, timeout=120)
    assert got == [(0, "0", 0), (1, "0", 0), (2, "1", 1), (3, "1", 1)]
