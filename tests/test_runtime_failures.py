"""Failures on real processes: a peer that dies or stops mid-transfer, a peer that never arrives.
Every rank that depends on it raises within its timeout, naming the rank that failed first, what
the ranks were doing and the real elapsed time; nothing hangs and no thread is left behind.

A victim dies (``os._exit``) or stops (``SIGSTOP``) at a fixed point: when it is about to post its
n-th message (a wrapper around the transport's ``isend`` in that process only), so the failure
lands mid-transfer whatever the machine's speed. Each rank writes what it saw to a file before
the launcher's own end-of-job barrier (which cannot succeed with a dead rank) fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

import meshcast
from meshcast import Layout, Mesh, ReshardTask, Topology, plan
from meshcast.runtime import LaunchError

TOPOLOGY = Topology.uniform(3, 1)  # three hosts of one rank: the chain 0 -> 1 -> 2
HOSTS = Topology.uniform(4, 2)  # four hosts of two ranks: {0, 1} {2, 3} {4, 5} {6, 7}


def _task(n: int) -> ReshardTask:
    return ReshardTask((n,), "float32", Layout(Mesh([[0]]), "R"), Layout(Mesh([[1], [2]]), "R"))


def _fail_at(count: int, how: str) -> None:
    """Make this process die or stop when it is about to post its ``count``-th message."""
    from meshcast.runtime import p2p

    original = p2p.Links.isend
    posted = [0]

    def isend(self, *args, **kwargs):
        posted[0] += 1
        if posted[0] == count:
            if how == "kill":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGSTOP)
        return original(self, *args, **kwargs)

    p2p.Links.isend = isend


def _attempt(rank: int, out_dir: str, fn, after=None) -> None:
    """Run ``fn()``, write what happened to ``out_dir/rank<r>.json``, run ``after()`` (its result
    goes to ``after<r>.json``); raise if ``fn`` raised."""
    start = time.monotonic()
    try:
        out = fn()
        result = {"ok": True, "exact": out}
    except meshcast.ReshardError as exc:
        result = {"ok": False, "error": str(exc), "failed": list(exc.failed),
                  "ranks": list(exc.ranks)}
    result["seconds"] = time.monotonic() - start
    result["threads"] = [t.name for t in threading.enumerate() if t.name.startswith("meshcast")]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    if after is not None:
        Path(out_dir, f"after{rank}.json").write_text(json.dumps(after()))
    if not result["ok"]:
        raise RuntimeError(f"rank {rank}: {result['error']}")


def _results(out_dir: Path, ranks) -> dict[int, dict]:
    return {r: json.loads((out_dir / f"rank{r}.json").read_text()) for r in ranks}


# -- a peer dies in the middle of a broadcast chain -------------------------------------------
def _dies_mid_transfer(rank: int, out_dir: str) -> str:
    import torch

    p = plan(_task(16 << 20), TOPOLOGY, strategy="broadcast")  # 64 MiB through leader 1
    local = torch.ones(16 << 20) if rank == 0 else None
    if rank == 1:
        _fail_at(3, "kill")  # forwarding its third chunk
    _attempt(rank, out_dir, lambda: meshcast.reshard(local, p, timeout=20) is not None)
    return "finished"


@pytest.mark.timeout(180)
def test_peer_dying_mid_transfer_makes_the_others_raise(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:
        meshcast.launch(_dies_mid_transfer, 3, hosts=TOPOLOGY, args=(str(tmp_path),), timeout=60)
    assert "exited with code 3" in info.value.failures[1]
    seen = _results(tmp_path, (0, 2))
    for rank, r in seen.items():
        assert not r["ok"], f"rank {rank} returned although its peer died"
        assert r["failed"] == [1]
        assert f"meshcast.reshard on rank {rank} failed after " in r["error"]
        assert "rank 1 failed first: its connections closed (the process died or left the " \
               "process group)" in r["error"]
        assert re.search(r"ranks involved: \[[^\]]*\b1\b", r["error"]), r["error"]
        assert "op 0 (broadcast from 0)" in r["error"]
        assert r["seconds"] < 10  # well within the 20 s timeout: the connection closed at once
        assert r["threads"] == []
        elapsed = float(re.search(r"failed after ([0-9.]+) s", r["error"]).group(1))
        assert elapsed <= r["seconds"] + 0.01


# -- a multi-host broadcast whose sender dies; a leader that stops -----------------------------
def _broadcast_job(rank: int, victim: int, how: str, out_dir: str) -> str:
    import torch

    n = 8 << 20  # 32 MiB of float32 to 7 receivers on 4 hosts, 128 chunks
    task = ReshardTask((n,), "float32", Layout(Mesh([0]), "R"), Layout(Mesh.from_range(1, (7,)),
                                                                        "R"))
    p = plan(task, HOSTS, strategy="broadcast")
    local = torch.arange(n, dtype=torch.float32) if rank == 0 else None
    if rank == victim:
        _fail_at(6, how)

    def run():  # chunks well below the socket buffers: a sender killed half-way through
        # writing one leaves its receiver waiting the timeout (gloo; docs/runtime.md)
        out = meshcast.reshard(local, p, timeout=TIMEOUTS[how], chunk_bytes=256 << 10)
        return None if out is None else bool(torch.equal(out, torch.arange(n,
                                                                           dtype=torch.float32)))

    # after a death the connections among the live ranks are left usable: a ring of them
    ring = (lambda: _ring(rank, [r for r in range(8) if r != victim])) if how == "kill" else None
    _attempt(rank, out_dir, run, ring)
    return "finished"


TIMEOUTS = {"kill": 60.0, "stop": 6.0}


def _ring(rank: int, live: list[int]) -> bool:
    import torch
    import torch.distributed as dist

    k = live.index(rank)
    nxt, prv = live[(k + 1) % len(live)], live[(k - 1) % len(live)]
    got = torch.zeros(4)
    works = [dist.isend(torch.full((4,), float(rank)), nxt, tag=77),
             dist.irecv(got, prv, tag=77)]
    for w in works:
        w.wait()
    return bool(torch.equal(got, torch.full((4,), float(prv))))


@pytest.mark.timeout(240)
def test_sender_killed_in_a_multi_host_broadcast(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:
        meshcast.launch(_broadcast_job, 8, hosts=HOSTS, args=(0, "kill", str(tmp_path)),
                        timeout=120)
    assert "exited with code 3" in info.value.failures[0]
    seen = _results(tmp_path, range(1, 8))
    for rank, r in seen.items():  # leaders, their members and the sender's own host
        assert not r["ok"], f"rank {rank} returned although the sender died"
        assert r["failed"] == [0], r["error"]
        assert "rank 0 failed first: its connections closed (the process died or left the " \
               "process group)" in r["error"]
        assert 0 in r["ranks"] and rank in r["ranks"]
        assert r["seconds"] < TIMEOUTS["kill"] / 4, r["error"]
        assert r["threads"] == []
    # every live rank ran a ring of messages after its error: their connections were usable
    for rank in range(1, 8):
        assert json.loads((tmp_path / f"after{rank}.json").read_text()) is True


@pytest.mark.timeout(300)
def test_stopped_leader_is_named_by_every_rank_that_depends_on_it(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:
        meshcast.launch(_broadcast_job, 8, hosts=HOSTS, args=(2, "stop", str(tmp_path)),
                        timeout=60)
    assert info.value.failures[2] == "did not finish in time (stopped)"
    seen = _results(tmp_path, (0, 1, 3, 4, 5, 6, 7))
    assert seen[1]["ok"] and seen[1]["exact"] is True  # rank 1 does not depend on rank 2
    for rank in (0, 3, 4, 5, 6, 7):
        r = seen[rank]
        assert not r["ok"], f"rank {rank} returned although rank 2 stopped"
        assert r["failed"] == [2], r["error"]
        assert "rank 2 failed first: it stopped responding (stopped, hung or busy outside this " \
               "call)" in r["error"]
        assert "gloo then closes every connection of the process group on this rank" in \
               r["error"] or "connections with ranks" in r["error"]
        assert r["seconds"] < 4 * TIMEOUTS["stop"], r["error"]
        assert r["threads"] == []


# -- a rank of a joint reshard_many dies -------------------------------------------------------
def _many_job(rank: int, out_dir: str) -> str:
    import torch

    tasks = [ReshardTask((1 << 18,), "float32", Layout(Mesh([0, 1]), "S0"),
                         Layout(Mesh([2, 3]), "R")) for _ in range(8)]
    plans = meshcast.plan_many(tasks, Topology.uniform(2, 2))
    locals_ = [None if t.src_box(rank) is None else torch.ones(1 << 17) for t in tasks]
    if rank == 1:
        _fail_at(3, "kill")
    _attempt(rank, out_dir, lambda: meshcast.reshard_many(locals_, plans, bucket_bytes=1 << 20,
                                                          timeout=60) and True)
    return "finished"


@pytest.mark.timeout(180)
def test_reshard_many_names_the_dead_rank(tmp_path: Path) -> None:
    with pytest.raises(LaunchError):
        meshcast.launch(_many_job, 4, hosts=2, args=(str(tmp_path),), timeout=60)
    for rank, r in _results(tmp_path, (0, 2, 3)).items():
        assert not r["ok"]
        assert r["failed"] == [1], r["error"]
        assert f"meshcast.reshard_many on rank {rank} failed after" in r["error"]
        assert "rank 1 failed first: its connections closed" in r["error"]
        assert r["seconds"] < 15


# -- a peer that never arrives; a bad input -----------------------------------------------------
def _never_arrives(rank: int) -> str:
    import torch

    p = plan(_task(1024), TOPOLOGY, strategy="broadcast")
    if rank == 2:
        return "skipped"
    local = torch.ones(1024) if rank == 0 else None
    meshcast.reshard(local, p, timeout=3)
    return "finished"


def _bad_dtype(rank: int) -> str:
    import torch

    p = plan(_task(1024), TOPOLOGY, strategy="broadcast")
    local = torch.ones(1024, dtype=torch.float64) if rank == 0 else None
    try:
        meshcast.reshard(local, p, timeout=20)
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(120)
def test_peer_never_arriving_times_out_naming_ranks() -> None:
    with pytest.raises(LaunchError) as info:
        meshcast.launch(_never_arrives, 3, hosts=TOPOLOGY, timeout=60)
    failures = info.value.failures
    for rank in (0, 1):
        assert "ReshardError" in failures[rank]
        assert "[0, 1, 2]" in failures[rank]
        assert "ranks [2] did not join the input agreement within 3 s (rank 2 has not called " \
               "meshcast on this process group)" in failures[rank]


@pytest.mark.timeout(120)
def test_wrong_dtype_is_reported_on_every_rank() -> None:
    out = meshcast.launch(_bad_dtype, 3, hosts=TOPOLOGY, timeout=60)
    assert out[0] == ("meshcast.reshard on rank 0: local has dtype torch.float64 on rank 0; the "
                      "plan moves torch.float32; nothing was sent")
    for rank in (1, 2):
        assert out[rank] == (
            f"meshcast.reshard on rank {rank}: ranks [0] passed inputs that do not fit the plans "
            f"(rank 0: local has dtype torch.float64 on rank 0; the plan moves torch.float32); "
            f"nothing was sent")


def _waits_elsewhere(rank: int) -> str:
    """Rank 0 calls on the default group with rank 1; rank 1 is in a call with rank 2 on
    another group over the same ranks; rank 2 is busy (it sleeps past both timeouts)."""
    import torch
    import torch.distributed as dist

    other = dist.new_group([0, 1, 2])
    ones = ReshardTask((8,), "float32", Layout(Mesh([0]), "R"), Layout(Mesh([1]), "R"))
    twos = ReshardTask((8,), "float32", Layout(Mesh([2]), "R"), Layout(Mesh([1]), "R"))
    try:
        if rank == 0:
            meshcast.reshard(torch.ones(8), plan(ones, TOPOLOGY), timeout=3)
        elif rank == 1:
            meshcast.reshard(None, plan(twos, TOPOLOGY), group=other, timeout=6)
        else:
            time.sleep(8)
    except meshcast.ReshardError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(120)
def test_a_timeout_follows_the_missing_rank_to_the_call_it_waits_in_on_another_group() -> None:
    told = meshcast.launch(_waits_elsewhere, 3, hosts=TOPOLOGY, timeout=60)
    assert re.search(r"ranks \[1\] did not join the input agreement within 3 s \(rank 1 has not "
                     r"called meshcast on this process group; global rank 1 waits in a "
                     r"meshcast.reshard on process group '\w+' \(global ranks 1..2\) for global "
                     r"ranks \[2\], for \d+ s; global ranks \[2\] wait in no meshcast agreement: "
                     r"busy elsewhere, or dead\)", told[0]), told[0]
    assert "ranks [2] did not join the input agreement within 6 s (rank 2 has not called " \
           "meshcast on this process group)" in told[1], told[1]
    assert told[2] == "no error"
