"""A job of 8 gloo ranks under the real ``torchrun`` (tests/test_fsdp_llama.py): Llama-style
models parallelized the torchtitan way (``parallelize_module`` with Colwise/Rowwise/Sequence
parallel, then ``fully_shard`` per layer and on the root), one Adam step, then their model and
optimizer state resharded by meshcast to inference and other training layouts. Every
destination shard is compared byte for byte with the source's ``full_tensor()`` cut as the
destination placements say; every rank writes ``<out>/rank<r>.json`` and the process exits 0.

``python fsdp_llama_job.py OUT`` under ``torchrun --standalone --nproc-per-node 8``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import meshcast

VOCAB = 37  # uneven over every mesh
DIM = 16
HEADS = 4
KV_HEADS = 2  # grouped-query attention: k and v have half the heads of q
HEAD_DIM = DIM // HEADS
HIDDEN = 42  # SwiGLU hidden size, uneven over 4
LAYERS = 2
SEQ = 4
TIMEOUT = 120.0


class Attention(nn.Module):
    """Grouped-query attention (no rotary embedding: it has no weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, -1, HEAD_DIM).transpose(1, 2)  # local heads under TP
        k = self.wk(x).view(bs, seq, -1, HEAD_DIM).transpose(1, 2)
        v = self.wv(x).view(bs, seq, -1, HEAD_DIM).transpose(1, 2)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        if tied:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def _parallelize(model: Llama, tp: DeviceMesh, dp: DeviceMesh, *, tied: bool,
                 mp: bool) -> None:
    """torchtitan's ``apply_tp`` (sequence parallel norms) and ``apply_fsdp``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    parallelize_module(model, tp, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for block in model.layers.values():
        parallelize_module(block, tp, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                            desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })
    if tied:  # parallelize_module registered a new parameter for each: tie them again
        model.output.weight = model.tok_embeddings.weight
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if mp else None)
    for block in model.layers.values():
        fully_shard(block, mesh=dp, mp_policy=policy)
    fully_shard(model, mesh=dp, mp_policy=policy)


def _train_step(model: Llama) -> torch.optim.Optimizer:
    """One Adam step on the same tokens on every rank."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, SEQ + 1), generator=gen)
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    optim.step()
    return optim


def _tp_placements(name: str) -> list:
    """Inference tensor parallel (vLLM-style): column-parallel q/k/v/w1/w3/output, row-parallel
    wo/w2, vocab-parallel embedding, replicated norms."""
    module = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
    if module in ("wq", "wk", "wv", "w1", "w3", "output", "tok_embeddings"):
        return [Shard(0)]
    if module in ("wo", "w2"):
        return [Shard(1)]
    return [Replicate()]


def _wrong(sd: dict[str, Any], out: dict[str, Any], layouts: dict[str, Any],
           dtype: torch.dtype | None = None) -> list[str]:
    """Names whose destination DTensor differs from the source's ``full_tensor()`` cut as the
    destination says (every rank of the source meshes calls ``full_tensor``)."""
    wrong = []
    for name, (mesh, placements) in layouts.items():
        full = sd[name].full_tensor().detach()
        if dtype is not None:
            full = full.to(dtype)
        if mesh.get_coordinate() is None:
            if name in out:
                wrong.append(f"{name}: off the destination mesh, got a result")
            continue
        got = out.get(name)
        want = distribute_tensor(full, mesh, placements, src_data_rank=None)
        if not isinstance(got, DTensor):
            wrong.append(f"{name}: got {type(got).__name__}")
        elif (tuple(got.placements) != tuple(placements) or got.dtype != full.dtype
              or got.shape != full.shape
              or not torch.equal(got.to_local(), want.to_local())):
            wrong.append(f"{name}: {tuple(got.placements)} {got.dtype} {tuple(got.shape)} "
                         f"local {tuple(got.to_local().shape)} != {tuple(want.to_local().shape)}"
                         f" or values differ")
    return wrong


def _attempt(fn: Any) -> Any:
    """``fn()``'s result, or ``["error", type, message]``: the report says what was raised."""
    try:
        return fn()
    except Exception as exc:  # the report says what was raised
        return ["error", type(exc).__name__, str(exc)[:2000]]


def _reshard(sd: dict[str, Any], layouts: dict[str, Any], dtype: torch.dtype | None = None
             ) -> Any:
    out = meshcast.reshard_state_dict(sd, layouts, timeout=TIMEOUT)
    return _wrong(sd, out, layouts, dtype)


def _optimizer_state(model: Llama, optim: torch.optim.Optimizer,
                     world: DeviceMesh) -> dict[str, Any]:
    """The optimizer state as one flat dict of DTensors: ``exp_avg`` and ``exp_avg_sq`` as FSDP2
    holds them, the scalar ``step`` (a plain tensor in FSDP2) replicated on ``world``."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optim)["state"]
    flat: dict[str, Any] = {}
    for fqn, entry in state.items():
        for key, value in entry.items():
            if not isinstance(value, DTensor):
                value = DTensor.from_local(value, world, [Replicate()], run_check=False)
            flat[f"{fqn}.{key}"] = value
    return flat


def _fsdp_tp(report: dict[str, Any]) -> None:
    """FSDP2 (dp 4) x TP 2 on all 8 ranks, fp32; to TP 4 on ranks 4-7 and TP 2 on ranks 1-2
    (overlapping), optimizer state to FSDP 8 (dp 8) and to FSDP 2 x TP 2 on ranks 2-5."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Llama(tied=False)
    _parallelize(model, mesh["tp"], mesh["dp"], tied=False, mp=False)
    optim = _train_step(model)
    sd = model.state_dict()
    report["fsdp_tp placements"] = {k: str(tuple(v.placements)) for k, v in sd.items()}
    tp4 = DeviceMesh("cpu", [4, 5, 6, 7])
    tp2 = DeviceMesh("cpu", [1, 2])
    report["fsdp_tp -> tp4"] = _attempt(lambda: _reshard(
        sd, {k: (tp4, _tp_placements(k)) for k in sd}))
    dcp = get_model_state_dict(model)
    report["fsdp_tp dcp -> tp2"] = _attempt(lambda: _reshard(
        dcp, {k: (tp2, _tp_placements(k)) for k in dcp}))
    replicas = mesh["dp"].size() // 2  # two inference engines of TP 4, a sub-mesh of a root
    engines = init_device_mesh("cpu", (replicas, 4), mesh_dim_names=("engine", "tp"))["tp"]
    report["fsdp_tp -> 2 engines x tp4"] = _attempt(lambda: _reshard(
        sd, {k: (engines, _tp_placements(k)) for k in sd}))
    world = DeviceMesh("cpu", list(range(8)))
    opt = _optimizer_state(model, optim, world)
    report["optim keys"] = sorted(opt)
    raw = {k: v.to_local() if k.endswith(".step") else v for k, v in opt.items()}
    report["plain step refused"] = _attempt(lambda: meshcast.reshard_state_dict(
        raw, {k: (world, [Replicate()]) for k in raw}, timeout=TIMEOUT) and "moved")
    report["optim -> fsdp8"] = _attempt(lambda: _reshard(
        opt, {k: (world, [Shard(0)] if v.ndim else [Replicate()]) for k, v in opt.items()}))
    fsdp_tp = DeviceMesh("cpu", [[2, 3], [4, 5]])
    report["optim -> fsdp2xtp2"] = _attempt(lambda: _reshard(opt, {
        k: (fsdp_tp, [Shard(0), _tp_placements(k.rsplit(".", 1)[0])[0]] if v.ndim
            else [Replicate(), Replicate()]) for k, v in opt.items()}))
    report["into fsdp2xtp4 model"] = _attempt(lambda: _into_model(model, optim, opt))


def _into_model(src: Llama, src_optim: torch.optim.Optimizer, opt: dict[str, Any]) -> list[str]:
    """Reshard ``src``'s parameters (``named_parameters``, which require grad) and optimizer
    state into the layouts of a real FSDP2 (dp 2) x TP 4 model's own parameters, load them with
    ``load_state_dict`` / ``set_optimizer_state_dict``, and compare."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(5)  # other values: everything must come from the source
    dst = Llama(tied=False)
    _parallelize(dst, mesh["tp"], mesh["dp"], tied=False, mp=False)
    params = dict(src.named_parameters())
    mine = dict(dst.named_parameters())
    layouts = {k: (p.device_mesh, tuple(p.placements)) for k, p in mine.items()}
    out = meshcast.reshard_state_dict(params, layouts, timeout=TIMEOUT)
    wrong = _wrong(params, out, layouts)
    dst.load_state_dict(out)
    optim = torch.optim.Adam(dst.parameters(), lr=0.01)
    olay = {k: (layouts[k.rsplit(".", 1)[0]] if v.ndim else (v.device_mesh, v.placements))
            for k, v in opt.items()}
    moved = meshcast.reshard_state_dict(opt, olay, timeout=TIMEOUT)
    wrong += _wrong(opt, moved, olay)
    state = {fqn: {} for fqn in mine}
    for key, value in moved.items():
        fqn, _, what = key.rpartition(".")
        state[fqn][what] = value.to_local() if what == "step" else value
    want = get_optimizer_state_dict(src, src_optim)
    set_optimizer_state_dict(dst, optim, {"state": state, "param_groups": want["param_groups"]})
    for k, p in mine.items():
        if not torch.equal(p.full_tensor(), params[k].full_tensor()):
            wrong.append(f"{k}: loaded parameter differs")
    got = get_optimizer_state_dict(dst, optim)["state"]
    for fqn, entry in want["state"].items():
        for what, value in entry.items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            mine_v = got[fqn][what]
            mine_v = mine_v.full_tensor() if isinstance(mine_v, DTensor) else mine_v
            if not torch.equal(full, mine_v):
                wrong.append(f"{fqn}.{what}: loaded optimizer state differs")
    return wrong


def _hsdp_tied_bf16(report: dict[str, Any]) -> None:
    """HSDP (replicate 2 x shard 2) x TP 2 on all 8 ranks, tied embedding and head, bf16 mixed
    precision; to TP 4 on ranks 0-3 in fp32 and cast to bf16 on the source, and the optimizer
    state to FSDP 4 on ranks 4-7."""
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("rep", "shard", "tp"))
    torch.manual_seed(0)
    model = Llama(tied=True)
    _parallelize(model, mesh["tp"], mesh["rep", "shard"], tied=True, mp=True)
    optim = _train_step(model)
    sd = model.state_dict()
    report["hsdp placements"] = {k: str(tuple(v.placements)) for k, v in sd.items()}
    report["hsdp tied"] = model.output.weight is model.tok_embeddings.weight
    tp4 = DeviceMesh("cpu", [0, 1, 2, 3])
    layouts = {k: (tp4, _tp_placements(k)) for k in sd}
    report["hsdp -> tp4"] = _attempt(lambda: _reshard(sd, layouts))
    bf16 = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    report["hsdp bf16 -> tp4"] = _attempt(lambda: _reshard(bf16, layouts))
    world = DeviceMesh("cpu", list(range(8)))
    opt = _optimizer_state(model, optim, world)
    emb = model.tok_embeddings.weight  # the tied parameter itself, one DTensor call
    tp2 = DeviceMesh("cpu", [6, 7])
    got = meshcast.reshard_dtensor(emb, tp2, [Shard(0)], timeout=TIMEOUT)
    report["hsdp tied parameter -> tp2"] = _wrong({"e": emb}, {"e": got} if got is not None
                                                 else {}, {"e": (tp2, [Shard(0)])})
    fsdp4 = DeviceMesh("cpu", [4, 5, 6, 7])
    report["hsdp optim -> fsdp4"] = _attempt(lambda: _reshard(
        opt, {k: (fsdp4, [Shard(0)] if v.ndim else [Replicate()]) for k, v in opt.items()}))


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report: dict[str, Any] = {"meshcast": meshcast.__file__}
    start = time.monotonic()
    _fsdp_tp(report)
    report["seconds fsdp_tp"] = round(time.monotonic() - start, 1)
    _hsdp_tied_bf16(report)
    report["seconds"] = round(time.monotonic() - start, 1)
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
