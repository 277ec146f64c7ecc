"""Strided and fused layouts (a shard of several boxes) on real processes: every strategy and
balance, both transports, ``reshard_many`` buckets and ``out=``, byte for byte against the
reference split of the tensor.

One launched job of 8 ranks (4 emulated hosts of 2) over gloo.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import meshcast
from meshcast import Layout, ReshardTask, Topology
from meshcast.core.local import scatter

WORLD = 8
TOPOLOGY = Topology.uniform(4, 2)

# (shape, source, destination): strided steps, orders, fused dimensions, overlapping meshes
CASES = [
    ((16, 6), "2x2:S0[2]1R", "2x2@4:S0R"),  # FSDP2 + TP's layout to TP on other ranks
    ((13, 5), "2x2:S0[2]R", "4@4:RS0"),  # uneven strided pieces, two boxes per rank
    ((16, 3), "2:{q=8:S0+k=4:S0+v=4:R}R", "2x2@2:S0R"),  # fused QKV with a replicated part
    ((16, 6), "2x2:S0[3]R", "2x2@4:{a=10:S1+b=6:S0[2]}R"),  # fused to fused, overlapping
    ((9, 10), "2x2@1:S0[2]S1[3]", "2x4:S1S0[2]"),  # strided in both dimensions, same ranks
    ((7,), "4:S0[2]", "2@6:S0[3]"),  # 1-D, empty pieces
]
TRANSPORTS = ("p2p", "collectives")
# every strategy x balance through "p2p"; through "collectives" every strategy (the balances
# change which ranks send, not how a transport moves a box of a shard of several boxes)
RUNS = [(s, b, "p2p") for s in meshcast.STRATEGIES for b in meshcast.BALANCES] + [
    (s, "none", "collectives") for s in meshcast.STRATEGIES] + [(None, "auto", "collectives")]


def _global(shape: tuple[int, ...], k: int) -> np.ndarray:
    return (np.arange(int(np.prod(shape)), dtype=np.int64) * 7 + k).reshape(shape).astype(
        np.int32)


def _run(rank: int) -> dict:
    out: dict = {"reshard": [], "many": None}
    tasks = [ReshardTask(shape, "int32", Layout.parse(s), Layout.parse(d))
             for shape, s, d in CASES]
    full = [_global(t.shape, k) for k, t in enumerate(tasks)]

    def local(k: int) -> torch.Tensor | None:
        t = tasks[k]
        if t.src_region(rank) is None:
            return None
        return torch.from_numpy(scatter(full[k], t.src)[rank])

    def same(k: int, got: torch.Tensor | None) -> bool:
        want = scatter(full[k], tasks[k].dst).get(rank)
        if want is None or got is None:
            return want is None and got is None
        return got.shape == want.shape and np.array_equal(got.numpy(), want)

    for k, task in enumerate(tasks):
        for strategy, balance, transport in RUNS:
            p = meshcast.plan(task, TOPOLOGY, strategy=strategy, balance=balance)
            got = meshcast.reshard(local(k), p, chunk_bytes=16, transport=transport)
            out["reshard"].append(((k, strategy, balance, transport), same(k, got)))
    plans = [meshcast.plan(t, TOPOLOGY) for t in tasks]
    # in place: every destination rank passes its own output tensors (strided views of bigger
    # buffers), and gets the very same tensors back, filled
    bufs = [None if t.dst_region(rank) is None else
            torch.full((*t.dst_region(rank).shape, 2), -1, dtype=torch.int32)[..., 0]
            for t in tasks]
    got = meshcast.reshard_many([local(k) for k in range(len(tasks))], plans, bucket_bytes=96,
                                out=bufs)
    out["many"] = [same(k, g) and g is b for k, (g, b) in enumerate(zip(got, bufs))]
    # an out tensor of the wrong shape on one rank: refused on every rank, nothing moves
    wrong = None if tasks[0].dst_region(rank) is None else torch.zeros(
        tasks[0].dst_region(rank).shape, dtype=torch.int32)
    if rank == 5:
        wrong = torch.zeros(1, dtype=torch.int32)
    try:
        meshcast.reshard(local(0), plans[0], out=wrong)
        out["refusal"] = "no error"
    except ValueError as exc:
        out["refusal"] = str(exc)
    return out


@pytest.fixture(scope="module")
def job() -> list[dict]:
    return meshcast.launch(_run, WORLD, hosts=TOPOLOGY, timeout=600)


def test_strided_and_fused_layouts_reshard_exactly(job: list[dict]) -> None:
    wrong = [(rank, what) for rank, r in enumerate(job) for what, ok in r["reshard"] if not ok]
    assert wrong == []
    assert all(len(r["reshard"]) == len(CASES) * len(RUNS) for r in job)
    assert {t for _, _, t in RUNS} == set(TRANSPORTS)


def test_strided_and_fused_layouts_in_reshard_many_buckets(job: list[dict]) -> None:
    assert [r["many"] for r in job] == [[True] * len(CASES)] * WORLD


def test_a_bad_out_tensor_on_one_rank_is_refused_on_every_rank(job: list[dict]) -> None:
    for r in job:
        assert "out has shape (1,) on rank 5" in r["refusal"], r["refusal"]
