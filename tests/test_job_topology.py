"""The default topology is the job's real hosts (issue 11, point 7), without a collective.

Pure: :func:`meshcast.job_topology` on torchrun's and meshcast.launch's variables (exact
topologies, loud errors and warnings, link rates from arguments and environment variables).
Real processes (``meshcast.launch``, loopback): the default plan of a job with emulated hosts
uses them on every rank, moves each byte into each receiving host once, and the byte counters
count by those hosts even for a plan made with a wrong topology. The emulated cluster and the
real ``torchrun`` command are in tests/test_cluster_torchrun.py.
"""

from __future__ import annotations

import warnings

import pytest

import meshcast as mc
from meshcast.core.job import DEFAULT_INTRA_GBPS, DEFAULT_NIC_GBPS, read_job_hosts
from meshcast.core.layout import box_size

TORCHRUN_2X2 = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2",
                "RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1"}


def test_outside_a_job_the_planner_keeps_its_convention() -> None:
    assert mc.job_topology({}) is None
    import topology_job

    plan = mc.plan(topology_job.TASK)  # this pytest process is no job
    assert plan.topology.hosts == ((0, 1), (2,), (3,))
    assert plan.cross_host_bytes() == 2 * topology_job.TASK.nbytes


def test_torchrun_with_equal_nodes() -> None:
    topo = mc.job_topology(TORCHRUN_2X2)
    assert topo == mc.Topology.uniform(2, 2, nic_gbps=DEFAULT_NIC_GBPS,
                                       intra_gbps=DEFAULT_INTRA_GBPS, name="torchrun 2x2")
    assert read_job_hosts(TORCHRUN_2X2).source == "torchrun: 2 nodes x 2 ranks"
    # every rank reads the same topology
    for rank in range(4):
        env = {**TORCHRUN_2X2, "RANK": str(rank), "LOCAL_RANK": str(rank % 2),
               "GROUP_RANK": str(rank // 2)}
        assert mc.job_topology(env) == topo


def test_one_host() -> None:
    for env in ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"},  # meshcast.launch without hosts
                {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "1"}):
        assert mc.job_topology(env).hosts == (tuple(range(8)),)


def test_meshcast_topology_variable_wins() -> None:
    import json

    topo = mc.Topology(((0, 2), (1, 3)), nic_in_gbps=(5.0, 5.0), nic_out_gbps=(5.0, 5.0))
    env = {**TORCHRUN_2X2, "MESHCAST_TOPOLOGY": json.dumps(topo.to_json())}
    assert mc.job_topology(env) == topo
    with pytest.raises(ValueError, match="MESHCAST_TOPOLOGY is not a topology"):
        mc.job_topology({"MESHCAST_TOPOLOGY": '{"hosts": []}'})


def test_nodes_of_different_sizes_are_refused_with_the_remedy() -> None:
    # node 0 runs 4 ranks, node 1 runs 2: world 6, this rank is on node 1
    env = {"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2", "RANK": "5",
           "LOCAL_RANK": "1", "GROUP_RANK": "1"}
    with pytest.raises(ValueError, match=r"topology=None: the hosts of this job cannot be read.*"
                                         r"meshcast\.detect_topology\(\) on every rank"):
        mc.job_topology(env)
    # the same sizes on node 0 (3 ranks of 3 x 2 = 6) but the ranks do not add up
    env = {"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3", "GROUP_WORLD_SIZE": "2", "RANK": "4",
           "LOCAL_RANK": "1", "GROUP_RANK": "1"}
    assert mc.job_topology(env) == mc.Topology.uniform(2, 3, name="torchrun 2x3")
    env["RANK"] = "2"  # node 1 starting at rank 2: node 0 has 2 ranks, not 3
    with pytest.raises(ValueError, match="not every node runs the same number of ranks"):
        mc.job_topology(env)


def test_a_job_without_local_world_size_warns_once() -> None:
    env = {"WORLD_SIZE": "4", "RANK": "0", "MESHCAST_NIC_GBPS": "3"}
    with pytest.warns(UserWarning, match="LOCAL_WORLD_SIZE is not.*detect_topology"):
        assert mc.job_topology(env) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mc.job_topology(env) is None


def test_link_rates_from_arguments_and_environment() -> None:
    env = {**TORCHRUN_2X2, "MESHCAST_NIC_GBPS": "25", "MESHCAST_INTRA_GBPS": "150",
           "MESHCAST_NICS_PER_HOST": "2"}
    topo = mc.job_topology(env)
    assert topo.nic_in_gbps == topo.nic_out_gbps == (25.0, 25.0)
    assert topo.intra_gbps == 150.0 and topo.nics_per_host == (2, 2)
    topo = mc.job_topology(env, nic_gbps=100, intra_gbps=900.0)  # arguments win
    assert topo.nic_in_gbps == (100.0, 100.0) and topo.intra_gbps == 900.0
    plain = mc.job_topology(TORCHRUN_2X2)
    assert plain.nic_in_gbps == (DEFAULT_NIC_GBPS,) * 2 and plain.intra_gbps == 800.0
    for name, value in (("MESHCAST_NIC_GBPS", "fast"), ("MESHCAST_NIC_GBPS", "0"),
                        ("MESHCAST_INTRA_GBPS", "-1"), ("MESHCAST_NICS_PER_HOST", "1.5")):
        with pytest.raises(ValueError, match=f"environment variable {name}="):
            mc.job_topology({**TORCHRUN_2X2, name: value})
    with pytest.raises(ValueError, match="nic_gbps=0 must be a positive number"):
        mc.job_topology(TORCHRUN_2X2, nic_gbps=0)
    with pytest.raises(ValueError, match="WORLD_SIZE='x' must be a non-negative integer"):
        mc.job_topology({"WORLD_SIZE": "x"})


def _bytes_each_host_lacks(task: mc.ReshardTask, hosts: mc.Topology) -> dict[int, int]:
    """Bytes each host needs and holds no copy of: the least that must enter it."""
    need: dict[int, int] = {}
    for unit in task.unit_slices():
        held = {hosts.host_of(r) for r in unit.holders}
        for h in {hosts.host_of(r) for r in unit.receivers} - held:
            need[h] = need.get(h, 0) + box_size(unit.box) * task.itemsize
    return need


def test_under_torchrun_the_default_plan_moves_each_byte_into_each_host_once(monkeypatch):
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2", "RANK": "5",
           "LOCAL_RANK": "1", "GROUP_RANK": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    meshes = [mc.Mesh([0, 1, 2, 3]), mc.Mesh([[0, 4], [1, 5]]), mc.Mesh([[4, 5, 6, 7]]),
              mc.Mesh([[0, 4], [2, 6], [1, 5], [3, 7]]), mc.Mesh.from_range(0, (2, 4))]
    specs = {1: ["S0R", "RS0", "RR"], 2: ["S0R", "RS1", "S01R", "S10R", "RR", "S1S0"]}
    layouts = [mc.Layout(m, s) for m in meshes for s in specs[m.ndim]]
    pairs = [(a, b) for a in layouts for b in layouts][::7]  # 64 MiB tasks: bytes dominate
    for src, dst in pairs:
        task = mc.ReshardTask((4096, 4096), "float32", src, dst)
        p = mc.plan(task)  # no topology: torchrun's 2 nodes x 4
        assert p.topology.hosts == ((0, 1, 2, 3), (4, 5, 6, 7))
        into = {h: i for h, (_, i) in p.bytes_per_host().items() if i}
        assert into == _bytes_each_host_lacks(task, p.topology), task.describe()


def _in_job(rank: int) -> dict:
    import topology_job

    report = topology_job.measure(rank)
    try:
        mc.plan(mc.ReshardTask((4,), "float32", mc.Layout(mc.Mesh([0, 1]), "S0"),
                               mc.Layout(mc.Mesh([6, 7]), "R")))
        report["outside"] = "no error"
    except ValueError as exc:
        report["outside"] = str(exc)
    detected = mc.detect_topology(nic_gbps=2.5)
    report["detected"] = (detected.hosts, detected.nic_in_gbps, detected.intra_gbps)
    return report


def _expected_cross(plan: mc.Plan, hosts: mc.Topology) -> int:
    return sum(t.nbytes for t in plan.transfers() if hosts.host_of(t.src) != hosts.host_of(t.dst))


@pytest.mark.timeout(300)
def test_under_launch_the_default_plan_uses_the_emulated_hosts(monkeypatch) -> None:
    import topology_job

    monkeypatch.setenv("MESHCAST_INTRA_GBPS", "40")
    hosts = mc.Topology.uniform(2, 2)
    reports = mc.launch(_in_job, 4, hosts=2, timeout=120)
    nbytes = topology_job.TASK.nbytes
    for r in reports:
        assert r["default"]["exact"] and r["one_host"]["exact"]
        assert r["default"]["hosts"] == [[0, 1], [2, 3]]
        assert r["default"]["hosts_from"] == "$MESHCAST_TOPOLOGY"
        assert "ranks [6, 7] outside this job" in r["outside"]
        assert r["detected"] == (hosts.hosts, (2.5, 2.5), 40.0)
    # each byte enters host 1 once (the convention would send it twice)
    assert sum(r["default"]["cross_host_bytes"] for r in reports) == nbytes
    one_host = mc.plan(topology_job.TASK, topology_job.ONE_HOST, strategy="broadcast")
    assert one_host.cross_host_bytes() == 0  # the plan's own idea
    counted = sum(r["one_host"]["cross_host_bytes"] for r in reports)
    assert counted == _expected_cross(one_host, hosts) > 0  # the counters: the real hosts


@pytest.mark.timeout(300)
def test_under_launch_without_hosts_the_job_is_one_host() -> None:
    reports = mc.launch(_in_job, 4, timeout=120)
    for r in reports:
        assert r["default"]["exact"] and r["default"]["hosts"] == [[0, 1, 2, 3]]
        assert r["default"]["cross_host_bytes"] == 0
        assert r["default"]["hosts_from"].startswith("one host")
