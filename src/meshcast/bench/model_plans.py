"""Whole-model weight syncs on paper: the task lists of a Llama-70B-like dense model and of a
Kimi-K2-like 1-trillion-parameter mixture of experts, from a trainer's layout to an inference
engine's (numpy only; nothing is allocated). ``meshcast bench model-plans`` plans and simulates
them.

Both are described by their sizes (keyword arguments whose defaults are the real models), so a
test builds a tiny version with the same structure. Weights follow Hugging Face names and shapes
(``nn.Linear`` weights are ``(out, in)``); tensor parallelism is Megatron's: column-parallel
linears split the output dimension (dim 0), row-parallel ones the input dimension (dim 1),
embedding and head split the vocabulary (dim 0), norms and small projections are replicated.

* :func:`llama70b_tasks`: trainer pipeline 8 x tensor parallel 8 on ranks 0-63 (stage ``s`` on
  host ``s``, its own TP-8 mesh); engine tensor parallel 8 x data parallel 4 on the next 32 ranks:
  one (4, 8) mesh, axis 0 the replicas (one host each), axis 1 tensor parallel.
* :func:`kimi_k2_tasks`: trainer pipeline 8 x (4 hosts x 8 GPUs) per stage on ranks 0-255:
  attention and dense MLPs tensor parallel 8 over a host and replicated over the stage's 4 hosts
  (data parallel), routed experts expert parallel over the stage's 32 GPUs; engine 16 hosts x 8
  GPUs (ranks 256-383): attention and dense tensor parallel 8 per host (16 replicas), experts
  expert parallel over all 128 GPUs, stacked as ``(experts, rows, cols)`` tensors split on dim 0.

The engine fuses q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj`` (and the experts' into
one ``w13`` tensor) as vLLM does: each trainer tensor moves into its part of the fused tensor
(:func:`meshcast.fused_tasks`), so a fused tensor contributes one task per part.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import NamedTuple

from ..core.fused import fused_tasks
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..estimate.lower_bound import joint_lower_bound
from ..estimate.simulate import simulate_many
from ..planning.many import clear_plan_cache, plan_many

__all__ = [
    "ModelSync",
    "MoeSizes",
    "SyncFigures",
    "kimi_k2_tasks",
    "llama70b_tasks",
    "measure",
    "split_layers",
    "sync_order",
]

GPUS_PER_HOST = 8
"""Devices per host of the ``h100x8`` preset the syncs run on."""


class ModelSync:
    """A model's weight sync: ``tasks[i]`` moves trainer tensor ``names[i]`` (into its part of
    an engine tensor where the engine fuses, see the module docstring), on ``topology``."""

    def __init__(self, model: str, topology: Topology) -> None:
        self.model = model
        self.topology = topology
        self.names: list[str] = []
        self.tasks: list[ReshardTask] = []

    def add(self, name: str, task: ReshardTask) -> None:
        """Append one tensor's task."""
        self.names.append(name)
        self.tasks.append(task)

    @property
    def num_params(self) -> int:
        """Parameters of the model: elements of every tensor (each fused part once)."""
        return sum(math.prod(t.shape) for t in self.tasks)

    @property
    def nbytes(self) -> int:
        """Bytes of the model's weights."""
        return sum(t.nbytes for t in self.tasks)


class _Side(NamedTuple):
    """One side's layouts of a tensor kind: the mesh and the spec of each parallel style."""

    mesh: Mesh
    column: str  # 2-D weight split on dim 0 (output features, or the vocabulary)
    row: str  # 2-D weight split on dim 1 (input features)
    replicated: str  # a 1-D weight (norms) replicated
    experts: str = ""  # stacked experts (experts, rows, cols) split on dim 0

    def layout(self, style: str) -> Layout:
        """The layout of parallel style ``style`` (``column``, ``row``, ``replicated``,
        ``dense`` (a 2-D weight replicated), ``experts``)."""
        spec = "RR" if style == "dense" else getattr(self, style)
        return Layout(self.mesh, spec)


def split_layers(layers: int, stages: int) -> list[range]:
    """Contiguous layers per pipeline stage, the first ``layers % stages`` stages one more."""
    base, extra = divmod(layers, stages)
    out, start = [], 0
    for s in range(stages):
        n = base + (s < extra)
        out.append(range(start, start + n))
        start += n
    return out


def _move(sync: ModelSync, name: str, shape: tuple[int, ...], dtype: str, src: _Side,
          dst: _Side, style: str) -> None:
    """One tensor of ``style`` from trainer side ``src`` to engine side ``dst``."""
    sync.add(name, ReshardTask(shape, dtype, src.layout(style), dst.layout(style)))


def _move_fused(sync: ModelSync, prefix: str, parts: Mapping[str, tuple[int, ...]], dtype: str,
                src: _Side, fused: Layout, dim: int) -> None:
    """Trainer tensors ``prefix + part`` (column-parallel or stacked experts, by their rank)
    into their parts of the engine's fused tensor of layout ``fused`` (concatenated on ``dim``)."""
    shapes = list(parts.values())
    shape = list(shapes[0])
    shape[dim] = sum(s[dim] for s in shapes)
    style = "experts" if len(shape) == 3 else "column"
    sources = {name: src.layout(style) for name in parts}
    for name, task in zip(parts, fused_tasks(fused, shape, dtype, sources, dim=dim)):
        sync.add(f"{prefix}{name}", task)


def _fused_spec(parts: Mapping[str, tuple[int, ...]], dim: int, step: str) -> str:
    """The engine's fused spec: dimension ``dim`` the parts (each split by ``step``)."""
    return "{" + "+".join(f"{n}={s[dim]}:{step}" for n, s in parts.items()) + "}"


# -- Llama-70B --------------------------------------------------------------------------------
def llama70b_tasks(
    *,
    layers: int = 80,
    hidden: int = 8192,
    heads: int = 64,
    kv_heads: int = 8,
    head_dim: int = 128,
    intermediate: int = 28672,
    vocab: int = 128256,
    pp: int = 8,
    tp: int = 8,
    dp: int = 4,
    dtype: str = "bfloat16",
) -> ModelSync:
    """A Llama-70B-like model (defaults: Llama 3 70B) from a trainer's pipeline ``pp`` x tensor
    parallel ``tp`` (stage ``s`` = ranks ``s*tp ..``, one host) to an engine's ``dp`` replicas of
    tensor parallel ``tp`` (the next ``dp*tp`` ranks, one host per replica); hosts of ``tp``
    GPUs with the ``h100x8`` links. Tasks in model order: embedding, then per layer the input
    norm, q, k, v, o, the post-attention norm, gate, up, down; the final norm and the head."""
    engine = _Side(Mesh.from_range(pp * tp, (dp, tp)), "S1R", "RS1", "R")
    topology = Topology.preset("h100x8", pp + dp, devices_per_host=tp)
    sync = ModelSync("Llama-70B", topology)
    stages = [_Side(Mesh.from_range(s * tp, (tp,)), "S0R", "RS0", "R") for s in range(pp)]
    attn = {"q_proj.weight": (heads * head_dim, hidden),
            "k_proj.weight": (kv_heads * head_dim, hidden),
            "v_proj.weight": (kv_heads * head_dim, hidden)}
    mlp = {"gate_proj.weight": (intermediate, hidden), "up_proj.weight": (intermediate, hidden)}
    qkv = Layout(engine.mesh, _fused_spec(attn, 0, "S1") + "R")
    gate_up = Layout(engine.mesh, _fused_spec(mlp, 0, "S1") + "R")
    _move(sync, "model.embed_tokens.weight", (vocab, hidden), dtype, stages[0], engine, "column")
    for s, block in enumerate(split_layers(layers, pp)):
        src = stages[s]
        for i in block:
            p = f"model.layers.{i}."
            _move(sync, p + "input_layernorm.weight", (hidden,), dtype, src, engine, "replicated")
            _move_fused(sync, p + "self_attn.", attn, dtype, src, qkv, 0)
            _move(sync, p + "self_attn.o_proj.weight", (hidden, heads * head_dim), dtype, src,
                  engine, "row")
            _move(sync, p + "post_attention_layernorm.weight", (hidden,), dtype, src, engine,
                  "replicated")
            _move_fused(sync, p + "mlp.", mlp, dtype, src, gate_up, 0)
            _move(sync, p + "mlp.down_proj.weight", (hidden, intermediate), dtype, src, engine,
                  "row")
    _move(sync, "model.norm.weight", (hidden,), dtype, stages[-1], engine, "replicated")
    _move(sync, "lm_head.weight", (vocab, hidden), dtype, stages[-1], engine, "column")
    return sync


# -- Kimi-K2 ----------------------------------------------------------------------------------
class MoeSizes(NamedTuple):
    """Sizes of a DeepSeek-V3-style model (defaults: Kimi K2): multi-head latent attention
    (low-rank q and kv projections), ``dense_layers`` dense MLP layers first, then mixture of
    experts layers with ``experts`` routed and ``shared`` shared experts."""

    layers: int = 61
    dense_layers: int = 1
    hidden: int = 7168
    dense_intermediate: int = 18432
    experts: int = 384
    shared: int = 1
    expert_intermediate: int = 2048
    heads: int = 64
    q_lora: int = 1536
    kv_lora: int = 512
    qk_nope: int = 128
    qk_rope: int = 64
    v_head: int = 128
    vocab: int = 163840


def _mla(sync: ModelSync, p: str, m: MoeSizes, dtype: str, src: _Side, dst: _Side) -> None:
    """One layer's norms and multi-head latent attention weights: the low-rank down projections
    replicated, the up projections column-parallel (by heads), the output row-parallel."""
    qk = m.qk_nope + m.qk_rope
    _move(sync, p + "input_layernorm.weight", (m.hidden,), dtype, src, dst, "replicated")
    _move(sync, p + "self_attn.q_a_proj.weight", (m.q_lora, m.hidden), dtype, src, dst, "dense")
    _move(sync, p + "self_attn.q_a_layernorm.weight", (m.q_lora,), dtype, src, dst, "replicated")
    _move(sync, p + "self_attn.q_b_proj.weight", (m.heads * qk, m.q_lora), dtype, src, dst,
          "column")
    _move(sync, p + "self_attn.kv_a_proj_with_mqa.weight", (m.kv_lora + m.qk_rope, m.hidden),
          dtype, src, dst, "dense")
    _move(sync, p + "self_attn.kv_a_layernorm.weight", (m.kv_lora,), dtype, src, dst,
          "replicated")
    _move(sync, p + "self_attn.kv_b_proj.weight", (m.heads * (m.qk_nope + m.v_head), m.kv_lora),
          dtype, src, dst, "column")
    _move(sync, p + "self_attn.o_proj.weight", (m.hidden, m.heads * m.v_head), dtype, src, dst,
          "row")
    _move(sync, p + "post_attention_layernorm.weight", (m.hidden,), dtype, src, dst,
          "replicated")


def _mlp(sync: ModelSync, p: str, width: int, hidden: int, dtype: str, src: _Side,
         dst: _Side) -> None:
    """A dense (or shared-expert) MLP: gate and up into the engine's fused ``gate_up_proj``,
    down row-parallel."""
    parts = {"gate_proj.weight": (width, hidden), "up_proj.weight": (width, hidden)}
    fused = Layout(dst.mesh, _fused_spec(parts, 0, dst.column[:2]) + "R")
    _move_fused(sync, p, parts, dtype, src, fused, 0)
    _move(sync, p + "down_proj.weight", (hidden, width), dtype, src, dst, "row")


def _moe(sync: ModelSync, p: str, m: MoeSizes, dtype: str, src: _Side, dst: _Side) -> None:
    """A mixture-of-experts MLP: the router (replicated), the routed experts stacked
    ``(experts, rows, cols)`` and split over experts (gate and up into the engine's fused
    ``w13``), the shared experts as one dense MLP of ``shared`` times the width."""
    _move(sync, p + "gate.weight", (m.experts, m.hidden), dtype, src, dst, "dense")
    _move(sync, p + "gate.e_score_correction_bias", (m.experts,), dtype, src, dst, "replicated")
    e, w, h = m.experts, m.expert_intermediate, m.hidden
    parts = {"gate_proj.weight": (e, w, h), "up_proj.weight": (e, w, h)}
    w13 = Layout(dst.mesh, dst.experts[:-2] + _fused_spec(parts, 1, "R") + "R")
    _move_fused(sync, p + "experts.", parts, dtype, src, w13, 1)
    _move(sync, p + "experts.down_proj.weight", (e, h, w), dtype, src, dst, "experts")
    _mlp(sync, p + "shared_experts.", m.shared * w, h, dtype, src, dst)


def kimi_k2_tasks(
    sizes: MoeSizes | None = None,
    *,
    pp: int = 8,
    stage_hosts: int = 4,
    engine_hosts: int = 16,
    gpus_per_host: int = GPUS_PER_HOST,
    dtype: str = "bfloat16",
) -> ModelSync:
    """A Kimi-K2-like mixture of experts (``sizes``, default :class:`MoeSizes`: about 1.03e12
    parameters) from a trainer of ``pp`` stages of ``stage_hosts`` hosts to an engine of
    ``engine_hosts`` hosts (module docstring; defaults: 256 -> 128 GPUs), hosts of
    ``gpus_per_host`` GPUs with the ``h100x8`` links. Tasks in model order."""
    m = sizes or MoeSizes()
    g = gpus_per_host
    trainer_ranks = pp * stage_hosts * g
    topology = Topology.preset("h100x8", pp * stage_hosts + engine_hosts, devices_per_host=g)
    sync = ModelSync("Kimi-K2", topology)
    engine = _Side(Mesh.from_range(trainer_ranks, (engine_hosts, g)), "S1R", "RS1", "R", "S01RR")
    stages = [_Side(Mesh.from_range(s * stage_hosts * g, (stage_hosts, g)), "S1R", "RS1", "R",
                    "S01RR") for s in range(pp)]
    _move(sync, "model.embed_tokens.weight", (m.vocab, m.hidden), dtype, stages[0], engine,
          "column")
    for s, block in enumerate(split_layers(m.layers, pp)):
        for i in block:
            p = f"model.layers.{i}."
            _mla(sync, p, m, dtype, stages[s], engine)
            if i < m.dense_layers:
                _mlp(sync, p + "mlp.", m.dense_intermediate, m.hidden, dtype, stages[s], engine)
            else:
                _moe(sync, p + "mlp.", m, dtype, stages[s], engine)
    _move(sync, "model.norm.weight", (m.hidden,), dtype, stages[-1], engine, "replicated")
    _move(sync, "lm_head.weight", (m.vocab, m.hidden), dtype, stages[-1], engine, "column")
    return sync


# -- the order of a sync, and its figures -----------------------------------------------------
def sync_order(tasks: list[ReshardTask]) -> list[int]:
    """Indices of ``tasks`` in the order to run them as one sync: first the tensors some engine
    unit slice of which goes to several ranks (broadcasts), then the others; within each group,
    round-robin over the source meshes (pipeline stages), one tensor of each in turn, in list
    order within a mesh.

    Every rank runs its operations in plan order, so in model order (stage after stage) the
    engine ranks take the stages one after another and only one stage's NICs send at a time; a
    broadcast to every engine host between two layers' experts also holds all of them together.
    """
    turn: dict[tuple[bool, Mesh], int] = {}
    keys = []
    for k, t in enumerate(tasks):
        many = max(len(r) for r in t.decomposition.receivers_of_tile) > 1
        group = (not many, t.src.mesh)
        keys.append((not many, turn.get(group, 0), min(t.src.mesh.devices), k))
        turn[group] = turn.get(group, 0) + 1
    return [k for *_, k in sorted(keys)]


class SyncFigures(NamedTuple):
    """What :func:`measure` found for one model (times in seconds unless named otherwise)."""

    tasks: int
    params: int
    nbytes: int
    ops: int
    plan_s: float  # first plan_many call, model order, cold (fresh tasks, empty plan cache)
    cached_us: float  # best cached plan_many call, microseconds
    same_objects: bool  # the cached call returned the very plan objects of the first
    check_s: float  # Plan.check() of every plan (raises if one is wrong)
    sync_plan_s: float  # plan_many of the sync order (decompositions already made)
    simulate_s: float  # simulate_many of the sync order's plans
    model_order_time: float  # simulated sync time, tasks in model order
    sync_order_time: float  # simulated sync time, tasks in sync_order
    bound: float  # joint_lower_bound of the tasks
    bound_s: float  # computing the bound


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def measure(sync: ModelSync, repeats: int = 5) -> SyncFigures:
    """Plan ``sync`` with :func:`meshcast.plan_many` (first call, then ``repeats`` cached calls),
    check every plan (:meth:`meshcast.Plan.check`), simulate the sync as one job
    (:func:`meshcast.simulate_many`) in model order and in :func:`sync_order`, and compute
    :func:`meshcast.joint_lower_bound`."""
    clear_plan_cache()
    tasks, topo = sync.tasks, sync.topology
    plans, plan_s = _timed(lambda: plan_many(tasks, topo))
    cached = []
    for _ in range(repeats):
        again, seconds = _timed(lambda: plan_many(tasks, topo))
        cached.append(seconds)
    same = all(a is b for a, b in zip(plans, again))
    _, check_s = _timed(lambda: [p.check() for p in plans])
    model_time = simulate_many(plans, topo).time_s
    ordered = [tasks[k] for k in sync_order(tasks)]
    sync_plans, sync_plan_s = _timed(lambda: plan_many(ordered, topo))
    report, simulate_s = _timed(lambda: simulate_many(sync_plans, topo))
    bound, bound_s = _timed(lambda: joint_lower_bound(tasks, topo))
    return SyncFigures(
        tasks=len(tasks), params=sync.num_params, nbytes=sync.nbytes,
        ops=sum(len(p.ops) for p in plans), plan_s=plan_s, cached_us=min(cached) * 1e6,
        same_objects=same, check_s=check_s, sync_plan_s=sync_plan_s, simulate_s=simulate_s,
        model_order_time=model_time, sync_order_time=report.time_s, bound=bound,
        bound_s=bound_s,
    )
