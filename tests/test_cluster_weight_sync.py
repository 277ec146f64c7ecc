"""Weight sync between two separately launched torchrun jobs on emulated hosts (issue 16, point 7),
as root; skipped, with the reason, where network namespaces are unavailable
(tests/test_weight_sync_jobs.py covers the same logic on loopback).

One cluster of 4 hosts (1 Gbit/s NICs). The trainer job (tests/weight_sync_jobs.py): hosts 0-1, 2
ranks each, 2 pipeline stages x tensor parallel 2, float32. The engine job: hosts 2-3, 2 ranks
each, tensor parallel 4, bfloat16 parameters it keeps. Each job is its own ``torchrun`` (own
rendezvous, default group, world size). The engine starts first; the trainer pushes versions 1,
2, and dies on rank 3 in the middle of version 3 (exit 17); every engine rank raises naming
trainer rank 3 and keeps version 2 whole; a restarted trainer job pushes 3 and 4 after the engine
connected again. Every weight is checked byte for byte after every sync, in place. Then two
jobs of one rank on each of two hosts sync a Llama-style model into fused engine tensors and
FP8 parameters with their scales (the cases of tests/test_weight_sync_jobs.py, under torchrun).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from meshcast.cluster import Cluster, available, free_port, start_torchrun, wait_torchrun

OK, REASON = available()
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "weight_sync_jobs.py")


@pytest.fixture(scope="module")
def cluster():
    if not OK:
        pytest.skip(f"emulated cluster unavailable: {REASON}")
    c = Cluster.up(4, nic_gbit=1.0, latency_ms=0.0, name=f"mc-b{os.getpid()}-ws")
    try:
        yield c
    finally:
        c.down()


def _job(cluster, hosts, role, address, out, log, nproc=2, **options) -> list[subprocess.Popen]:
    port = free_port(cluster, hosts[0])
    while address.endswith(f":{port}"):  # torchrun's rendezvous: not the weight-sync store's
        port = free_port(cluster, hosts[0])
    argv = [SCRIPT, role, address, str(out), json.dumps(options)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, *filter(None, [
        os.environ.get("PYTHONPATH")])])}
    return start_torchrun(cluster, nproc, argv, job_hosts=hosts, port=port, env=env, stdout=log,
                          stderr=subprocess.STDOUT)


@pytest.mark.timeout(400)
def test_two_torchrun_jobs_sync_fail_and_reconnect(cluster, tmp_path) -> None:
    store_port = free_port(cluster, 0)
    address = f"{cluster.host_addr(0)}:{store_port}"
    log = open(tmp_path / "jobs.log", "w")  # noqa: SIM115 - closed below
    try:
        engine = _job(cluster, [2, 3], "engine", address, tmp_path, log, sessions=2,
                      versions=4, timeout=60.0)
        first = _job(cluster, [0, 1], "trainer", address, tmp_path, log, tag="trainer-a",
                     versions=[1, 2, 3], die=[3, 3, 5], timeout=60.0)
        codes = wait_torchrun(first, 120)
        assert codes != [0, 0], (tmp_path / "jobs.log").read_text()[-3000:]
        again = _job(cluster, [0, 1], "trainer", address, tmp_path, log, tag="trainer-b",
                     versions=[3, 4], timeout=60.0)
        assert wait_torchrun(again, 150) == [0, 0], (tmp_path / "jobs.log").read_text()[-4000:]
        assert wait_torchrun(engine, 60) == [0, 0], (tmp_path / "jobs.log").read_text()[-4000:]
    finally:
        log.close()
    for r in range(4):
        assert json.loads((tmp_path / f"trainer-b-rank{r}.json").read_text()) == [3, 4]
        report = json.loads((tmp_path / f"engine-rank{r}.json").read_text())
        assert report["received"] == [1, 2, 3, 4]
        assert report["exact"] == [True] * 4  # byte for byte after every sync
        assert report["kept"] == [True]  # the failed sync left version 2 whole
        assert report["same_storage"]  # received in place
        assert report["staging_bytes"] == report["param_bytes"]  # the cost of atomicity
        assert 0 < report["peak_bucket"] <= 16 << 10  # bucket_bytes bounds the staging
        (message, _), = report["errors"]
        assert f"meshcast.WeightSync.receive on engine rank {r}" in message
        assert "trainer rank 3" in message, message
        assert "parameters keep version 2" in message
    assert not any(cluster.pids().values()), "processes left in the namespaces"


@pytest.mark.timeout(300)
def test_fused_and_fp8_syncs_between_torchrun_jobs(cluster, tmp_path) -> None:
    """The Llama-style model into fused QKV, gate_up and stacked experts, then FP8 parameters
    with block and per-tensor scales: each job one rank on each of two hosts."""
    import weight_sync_fp8_job as fp8
    import weight_sync_jobs as jobs

    address = f"{cluster.host_addr(0)}:{free_port(cluster, 0)}"
    log = open(tmp_path / "jobs.log", "w")  # noqa: SIM115 - closed below
    cases = {"cases": ["fused", "fp8"], "versions": [1, 2]}
    try:
        engine = _job(cluster, [2, 3], "engine", address, tmp_path, log, nproc=1, **cases)
        trainer = _job(cluster, [0, 1], "trainer", address, tmp_path, log, nproc=1, **cases)
        for procs in (trainer, engine):
            assert wait_torchrun(procs, 150) == [0, 0], (tmp_path / "jobs.log").read_text()[-4000:]
    finally:
        log.close()
    reports = {role: [json.loads((tmp_path / f"{role}-rank{r}.json").read_text())
                      for r in range(2)] for role in ("trainer", "engine")}
    jobs.check_fused([r["fused"] for r in reports["trainer"]],
                     [r["fused"] for r in reports["engine"]], [1, 2])
    fp8.check([r["fp8"] for r in reports["trainer"]], [r["fp8"] for r in reports["engine"]],
              [1, 2])
    assert not any(cluster.pids().values()), "processes left in the namespaces"


def test_torchrun_command_of_a_job_on_some_hosts() -> None:
    from meshcast.cluster import torchrun_command

    fake = Cluster("mc-x", 4, 1.0, 0.0)  # never built: the command is plain data
    cmd = torchrun_command(fake, 3, 2, ["serve.py"], port=29400, job_hosts=[2, 3])
    i = cmd.index("--nnodes")
    assert cmd[i:i + 14] == [
        "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.213.0.3:29400",
        "--rdzv-id", "mc-x-29400", "--rdzv-conf", "is_host=false"]
    assert "is_host=true" in torchrun_command(fake, 2, 2, ["s.py"], port=1, job_hosts=[2, 3])
    with pytest.raises(ValueError, match=r"host 1 is not one of the job's hosts \[2, 3\]"):
        torchrun_command(fake, 1, 2, ["s.py"], port=1, job_hosts=[2, 3])
