"""The standard PyTorch trainer -> inference weight sync: a model parallelized with
``parallelize_module`` (tensor parallel) and then ``fully_shard`` (FSDP2) on a 2-D mesh of 4 ranks
has its state dict resharded to a tensor-parallel-4 inference mesh on 4 other ranks, exact.

FSDP2 + TP gives column-parallel weights ``(_StridedShard(dim=0, sf=2), Shard(dim=0))`` and
row-parallel weights ``(Shard(dim=0), Shard(dim=1))``; uneven sizes (18 and 9 rows) give
strided shards of uneven pieces. Real processes over gloo, one job of 8 ranks.
"""

from __future__ import annotations

import pytest
import torch

import meshcast

WORLD = 8


def _model() -> torch.nn.Module:
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(16)
            self.up = nn.Linear(16, 36)
            self.gate = nn.Linear(16, 18, bias=False)  # uneven: 18 rows over tp 2 x dp 2
            self.down = nn.Linear(36, 16)
            self.head = nn.Linear(16, 9, bias=False)  # uneven, column parallel

    torch.manual_seed(0)
    return Block()


COLWISE = ("up", "gate", "head")
ROWWISE = ("down",)


def _inference_placements(name: str) -> list:
    from torch.distributed.tensor import Replicate, Shard

    module, _, kind = name.partition(".")
    if module in COLWISE:
        return [Shard(0)]
    if module in ROWWISE and kind == "weight":
        return [Shard(1)]
    return [Replicate()]


def _job(rank: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    full = {k: v.detach().clone() for k, v in _model().state_dict().items()}
    train = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("dp", "tp"))
    infer = DeviceMesh("cpu", torch.arange(4, 8), mesh_dim_names=("tp",))
    specs: list = [None]
    if rank < 4:
        model = _model()
        plan = {m: ColwiseParallel() for m in COLWISE} | {m: RowwiseParallel() for m in ROWWISE}
        parallelize_module(model, train["tp"], plan)
        fully_shard(model, mesh=train["dp"])
        sd = model.state_dict()
        specs = [{k: (tuple(v.shape), ",".join(v.device_mesh.mesh_dim_names),
                      tuple(v.placements)) for k, v in sd.items()}]
    dist.broadcast_object_list(specs, src=0)
    if rank >= 4:
        # ranks off the trainer mesh hold (empty) DTensor objects, as in SPMD; FSDP2 puts the
        # parameters TP leaves out on the "dp" sub-mesh, which meshcast reads on the root mesh
        # (replicated over "tp"), so the same layout is written there
        sd = {k: distribute_tensor(torch.zeros(shape), train,
                                   list(pl) if mesh == "dp,tp" else [pl[0], Replicate()])
              for k, (shape, mesh, pl) in specs[0].items()}
    layouts = {k: (infer, _inference_placements(k)) for k in sd}
    out = meshcast.reshard_state_dict(sd, layouts)
    report = {"placements": {k: str(pl) for k, (_, _, pl) in specs[0].items()}, "wrong": []}
    if rank >= 4:
        for k, dt in out.items():
            want = distribute_tensor(full[k], infer, _inference_placements(k))
            if not (isinstance(dt, DTensor) and tuple(dt.placements) == tuple(want.placements)
                    and torch.equal(dt.to_local(), want.to_local())
                    and torch.equal(dt.full_tensor(), full[k])):
                report["wrong"].append(k)
        report["names"] = sorted(out)
    return report


@pytest.fixture(scope="module")
def job() -> list[dict]:
    return meshcast.launch(_job, WORLD, hosts=2, timeout=600)


def test_fsdp2_tp_state_dict_reshards_to_tp4_exactly(job: list[dict]) -> None:
    placements = job[0]["placements"]
    assert placements["up.weight"] == "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    assert placements["down.weight"] == "(Shard(dim=0), Shard(dim=1))"
    for rank in range(4, WORLD):
        assert job[rank]["wrong"] == []
        assert job[rank]["names"] == sorted(placements)
