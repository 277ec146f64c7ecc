"""The emulated multi-host cluster (meshcast.cluster): real namespaces, veths, bridge, tc, gloo.

Everything that builds namespaces is skipped, with the reason, where that is impossible (not root,
no namespaces). Cluster names carry this process's pid so parallel runs do not collide, and every
cluster is brought down in a fixture or a finally block.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import warnings
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from meshcast.cli import main as cli_main
from meshcast.cluster import (
    IFACE,
    Cluster,
    ClusterError,
    ClusterWarning,
    available,
    down,
    free_port,
    list_clusters,
    netem_available,
    rank_env,
    spawn_in_host,
    start_job,
    wait_job,
)
from meshcast.cluster.cluster import check_name
from meshcast.core.topology import Topology

OK, REASON = available()
needs_netns = pytest.mark.skipif(not OK, reason=f"emulated cluster unavailable: {REASON}")

RUN = f"mc-t{os.getpid()}"
JOB = Path(__file__).with_name("cluster_job.py")
TIMEOUT = 30


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=True).stdout


def netns_names() -> set[str]:
    return set(sh("ip", "netns", "list").split()) - {"(id:"}


def ours(name: str) -> set[str]:
    return {n for n in netns_names() if n == name or n.startswith(name + "-")}


# -- everywhere --------------------------------------------------------------------------------
def test_available_answers_with_a_reason() -> None:
    ok, reason = available()
    assert isinstance(ok, bool) and isinstance(reason, str) and reason


@pytest.mark.parametrize("bad", ["", "x", "mcx", "mc-", "mc-A", "mc_x", "mc-a-sw", "mc-a-h3",
                                 "mc-" + "a" * 60])
def test_bad_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        check_name(bad)


def test_good_names() -> None:
    for name in ("mc", "mc-a", "mc-t123-x9"):
        assert check_name(name) == name


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((0,), {}), ((251,), {}), ((2.0,), {}), ((2,), {"nic_gbit": 0}),
     ((2,), {"latency_ms": -1}), ((2,), {"name": "other"})],
)
def test_bad_arguments_are_refused_before_touching_the_system(args, kwargs) -> None:
    with pytest.raises(ValueError):
        Cluster.up(*args, **kwargs)


def test_topology_matches_the_shaping_without_building() -> None:
    c = Cluster("mc-x", 3, 2.5, 0.2)
    topo = c.topology(4)
    assert topo == Topology.uniform(3, 4, nic_gbps=2.5, intra_gbps=topo.intra_gbps,
                                    latency_us=200.0, name="cluster:mc-x")
    assert topo.hosts == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))
    assert (c.netns(2), c.switch_netns, c.host_addr(2)) == ("mc-x-h2", "mc-x-sw", "10.213.0.3")
    env = c.host_env(1)
    assert env["GLOO_SOCKET_IFNAME"] == IFACE and env["MASTER_ADDR"] == "10.213.0.1"
    assert env["MESHCAST_HOST"] == "1" and env["MESHCAST_HOST_ADDR"] == "10.213.0.2"
    with pytest.raises(ValueError):
        c.netns(3)


# -- with namespaces ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    if not OK:
        pytest.skip(f"emulated cluster unavailable: {REASON}")
    name = f"{RUN}-main"
    root_links = sh("ip", "-br", "link")
    c = Cluster.up(2, nic_gbit=1.0, latency_ms=0.0, name=name)
    try:
        yield c
    finally:
        c.down()
        assert ours(name) == set()
        # nothing was ever created in (or left in) the root namespace
        assert sh("ip", "-br", "link") == root_links


@needs_netns
def test_up_builds_namespaces_addresses_and_loopback(cluster: Cluster) -> None:
    name = cluster.name
    assert ours(name) == {f"{name}-sw", f"{name}-h0", f"{name}-h1"}
    assert list_clusters()[name] == sorted(ours(name))
    for h in range(2):
        ns = cluster.netns(h)
        assert cluster.addresses(h) == [f"10.213.0.{h + 1}/24"]
        links = sh("ip", "-n", ns, "-br", "link").splitlines()
        assert {line.split()[0].split("@")[0] for line in links} == {"lo", IFACE}
        assert "UP" in sh("ip", "-n", ns, "link", "show", "lo").split("<", 1)[1].split(">")[0]
    ports = sh("ip", "-n", cluster.switch_netns, "-br", "link", "show", "master", "br0")
    assert sorted(line.split()[0].split("@")[0] for line in ports.splitlines()) == ["h0", "h1"]
    assert Cluster.detect(name) == cluster


@needs_netns
def test_shaping_is_configured_as_asked(cluster: Cluster) -> None:
    for h in range(2):
        egress = sh("tc", "-n", cluster.netns(h), "qdisc", "show", "dev", IFACE)
        ingress = sh("tc", "-n", cluster.switch_netns, "qdisc", "show", "dev", f"h{h}")
        for text in (egress, ingress):
            assert re.search(r"qdisc tbf .* rate 1Gbit ", text), text
        shaping = cluster.shaping(h)
        assert shaping["egress"].rate_gbit == 1.0 and shaping["ingress"].rate_gbit == 1.0
        assert shaping["egress"].delay_ms == 0.0


@needs_netns
def test_other_rates_and_the_latency_request() -> None:
    name = f"{RUN}-rate"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c = Cluster.up(1, nic_gbit=2.5, latency_ms=0.2, name=name)
        text = sh("tc", "-n", c.switch_netns, "qdisc", "show", "dev", "h0")
        assert re.search(r"rate 2500Mbit ", text), text
        assert c.shaping(0)["egress"].rate_gbit == 2.5
        if netem_available():
            assert c.latency_ms == 0.2 and c.shaping(0)["egress"].delay_ms == 0.2
            assert not any(issubclass(w.category, ClusterWarning) for w in caught)
        else:  # this kernel has no sch_netem: told, and the cluster reports what it really has
            assert c.latency_ms == 0.0
            assert any(issubclass(w.category, ClusterWarning) for w in caught)
        assert Cluster.detect(name) == c
        with pytest.raises(ClusterError, match="already exists"):
            Cluster.up(1, latency_ms=0.0, name=name)
    finally:
        down(name)
    assert ours(name) == set()


@needs_netns
def test_spawn_in_host_runs_inside_the_namespace(cluster: Cluster) -> None:
    code = ("import os;print(os.stat('/proc/self/ns/net').st_ino, os.environ['GLOO_SOCKET_IFNAME'],"
            " os.environ['MASTER_ADDR'], os.environ['MESHCAST_HOST'], os.environ['KEEP'])")
    env = {**os.environ, "KEEP": "kept", "MASTER_ADDR": "wrong", "GLOO_SOCKET_IFNAME": "eth9"}
    p = spawn_in_host(cluster, 1, [sys.executable, "-c", code], env, stdout=subprocess.PIPE,
                      text=True)
    out, _ = p.communicate(timeout=TIMEOUT)
    ino, ifname, master, host, keep = out.split()
    assert p.returncode == 0
    assert int(ino) != os.stat("/proc/self/ns/net").st_ino
    assert (ifname, master, host, keep) == (IFACE, "10.213.0.1", "1", "kept")
    # the host reaches the other host through the bridge, and only the namespace's own links exist
    ping = ("import socket;s=socket.socket();s.settimeout(5);"
            "print(s.connect_ex(('10.213.0.1', 9)))")  # port 9 closed: refused = reachable
    p = spawn_in_host(cluster, 1, [sys.executable, "-c", ping], stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=TIMEOUT)
    assert int(out) == 111  # ECONNREFUSED from host 0's kernel


@needs_netns
def test_gloo_job_2_hosts_x_2_ranks_gives_exact_results(cluster: Cluster, tmp_path: Path) -> None:
    # what a launcher does: one spawn_in_host per rank, with torchrun's env:// variables
    port = free_port(cluster, 0)
    procs = []
    logs = []
    try:
        for rank in range(4):
            host, local = divmod(rank, 2)
            logs.append(open(tmp_path / f"rank{rank}.log", "w"))  # noqa: SIM115
            env = {**os.environ, **rank_env(rank, 4, local, 2, port, host)}
            procs.append(spawn_in_host(cluster, host, [sys.executable, str(JOB)], env,
                                       stdout=logs[-1], stderr=subprocess.STDOUT))
        codes = wait_job(procs, timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=TIMEOUT)
        for f in logs:
            f.close()
    texts = [(tmp_path / f"rank{r}.log").read_text() for r in range(4)]
    assert codes == [0, 0, 0, 0], texts
    for r, text in enumerate(texts):
        assert f"OK rank {r}" in text, text


@needs_netns
def test_start_job_runs_the_same_job(cluster: Cluster) -> None:
    procs = start_job(cluster, [sys.executable, str(JOB)], 2, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
    assert wait_job(procs, timeout=120) == [0, 0, 0, 0]


@needs_netns
def test_down_after_a_crash_finds_everything_by_name() -> None:
    name = f"{RUN}-crash"
    try:
        c = Cluster.up(2, nic_gbit=1.0, latency_ms=0.0, name=name)
        # a process left running in a host, as after a crashed launcher
        orphan = spawn_in_host(c, 1, ["sleep", "60"])
        del c  # the object is gone; a fresh CLI call must clean up from the names alone
        out = io.StringIO()
        with redirect_stdout(out):
            assert cli_main(["cluster", "status", "--name", name]) == 0
        assert f"cluster {name}: 2 hosts" in out.getvalue()
        assert "1 processes" in out.getvalue()
        with redirect_stdout(io.StringIO()):
            assert cli_main(["cluster", "down", "--name", name]) == 0
        assert ours(name) == set()
        assert orphan.wait(timeout=TIMEOUT) != 0  # ended by down
        # a crash half way through `up`: only some namespaces exist
        sh("ip", "netns", "add", f"{name}-h0")
        with pytest.raises(ClusterError, match="incomplete"):
            Cluster.detect(name)
        assert Cluster(name, 2, 1.0, 0.0).down() == [f"{name}-h0"]
        assert ours(name) == set() and Cluster.detect(name) is None
    finally:
        down(name)
    assert ours(name) == set()


@needs_netns
def test_cli_up_status_down() -> None:
    name = f"{RUN}-cli"
    try:
        out = io.StringIO()
        with redirect_stdout(out):
            assert cli_main(["cluster", "up", "--hosts", "3", "--nic-gbit", "0.5",
                             "--latency-ms", "0", "--name", name]) == 0
        assert f"cluster {name}: 3 hosts, 0.5 Gbit/s" in out.getvalue()
        assert ours(name) == {f"{name}-sw"} | {f"{name}-h{h}" for h in range(3)}
        assert re.search(r"rate 500Mbit ", sh("tc", "-n", f"{name}-h2", "qdisc", "show"))
        with redirect_stdout(io.StringIO()):
            assert cli_main(["cluster", "up", "--hosts", "1", "--name", name]) == 1  # exists
            assert cli_main(["cluster", "exec", "--name", name, "--host", "2", "--",
                             "ip", "addr", "show", "dev", IFACE]) == 0
        with redirect_stdout(io.StringIO()):
            assert cli_main(["cluster", "down", "--name", name]) == 0
        assert ours(name) == set()
    finally:
        down(name)
