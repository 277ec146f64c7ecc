"""The two jobs of the weight-sync tests (issue 16): a trainer and an inference engine, launched
separately, meeting through ``meshcast.connect``.

* The trainer: a small GPT in float32, 2 pipeline stages x tensor-parallel 2 (ranks 0-1 stage 0,
  ranks 2-3 stage 1), Megatron layouts; each rank describes only its stage's parameters (as
  ``ParamSpec`` or as DTensors on the ``tp`` sub-mesh). At version ``v`` its weights are the
  seed-0 model plus ``v``.
* The engine: the same model in bfloat16, tensor-parallel over all its ranks, as plain local
  tensors or as DTensors (``dtensor``); it receives in place and checks every weight byte for
  byte against the trainer's at that version (cast to bfloat16), and that no parameter moved.

``fused``: a Llama-style model (``LLAMA``) into fused and stacked engine tensors through
``mapping=meshcast.llama_mapping(...)``.

Run by tests/test_weight_sync_jobs.py through ``meshcast.launch`` (loopback) and by
tests/test_cluster_weight_sync.py under the real ``torchrun`` on emulated hosts::

    python weight_sync_jobs.py trainer|engine ADDRESS OUT_DIR JSON_OPTIONS

(``JSON_OPTIONS`` with ``"cases"``: the fused and FP8 cases of 2-rank jobs, one after another.)
"""

from __future__ import annotations

import json
import os
import sys
import time

import meshcast as mc

MODEL = "gpt-test-4l-32"
VERSIONS_ENV = "WEIGHT_SYNC_TEST"


def _config():
    from meshcast.models.gpt import GPTConfig

    return GPTConfig(vocab_size=96, block_size=16, n_layer=4, n_head=4, n_embd=32)


def weights(version: int) -> dict:
    """The trainer's full weights at ``version`` (float32)."""
    from meshcast.models.gpt import GPT

    return {k: v.detach() + version for k, v in GPT(_config(), seed=0).state_dict().items()}


def trainer_layouts() -> dict[str, mc.Layout]:
    """Each parameter's layout on the trainer (2 stages x TP2 over ranks 0-3)."""
    from meshcast.interop.weights import gpt_stage_of
    from meshcast.models.gpt import split_layers

    stages = [mc.Mesh([0, 1]), mc.Mesh([2, 3])]
    return {k: tp_layout(k, stages[gpt_stage_of(k, split_layers(4, 2))]) for k in weights(0)}


def tp_layout(name: str, mesh: mc.Mesh) -> mc.Layout:
    """Megatron-style tensor parallelism, every shard one box (``attn.c_attn`` cut in rows)."""
    from meshcast.interop.weights import tensor_parallel_layout

    if "attn.c_attn" in name:
        return mc.Layout(mesh, [mc.Shard(0)])
    return tensor_parallel_layout(name, mesh)


def _as_dtensors(shards: dict, layouts: dict) -> dict:
    """This stage rank's shards as DTensors on the ``tp`` sub-mesh of a (pp=2, tp=2) mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))["tp"]
    out = {}
    for n, shard in shards.items():
        p = layouts[n].placements[0]
        place = Shard(p.dim) if isinstance(p, mc.Shard) else Replicate()
        out[n] = DTensor.from_local(shard, tp, [place], run_check=False)
    return out


def run_trainer(rank: int, address: str, versions: list[int], die: list | None = None,
                timeout: float = 60.0, dtensor: bool = False) -> list[int]:
    """Connect, build the sync, push ``versions``; ``die = [rank, version, k]``: that rank exits
    (status 17) while converting its k-th tensor of that version, i.e. in the middle of the
    push. ``dtensor``: describe and push DTensors on the tensor-parallel sub-mesh of the stage."""
    layouts = trainer_layouts()
    shapes = {k: tuple(v.shape) for k, v in weights(0).items()}
    mine = {n: lay for n, lay in layouts.items() if lay.box(rank, shapes[n]) is not None}

    def shards(version: int) -> dict:
        full = weights(version)
        local = {n: full[n][lay.box(rank, shapes[n])] for n, lay in mine.items()}
        return _as_dtensors(local, mine) if dtensor else local

    desc = shards(0) if dtensor else {n: mc.ParamSpec(shapes[n], "float32", lay)
                                      for n, lay in mine.items()}
    state = {"version": None, "count": 0}

    def convert(name, shard, dtype):
        state["count"] += 1
        if die and rank == die[0] and state["version"] == die[1] and state["count"] == die[2]:
            os._exit(17)
        return shard.to(dtype)

    group = mc.connect(address, "trainer", model=MODEL, timeout=timeout)
    sync = mc.WeightSync(group, desc, convert=convert, bucket_bytes=16 << 10)
    pushed = []
    for v in versions:
        state["version"], state["count"] = v, 0
        sync.push(shards(v), version=v)
        pushed.append(v)
    mc.disconnect(group)
    return pushed


def _engine_params(rank: int, world: int, dtensor: bool) -> tuple[dict, dict, dict]:
    """(description, parameters, layouts) of an engine rank: TP over all ``world`` ranks."""
    import torch

    shapes = {k: tuple(v.shape) for k, v in weights(0).items()}
    layouts = {n: tp_layout(n, mc.Mesh(list(range(world)))) for n in shapes}
    local = {n: torch.zeros(layouts[n].shard_shape(rank, shapes[n]), dtype=torch.bfloat16)
             for n in shapes}
    if not dtensor:
        desc = {n: mc.ParamSpec(shapes[n], "bfloat16", layouts[n]) for n in shapes}
        return desc, local, layouts
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (world,))
    params = {}
    for n, lay in layouts.items():
        p = lay.placements[0]
        place = Shard(p.dim) if isinstance(p, mc.Shard) else Replicate()
        params[n] = DTensor.from_local(local[n], mesh, [place], run_check=False)
    return params, params, layouts


def run_engine(rank: int, address: str, sessions: int, versions: int, world: int,
               dtensor: bool = False, timeout: float = 60.0) -> dict:
    """Receive ``versions`` syncs over up to ``sessions`` connections (a failed sync: check the
    parameters kept the last version, then connect again); report what happened."""
    import torch

    desc, params, layouts = _engine_params(rank, world, dtensor)
    local = {n: p.to_local() if hasattr(p, "to_local") else p for n, p in params.items()}
    ptrs = {n: t.data_ptr() for n, t in local.items()}
    report: dict = {"received": [], "errors": [], "exact": [], "kept": [], "same_storage": True}
    last = None
    for _ in range(sessions):
        group = mc.connect(address, "engine", model=MODEL, timeout=timeout)
        sync = mc.WeightSync(group, desc, bucket_bytes=16 << 10, version=last)
        while len(report["received"]) < versions:
            started = time.monotonic()
            try:
                got = sync.receive(params)
            except mc.WeightSyncError as exc:
                report["errors"].append([str(exc), round(time.monotonic() - started, 2)])
                report["kept"].append(_exact(local, layouts, rank, last))
                break
            last = got.version
            report["received"].append(got.version)
            report["exact"].append(_exact(local, layouts, rank, got.version))
            report["staging_bytes"] = got.staging_bytes
            report["peak_bucket"] = max(report.get("peak_bucket", 0), got.peak_bucket_bytes)
        else:
            mc.disconnect(group)
            break
    report["same_storage"] = all(t.data_ptr() == ptrs[n] for n, t in local.items())
    report["param_bytes"] = sum(t.numel() * t.element_size() for t in local.values())
    report["version"] = last
    assert torch.is_tensor(next(iter(local.values())))
    return report


def _exact(local: dict, layouts: dict, rank: int, version: int | None) -> bool:
    import torch

    full = weights(version)
    return all(torch.equal(t, full[n][layouts[n].box(rank, full[n].shape)].to(torch.bfloat16))
               for n, t in local.items())


def mismatched(rank: int, address: str, role: str, model: str) -> list[str]:
    """One rank per job: a model mismatch at connect, then a second connect whose parameter
    descriptions disagree (names and a shape); the errors each side sees."""
    import torch

    errors = []
    try:
        mc.connect(address, role, model=model, timeout=60)
    except ValueError as exc:
        errors.append(str(exc))
    group = mc.connect(address, role, model="same", timeout=60)
    one = mc.Layout(mc.Mesh([0]), "RR")
    if role == "trainer":
        desc = {"a": mc.ParamSpec((4, 4), torch.float32, one),
                "b": mc.ParamSpec((4, 4), torch.float32, one),
                "c": mc.ParamSpec((4, 2), torch.float32, one)}
    else:
        desc = {"a": mc.ParamSpec((4, 4), torch.bfloat16, one),
                "c": mc.ParamSpec((4, 4), torch.bfloat16, one),
                "d": mc.ParamSpec((4, 4), torch.bfloat16, one)}
    try:
        mc.WeightSync(group, desc)
    except ValueError as exc:
        errors.append(str(exc))
    # then a good one: fresh tensors, and in place without staging (atomic=False)
    full = torch.arange(16, dtype=torch.float32).view(4, 4) / 8
    dtype = torch.float32 if role == "trainer" else torch.bfloat16
    sync = mc.WeightSync(group, {"a": mc.ParamSpec((4, 4), dtype, one)}, atomic=False)
    if role == "trainer":
        sync.push({"a": full}, version=7)
        sync.push({"a": full + 1}, version=8)
    else:
        fresh = sync.receive()
        errors.append([fresh.version, torch.equal(fresh.tensors["a"], full.to(dtype))])
        mine = torch.zeros(4, 4, dtype=dtype)
        got = sync.receive({"a": mine})
        errors.append([got.version, torch.equal(mine, (full + 1).to(dtype)),
                       got.tensors["a"] is mine, got.staging_bytes])
    mc.disconnect(group)
    return errors


# A Llama-style model into a vLLM-style engine: fused QKV (grouped-query attention: 4 query
# heads, 2 key/value heads), fused gate_up, and a MoE layer whose 2 experts are stacked (w13 a
# Stack of Fuse, w2 a Stack). Trainer: 2 ranks, every matrix cut in columns, expert e on rank e;
# engine: 2 ranks, tensor parallel (heads of q, k and v cut separately), w2 expert parallel.
LLAMA = {"layers": 2, "hidden": 8, "head": 2, "heads": 4, "kv": 2, "ffn": 12, "vocab": 16,
         "experts": 2}


def llama_specs(role: str) -> dict:
    """``{name: ParamSpec}`` of the Llama-style model on ``role``'s 2 ranks."""
    d = LLAMA
    h, ffn, e, two = d["hidden"], d["ffn"], d["experts"], mc.Mesh([0, 1])
    q, kv = d["heads"] * d["head"], d["kv"] * d["head"]
    trainer = role == "trainer"
    dtype = "float32" if trainer else "bfloat16"

    def spec(shape: tuple, layout: str, mesh: mc.Mesh = two) -> mc.ParamSpec:
        lay = mc.Layout(mesh, [mc.Replicate()] if layout == "R" else layout)
        return mc.ParamSpec(shape, dtype, lay)

    col, row = ("RS0", "RS0") if trainer else ("S0R", "RS0")
    out = {"model.embed_tokens.weight": spec((d["vocab"], h), col)}
    for i in range(d["layers"]):
        p = f"model.layers.{i}"
        a, m = f"{p}.self_attn", f"{p}.mlp"
        out[f"{p}.input_layernorm.weight"] = spec((h,), "R")
        if trainer:
            out.update({f"{a}.{x}_proj.weight": spec((n, h), col)
                        for x, n in (("q", q), ("k", kv), ("v", kv))})
        else:
            qkv = f"{{q={q}:S0+k={kv}:S0+v={kv}:S0}}R"
            out[f"{a}.qkv_proj.weight"] = spec((q + 2 * kv, h), qkv)
        out[f"{a}.o_proj.weight"] = spec((h, q), row)
        out[f"{p}.post_attention_layernorm.weight"] = spec((h,), "R")
        if i == 0 and trainer:
            out.update({f"{m}.{x}_proj.weight": spec((ffn, h), col) for x in ("gate", "up")})
        elif i == 0:
            out[f"{m}.gate_up_proj.weight"] = spec((2 * ffn, h), f"{{gate={ffn}:S0+up={ffn}:S0}}R")
        if i == 0:
            out[f"{m}.down_proj.weight"] = spec((h, ffn), row)
            continue
        out[f"{m}.gate.weight"] = spec((e, h), "R")
        if trainer:
            for x in range(e):
                one = mc.Mesh([x])
                out.update({f"{m}.experts.{x}.{y}_proj.weight": spec((ffn, h), "RR", one)
                            for y in ("gate", "up")})
                out[f"{m}.experts.{x}.down_proj.weight"] = spec((h, ffn), "RR", one)
        else:
            out[f"{m}.experts.w13_weight"] = spec((e, 2 * ffn, h),
                                                  f"R{{gate={ffn}:S0+up={ffn}:S0}}R")
            out[f"{m}.experts.w2_weight"] = spec((e, h, ffn), "S0RR")
    out["model.norm.weight"] = spec((h,), "R")
    out["lm_head.weight"] = spec((d["vocab"], h), col)
    return out


def llama_full(name: str, shape: tuple, version: int):
    """Trainer tensor ``name`` at ``version`` (float32, distinct values)."""
    import numpy as np

    seed = sum(map(ord, name))
    n = int(np.prod(shape))
    return (((np.arange(n) * 7 + seed) % 1009) / 8 + version).astype(np.float32).reshape(shape)


def llama_engine_full(name: str, version: int):
    """Engine tensor ``name`` at ``version``, assembled by hand from the trainer's (float32)."""
    import numpy as np

    trainer, rule = llama_specs("trainer"), mc.llama_mapping(2, num_experts=2, moe_layers=[1])
    rule = rule[name]

    def build(r):
        if isinstance(r, str):
            return llama_full(r, tuple(trainer[r].shape), version)
        if isinstance(r, mc.Fuse):
            return np.concatenate([build(t) for _, t in r.parts], r.dim)
        return np.stack([build(item) for item in r.items], r.dim)

    return build(rule)


def llama_shards(specs: dict, rank: int, version: int) -> dict:
    """Trainer rank ``rank``'s shards of the Llama-style model at ``version``."""
    import torch

    return {n: torch.from_numpy(mc.scatter(llama_full(n, tuple(s.shape), version),
                                           s.layout)[rank])
            for n, s in specs.items() if s.layout.region(rank, s.shape) is not None}


def fused(rank: int, address: str, role: str, versions: list[int]) -> dict:
    """One side of the fused sync: a mapping that leaves out ``lm_head`` (one error on both
    sides), then ``llama_mapping``: the trainer pushes ``versions``; the engine receives them
    in place (the last into fresh tensors) and checks every byte; the report."""
    mapping = mc.llama_mapping(2, num_experts=2, moe_layers=[1])
    specs = llama_specs(role)
    group = mc.connect(address, role, model="llama-test", timeout=60)
    report: dict = {"errors": [], "exact": [], "received": []}
    try:
        mc.WeightSync(group, specs, mapping={k: v for k, v in mapping.items() if "lm_" not in k})
    except ValueError as exc:
        report["errors"].append(str(exc))
    sync = mc.WeightSync(group, specs, mapping=mapping, bucket_bytes=4 << 10)
    report["routes"] = len(sync.routes)
    if role == "trainer":
        for v in versions:
            report["received"].append(sync.push(llama_shards(specs, rank, v), version=v).version)
    else:
        report.update(receive_versions(sync, specs, rank, versions,
                                       lambda got, v: _bytes_equal(got, specs, rank, v)))
    mc.disconnect(group)
    return report


def receive_versions(sync, specs: dict, rank: int, versions: list[int], exact) -> dict:
    """An engine rank of the fused and FP8 cases: receive ``versions`` into zeroed parameters in
    place (the last into fresh tensors), each checked by ``exact(tensors, version)``; the
    report's engine entries."""
    import torch

    local = {n: torch.zeros(s.layout.shard_shape(rank, tuple(s.shape)),
                            dtype=getattr(torch, s.dtype) if isinstance(s.dtype, str) else s.dtype)
             for n, s in specs.items()}
    ptrs = {n: t.data_ptr() for n, t in local.items()}
    report: dict = {"received": [], "exact": []}
    for k, _ in enumerate(versions):
        got = sync.receive(None if k == len(versions) - 1 else local)
        report["received"].append(got.version)
        report["exact"].append(exact(got.tensors, got.version))
    report["same_storage"] = all(t.data_ptr() == ptrs[n] for n, t in local.items())
    report["in_place"] = exact(local, versions[-2])
    return report


def check_fused(trainer: list[dict], engine: list[dict], versions: list[int]) -> None:
    """What :func:`fused` must report on every rank of both jobs."""
    missing = ("the trainer's and the engine's parameters do not match: the mapping does not "
               "fit (2 problems):\n  engine tensors the mapping does not fill: 'lm_head.weight'"
               "\n  trainer tensors the mapping does not use: 'lm_head.weight'")
    for report in trainer + engine:
        assert report["errors"] == [missing]  # the same error on every rank of both jobs
        assert report["received"] == versions
        assert report["routes"] == len(llama_specs("trainer")) == 25  # one per piece
    for report in engine:
        assert report["exact"] == [True] * len(versions)  # byte for byte; the last: fresh
        assert report["in_place"] and report["same_storage"]  # the one before, in place


def _bytes_equal(tensors: dict, specs: dict, rank: int, version: int) -> bool:
    import numpy as np
    import torch

    def bits(a) -> np.ndarray:
        return torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy()

    return sorted(tensors) == sorted(specs) and all(
        np.array_equal(tensors[n].view(torch.int16).numpy(),
                       bits(mc.scatter(llama_engine_full(n, version), s.layout)[rank]))
        for n, s in specs.items())


def alone(rank: int, address: str, role: str) -> str:
    """Connect with nobody on the other side (3 s): the error."""
    try:
        mc.connect(address, role, timeout=3.0)
    except mc.ReshardError as exc:
        return str(exc)
    return "connected"


def _cases(rank: int, address: str, role: str, cases: list[str], versions: list[int]) -> dict:
    """The 2-rank cases one after another, each its own connection: ``fused`` (above) and
    ``fp8`` (weight_sync_fp8_job.py)."""
    import weight_sync_fp8_job

    run = {"fused": fused, "fp8": weight_sync_fp8_job.run}
    return {case: run[case](rank, address, role, versions) for case in cases}


def main(argv: list[str]) -> int:
    """``trainer|engine ADDRESS OUT_DIR JSON_OPTIONS`` under torchrun: write
    ``OUT_DIR/<role><incarnation>-rank<R>.json``."""
    import torch.distributed as dist

    role, address, out, options = argv[0], argv[1], argv[2], json.loads(argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tag = options.pop("tag", role)
    try:
        if "cases" in options:  # {"cases": ["fused", "fp8"], "versions": [...]}: one by one
            result: object = _cases(rank, address, role, options["cases"], options["versions"])
        elif role == "trainer":
            result = run_trainer(rank, address, **options)
        else:
            result = run_engine(rank, address, world=dist.get_world_size(), **options)
        with open(os.path.join(out, f"{tag}-rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def misuse(rank: int, address: str, role: str) -> list[str]:
    """Two ranks per job: name maps that differ between trainer ranks (they would feed the engine
    tensors from swapped trainer tensors), a layout over ranks the job does not have, then a
    push of a wrong shape, a wrong dtype and not a mapping (each refused on every rank of both
    jobs, nothing sent), and a good push; then two syncs used in another order by the engine
    (refused) and in the same order; the errors each rank sees, and whether the engine's good
    syncs were exact."""
    import torch

    group = mc.connect(address, role, model="misuse", timeout=60)
    two = mc.Layout(mc.Mesh([0, 1]), "S0R")
    desc = {n: mc.ParamSpec((4, 6), torch.float32, two) for n in ("a", "b")}
    seen = []
    swap = {"a": "b", "b": "a"} if role == "trainer" and rank == 1 else {"a": "a", "b": "b"}
    for kwargs, params in (({"name_map": swap}, desc),
                           ({}, {**desc, "a": mc.ParamSpec((6, 6), torch.float32,
                                                           mc.Layout(mc.Mesh([0, 1, 2]), "S0R"))})):
        try:
            mc.WeightSync(group, params, **kwargs)
            seen.append("no error")
        except ValueError as exc:
            seen.append(str(exc))
    sync = mc.WeightSync(group, desc)
    full = {n: torch.arange(24, dtype=torch.float32).view(4, 6) + k for k, n in enumerate("ab")}
    mine = {n: t[2 * rank: 2 * rank + 2] for n, t in full.items()}
    bad = [{**mine, "a": mine["a"][:, :3]}, {**mine, "a": mine["a"].double()}, list(mine)]
    for version, params in enumerate(bad, start=1):
        try:
            if role == "trainer":
                sync.push(params if rank == 1 else mine, version=version)
            else:
                sync.receive()
            seen.append("no error")
        except ValueError as exc:
            seen.append(str(exc))
    if role == "trainer":
        sync.push(mine, version=9)
    else:
        got = sync.receive()
        seen.append(all(torch.equal(got.tensors[n], mine[n]) for n in "ab"))
    # two syncs of tensors alike, used in another order by the engine: refused on every rank
    # (their plans agree, their names and syncs do not), then used in the same order, exact
    one = {n: mc.WeightSync(group, {n: desc[n]}) for n in "ab"}
    for n in ("ab" if role == "trainer" else "ba"):
        try:
            if role == "trainer":
                one[n].push({n: mine[n]}, version=10)
            else:
                one[n].receive()
            seen.append("no error")
        except ValueError as exc:
            seen.append(str(exc))
    if role == "trainer":
        one["a"].push({"a": mine["a"] + 1}, version=11)
    else:
        seen.append(torch.equal(one["a"].receive().tensors["a"], mine["a"] + 1))
    return seen + _more_misuse(group, rank, role, desc, full, sync)


def _more_misuse(group: object, rank: int, role: str, desc: dict, full: dict,
                 sync: object) -> list[str]:
    """Engine results that share memory (staged by ``atomic``, the last copy would win), a
    trainer DTensor laid out otherwise than described (its local shard has the declared shape),
    and a name map that raises on one trainer rank: each refused on every rank of both jobs."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mine = {n: t[2 * rank: 2 * rank + 2] for n, t in full.items()}
    flipped = DeviceMesh("cpu", [1, 0])  # rank 0 holds rows 2-3: the shape described, not rows
    seen = []
    shared = torch.zeros(2, 6)
    for version, (params, into) in enumerate((
            (mine, {"a": shared, "b": shared}),
            ({**mine, "a": distribute_tensor(full["a"], flipped, [Shard(0)])}, None)), start=12):
        try:
            if role == "trainer":
                sync.push(params, version=version)
            else:
                sync.receive(into)
            seen.append("no error")
        except ValueError as exc:
            seen.append(str(exc))
    try:
        mc.WeightSync(group, desc, name_map=lambda n: {"a": "a"}[n] if role == "trainer"
                      and rank == 0 else n)
        seen.append("no error")
    except ValueError as exc:
        seen.append(str(exc))
    return seen


def store_holder_exits_after_push(rank: int, address: str, role: str) -> object:
    """Trainer rank 0, which holds the rendezvous store, exits the moment its push returns: the
    sync had succeeded on every rank of both jobs, so every engine rank commits it (none may
    find the store gone while it still reads the success)."""
    import os

    import torch

    shape = (64, 64)
    layout = mc.Layout(mc.Mesh([0, 1]), "S0R")
    group = mc.connect(address, role, model="holder", timeout=60)
    sync = mc.WeightSync(group, {"w": mc.ParamSpec(shape, torch.float32, layout)}, timeout=60)
    if role == "trainer":
        sync.push({"w": torch.full(layout.shard_shape(rank, shape), 1.0)}, version=1)
        if rank == 0:
            os._exit(3)
        return "pushed"
    w = torch.zeros(layout.shard_shape(rank, shape))
    try:
        got = sync.receive({"w": w})
        return got.version, bool((w == 1).all())
    except mc.WeightSyncError as exc:
        return str(exc)


def tied_engine(rank: int, address: str, role: str) -> object:
    """The engine's embedding and output head are one tensor (a tied model's ``state_dict()``),
    both names fed from the trainer's embedding by the mapping: received once, in place, staged
    (version 1) and not (version 2); then engine rank 1 exits as version 3 is pushed, and the
    trainer's ``disconnect`` does not wait for the rank its failed push named."""
    import os
    import warnings

    import torch

    shape, mesh = (16, 8), mc.Mesh([0, 1])
    tied = {"embed": "embed", "head": "embed"}
    group = mc.connect(address, role, model="tied", timeout=60)
    if role == "trainer":
        spec = {"embed": mc.ParamSpec(shape, torch.float32, mc.Layout(mesh, "S0R"))}
        syncs = [mc.WeightSync(group, spec, mapping=tied, atomic=a, timeout=8) for a in (1, 0)]
        local = mc.Layout(mesh, "S0R").shard_shape(rank, shape)
        for v in (1, 2, 3):
            try:
                syncs[v == 2].push({"embed": torch.full(local, float(v))}, version=v)
            except mc.WeightSyncError as exc:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    mc.disconnect(group)
                return [str(exc), [str(w.message) for w in caught]]
        return "pushed"
    layout = mc.Layout(mesh, "RS0")
    spec = {n: mc.ParamSpec(shape, torch.bfloat16, layout) for n in tied}
    syncs = [mc.WeightSync(group, spec, mapping=tied, atomic=a, timeout=8) for a in (1, 0)]
    weight = torch.zeros(layout.shard_shape(rank, shape), dtype=torch.bfloat16)
    for v in (1, 2):
        got = syncs[v == 2].receive({"embed": weight, "head": weight})
        if got.version != v or not (weight == v).all() or got.tensors["head"] is not weight:
            raise AssertionError(f"the tied weight at version {v}: {got.version}, {weight}")
    os._exit(3) if rank == 1 else time.sleep(5)
    return "received"
