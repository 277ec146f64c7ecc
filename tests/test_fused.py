"""Fused tensors, the worked examples of docs/concepts.md, on real processes (8 ranks, gloo).

A Llama-style block: a trainer holds q, k, v, o, gate, up, down as separate tensors, tensor
parallel over 4 ranks; the inference engine, tensor parallel over 4 other ranks (a 2 x 2 mesh),
holds qkv fused with grouped-query attention (8 query heads over all 4 ranks, 2 key/value heads:
each held by 2 ranks) and gate_up fused. A MoE layer: stacked experts, expert parallel in the
trainer, into fused gate_up experts split over expert x tensor parallel ranks. And back: the
fused engine tensors into separate trainer tensors. One ``reshard_many`` call per direction
writes every part straight into its slice of the fused shard (``out=``); compared byte for byte
with the fused tensor cut by its layout.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import meshcast as mc

WORLD = 8
HEAD, HIDDEN, HEADS, KV_HEADS, FFN, EXPERTS = 4, 16, 8, 2, 24, 4
TRAINER = mc.Mesh.from_range(0, (4,))
ENGINE = mc.Mesh.from_range(4, (2, 2))  # axes: (kv group, rank within it)

# name: (shape, trainer layout); the trainer's column-parallel tensors split dim 0 4 ways
SEPARATE = {
    "q": ((HEADS * HEAD, HIDDEN), "S0R"),
    "k": ((KV_HEADS * HEAD, HIDDEN), "S0R"),
    "v": ((KV_HEADS * HEAD, HIDDEN), "S0R"),
    "gate": ((FFN, HIDDEN), "S0R"),
    "up": ((FFN, HIDDEN), "S0R"),
    "experts.gate": ((EXPERTS, FFN, HIDDEN), "S0RR"),  # expert parallel
    "experts.up": ((EXPERTS, FFN, HIDDEN), "S0RR"),
}
# fused engine tensors: (name, dim, parts, spec with {} for the fused dimension)
FUSED = {
    # q over all 4 ranks (axes 0 then 1); k and v over the kv-group axis only: GQA replication
    "qkv": ("{q=32:S01+k=8:S0+v=8:S0}R", ("q", "k", "v")),
    "gate_up": ("{gate=24:S01+up=24:S01}R", ("gate", "up")),
    # experts split over axis 0 (expert parallel), each expert's rows over axis 1
    "experts.gate_up": ("S0{gate=24:S1+up=24:S1}R", ("experts.gate", "experts.up")),
}


def _full(name: str, shape) -> np.ndarray:
    seed = sum(map(ord, name))
    return (np.arange(int(np.prod(shape)), dtype=np.int64) * 31 + seed).reshape(shape).astype(
        np.float32)


def _fused_full(fused: str) -> np.ndarray:
    spec, parts = FUSED[fused]
    dim = 0 if spec.startswith("{") else 1
    return np.concatenate([_full(p, SEPARATE[p][0]) for p in parts], axis=dim)


def _job(rank: int) -> dict:
    report: dict = {"into": {}, "out_of": {}}
    tasks, srcs, outs, where = [], [], [], []
    for fused, (spec, parts) in FUSED.items():
        full = _fused_full(fused)
        layout = mc.Layout(ENGINE, spec)
        names = dict(zip(mc.part_names(layout, full.shape), parts))
        sources = {n: mc.Layout(TRAINER, SEPARATE[p][1]) for n, p in names.items()}
        local = None
        if ENGINE.position(rank) is not None:
            local = torch.full(layout.shard_shape(rank, full.shape), -1.0)
        views = {} if local is None else mc.fused_part_views(local, layout, full.shape, rank)
        for n, task in zip(names, mc.fused_tasks(layout, full.shape, "float32", sources)):
            shard = mc.scatter(_full(names[n], task.shape), task.src).get(rank)
            tasks.append(task)
            srcs.append(None if shard is None else torch.from_numpy(shard))
            outs.append(views.get(n))
        where.append((fused, local, layout, full))
    got = mc.reshard_many(srcs, mc.plan_many(tasks), out=outs)
    report["in_place"] = all(g is o for g, o in zip(got, outs))
    for fused, local, layout, full in where:
        if local is not None:
            want = mc.scatter(full, layout)[rank]
            report["into"][fused] = local.shape == want.shape and np.array_equal(local, want)
    # and back: out of the fused engine tensors into separate trainer tensors
    back, srcs = [], []
    for fused, local, layout, full in where:
        names = dict(zip(mc.part_names(layout, full.shape), FUSED[fused][1]))
        dests = {n: mc.Layout(TRAINER, SEPARATE[p][1]) for n, p in names.items()}
        views = {} if local is None else mc.fused_part_views(local, layout, full.shape, rank)
        for n, task in zip(names, mc.fused_tasks(layout, full.shape, "float32", dests,
                                                 into=False)):
            back.append((names[n], task))
            srcs.append(views.get(n))
    got = mc.reshard_many(srcs, mc.plan_many([t for _, t in back]))
    for (name, task), g in zip(back, got):
        want = mc.scatter(_full(name, task.shape), task.dst).get(rank)
        if want is not None:
            report["out_of"][name] = g is not None and np.array_equal(g.numpy(), want)
    return report


@pytest.fixture(scope="module")
def job() -> list[dict]:
    return mc.launch(_job, WORLD, hosts=2, timeout=300)


def test_separate_tensors_land_in_their_fused_slices_in_place(job: list[dict]) -> None:
    for rank in range(4, WORLD):
        assert job[rank]["into"] == {name: True for name in FUSED}
    assert all(r["in_place"] for r in job)


def test_fused_tensors_split_back_into_separate_tensors(job: list[dict]) -> None:
    for rank in range(4):
        assert job[rank]["out_of"] == {name: True for name in SEPARATE}


def test_gqa_layout_replicates_each_kv_head_on_two_ranks() -> None:
    layout = mc.Layout(ENGINE, FUSED["qkv"][0])
    shape = (HEADS * HEAD + 2 * KV_HEADS * HEAD, HIDDEN)
    k, _ = mc.part_layout(layout, shape, "k")
    assert [k.region(r, (KV_HEADS * HEAD, HIDDEN)).runs[0] for r in ENGINE.devices] == [
        ((0, 4),), ((0, 4),), ((4, 8),), ((4, 8),)]
    assert [mc.fused_part_index(layout, shape, r, "v")[0] for r in ENGINE.devices] == [
        slice(12, 16)] * 4
    with pytest.raises(ValueError, match="missing 'v'"):
        mc.fused_tasks(layout, shape, "float32", {"q": k, "k": k})
