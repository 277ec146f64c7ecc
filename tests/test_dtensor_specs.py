"""DTensor specs read whole: shard order, _StridedShard, Partial destinations, sub-meshes.

Real gloo processes (``meshcast.launch``). Sources with a non-default ``DTensorSpec.shard_order``
are made by DTensor itself (``redistribute_local_tensor`` from a replica to the ordered spec) and
checked to be self-consistent (``full_tensor()``). On every rank: meshcast's reading of the
source holds exactly DTensor's ``to_local()``, and every destination shard of
``reshard_dtensor`` equals DTensor's own ``distribute_tensor(glob, dst, placements).to_local()``
byte for byte, with ``full_tensor()`` equal to the global tensor (on meshes of ascending ranks:
on others DTensor's own ``full_tensor()`` is wrong in torch 2.13). ``_StridedShard`` of any split
factor, even or uneven, reshards exactly in both directions (a shard of several boxes); a
Partial destination holds what DTensor's ``redistribute`` makes from the replicated value.
Sub-meshes (``init_device_mesh(...)["tp"]``, flattened dims)
are read identically on every rank, as source and as destination, uneven sizes included.
"""

from __future__ import annotations

import pytest

import meshcast as mc

pytest.importorskip("torch.distributed.tensor")


def _bytes(t) -> bytes:
    import torch

    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _ascending(device_mesh) -> bool:
    """Whether the mesh's ranks ascend: elsewhere DTensor's own ``full_tensor()`` is wrong in
    torch 2.13 (its all-gather puts the pieces of a mesh like [3, 1, 0, 2] in rank order)."""
    ranks = device_mesh.mesh.reshape(-1).tolist()
    return ranks == sorted(ranks)


def _ordered(glob, mesh, placements, order):
    """A DTensor of ``glob`` with ``placements`` in shard ``order`` ({tensor dim: mesh dims}),
    its local shards computed by DTensor's own redistribution."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta
    from torch.distributed.tensor._redistribute import redistribute_local_tensor

    rep = distribute_tensor(glob, mesh, [Replicate()] * mesh.ndim, src_data_rank=None)
    meta = TensorMeta(glob.shape, glob.stride(), glob.dtype)
    entries = tuple(ShardOrderEntry(d, tuple(m)) for d, m in sorted(order.items()))
    spec = DTensorSpec(mesh, tuple(placements), tensor_meta=meta, shard_order=entries)
    local = redistribute_local_tensor(rep.to_local(), rep._spec, spec)
    return DTensor(local, spec, requires_grad=False)


class _Checker:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []

    def source(self, dt, glob, what: str, full_tensor: bool = True) -> None:
        """meshcast's reading of ``dt`` holds exactly DTensor's local shard on this rank (and
        DTensor's own ``full_tensor()`` is the tensor, unless ``full_tensor`` is False)."""
        if dt.device_mesh.get_coordinate() is None:
            return
        if full_tensor and _ascending(dt.device_mesh) and \
                _bytes(dt.full_tensor()) != _bytes(glob):
            self.failures.append(f"{what}: DTensor's own full_tensor() is not the tensor")
        layout = mc.layout_from_dtensor(dt)
        region = layout.region(self.rank, tuple(glob.shape))
        mine = mc.scatter(glob.numpy(), layout)[self.rank]
        if region is None or mine.tobytes() != _bytes(dt.to_local()) or \
                mine.shape != tuple(dt.to_local().shape):
            self.failures.append(f"{what}: rank {self.rank}: meshcast reads {region}, which "
                                 f"is not DTensor's to_local()")

    def result(self, res, glob, dst, placements, what: str) -> None:
        from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

        # DTensor's own shards, cut on each rank (its scatter from rank 0 mis-sends on a mesh whose
        # ranks are not ascending: [3, 1, 0, 2] gives rank 3 zeros in torch 2.13); a Partial
        # destination as DTensor's redistribute makes it from the replicated value
        partial = [p.is_partial() for p in placements]
        held = [Replicate() if q else p for p, q in zip(placements, partial)]
        want = distribute_tensor(glob, dst, held, src_data_rank=None)
        if any(partial) and dst.get_coordinate() is not None:  # as DTensor's own tests do it
            from torch.distributed.tensor._redistribute import redistribute_local_tensor

            spec = type(want._spec)(dst, tuple(placements), tensor_meta=want._spec.tensor_meta)
            want = DTensor(redistribute_local_tensor(want.to_local(), want._spec, spec), spec,
                           requires_grad=False)
        if dst.get_coordinate() is None:
            if res is not None:
                self.failures.append(f"{what}: rank {self.rank} is outside dst, got {res!r}")
            return
        if not isinstance(res, DTensor):
            self.failures.append(f"{what}: rank {self.rank} got {type(res).__name__}")
            return
        local = res.to_local()
        if local.shape != want.to_local().shape or _bytes(local) != _bytes(want.to_local()):
            self.failures.append(f"{what}: rank {self.rank}: local shard differs from DTensor's")
        if tuple(res.placements) != tuple(placements):
            self.failures.append(f"{what}: rank {self.rank}: placements {res.placements}")
        if _ascending(dst) and not any(partial) and _bytes(res.full_tensor()) != _bytes(glob):
            self.failures.append(f"{what}: rank {self.rank}: full_tensor() differs")

    def refused(self, fn, needles: tuple[str, ...], what: str) -> None:
        try:
            fn()
        except ValueError as exc:
            if not all(n in str(exc) for n in needles):
                self.failures.append(f"{what}: unclear error {exc}")
        else:
            self.failures.append(f"{what}: no error on rank {self.rank}")


def _shard_order_job(rank: int) -> list[str]:
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    check = _Checker(rank)
    mesh = DeviceMesh("cpu", [[0, 1], [2, 3]])
    dsts = [
        (mesh, [Shard(0), Replicate()]),
        (DeviceMesh("cpu", [0, 1, 2, 3]), [Shard(0)]),
        (DeviceMesh("cpu", [3, 1, 0, 2]), [Shard(1)]),
        (DeviceMesh("cpu", [[1, 0], [3, 2]]), [Shard(0), Shard(0)]),
        (DeviceMesh("cpu", [2, 3]), [Replicate()]),
    ]
    cases = [
        ((5, 3), [Shard(0), Shard(0)], {0: (1, 0)}),
        ((7, 4), [Shard(0), Shard(0)], {0: (1, 0)}),
        ((3, 5), [Shard(1), Shard(1)], {1: (1, 0)}),
        ((2, 11), [Shard(1), Shard(1)], {1: (1, 0)}),
        ((6, 5), [Shard(0), Shard(0)], {0: (0, 1)}),  # the default order, given explicitly
        ((5, 6), [Shard(1), Shard(0)], {0: (1,), 1: (0,)}),
    ]
    for k, (shape, placements, order) in enumerate(cases):
        glob = (torch.arange(shape[0] * shape[1], dtype=torch.int32).reshape(shape) * 7 + k)
        dt = _ordered(glob, mesh, placements, order)
        what = f"{shape} {placements} order {order}"
        check.source(dt, glob, what)
        if order == {0: (1, 0)} and str(mc.layout_from_dtensor(dt)) != \
                "Layout(Mesh.from_range(0, (2, 2)), 'S10R')":
            check.failures.append(f"{what}: read as {mc.layout_from_dtensor(dt)!r}")
        for j, (dst, dp) in enumerate(dsts):
            res = mc.reshard_dtensor(dt, dst, dp, timeout=60,
                                     **({} if j % 2 else {"strategy": "send_recv"}))
            check.result(res, glob, dst, dp, f"{what} -> {dst.mesh.tolist()} {dp}")

    glob = torch.arange(35, dtype=torch.float32).reshape(7, 5)
    plain = distribute_tensor(glob, mesh, [Shard(0), Shard(1)], src_data_rank=None)
    strided = distribute_tensor(glob, mesh, [_StridedShard(0, split_factor=2), Shard(0)],
                                src_data_rank=None)
    check.source(strided, glob, "_StridedShard(sf=2), Shard(0)")
    res = mc.reshard_dtensor(strided, dsts[1][0], [Shard(0)], timeout=60)
    check.result(res, glob, dsts[1][0], [Shard(0)], "_StridedShard(sf=2) -> 1-D")
    one = DTensor.from_local(plain.to_local(), mesh, [_StridedShard(0, split_factor=1),
                                                      Shard(1)],
                             run_check=False, shape=glob.shape, stride=glob.stride())
    check.source(one, glob, "_StridedShard(sf=1)")
    res = mc.reshard_dtensor(one, dsts[1][0], [Shard(1)], timeout=60)
    check.result(res, glob, dsts[1][0], [Shard(1)], "_StridedShard(sf=1) -> 1-D")
    _views(check, mesh, dsts)
    _partial_edges(check, mesh, dsts)
    return check.failures


def _partial_edges(check: _Checker, mesh, dsts) -> None:
    """A Partial source split by a _StridedShard, reduce-scattered; an integer Partial(sum)
    destination on a mesh dimension of one rank (kept integer, as DTensor keeps it); Partial
    destinations DTensor cannot make, refused before anything moves; a strategy alone; a Partial
    source that cannot be reduced, refused on every rank."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    glob = torch.arange(56, dtype=torch.int64).reshape(8, 7)
    spec = [Replicate(), _StridedShard(0, split_factor=2)]
    local = distribute_tensor(glob, mesh, spec, src_data_rank=None).to_local()
    if mesh.get_coordinate()[0] == 1:
        local = torch.zeros_like(local)  # the Partial sum over mesh dim 0 is glob
    dt = DTensor.from_local(local, mesh, [Partial("sum"), spec[1]], run_check=False,
                            shape=glob.shape, stride=glob.stride())
    for how in ("reduce_scatter", "all_reduce"):
        res = mc.reshard_dtensor(dt, dsts[1][0], [Shard(0)], reduce_partial=how, timeout=60)
        check.result(res, glob, dsts[1][0], [Shard(0)], f"[Partial, _StridedShard] {how}")
    tall = DeviceMesh("cpu", [[0], [1]])
    src = distribute_tensor(glob, mesh, [Shard(0), Replicate()], src_data_rank=None)
    res = mc.reshard_dtensor(src, tall, [Shard(1), Partial("sum")], timeout=60)
    check.result(res, glob, tall, [Shard(1), Partial("sum")], "int64 Partial(sum) of one rank")
    if res is not None and res.to_local().dtype != torch.int64:
        check.failures.append(f"int64 Partial(sum) of one rank became {res.to_local().dtype}")
    check.refused(lambda: mc.reshard_dtensor(src, mesh, [Partial("max"), Partial("sum")]),
                  ("mix Partial reduce ops",), "mixed Partial destination")
    eight = distribute_tensor(glob.to(torch.float8_e4m3fn), mesh, [Shard(0), Replicate()],
                              src_data_rank=None)
    check.refused(lambda: mc.reshard_dtensor(eight, mesh, [Replicate(), Partial("sum")]),
                  ("DTensor cannot make it for torch.float8_e4m3fn",), "float8 Partial(sum)")
    res = mc.reshard_dtensor(src, dsts[1][0], [Shard(1)], strategy="allgather", timeout=60)
    check.result(res, glob, dsts[1][0], [Shard(1)], "strategy='allgather' alone")
    # a Partial source its mesh cannot reduce (an average of integers): every rank refuses at
    # once, the destination ranks too (they do not take part in the reduction)
    avg = DTensor.from_local(local, mesh, [Partial("avg"), spec[1]], run_check=False,
                             shape=glob.shape, stride=glob.stride())
    check.refused(lambda: mc.reshard_dtensor(avg, dsts[1][0], [Shard(0)], timeout=60),
                  ("dt ((Partial(avg)", "could not be reduced"), "int64 Partial(avg) source")
    check.refused(lambda: mc.reshard_state_dict({"w": avg}, {"w": (dsts[1][0], [Shard(0)])},
                                                timeout=60),
                  ("state_dict['w']", "could not be reduced"), "the same in a state dict")


def _views(check: _Checker, mesh, dsts) -> None:
    """DTensors that views make (reshape, flatten): real _StridedShard placements with a shard
    order (``use_strided_shard_as_shard_order=False``), read with their split factors."""
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    cases = [((4, 6), [Shard(1), Replicate()], (24,)), ((4, 8), [Shard(1), Shard(1)], (32,)),
             ((4, 8), [Shard(0), Shard(1)], (32,)), ((4, 8), [Shard(1), Shard(0)], (32,)),
             ((2, 4, 6), [Shard(1), Shard(2)], (2, 24))]
    for k, (shape, placements, view) in enumerate(cases):
        glob = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.int32).reshape(shape) + k
        dt = distribute_tensor(glob, mesh, placements, src_data_rank=None).reshape(view)
        what = f"{shape} {placements} viewed as {view} ({dt.placements})"
        check.source(dt, glob.reshape(view), what)
        for dst, dp in (dsts[1], (dsts[4][0], [Replicate()])):
            res = mc.reshard_dtensor(dt, dst, dp, timeout=60)
            check.result(res, glob.reshape(view), dst, dp, f"{what} -> {dst.mesh.tolist()} {dp}")


def _strided_and_partial_job(rank: int) -> list[str]:
    """_StridedShard with split factors 1 to 3, even and uneven, decodable into a shard order
    or not, in both directions; Partial (sum, avg, max, min) destinations."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard as SS

    check = _Checker(rank)
    cube = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2).tolist())
    wide = DeviceMesh("cpu", [[0, 1, 2, 3], [4, 5, 6, 7]])
    line = DeviceMesh("cpu", [4, 5, 6, 7])
    pair = DeviceMesh("cpu", [[6, 7], [2, 3]])
    # (shape, mesh, placements, destination mesh, placements, whether the source's split
    # factors decode into a shard order: where not, torch 2.13's own full_tensor() does not
    # invert its own distribute_tensor, and to_local() is what a rank holds)
    cases = [
        ((16, 6), wide, [SS(0, split_factor=4), Shard(0)], line, [Shard(0)], True),
        ((13, 5), wide, [SS(0, split_factor=2), Replicate()], line, [SS(0, split_factor=3)],
         True),
        ((9, 10), cube, [SS(0, split_factor=2), SS(1, split_factor=3), Shard(0)], pair,
         [Shard(1), SS(0, split_factor=2)], False),
        ((7, 11), cube, [SS(1, split_factor=3), Shard(1), SS(1, split_factor=1)], wide,
         [Shard(1), Shard(0)], False),
        ((12, 4), line, [SS(0, split_factor=2)], cube, [SS(0, split_factor=2), Shard(0),
                                                         Shard(1)], True),
        ((5, 8), pair, [Shard(1), SS(0, split_factor=2)], line, [Partial("sum")], True),
        ((6, 6), wide, [SS(1, split_factor=2), Shard(1)], pair, [Partial("max"), Shard(0)],
         False),
        ((6, 7), line, [Shard(0)], wide, [Partial("avg"), SS(1, split_factor=2)], True),
        ((4, 9), cube, [Replicate(), Shard(1), Shard(0)], line, [Partial("min")], True),
    ]
    for k, (shape, src, sp, dst, dp, decodable) in enumerate(cases):
        glob = torch.arange(shape[0] * shape[1], dtype=torch.float64).reshape(shape) * 3 + k
        dt = distribute_tensor(glob, src, sp, src_data_rank=None)
        what = f"case {k}: {sp} -> {dp}"
        check.source(dt, glob, what, full_tensor=decodable)
        res = mc.reshard_dtensor(dt, dst, dp, timeout=60)
        check.result(res, glob, dst, dp, what)
    # Partial sources, reduced by an all-reduce or a reduce-scatter toward the destination
    glob = torch.arange(7 * 6, dtype=torch.float64).reshape(7, 6)
    base = distribute_tensor(glob, wide, [Replicate(), Shard(1)], src_data_rank=None)
    coord = wide.get_coordinate()
    local = base.to_local() * (coord[0] + 1 if coord is not None else 0)  # sums to 3 * glob
    partial = DTensor.from_local(local, wide, [Partial("sum"), Shard(1)], run_check=False,
                                 shape=glob.shape, stride=glob.stride())
    for how in mc.REDUCTIONS:
        for dst, dp in [(line, [Shard(0)]), (pair, [Replicate(), SS(1, split_factor=2)]),
                        (cube, [Replicate(), Replicate(), Replicate()])]:
            res = mc.reshard_dtensor(partial, dst, dp, timeout=60, reduce_partial=how)
            check.result(res, glob * 3, dst, dp, f"Partial(sum) x Shard(1) {how} -> {dp}")
    check.refused(lambda: mc.reshard_dtensor(dt, line, [Partial("prod")], timeout=30),
                  ("placements[0]", "Partial(prod)", "sum, avg, max, min"), "Partial(prod)")
    return check.failures


def _three_d_job(rank: int) -> list[str]:
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    check = _Checker(rank)
    mesh = DeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2).tolist())
    dsts = [(DeviceMesh("cpu", [7, 6, 5, 4, 3, 2, 1, 0]), [Shard(0)]),
            (DeviceMesh("cpu", [[0, 1, 2, 3], [4, 5, 6, 7]]), [Replicate(), Shard(1)])]
    for k, order in enumerate([(2, 0, 1), (1, 2, 0), (2, 1, 0), (0, 2, 1)]):
        glob = torch.arange(11 * 3, dtype=torch.float64).reshape(11, 3) + k
        dt = _ordered(glob, mesh, [Shard(0)] * 3, {0: order})
        check.source(dt, glob, f"order {order}")
        for dst, dp in dsts:
            res = mc.reshard_dtensor(dt, dst, dp, timeout=60)
            check.result(res, glob, dst, dp, f"order {order} -> {dp}")
    # Partial on mesh dim 0 with dim 1 of the tensor sharded over mesh dims 2 then 1
    glob = torch.arange(5 * 9, dtype=torch.int64).reshape(5, 9)
    ordered = _ordered(glob, mesh, [Replicate(), Shard(1), Shard(1)], {1: (2, 1)})
    coord = mesh.get_coordinate()
    spec = type(ordered._spec)(mesh, (Partial(), Shard(1), Shard(1)),
                               tensor_meta=ordered._spec.tensor_meta,
                               shard_order=ordered._spec.shard_order)
    local = ordered.to_local() + (coord[0] if coord is not None else 0)
    partial = DTensor(local, spec, requires_grad=False)
    for dst, dp in dsts:
        res = mc.reshard_dtensor(partial, dst, dp, timeout=60)
        check.result(res, glob * 2 + 1, dst, dp, f"Partial + order (2, 1) -> {dp}")
    return check.failures


def _sub_mesh_job(rank: int) -> dict:
    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    check = _Checker(rank)
    root = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    cube = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    flat = cube["dp", "tp"]._flatten("dp_tp")
    other = DeviceMesh("cpu", [[7, 6], [5, 4]])
    glob = torch.arange(7 * 6, dtype=torch.float32).reshape(7, 6)
    readings = {}
    cases = [
        (root["tp"], [Shard(0)], root["dp"], [Shard(1)]),
        (root["tp"], [Shard(1)], root, [Shard(0), Shard(0)]),
        (root, [Shard(1), Shard(0)], root["tp"], [Shard(0)]),
        (root["dp"], [Shard(0)], root["tp"], [Replicate()]),
        (cube["dp", "tp"], [Shard(0), Shard(1)], cube["pp"], [Shard(0)]),
        (flat, [Shard(0)], cube["tp"], [Shard(1)]),
        (cube["tp"], [Shard(0)], flat, [Shard(0)]),
        (root["tp"], [Shard(0)], other, [Shard(1), Shard(0)]),
        (other, [Replicate(), Shard(0)], cube["dp"], [Shard(0)]),
    ]
    for k, (src, sp, dst, dp) in enumerate(cases):
        dt = distribute_tensor(glob + k, src, sp, src_data_rank=None)  # members hold the same
        what = f"case {k}: {src.mesh_dim_names}{sp} -> {dst.mesh_dim_names}{dp}"
        readings[k] = repr(mc.layout_from_dtensor(dt))
        check.source(dt, glob + k, what)
        res = mc.reshard_dtensor(dt, dst, dp, timeout=60)
        check.result(res, glob + k, dst, dp, what)
    return {"failures": check.failures, "readings": readings}


@pytest.mark.timeout(600)
def test_shard_order_and_strided_shard_on_a_2x2_mesh() -> None:
    results = mc.launch(_shard_order_job, 4, timeout=300)
    failures = [f for r in results for f in r]
    assert not failures, "\n".join(failures[:20])


def _eight_rank_job(rank: int) -> dict:
    return {"three_d": _three_d_job(rank), "sub_mesh": _sub_mesh_job(rank),
            "strided": _strided_and_partial_job(rank)}


@pytest.fixture(scope="module")
def eight_ranks() -> list[dict]:
    """One launch of 8 ranks (4 emulated hosts of 2) for the 2x2x2, sub-mesh and strided checks:
    starting 8 ranks that import torch and DTensor costs about 4 s of CPU each."""
    return mc.launch(_eight_rank_job, 8, hosts=4, timeout=500)


@pytest.mark.timeout(600)
def test_strided_shards_and_partial_destinations(eight_ranks) -> None:
    failures = [f for r in eight_ranks for f in r["strided"]]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.timeout(600)
def test_shard_order_on_a_2x2x2_mesh_and_with_partial(eight_ranks) -> None:
    failures = [f for r in eight_ranks for f in r["three_d"]]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.timeout(600)
def test_sub_meshes_are_read_whole_on_every_rank(eight_ranks) -> None:
    results = [r["sub_mesh"] for r in eight_ranks]
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:20])
    readings = [r["readings"] for r in results]
    assert all(r == readings[0] for r in readings), "ranks read a sub-mesh differently"
    root = mc.Mesh.from_range(0, (2, 4))
    assert readings[0][0] == repr(mc.Layout(root, [mc.Replicate(), mc.Shard(0)]))
    assert readings[0][3] == repr(mc.Layout(root, [mc.Shard(0), mc.Replicate()]))
    cube = mc.Mesh.from_range(0, (2, 2, 2))
    assert readings[0][4] == repr(mc.Layout(cube, [mc.Replicate(), mc.Shard(0), mc.Shard(1)]))
    # a flattened dim is no root dim: the family of meshes, one per pp index, axis 0 = which
    assert readings[0][5] == repr(mc.Layout(mc.Mesh.from_range(0, (2, 4)),
                                            [mc.Replicate(), mc.Shard(0)]))
    assert readings[0][6] == repr(mc.Layout(cube, [mc.Replicate(), mc.Replicate(), mc.Shard(0)]))
