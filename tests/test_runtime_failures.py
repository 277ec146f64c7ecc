"""Failures on real processes: a peer that dies mid-transfer, a peer that never arrives. Every
other rank must raise within its timeout, naming the ranks involved; nothing may hang."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

import meshcast
from meshcast import Layout, Mesh, ReshardTask, Topology, plan
from meshcast.runtime import LaunchError

TOPOLOGY = Topology.uniform(3, 1)  # three hosts of one rank: the chain 0 -> 1 -> 2


def _task(n: int) -> ReshardTask:
    return ReshardTask((n,), "float32", Layout(Mesh([[0]]), "R"), Layout(Mesh([[1], [2]]), "R"))


def _dies_mid_transfer(rank: int) -> str:
    import torch

    p = plan(_task(64 << 20), TOPOLOGY, strategy="broadcast")  # 256 MiB through leader 1
    local = torch.ones(64 << 20) if rank == 0 else None
    if rank == 1:
        threading.Timer(0.05, os._exit, (3,)).start()  # the middle of the chain dies
    meshcast.reshard(local, p, timeout=20)
    time.sleep(2.0)  # rank 1 must die before it finishes
    return "finished"


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
def test_peer_dying_mid_transfer_makes_the_others_raise() -> None:
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        meshcast.launch(_dies_mid_transfer, 3, hosts=TOPOLOGY, timeout=60)
    failures = info.value.failures
    assert "exited with code 3" in failures[1]
    # rank 0 may have handed all its chunks to rank 1 before it died; rank 2 cannot finish
    assert "ReshardError" in failures[2] or "barrier" in failures[0]
    for rank in (2,):
        assert "ReshardError" in failures[rank]
        assert re.search(r"ranks involved: \[[^\]]*\b1\b", failures[rank]), failures[rank]
    assert time.monotonic() - start < 60


@pytest.mark.timeout(120)
def test_peer_never_arriving_times_out_naming_ranks() -> None:
    with pytest.raises(LaunchError) as info:
        meshcast.launch(_never_arrives, 3, hosts=TOPOLOGY, timeout=60)
    failures = info.value.failures
    for rank in (0, 1):
        assert "ReshardError" in failures[rank]
        assert "[0, 1, 2]" in failures[rank]


@pytest.mark.timeout(120)
def test_wrong_dtype_is_reported_on_every_rank() -> None:
    out = meshcast.launch(_bad_dtype, 3, hosts=TOPOLOGY, timeout=60)
    assert "dtype torch.float64" in out[0] and "rank 0" in out[0]
    assert all("ranks [0]" in text for text in out[1:])
