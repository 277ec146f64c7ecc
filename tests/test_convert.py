"""Dtype conversion en route: a sharded FP8 conversion equals the whole tensor's, bit for bit.

The whole-tensor conversion (:func:`quantize`) is checked against an independent DeepSeek-V3
style reference (pad to whole blocks, amax per block). Then, for random shapes (not multiples of
the block), random layouts (plain, strided, fused: shards that cut blocks, replicas) and both FP8
formats, per tensor and block-wise: every rank's partial amax, the planned exchange
(:func:`combine_local`) and its own conversion give exactly the whole tensor's bytes cut by the
layout, and the scales arrive in the scale layout. On real gloo processes: trainer ranks convert
their shards after :func:`combine_amax`, meshcast moves the FP8 bytes, and the engine ranks hold
exactly the whole conversion and its scales.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import meshes, rich_specs

import meshcast as mc
from meshcast.core.scales import scale_layout
from meshcast.planning.amax import combine_local, plan_amax
from meshcast.runtime.convert import partial_amax, quantize, quantize_shard, scales_of

FP8 = ("float8_e4m3fn", "float8_e5m2")


def reference(x: torch.Tensor, dtype: str, block) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's block quantization of a 2-D weight, written out independently."""
    x, fmax = x.float(), torch.finfo(getattr(torch, dtype)).max
    if block is None:
        s = x.abs().amax().clamp(min=1e-12) / fmax
        return (x / s).to(getattr(torch, dtype)), s
    (m, n), (bm, bn) = x.shape, block
    big, bigc = -(-m // bm), -(-n // bn)
    pad = torch.zeros(big * bm, bigc * bn)
    pad[:m, :n] = x.abs()
    s = pad.view(big, bm, bigc, bn).amax(dim=(1, 3)).clamp(min=1e-12) / fmax
    full = s.repeat_interleave(bm, 0).repeat_interleave(bn, 1)[:m, :n]
    return (x / full).to(getattr(torch, dtype)), s


def bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


def sample(shape, dtype: str, seed: int) -> torch.Tensor:
    """Values over many magnitudes (a different one per row), a few exact zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 20, shape[:1],
                                                                   generator=g).float()
                                                     ).reshape(-1, *[1] * (len(shape) - 1))
    x[torch.rand(shape, generator=g) < 0.05] = 0
    return x.to(getattr(torch, dtype))


@pytest.mark.parametrize("block", [(128, 128), (16, 48), None])
@pytest.mark.parametrize("dtype", FP8)
def test_whole_conversion_is_deepseeks(block, dtype) -> None:
    x = sample((300, 200), "bfloat16", 1)
    q, s = quantize(x, dtype, block)
    rq, rs = reference(x, dtype, block)
    assert np.array_equal(bits(q), bits(rq)) and torch.equal(s, rs)
    assert q.dtype == getattr(torch, dtype) and s.dtype == torch.float32


@pytest.mark.parametrize("shape", [(0, 200), (300, 0), (0,)])
@pytest.mark.parametrize("block", [(128, 128), None])
def test_a_tensor_without_elements_has_empty_or_floor_scales(shape, block) -> None:
    block = block and block[-len(shape):]
    q, s = quantize(torch.zeros(shape, dtype=torch.bfloat16), "float8_e4m3fn", block)
    assert q.shape == shape and q.dtype == torch.float8_e4m3fn
    if block is None:  # one scale: an amax of 0, floored as any tensor of zeros is
        assert torch.equal(s, quantize(torch.zeros(2), "float8_e4m3fn", None)[1])
    else:  # the block grid, with no block
        assert s.shape == tuple(-(-n // b) for n, b in zip(shape, block)) and s.numel() == 0


@st.composite
def cases(draw):
    mesh = draw(meshes(max_devices=8, rank_pool=12))
    ndim = draw(st.integers(1, 3))
    shape = tuple([draw(st.integers(1, 4)) for _ in range(ndim - 2)]
                  + [draw(st.integers(1, 300)) for _ in range(min(ndim, 2))])
    src = mc.Layout(mesh, draw(rich_specs(mesh, shape)))
    block = draw(st.sampled_from([None, (128, 128), (16, 16), (7, 5), (3,)]))
    if block is not None:
        block = block[-ndim:]
    dst_mesh = draw(meshes(max_devices=4, rank_pool=12))
    try:
        dst = scale_layout(mc.Layout(dst_mesh, draw(rich_specs(dst_mesh, shape))), shape,
                           block)[0]
    except ValueError:  # that engine layout cuts blocks: the senders only
        dst = None
    return shape, src, block, dst, draw(st.sampled_from(FP8)), draw(st.sampled_from(
        ["float32", "bfloat16"]))


@given(cases(), st.integers(0, 2**16))
def test_sharded_conversion_equals_the_whole_tensors_bit_for_bit(case, seed) -> None:
    shape, src, block, dst, dtype, source_dtype = case
    x = sample(shape, source_dtype, seed)
    q, s = quantize(x, dtype, block)
    plan = plan_amax(shape, block, src, dst)
    regions = src.regions(shape)
    local = {r: x[np.ix_(*reg.indices())] for r, reg in regions.items()}
    partials = {r: partial_amax(local[r], regions[r], shape, block).numpy()
                for r in plan.partial}
    known = combine_local(plan, partials)
    want = mc.scatter(bits(q), src)
    for r, region in regions.items():
        if r not in plan.partial:
            assert region.size == 0
            continue
        amax = known[r][plan.slots(r, plan.partial[r])].reshape(plan.partial_shape[r])
        got = quantize_shard(local[r], region, shape, block, torch.from_numpy(amax), dtype)
        assert np.array_equal(bits(got), want[r]), r
    if dst is not None:
        grid_scales = mc.scatter(s.numpy(), dst)
        for r, ids in plan.scale.items():
            amax = torch.from_numpy(known[r][plan.slots(r, ids)])
            assert np.array_equal(scales_of(amax, dtype).numpy().reshape(-1),
                                  grid_scales[r].reshape(-1)), r


def test_the_exchange_sends_only_what_is_missing() -> None:
    # 4 ranks split columns (300 = 75 x 4: blocks of 128 cut at 75, 150, 225), 2 replicas each
    src = mc.Layout(mc.Mesh.from_range(0, (2, 4)), "RS1")
    plan = plan_amax((256, 300), (128, 128), src)
    # column blocks 0..2; ranks 0-3 hold 0:75, 75:150, 150:225, 225:300; replicas 4-7 send none
    assert {c for c, _ in plan.pairs()} == {0, 1, 2, 3}
    assert plan.pairs()[:3] == [(0, 1), (0, 5), (1, 0)]
    assert list(plan.messages[(0, 1)]) == [0, 3]  # both row blocks of column block 0
    whole = plan_amax((256, 256), (128, 128), mc.Layout(mc.Mesh.from_range(0, (2,)), "RS0"))
    assert whole.messages == {}  # every shard is whole blocks: nothing to combine


def test_scale_layouts_follow_the_weight_and_refuse_cut_blocks() -> None:
    engine = mc.Mesh.from_range(4, (2, 2))
    qkv = mc.Layout(engine, "{q=512:S01+k=256:S0+v=256:S0}R")
    scales, grid = scale_layout(qkv, (1024, 300), (128, 128))
    assert (scales.spec, grid) == ("{q=4:S01+k=2:S0+v=2:S0}R", (8, 3))
    assert scale_layout(qkv, (1024, 300), None)[0].spec == ""
    with pytest.raises(ValueError, match=r"rank 4's shard of layout 'S0R' \(shape \(300, 8\)\) "
                       r"holds indices \(\(0, 150\),\) of dimension 0, which are not whole "):
        scale_layout(mc.Layout(mc.Mesh.from_range(4, (2,)), "S0R"), (300, 8), (128, 128))
    with pytest.raises(ValueError, match=r"fused parts \['k', 'v'\] of dimension 0"):
        scale_layout(mc.Layout(engine, "{q=512:S01+k=64:S0+v=64:S0}R"), (640, 8), (128, 128))


# -- real processes: trainer ranks 0-3 convert, meshcast moves the FP8 bytes to ranks 4-5 ------
TRAIN, ENGINE = mc.Mesh.from_range(0, (2, 2)), mc.Mesh([4, 5])
TENSORS = [  # shape, source dtype, FP8 dtype, block, trainer spec, engine spec
    ((512, 300), "bfloat16", "float8_e4m3fn", (128, 128), "S1S0", "S0R"),  # shards cut blocks
    ((200, 70), "float32", "float8_e5m2", None, "S0R", "RS0"),  # per tensor, with replicas
]


def _convert_job(rank: int) -> dict:
    from meshcast.runtime.convert import combine_amax

    out: dict = {"exact": [], "scales": []}
    plans, partials, locals_, tasks, wholes = [], [], [], [], []
    for k, (shape, sdt, dtype, block, sspec, dspec) in enumerate(TENSORS):
        x = sample(shape, sdt, k)
        src, dst = mc.Layout(TRAIN, sspec), mc.Layout(ENGINE, dspec)
        plan = plan_amax(shape, block, src, scale_layout(dst, shape, block)[0])
        region = src.region(rank, shape)
        local = None if region is None else x[np.ix_(*region.indices())]
        plans.append(plan)
        locals_.append((local, region))
        partials.append(None if rank not in plan.partial else
                        partial_amax(local, region, shape, block))
        tasks.append(mc.ReshardTask(shape, dtype, src, dst))
        wholes.append(quantize(x, dtype, block))
    combined = combine_amax(plans, partials, timeout=60)
    wire = [None if amax is None else quantize_shard(local, region, t.shape, spec[3], amax,
                                                     t.dtype)
            for (amax, _), (local, region), t, spec in zip(combined, locals_, tasks, TENSORS)]
    got = mc.reshard_many(wire, mc.plan_many(tasks))
    for (q, s), g, (_, scale_amax), t, plan in zip(wholes, got, combined, tasks, plans):
        if g is not None:
            out["exact"].append(np.array_equal(bits(g), mc.scatter(bits(q), t.dst)[rank]))
            want = mc.scatter(s.numpy(), plan.dst)[rank]
            out["scales"].append(np.array_equal(scales_of(scale_amax, t.dtype).numpy(), want))
    # a rank that never joins the exchange: its peers raise within the timeout, naming it (on a
    # group of its own: a gloo time-out closes the group's connections)
    import torch.distributed as dist

    group = dist.new_group(list(range(6)), backend="gloo")
    if rank == 3:
        import time

        time.sleep(6)
        return out
    try:
        combine_amax(plans, partials, group=group, timeout=3)
    except mc.ReshardError as exc:
        out["fault"] = (exc.failed, str(exc).split(" did not")[0])
    return out


def test_trainer_ranks_convert_to_fp8_before_the_wire_on_real_processes() -> None:
    results = mc.launch(_convert_job, 6, hosts=2, timeout=300)
    for rank in (4, 5):
        assert results[rank]["exact"] == [True, True]
        assert results[rank]["scales"] == [True, True]
    faults = {r: results[r].get("fault") for r in range(6) if r != 3}
    plans = [plan_amax(shape, block, mc.Layout(TRAIN, sspec), scale_layout(
        mc.Layout(ENGINE, dspec), shape, block)[0])
        for shape, _, _, block, sspec, dspec in TENSORS]
    waiting = {r for p in plans for c, r in p.messages if c == 3}
    assert waiting == {1, 5}  # rank 3 (rows 256:512) contributes to them
    sending = {c for p in plans for c, r in p.messages if r == 3}  # may complete, or not
    assert sending == {0, 1}
    for r, fault in faults.items():
        if r in waiting:
            assert fault == ((3,), f"rank {r}: combine_amax: the partial amax from rank 3")
        elif r in sending and fault is not None:
            assert fault == ((3,), f"rank {r}: combine_amax: the partial amax to rank 3")
        else:
            assert fault is None, r


def test_a_llama_model_into_an_fp8_engine_with_fused_and_stacked_scales() -> None:
    """Names, fusion and conversion together, in one process: every trainer tensor converted
    per 2 x 2 block on its own shards, moved as FP8 into its part of a fused or stacked engine
    tensor, its scales into their part of the engine's scale tensor; both equal the whole engine
    tensor's conversion cut by its layouts (part sizes are whole blocks, so the fused tensor's
    blocks are its parts')."""
    import ml_dtypes
    from test_weight_names import ENGINE, MAPPING, engine_full, engine_specs, full, trainer_specs

    from meshcast.core.names import rule_sources

    block, dtype = (2, 2), "float8_e4m3fn"  # (4, 4) would cut gate_up: 6 rows per rank
    engine = {n: s for n, s in engine_specs(dtype).items() if len(s[0]) > 1}  # not the norms
    trainer = trainer_specs()
    mapping = {n: MAPPING[n] for n in engine}
    trainer = {n: trainer[n] for n in {t for rule in mapping.values()
                                       for t in rule_sources(rule)}}
    weights = {n: {r: np.zeros(s[2].shard_shape(r, s[0]), ml_dtypes.float8_e4m3fn)
                   for r in ENGINE.devices} for n, s in engine.items()}
    scales = {n: {r: np.zeros(scale_layout(s[2], s[0], block)[0].shard_shape(
        r, scale_layout(s[2], s[0], block)[1]), np.float32) for r in ENGINE.devices}
        for n, s in engine.items()}
    for piece in mc.map_weights(trainer, engine, mapping):
        sp = mc.scale_piece(piece, block)
        x = torch.from_numpy(full(piece.trainer, piece.task.shape))
        plan = plan_amax(piece.task.shape, block, piece.task.src, sp.task.dst)
        regions = piece.task.src.regions(piece.task.shape)
        local = {r: x[np.ix_(*reg.indices())] for r, reg in regions.items()}
        known = combine_local(plan, {r: partial_amax(local[r], regions[r], x.shape, block)
                                     .numpy() for r in plan.partial})
        wire = {r: bits(quantize_shard(local[r], regions[r], x.shape, block, torch.from_numpy(
            known[r][plan.slots(r, plan.partial[r])].reshape(plan.partial_shape[r])), dtype)
            ).view(ml_dtypes.float8_e4m3fn) for r in plan.partial}
        moved = mc.execute_local(mc.plan(piece.task), {r: wire.get(r, np.zeros(
            reg.shape, ml_dtypes.float8_e4m3fn)) for r, reg in regions.items()})
        for r in ENGINE.devices:
            if r in piece.task.dst.mesh:
                piece.dst_view(weights[piece.engine][r], r)[...] = moved[r]
                amax = torch.from_numpy(known[r][plan.slots(r, plan.scale[r])])
                view = sp.dst_view(scales[piece.engine][r], r)
                view[...] = scales_of(amax, dtype).numpy().reshape(view.shape)
    for name, spec in engine.items():
        q, s = quantize(torch.from_numpy(engine_full(name, spec)), dtype, block)
        want_q = mc.scatter(bits(q).view(ml_dtypes.float8_e4m3fn), spec[2])
        want_s = mc.scatter(s.numpy(), scale_layout(spec[2], spec[0], block)[0])
        for r in ENGINE.devices:
            assert np.array_equal(weights[name][r].view(np.uint8), want_q[r].view(np.uint8))
            assert np.array_equal(scales[name][r], want_s[r]), (name, r)
