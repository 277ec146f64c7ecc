"""Names and fusion (meshcast.map_weights): trainer names into fused and stacked engine tensors.

A Llama-style model with Hugging Face names (2 layers: one dense, one MoE with 4 experts; q, k, v
with grouped-query attention, 8 query heads and 2 key/value heads), tensor parallel 4 on trainer
ranks 0-3 (the experts expert parallel 2 x tensor parallel 2), moves into a vLLM-style engine on
ranks 4-7 (a 2 x 2 mesh: kv group x rank in group): qkv_proj and gate_up_proj fused, experts
stacked (w13, w2) and split expert parallel 2 x tensor parallel 2. Every piece is checked byte
for byte against the engine tensor assembled by hand and cut by its layout, in one process with
the reference executor and on 8 real gloo processes (``reshard_many`` writing straight into the
engine's shards). The project's GPT: the mapping and its tensor-parallel layouts agree with
:class:`TensorParallelBlock` at any two degrees. A bad mapping is one error listing every problem.
"""

from __future__ import annotations

import numpy as np
import pytest

import meshcast as mc

LAYERS, HIDDEN, HEAD, HEADS, KV, FFN, VOCAB, EXPERTS = 2, 16, 4, 8, 2, 24, 32, 4
TRAINER = mc.Mesh.from_range(0, (4,))
EP_TP = mc.Mesh.from_range(0, (2, 2))  # the trainer's experts: expert parallel x tensor parallel
ENGINE = mc.Mesh.from_range(4, (2, 2))
MAPPING = mc.llama_mapping(LAYERS, num_experts=EXPERTS, moe_layers=[1])


def trainer_specs() -> dict:
    """HF names: column-parallel S0, row-parallel RS0, norms replicated; expert e on the
    tensor-parallel pair e // 2 of the trainer."""
    col, row = (mc.Layout(TRAINER, s) for s in ("S0R", "RS0"))
    rep = mc.Layout(TRAINER, [mc.Replicate()])  # placements: any number of dimensions
    out = {"model.embed_tokens.weight": ((VOCAB, HIDDEN), "float32", col)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        a, m = f"{p}.self_attn", f"{p}.mlp"
        out[f"{p}.input_layernorm.weight"] = ((HIDDEN,), "float32", rep)
        out[f"{a}.q_proj.weight"] = ((HEADS * HEAD, HIDDEN), "float32", col)
        out[f"{a}.k_proj.weight"] = ((KV * HEAD, HIDDEN), "float32", col)
        out[f"{a}.v_proj.weight"] = ((KV * HEAD, HIDDEN), "float32", col)
        out[f"{a}.o_proj.weight"] = ((HIDDEN, HEADS * HEAD), "float32", row)
        out[f"{p}.post_attention_layernorm.weight"] = ((HIDDEN,), "float32", rep)
        if i == 0:
            for x in ("gate", "up"):
                out[f"{m}.{x}_proj.weight"] = ((FFN, HIDDEN), "float32", col)
            out[f"{m}.down_proj.weight"] = ((HIDDEN, FFN), "float32", row)
            continue
        out[f"{m}.gate.weight"] = ((EXPERTS, HIDDEN), "float32", rep)
        for e in range(EXPERTS):
            pair = mc.Mesh(EP_TP.array[e // 2])
            for x in ("gate", "up"):
                out[f"{m}.experts.{e}.{x}_proj.weight"] = ((FFN, HIDDEN), "float32",
                                                           mc.Layout(pair, "S0R"))
            out[f"{m}.experts.{e}.down_proj.weight"] = ((HIDDEN, FFN), "float32",
                                                        mc.Layout(pair, "RS0"))
    out["model.norm.weight"] = ((HIDDEN,), "float32", rep)
    out["lm_head.weight"] = ((VOCAB, HIDDEN), "float32", col)
    return out


def engine_specs(dtype: str = "float32") -> dict:
    """vLLM names and layouts: tensor parallel over all 4 ranks (S01), each kv head on the 2
    ranks of its group (S0); experts over axis 0, their rows (w13) or columns (w2) over axis 1."""
    def lay(spec: str) -> mc.Layout:
        return mc.Layout(ENGINE, [mc.Replicate()] * 2 if spec == "R" else spec)

    qkv = f"{{q={HEADS * HEAD}:S01+k={KV * HEAD}:S0+v={KV * HEAD}:S0}}R"
    out = {"model.embed_tokens.weight": ((VOCAB, HIDDEN), dtype, lay("S01R"))}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        a, m = f"{p}.self_attn", f"{p}.mlp"
        out[f"{p}.input_layernorm.weight"] = ((HIDDEN,), dtype, lay("R"))
        out[f"{a}.qkv_proj.weight"] = (((HEADS + 2 * KV) * HEAD, HIDDEN), dtype, lay(qkv))
        out[f"{a}.o_proj.weight"] = ((HIDDEN, HEADS * HEAD), dtype, lay("RS01"))
        out[f"{p}.post_attention_layernorm.weight"] = ((HIDDEN,), dtype, lay("R"))
        if i == 0:
            out[f"{m}.gate_up_proj.weight"] = ((2 * FFN, HIDDEN), dtype,
                                               lay(f"{{gate={FFN}:S01+up={FFN}:S01}}R"))
            out[f"{m}.down_proj.weight"] = ((HIDDEN, FFN), dtype, lay("RS01"))
            continue
        out[f"{m}.gate.weight"] = ((EXPERTS, HIDDEN), dtype, lay("R"))
        out[f"{m}.experts.w13_weight"] = ((EXPERTS, 2 * FFN, HIDDEN), dtype,
                                          lay(f"S0{{gate={FFN}:S1+up={FFN}:S1}}R"))
        out[f"{m}.experts.w2_weight"] = ((EXPERTS, HIDDEN, FFN), dtype, lay("S0RS1"))
    out["model.norm.weight"] = ((HIDDEN,), dtype, lay("R"))
    out["lm_head.weight"] = ((VOCAB, HIDDEN), dtype, lay("S01R"))
    return out


def full(name: str, shape) -> np.ndarray:
    """The trainer tensor ``name``: distinct values, a function of the name."""
    seed = sum(map(ord, name))
    return ((np.arange(int(np.prod(shape)), dtype=np.int64) * 7 + seed) % 100003).reshape(
        shape).astype(np.float32)


def engine_full(name: str, spec) -> np.ndarray:
    """The engine tensor assembled by hand from the trainer's (what a loader would build)."""
    rule = MAPPING[name]
    if isinstance(rule, str):
        return full(rule, spec[0])
    if isinstance(rule, mc.Fuse):
        return np.concatenate([full(t, trainer_specs()[t][0]) for _, t in rule.parts], rule.dim)
    items = []
    for item in rule.items:
        if isinstance(item, str):
            items.append(full(item, trainer_specs()[item][0]))
        else:
            items.append(np.concatenate([full(t, (FFN, HIDDEN)) for _, t in item.parts]))
    return np.stack(items, axis=rule.dim)


def test_llama_block_and_moe_move_exactly_into_fused_and_stacked_shards() -> None:
    trainer, engine = trainer_specs(), engine_specs()
    pieces = mc.map_weights(trainer, engine, MAPPING)
    assert sorted(p.trainer for p in pieces) == sorted(trainer)  # each trainer tensor once
    assert [p.engine for p in pieces][:3] == ["model.embed_tokens.weight",
                                              "model.layers.0.input_layernorm.weight",
                                              "model.layers.0.self_attn.qkv_proj.weight"]
    local = {n: {r: np.full(s[2].shard_shape(r, s[0]), -1, np.float32) for r in ENGINE.devices}
             for n, s in engine.items()}
    for piece in pieces:
        moved = mc.execute_local(mc.plan(piece.task), mc.scatter(
            full(piece.trainer, piece.task.shape), piece.task.src))
        for r in ENGINE.devices:
            view = piece.dst_view(local[piece.engine][r], r)
            assert (view is None) == (r not in piece.task.dst.mesh)
            if view is not None:
                view[...] = moved[r]
    for name, spec in engine.items():
        want = mc.scatter(engine_full(name, spec), spec[2])
        for r in ENGINE.devices:
            assert np.array_equal(local[name][r], want[r]), (name, r)


def test_a_stacked_expert_lives_on_the_sub_mesh_holding_it() -> None:
    spec = engine_specs()["model.layers.1.mlp.experts.w13_weight"]
    sub, shape = mc.index_layout(spec[2], spec[0], 0, 3)
    assert (sub.mesh.devices, sub.spec, shape) == ([6, 7], f"{{gate={FFN}:S0+up={FFN}:S0}}R",
                                                   (2 * FFN, HIDDEN))
    assert [mc.index_local(spec[2], spec[0], r, 0, 3) for r in ENGINE.devices] == [
        None, None, 1, 1]
    piece = next(p for p in mc.map_weights(trainer_specs(), engine_specs(), MAPPING)
                 if p.trainer == "model.layers.1.mlp.experts.3.up_proj.weight")
    assert piece.path == (("stack", 0, 3), ("part", 0, "up"))
    assert piece.task.dst.spec == "S0R" and piece.task.dst.mesh.devices == [6, 7]
    assert piece.dst_indices(7) == [(1,), (slice(12, 24), slice(None))]


def test_an_unsplit_dimension_fuses_without_a_fused_layout() -> None:
    one = mc.Mesh([9])
    trainer = {n: ((r, 4), "float32", mc.Layout(TRAINER, "S0R"))
               for n, r in (("q", 8), ("k", 4), ("v", 4))}
    engine = {"qkv": ((16, 4), "bfloat16", mc.Layout(one, "RR"))}
    _, k, v = mc.map_weights(trainer, engine, {"qkv": mc.Fuse({"q": "q", "k": "k", "v": "v"})})
    assert (k.task.dtype, k.trainer_dtype, k.task.dst.spec) == ("bfloat16", "float32", "RR")
    assert k.dst_indices(9) == [(slice(8, 12), slice(None))]
    assert v.engine_layout.spec == "{q=8:R+k=4:R+v=4:R}R"


def test_a_bad_mapping_is_one_error_listing_every_problem() -> None:
    trainer, engine = trainer_specs(), engine_specs()
    trainer["extra.weight"] = ((3,), "float32", mc.Layout(TRAINER, "R"))
    del trainer["model.layers.0.self_attn.v_proj.weight"]
    engine["engine.only"] = ((3,), "float32", mc.Layout(ENGINE, "R"))
    mapping = dict(MAPPING)
    mapping["ghost"] = "model.norm.weight"
    mapping["model.layers.0.mlp.down_proj.weight"] = "model.layers.0.self_attn.o_proj.weight"
    mapping["lm_head.weight"] = mc.Fuse({"a": "lm_head.weight"})
    w2 = "model.layers.1.mlp.experts.w2_weight"
    mapping[w2] = mc.Stack(mapping[w2].items[:3])  # expert 3 left out
    with pytest.raises(ValueError) as info:
        mc.map_weights(trainer, engine, mapping)
    assert str(info.value) == (
        "the mapping does not fit (7 problems):\n"
        "  engine tensors the mapping does not fill: 'engine.only'\n"
        "  mapping names engine tensors the engine does not have: 'ghost'\n"
        "  trainer tensors the mapping does not use: 'model.layers.0.mlp.down_proj.weight', "
        "'model.layers.1.mlp.experts.3.down_proj.weight', 'extra.weight'\n"
        "  mapping reads trainer tensors the trainer does not have: "
        "'model.layers.0.self_attn.v_proj.weight'\n"
        "  model.layers.0.mlp.down_proj.weight: trainer 'model.layers.0.self_attn.o_proj.weight'"
        " has shape (16, 32), its place in the engine has shape (16, 24)\n"
        "  model.layers.1.mlp.experts.w2_weight: Stack of 3 items along dim 0, but the tensor's "
        "shape is (4, 16, 24)\n"
        "  lm_head.weight: layout 'S01R' splits the fused dim 0 plainly, which cuts across its "
        "parts; write it fused, {a=SIZE:SPLIT+...}")


def test_llama_mapping_ties_embeddings_and_adds_biases_and_qk_norms() -> None:
    m = mc.llama_mapping(1, tie_embeddings=True, attention_bias=True, qk_norm=True)
    assert m["lm_head.weight"] == "model.embed_tokens.weight"
    assert m["model.layers.0.self_attn.qkv_proj.bias"] == mc.Fuse(
        {x: f"model.layers.0.self_attn.{x}_proj.bias" for x in "qkv"})
    assert "model.layers.0.self_attn.k_norm.weight" in m
    assert mc.gpt_mapping(1, prefix="transformer.")["transformer.h.0.attn.c_attn.weight"] == (
        "h.0.attn.c_attn.weight")


def test_gpt_mapping_and_layouts_agree_with_the_tensor_parallel_block_at_any_degree() -> None:
    """Trainer: 2 pipeline stages x tensor parallel 2 (ranks 0-3); engine: tensor parallel 4
    (ranks 4-7) under vLLM-style names. Every engine shard equals the one
    :class:`TensorParallelBlock` cuts from the model at degree 4 (c_attn: [q_r; k_r; v_r])."""
    from meshcast.interop.weights import gpt_stage_of, tensor_parallel_layout
    from meshcast.models.gpt import GPT, GPTConfig, TensorParallelBlock, split_layers

    config = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=16)
    model = GPT(config, seed=0)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    stages, engine_tp = [mc.Mesh([0, 1]), mc.Mesh([2, 3])], mc.Mesh([4, 5, 6, 7])
    layers = split_layers(config.n_layer, 2)

    def stage(name: str) -> mc.Mesh:
        return stages[gpt_stage_of(name, layers)]

    trainer = {n: (v.shape, "float32", tensor_parallel_layout(n, stage(n), v.shape))
               for n, v in sd.items()}
    mapping = mc.gpt_mapping(config.n_layer, prefix="transformer.")
    engine = {e: (sd[t].shape, "float32", tensor_parallel_layout(t, engine_tp, sd[t].shape))
              for e, t in mapping.items()}
    got = {}
    for piece in mc.map_weights(trainer, engine, mapping):
        moved = mc.execute_local(mc.plan(piece.task), mc.scatter(sd[piece.trainer],
                                                                 piece.task.src))
        got[piece.trainer] = moved
    for i in range(config.n_layer):
        for r in range(2):  # the trainer's own shards, as the block at degree 2 holds them
            c_attn = TensorParallelBlock.from_block(model.h[i], config, r, 2).c_attn.weight
            name = f"h.{i}.attn.c_attn.weight"
            held = mc.scatter(sd[name], trainer[name][2])[stage(name).devices[r]]
            assert np.array_equal(held, c_attn.detach().numpy())
        for r in range(4):
            tp = TensorParallelBlock.from_block(model.h[i], config, r, 4)
            for mine, theirs in (("attn.c_attn", tp.c_attn), ("mlp.c_fc", tp.c_fc),
                                 ("attn.c_proj", tp.attn_proj), ("mlp.c_proj", tp.mlp_proj)):
                w = theirs.weight.detach().numpy()
                assert np.array_equal(got[f"h.{i}.{mine}.weight"][4 + r], w), (i, r, mine)


def _sync_job(rank: int) -> dict:
    """Every rank: the pieces, then one ``reshard_many`` from the trainer's shards straight into
    the engine's (preallocated) fused and stacked shards."""
    import torch

    engine = engine_specs()
    pieces = mc.map_weights(trainer_specs(), engine, MAPPING)
    local = {n: torch.full(s[2].shard_shape(rank, s[0]), -1.0) for n, s in engine.items()
             if rank in s[2].mesh}
    srcs, outs = [], []
    for p in pieces:
        shard = mc.scatter(full(p.trainer, p.task.shape), p.task.src).get(rank)
        srcs.append(None if shard is None else torch.from_numpy(shard))
        outs.append(p.dst_view(local[p.engine], rank) if p.engine in local else None)
    got = mc.reshard_many(srcs, mc.plan_many([p.task for p in pieces]), out=outs,
                          names=[f"{p.engine} <- {p.trainer}" for p in pieces])
    exact = {n: np.array_equal(t.numpy(), mc.scatter(engine_full(n, engine[n]),
                                                     engine[n][2])[rank])
             for n, t in local.items()}
    return {"exact": exact, "in_place": all(g is o for g, o in zip(got, outs) if o is not None)}


def test_a_llama_block_and_moe_layer_sync_on_real_processes() -> None:
    results = mc.launch(_sync_job, 8, hosts=2, timeout=300)
    names = list(engine_specs())
    for rank in range(4, 8):
        assert results[rank] == {"exact": {n: True for n in names}, "in_place": True}
    assert all(results[r] == {"exact": {}, "in_place": True} for r in range(4))
