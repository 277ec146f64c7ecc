"""The real ``torchrun`` across emulated hosts (issue 11, points 7 and 8), as root.

One 2-host cluster; one torchrun agent per host (``meshcast.cluster.run_torchrun`` and the
``meshcast cluster torchrun`` command), 2 ranks each. tests/topology_job.py plans with no
topology: the plan must use torchrun's hosts, deliver exact data, move each byte into host 1 once,
and the runtime's counters must agree with the expected bytes and with the NIC counters of the
emulated hosts (also for a plan made with a wrong topology). The same job runs under
``meshcast.launch(..., cluster=...)``. Every node exits 0; a failing node is reported and nothing
is left running in the namespaces. Skipped, with the reason, where namespaces are unavailable.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import meshcast as mc
from meshcast.cluster import Cluster, available, run_torchrun, torchrun_command

OK, REASON = available()
needs_netns = pytest.mark.skipif(not OK, reason=f"emulated cluster unavailable: {REASON}")
HERE = os.path.dirname(os.path.abspath(__file__))
HOSTS = mc.Topology.uniform(2, 2)
MESHCAST = os.path.join(os.path.dirname(sys.executable), "meshcast")  # the installed command
SLACK = 64 << 10  # NIC bytes beyond the payload: TCP/IP headers, acks, barriers


@pytest.fixture(scope="module")
def cluster():
    if not OK:
        pytest.skip(f"emulated cluster unavailable: {REASON}")
    c = Cluster.up(2, nic_gbit=1.0, latency_ms=0.0, name=f"mc-b{os.getpid()}-tr")
    try:
        yield c
    finally:
        c.down()


def test_torchrun_command_sets_what_multi_node_torchrun_needs() -> None:
    fake = Cluster("mc-x", 2, 1.0, 0.0)  # never built: the command is plain data
    cmd = torchrun_command(fake, 1, 2, ["train.py", "--lr", "1"], port=29400)
    i = cmd.index("--nnodes")
    assert cmd[i:] == [
        "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.213.0.1:29400",
        "--rdzv-id", "mc-x-29400", "--rdzv-conf", "is_host=false", "--local-addr", "10.213.0.2",
        "--max-restarts", "0", "train.py", "--lr", "1",
    ]
    assert "is_host=true" in torchrun_command(fake, 0, 2, ["t.py"], port=29400)
    with pytest.raises(ValueError, match="nproc_per_node"):
        torchrun_command(fake, 0, 0, ["t.py"], port=29400)
    with pytest.raises(ValueError, match="argv"):
        torchrun_command(fake, 0, 1, "t.py", port=29400)


def _expected_cross(plan: mc.Plan) -> dict[int, int]:
    """Bytes each real host sends to the other, by the plan's transfers."""
    out = {0: 0, 1: 0}
    for t in plan.transfers():
        a, b = HOSTS.host_of(t.src), HOSTS.host_of(t.dst)
        if a != b:
            out[a] += t.nbytes
    return out


def _check_reports(reports: list[dict], hosts_from: str) -> None:
    import topology_job

    assert [r["rank"] for r in reports] == [0, 1, 2, 3]
    assert [r["host_label"] for r in reports] == ["0", "0", "1", "1"]
    default = [r["default"] for r in reports]
    one_host = [r["one_host"] for r in reports]
    assert all(d["exact"] for d in default + one_host)
    assert all(d["hosts"] == [[0, 1], [2, 3]] and d["hosts_from"] == hosts_from
               for d in default)
    # the default plan: each byte into host 1 once, by the counters and by host 0's NIC
    nbytes = topology_job.TASK.nbytes
    assert sum(d["cross_host_bytes"] for d in default) == nbytes
    assert all(d["plan_cross_host_bytes"] == nbytes for d in default)
    assert nbytes <= default[0]["nic_tx_delta"] <= nbytes + SLACK
    assert default[0]["nic_tx_delta"] == default[1]["nic_tx_delta"] or \
        abs(default[0]["nic_tx_delta"] - default[1]["nic_tx_delta"]) <= SLACK
    assert default[2]["nic_tx_delta"] <= SLACK  # host 1 sends no payload
    # a plan made for one host: its own idea is 0 bytes across; the counters count the real ones
    plan = mc.plan(topology_job.TASK, topology_job.ONE_HOST, strategy="broadcast")
    out = _expected_cross(plan)
    assert plan.cross_host_bytes() == 0 < sum(out.values())
    assert sum(d["cross_host_bytes"] for d in one_host) == sum(out.values())
    for host, rank in ((0, 0), (1, 2)):
        assert out[host] <= one_host[rank]["nic_tx_delta"] <= out[host] + SLACK


@needs_netns
@pytest.mark.timeout(300)
def test_torchrun_on_two_emulated_hosts_plans_with_the_real_hosts(cluster, tmp_path) -> None:
    import json

    with open(tmp_path / "torchrun.log", "w") as log:
        codes = run_torchrun(cluster, 2, [os.path.join(HERE, "topology_job.py"), str(tmp_path)],
                             timeout=240, stdout=log, stderr=subprocess.STDOUT)
    text = (tmp_path / "torchrun.log").read_text()
    assert codes == [0, 0], text[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["group_rank"] for r in reports] == ["0", "0", "1", "1"]
    _check_reports(reports, "torchrun: 2 nodes x 2 ranks")
    assert not any(cluster.pids().values()), "processes left in the namespaces"


@needs_netns
@pytest.mark.timeout(300)
def test_launch_on_the_cluster_plans_with_its_hosts(cluster) -> None:
    import topology_job

    reports = mc.launch(topology_job.measure, 4, cluster=cluster, timeout=120)
    _check_reports(reports, "$MESHCAST_TOPOLOGY")


@needs_netns
@pytest.mark.timeout(300)
def test_meshcast_cluster_torchrun_command(cluster) -> None:
    cmd = [MESHCAST, "cluster", "torchrun", "--name", cluster.name,
           "--nproc-per-node", "2", "--timeout", "200", "--", os.path.join(HERE, "cluster_job.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=260)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # (the workers share the agents' stdout: lines may interleave)
    assert sorted(re.findall(r"OK rank (\d+)", proc.stdout)) == ["0", "1", "2", "3"]
    assert "meshcast cluster torchrun: host 0 exit 0, host 1 exit 0" in proc.stderr
    assert not any(cluster.pids().values())


@needs_netns
@pytest.mark.timeout(300)
def test_a_failing_node_is_reported_and_nothing_is_left(cluster, tmp_path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '3' else 0)\n")
    cmd = [MESHCAST, "cluster", "torchrun", "--name", cluster.name,
           "--nproc-per-node", "2", "--timeout", "200", "--", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=260)
    assert proc.returncode == 1, proc.stderr[-3000:]
    # host 1 fails; host 0's workers succeed, its agent waits for host 1 at torchrun's exit
    # barrier until meshcast stops it (after GRACE_S)
    assert re.search(r"meshcast cluster torchrun: host 0 exit (0|-9 \(stopped\)), host 1 exit 1",
                     proc.stderr), proc.stderr[-2000:]
    assert not any(cluster.pids().values())
    bad = subprocess.run([MESHCAST, "cluster", "torchrun", "--name",
                          cluster.name, "--nproc-per-node", "0", "--", str(script)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "--nproc-per-node: must be an integer >= 1, got '0'" in bad.stderr


@needs_netns
@pytest.mark.timeout(300)
def test_nodes_started_one_by_one_with_the_same_port(cluster) -> None:
    from meshcast.cluster import free_port

    port = free_port(cluster, 0)
    procs = [subprocess.Popen([MESHCAST, "cluster", "torchrun", "--name", cluster.name,
                               "--nproc-per-node", "2", "--port", str(port), "--node", str(h),
                               "--timeout", "200", "--", os.path.join(HERE, "cluster_job.py")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for h in (1, 0)]
    outs = [p.communicate(timeout=260) for p in procs]
    for (h, p), (out, err) in zip(zip((1, 0), procs), outs):
        assert p.returncode == 0, err[-3000:]
        assert f"meshcast cluster torchrun: host {h} exit 0" in err
        assert sorted(re.findall(r"OK rank (\d+)", out)) == [str(2 * h), str(2 * h + 1)]
    assert not any(cluster.pids().values())
