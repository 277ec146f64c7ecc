"""Tensor-parallel layers: shards against the full layer in one process, and a 2-rank gloo run."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from meshcast.models.gpt import Block, GPTConfig, TensorParallelBlock  # noqa: E402
from meshcast.parallel.tensor_parallel import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    reference_linear,
)


def _x(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _integer_valued(layer: torch.nn.Linear, seed: int) -> torch.nn.Linear:
    """Small integers in float32: every sum is exact whatever order a matmul kernel adds in."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.weight.copy_(torch.randint(-3, 4, layer.weight.shape, generator=g).float())
        layer.bias.copy_(torch.randint(-3, 4, layer.bias.shape, generator=g).float())
    return layer


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_column_parallel_shards_concatenate_to_the_full_output(tp_size: int) -> None:
    full = reference_linear(24, 16, seed=3)
    x = _x(5, 7, 24)
    for build in ("seed", "from_full"):
        shards = [
            ColumnParallelLinear(24, 16, r, tp_size, seed=3) if build == "seed"
            else ColumnParallelLinear.from_full(full, r, tp_size)
            for r in range(tp_size)
        ]
        assert torch.equal(torch.cat([s.weight for s in shards]), full.weight)
        assert torch.equal(torch.cat([s.bias for s in shards]), full.bias)
        y = torch.cat([s.local_forward(x) for s in shards], dim=-1)
        # same dot products; CPU BLAS picks kernels by matrix width, so random floats may differ
        # in the last bit (seen: 3.6e-7)
        torch.testing.assert_close(y, full(x), rtol=1e-6, atol=1e-6)
    # bitwise once rounding cannot occur
    full = _integer_valued(reference_linear(24, 16), seed=4)
    xi = torch.randint(-3, 4, (5, 7, 24), generator=torch.Generator().manual_seed(2)).float()
    shards = [ColumnParallelLinear.from_full(full, r, tp_size) for r in range(tp_size)]
    assert torch.equal(torch.cat([s.local_forward(xi) for s in shards], dim=-1), full(xi))
    if tp_size == 1:  # no group needed: forward never communicates
        assert torch.equal(shards[0](xi), full(xi))


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_row_parallel_partial_sums_give_the_full_output(tp_size: int) -> None:
    full = reference_linear(24, 16, seed=5)
    x = _x(5, 7, 24)
    for build in ("seed", "from_full"):
        shards = [
            RowParallelLinear(24, 16, r, tp_size, seed=5) if build == "seed"
            else RowParallelLinear.from_full(full, r, tp_size)
            for r in range(tp_size)
        ]
        assert torch.equal(torch.cat([s.weight for s in shards], dim=1), full.weight)
        partial = [s.local_forward(x[..., s.in_range.start : s.in_range.stop]) for s in shards]
        y = torch.stack(partial).sum(0) + shards[0].bias
        torch.testing.assert_close(y, full(x), rtol=1e-5, atol=1e-6)
    full = _integer_valued(reference_linear(24, 16), seed=6)
    xi = torch.randint(-3, 4, (5, 7, 24), generator=torch.Generator().manual_seed(2)).float()
    shards = [RowParallelLinear.from_full(full, r, tp_size) for r in range(tp_size)]
    partial = [s.local_forward(xi[..., s.in_range.start : s.in_range.stop]) for s in shards]
    assert torch.equal(torch.stack(partial).sum(0) + full.bias, full(xi))
    if tp_size == 1:
        assert torch.equal(shards[0](xi), full(xi))


def test_column_then_row_mlp_in_one_process() -> None:
    fc, proj = reference_linear(16, 64, seed=1), reference_linear(64, 16, seed=2)
    x = _x(3, 16)
    want = proj(torch.nn.functional.gelu(fc(x)))
    parts = []
    for r in range(4):
        col = ColumnParallelLinear.from_full(fc, r, 4)
        row = RowParallelLinear.from_full(proj, r, 4)
        parts.append(row.local_forward(torch.nn.functional.gelu(col.local_forward(x))))
    torch.testing.assert_close(torch.stack(parts).sum(0) + proj.bias, want)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="divisible"):
        ColumnParallelLinear(8, 10, 0, 4)
    with pytest.raises(ValueError, match="divisible"):
        RowParallelLinear(10, 8, 0, 4)
    with pytest.raises(ValueError, match="tp_rank"):
        ColumnParallelLinear(8, 8, 2, 2)
    with pytest.raises(ValueError, match="n_head"):
        TensorParallelBlock(GPTConfig(n_head=4), 0, 3)


# -- a real 2-rank run over gloo (CPU) -----------------------------------------------------------
def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        config = GPTConfig(n_embd=32, n_head=4)
        torch.manual_seed(0)
        block = Block(config)  # same weights on every rank: same seed
        tp = TensorParallelBlock.from_block(block, config, rank, world)
        x = _x(2, 8, 32).requires_grad_()
        y = tp(x)
        y.square().sum().backward()
        # column/row layers with gather_output / unsplit input
        fc, proj = reference_linear(32, 64, seed=1), reference_linear(64, 32, seed=2)
        col = ColumnParallelLinear.from_full(fc, rank, world, gather_output=True)
        row = RowParallelLinear.from_full(proj, rank, world, input_is_parallel=False)
        z = row(col(x.detach()))
        torch.save(
            {"y": y.detach(), "x_grad": x.grad, "z": z.detach(), "fc_grad": tp.c_fc.weight.grad,
             "fc_rows": (tp.c_fc.out_range.start, tp.c_fc.out_range.stop)},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_block_on_two_gloo_ranks_matches_the_full_block(tmp_path) -> None:
    world = 2
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world)
    config = GPTConfig(n_embd=32, n_head=4)
    torch.manual_seed(0)
    block = Block(config)
    x = _x(2, 8, 32).requires_grad_()
    y = block(x)
    y.square().sum().backward()
    fc, proj = reference_linear(32, 64, seed=1), reference_linear(64, 32, seed=2)
    z = proj(fc(x.detach()))
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(got["y"], y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["x_grad"], x.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["z"], z, rtol=1e-5, atol=1e-5)
        rows = got["fc_rows"]
        torch.testing.assert_close(
            got["fc_grad"], block.mlp.c_fc.weight.grad[rows[0] : rows[1]],
            rtol=1e-5, atol=1e-5,
        )
