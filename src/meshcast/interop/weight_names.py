"""Ready name mappings (numpy only): Llama-style (Hugging Face) trainers into vLLM-style engines,
and the project's GPT model (:class:`meshcast.models.gpt.GPT`).

A mapping is ``{engine name: rule}`` for :func:`meshcast.map_weights` (rules:
:mod:`meshcast.core.names`). The engine names follow vLLM: ``qkv_proj`` fuses ``q``, ``k``,
``v`` (grouped-query attention: k and v have fewer heads), ``gate_up_proj`` fuses ``gate`` and
``up``, and a MoE layer's experts are stacked, ``experts.w13_weight[e] = [gate_e; up_e]`` and
``experts.w2_weight[e] = down_e`` (the router is ``mlp.gate``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.names import Fuse, Rule, Stack

__all__ = ["gpt_mapping", "llama_mapping"]


def _attention(p: str, bias: bool, qk_norm: bool) -> dict[str, Rule]:
    a = f"{p}.self_attn"
    out: dict[str, Rule] = {
        f"{a}.qkv_proj.weight": Fuse({x: f"{a}.{x}_proj.weight" for x in "qkv"}),
    }
    if bias:
        out[f"{a}.qkv_proj.bias"] = Fuse({x: f"{a}.{x}_proj.bias" for x in "qkv"})
    out[f"{a}.o_proj.weight"] = f"{a}.o_proj.weight"
    if qk_norm:
        out.update({f"{a}.{n}.weight": f"{a}.{n}.weight" for n in ("q_norm", "k_norm")})
    return out


def _mlp(p: str, experts: int) -> dict[str, Rule]:
    m = f"{p}.mlp"
    if not experts:
        return {f"{m}.gate_up_proj.weight": Fuse({x: f"{m}.{x}_proj.weight" for x in
                                                  ("gate", "up")}),
                f"{m}.down_proj.weight": f"{m}.down_proj.weight"}
    e = f"{m}.experts"
    return {
        f"{m}.gate.weight": f"{m}.gate.weight",
        f"{e}.w13_weight": Stack([Fuse({x: f"{e}.{i}.{x}_proj.weight" for x in ("gate", "up")})
                                  for i in range(experts)]),
        f"{e}.w2_weight": Stack([f"{e}.{i}.down_proj.weight" for i in range(experts)]),
    }


def llama_mapping(
    num_layers: int,
    *,
    num_experts: int = 0,
    moe_layers: Iterable[int] | None = None,
    tie_embeddings: bool = False,
    attention_bias: bool = False,
    qk_norm: bool = False,
) -> dict[str, Rule]:
    """The mapping of a Llama-style model with Hugging Face names (``model.layers.{i}.self_attn.
    q_proj.weight``, ..., ``model.layers.{i}.mlp.experts.{e}.gate_proj.weight``) into vLLM's
    names, in the engine's order: embedding, then per layer its norms, attention and MLP, then
    the final norm and the head.

    ``num_experts > 0`` makes the layers in ``moe_layers`` (default: all) MoE layers with that
    many experts and a router ``mlp.gate``; ``tie_embeddings`` fills ``lm_head.weight`` from
    ``model.embed_tokens.weight``; ``attention_bias`` adds the fused ``qkv_proj.bias`` (Qwen2);
    ``qk_norm`` adds ``q_norm``/``k_norm`` (Qwen3).
    """
    moe = set(range(num_layers) if moe_layers is None else moe_layers) if num_experts else set()
    out: dict[str, Rule] = {"model.embed_tokens.weight": "model.embed_tokens.weight"}
    for i in range(num_layers):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = f"{p}.input_layernorm.weight"
        out.update(_attention(p, attention_bias, qk_norm))
        out[f"{p}.post_attention_layernorm.weight"] = f"{p}.post_attention_layernorm.weight"
        out.update(_mlp(p, num_experts if i in moe else 0))
    out["model.norm.weight"] = "model.norm.weight"
    out["lm_head.weight"] = "model.embed_tokens.weight" if tie_embeddings else "lm_head.weight"
    return out


_GPT_LAYER = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
              "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
              "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")


def gpt_mapping(n_layer: int, *, prefix: str = "", bias: bool = True) -> dict[str, str]:
    """The mapping of :class:`meshcast.models.gpt.GPT`'s names (in its order) to the same names
    with ``prefix`` (vLLM's GPT-2 names use ``"transformer."``; the head keeps its name).
    ``c_attn`` is already fused ``[q; k; v]`` in the GPT itself; give both sides its layout with
    :func:`meshcast.interop.weights.tensor_parallel_layout`."""
    layer = [n for n in _GPT_LAYER if bias or not n.endswith(".bias")]
    names = ["wte.weight", "wpe.weight",
             *(f"h.{i}.{n}" for i in range(n_layer) for n in layer),
             "ln_f.weight", *(["ln_f.bias"] if bias else []), "lm_head.weight"]
    return {(n if n == "lm_head.weight" else prefix + n): n for n in names}
