"""The two jobs of the FP8 weight-sync test (issue 16, point 4), loopback: a trainer of 2 ranks
(bfloat16 ``w`` split by columns of 192, cutting 128 x 128 blocks; float32 ``v`` by rows; float32
``b``) into an engine of 2 ranks, tensor parallel: ``w`` in ``float8_e4m3fn`` with 128 x 128 block
scales ``w_scale_inv``, ``v`` in ``float8_e5m2`` with one scale ``v_scale_inv``, ``b`` in
bfloat16; ``z`` and ``e`` have no elements (their FP8 shards are empty, their scales those of an
``amax`` of 0 per tensor, an empty block grid). The engine checks its FP8 bytes and scales
against :func:`meshcast.quantize` of the whole tensor, bit for bit, in place. Then, on the
same connection, FP8 into fused and stacked engine tensors (:func:`fused`).
"""

from __future__ import annotations

import meshcast as mc

SHAPES = {"w": (256, 384), "v": (64, 96), "b": (64,), "z": (0, 96), "e": (64, 0)}
BLOCKS = {"w": (128, 128), "v": None, "z": None, "e": (128, 128)}
FP8 = {"w": "float8_e4m3fn", "v": "float8_e5m2", "z": "float8_e4m3fn", "e": "float8_e5m2"}


def specs(role: str) -> dict:
    """What each side declares (every rank the same)."""
    import torch

    mesh = mc.Mesh([0, 1])
    if role == "trainer":
        return {"w": mc.ParamSpec(SHAPES["w"], torch.bfloat16, mc.Layout(mesh, "RS0")),
                "v": mc.ParamSpec(SHAPES["v"], torch.float32, mc.Layout(mesh, "S0R")),
                "b": mc.ParamSpec(SHAPES["b"], torch.float32, mc.Layout(mesh, "S0")),
                "z": mc.ParamSpec(SHAPES["z"], torch.float32, mc.Layout(mesh, "RS0")),
                "e": mc.ParamSpec(SHAPES["e"], torch.float32, mc.Layout(mesh, "S0R"))}
    out = {"w": mc.ParamSpec(SHAPES["w"], torch.float8_e4m3fn, mc.Layout(mesh, "S0R")),
           "v": mc.ParamSpec(SHAPES["v"], torch.float8_e5m2, mc.Layout(mesh, "RS0")),
           "b": mc.ParamSpec(SHAPES["b"], torch.bfloat16, mc.Layout(mesh, "R")),
           "z": mc.ParamSpec(SHAPES["z"], torch.float8_e4m3fn, mc.Layout(mesh, "S0R")),
           "e": mc.ParamSpec(SHAPES["e"], torch.float8_e5m2, mc.Layout(mesh, "RS0"))}
    for name in FP8:
        layout, grid = mc.scale_layout(out[name].layout, SHAPES[name], BLOCKS[name])
        out[f"{name}_scale_inv"] = mc.ParamSpec(grid, torch.float32, layout)
    return out


def full(name: str, version: int):
    """Trainer tensor ``name`` at ``version`` (its trainer dtype)."""
    import torch

    g = torch.Generator().manual_seed(sum(map(ord, name)) + 1000 * version)
    x = torch.randn(SHAPES[name], generator=g) * (version + 1)
    return x.to(torch.bfloat16) if name == "w" else x


def expected(name: str, version: int):
    """Engine tensor ``name`` (or its scales) at ``version``, whole."""
    import torch

    base = name.removesuffix("_scale_inv")
    if base not in FP8:
        return full(base, version).to(torch.bfloat16)
    q, scales = mc.quantize(full(base, version), FP8[base], BLOCKS[base])
    return scales if name.endswith("_scale_inv") else q


def _shard(x, layout, rank: int):
    import numpy as np

    region = layout.region(rank, tuple(x.shape))
    return x if x.dim() == 0 else x[np.ix_(*region.indices())]


def _bits(t):
    import torch

    return t.contiguous().view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def _exact(tensors: dict, declared: dict, rank: int, version: int, whole=expected) -> bool:
    """Whether ``tensors`` are bit for bit this rank's shards of ``whole(name, version)``."""
    import torch

    return sorted(tensors) == sorted(declared) and all(
        torch.equal(_bits(tensors[n]), _bits(_shard(whole(n, version), s.layout, rank)))
        for n, s in declared.items())


def run(rank: int, address: str, role: str, versions: list[int]) -> dict:
    """One side: the trainer pushes ``versions``; the engine receives each in place and reports
    whether every byte of every tensor and scale equals the whole conversion's (the last version
    into fresh tensors)."""

    declared = specs(role)
    group = mc.connect(address, role, model="fp8-test", timeout=60)
    report: dict = {"received": [], "exact": [], "errors": []}
    try:  # the engine leaves out v's scales, and w's are asked per tensor: one error everywhere
        mc.WeightSync(group, {n: s for n, s in declared.items() if n != "v_scale_inv"},
                      fp8_block={**BLOCKS, "w": None})
    except ValueError as exc:
        report["errors"].append(str(exc))
    sync = mc.WeightSync(group, declared, fp8_block=BLOCKS, bucket_bytes=8 << 10)
    if role == "trainer":
        for v in versions:
            shards = {n: _shard(full(n, v), s.layout, rank).contiguous()
                      for n, s in declared.items()}
            report["received"].append(sync.push(shards, version=v).version)
    else:
        from weight_sync_jobs import receive_versions

        report.update(receive_versions(sync, declared, rank, versions,
                                       lambda got, v: _exact(got, declared, rank, v)))
    report["fused"] = fused(group, rank, role, versions)
    mc.disconnect(group)
    return report


FUSED_FP8 = ("qkv_proj", "gate_up_proj", "w13_weight", "w2_weight", "o_proj")
"""The engine tensors of the Llama-style model (weight_sync_jobs.py) kept in FP8 by
:func:`fused`: fused (QKV with grouped-query attention, gate_up), stacked (w2), stacked of fused
(w13), and a plain one; 2 x 2 blocks (the model is tiny: its parts are whole blocks)."""


def fused_specs(role: str) -> dict:
    """The Llama-style model's descriptions, the engine's :data:`FUSED_FP8` tensors in
    ``float8_e4m3fn`` with their block scales."""
    import torch
    from weight_sync_jobs import llama_specs

    specs = llama_specs(role)
    if role == "trainer":
        return specs
    for name in [n for n in specs if any(f in n for f in FUSED_FP8)]:
        shape, _, layout = specs[name]
        specs[name] = mc.ParamSpec(shape, torch.float8_e4m3fn, layout)
        scale_layout, grid = mc.scale_layout(layout, shape, (2, 2))
        specs[f"{name}_scale_inv"] = mc.ParamSpec(grid, torch.float32, scale_layout)
    return specs


def fused_expected(name: str, version: int):
    """Engine tensor ``name`` (or its scales) at ``version``, whole: the trainer's tensors
    assembled by hand, then converted whole."""
    import torch
    from weight_sync_jobs import llama_engine_full

    base = name.removesuffix("_scale_inv")
    x = torch.from_numpy(llama_engine_full(base, version))
    if not any(f in base for f in FUSED_FP8):
        return x.to(torch.bfloat16)
    q, scales = mc.quantize(x, "float8_e4m3fn", (2, 2))
    return scales if name.endswith("_scale_inv") else q


def fused(group, rank: int, role: str, versions: list[int]) -> dict:
    """FP8 into fused and stacked engine tensors (``llama_mapping``), on ``group``: per-tensor
    scales for them are refused (one error on every rank of both jobs); with 2 x 2 blocks the
    trainer pushes ``versions`` and the engine receives them in place (the last into fresh
    tensors), checking every byte and scale against the whole tensor's conversion."""
    from weight_sync_jobs import llama_shards, receive_versions

    specs = fused_specs(role)
    mapping = mc.llama_mapping(2, num_experts=2, moe_layers=[1])
    report: dict = {"errors": [], "received": []}
    blocks = {n: (2, 2) for n in fused_specs("engine") if any(f in n for f in FUSED_FP8)}
    try:
        mc.WeightSync(group, specs, mapping=mapping,
                      fp8_block={**blocks, "model.layers.0.self_attn.qkv_proj.weight": None})
    except ValueError as exc:
        report["errors"].append(str(exc))
    sync = mc.WeightSync(group, specs, mapping=mapping, fp8_block=(2, 2), bucket_bytes=4 << 10)
    if role == "trainer":
        for v in versions:
            report["received"].append(sync.push(llama_shards(specs, rank, v), version=v).version)
        return report
    report.update(receive_versions(sync, specs, rank, versions,
                                   lambda got, v: _exact(got, specs, rank, v, fused_expected)))
    return report


def check(trainer: list[dict], engine: list[dict], versions: list[int]) -> None:
    """What :func:`run` must report on every rank of both jobs."""
    assert [r["received"] for r in trainer + engine] == [versions] * (len(trainer) + len(engine))
    error = ("the engine's FP8 parameters do not fit: w: 'w_scale_inv' is declared (2, 3) "
             "float32 2@2:S0R; its scales (per tensor) are () float32 2@2: (joint ranks); v: "
             "the engine declares no scale parameter 'v_scale_inv'")
    assert [r["errors"] for r in trainer + engine] == [[error]] * 4  # every rank of both jobs
    for report in engine:
        assert report["exact"] == [True] * len(versions)  # FP8 bytes and scales, bit for bit
        assert report["in_place"] and report["same_storage"]  # the one before last, in place
    per_tensor = ("the engine's FP8 parameters do not fit: model.layers.0.self_attn.qkv_proj."
                  "weight: a fused or stacked FP8 tensor needs block-wise scales (fp8_block): "
                  "one scale per tensor would span its parts, which come from different "
                  "trainer tensors")
    for report in trainer + engine:  # into fused and stacked tensors
        assert report["fused"]["errors"] == [per_tensor]
        assert report["fused"]["received"] == versions
    for report in engine:
        assert report["fused"]["exact"] == [True] * len(versions)
        assert report["fused"]["in_place"] and report["fused"]["same_storage"]


def dies_in_amax(rank: int, address: str, role: str) -> dict:
    """Version 1 syncs; in version 2 trainer rank 1 exits (status 3) as the block maxima are
    exchanged, before it sends any: every engine rank must raise naming it, its FP8 weights and
    scales still version 1's."""
    import os
    import time

    import torch

    from meshcast.interop import sync_fp8

    declared = specs(role)
    group = mc.connect(address, role, model="fp8-test", timeout=30)
    sync = mc.WeightSync(group, declared, fp8_block=BLOCKS, bucket_bytes=8 << 10)
    if role == "trainer":
        for v in (1, 2):
            if v == 2 and rank == 1:
                sync_fp8.combine_amax = lambda *a, **k: os._exit(3)
            sync.push({n: _shard(full(n, v), s.layout, rank).contiguous()
                       for n, s in declared.items()}, version=v)
        return {}
    local = {n: torch.zeros(s.layout.shard_shape(rank, tuple(s.shape)), dtype=s.dtype)
             for n, s in declared.items()}
    sync.receive(local)
    started, report = time.monotonic(), {}
    try:
        sync.receive(local)
    except mc.WeightSyncError as exc:
        report = {"error": str(exc), "failed": list(exc.failed)}
    report["seconds"] = time.monotonic() - started
    report["kept"] = _exact(local, declared, rank, 1)
    return report
