"""PyTorch's own DTensor redistribute tests, ported to cross-mesh form with meshcast.

The essence of torch's test/distributed/tensor/test_redistribute.py and test_dtensor.py
(shard -> replicate, replicate -> shard, shard(i) -> shard(j), partial -> replicate / shard with
sum, avg, max and min, uneven shards, dims smaller than the mesh and of size 0, 2-D and 3-D meshes
with several placements, ``_StridedShard`` of FSDP2 + TP, negative shard dims, non-contiguous
local tensors, a dozen dtypes, scalars and 1-element tensors, parameters that require grad), each
source made by DTensor itself (``distribute_tensor`` / ``from_local``) and moved by
``meshcast.reshard_dtensor`` onto the same mesh, a disjoint one, an overlapping one and one of
another shape. Each case is compared byte for byte on every rank with what DTensor gives: its
own ``redistribute`` on the same mesh, and ``distribute_tensor`` of the global value on the
destination (a Partial destination made from the replica by DTensor's own
``redistribute_local_tensor``), local shard, dtype, placements, mesh, shape and stride. Where
DTensor cannot compute a Partial reduction, meshcast must raise on every rank (exact or loud).

One launch of 8 gloo ranks (4 emulated hosts of 2) runs every case.
"""

from __future__ import annotations

import itertools
import os
import sys
import time

import pytest

import meshcast as mc

pytest.importorskip("torch.distributed.tensor")

WORLD = 8
MESHES = {
    "A4": [0, 1, 2, 3],
    "B4": [4, 5, 6, 7],
    "C4": [2, 3, 4, 5],
    "A3": [0, 1, 2],
    "A22": [[0, 1], [2, 3]],
    "B22": [[4, 5], [6, 7]],
    "C22": [[2, 3], [4, 5]],
    "W24": [[0, 1, 2, 3], [4, 5, 6, 7]],
    "W222": [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],
    "R4": [3, 1, 0, 2],  # ranks not ascending
    "S1": [6],  # one rank
    "T21": [[6], [7]],  # a mesh dimension of one rank
}
# destinations of each source mesh: itself, disjoint, overlapping, another shape
DSTS = {
    "A4": ("A4", "B4", "C4", "A22", "R4", "S1"),
    "A3": ("A3", "B4", "C4", "B22", "T21"),
    "A22": ("A22", "B22", "C22", "B4", "T21"),
    "W24": ("W24", "B22", "A3", "W222"),
    "W222": ("W222", "C22", "A4"),
    "R4": ("R4", "A22", "B4"),
    "T21": ("T21", "A22", "S1", "B4"),
}
SHAPES_1D = [(12, 3), (13, 5), (3, 5), (2, 2), (1, 1), (0, 4), (4, 0), (5,), (1,), (2, 3, 5)]
SHAPES_2D = [(7, 5), (4, 4), (1, 3), (3, 1), (0, 3), (5, 2, 3)]
DTYPES = ("float32", "bfloat16", "int64", "bool", "complex64", "float16", "int8", "uint8",
          "float64", "int32", "complex128", "int16", "float8_e4m3fn", "uint16", "complex32",
          "float8_e5m2", "uint32", "uint64")


def _placements(ndim: int, mesh_ndim: int, partial: bool):
    from torch.distributed.tensor import Replicate, Shard

    one = [Replicate()] + [Shard(d) for d in range(ndim)]
    if partial:
        one.append("P")  # filled in with a reduce op by the case
    return list(itertools.product(one, repeat=mesh_ndim))


def _cases() -> list[dict]:
    """Every case, the same list on every rank: source mesh and placements, destination mesh
    and placements, shape, dtype, and how the source is made."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    cases: list[dict] = []
    k = 0
    for src, dsts in DSTS.items():
        mesh_ndim = len(_shape(MESHES[src]))
        shapes = SHAPES_1D if mesh_ndim == 1 else SHAPES_2D
        if mesh_ndim == 3:
            shapes = [(5, 3), (2, 9)]
        if src == "R4":
            shapes = [(13, 5), (3, 5), (0, 4)]
        if src == "T21":
            shapes = [(3, 5), (1, 2)]
        for shape in shapes:
            src_pls = _placements(len(shape), mesh_ndim, partial=True)
            for i, sp in enumerate(src_pls):
                k += 1
                dst = dsts[k % len(dsts)]
                dst_pls = _placements(len(shape), len(_shape(MESHES[dst])), partial=True)
                dp = dst_pls[(k * 7 + i) % len(dst_pls)]
                op = ("sum", "avg", "max", "min")[k % 4]
                sp = tuple(Partial(op) if p == "P" else p for p in sp)
                dp = tuple(Partial(("sum", "avg", "max", "min")[k // 4 % 4]) if p == "P" else p
                           for p in dp)
                dtype = DTYPES[k % len(DTYPES)]
                if any(isinstance(p, Partial) for p in sp):
                    dtype = ("float32", "int64", "bfloat16", "float64")[k % 4]
                    if op == "avg" and dtype == "int64":
                        dtype = "float32"
                    if op == "sum" and k % 3 == 0:
                        dtype = "bool"  # gloo sums booleans as a logical or, as torch.any
                if any(isinstance(p, Partial) for p in dp) and dtype not in (
                        "float32", "float64", "bfloat16"):
                    dtype = "float64"  # a Partial(sum) destination divides
                cases.append({"src": src, "sp": sp, "dst": dst, "dp": tuple(dp),
                              "shape": shape, "dtype": dtype, "how": ("plain", "noncontig")[k % 2],
                              "reduce": ("all_reduce", "reduce_scatter")[k // 2 % 2]})
    extra = [
        # shard(i) -> shard(j) all-to-all on the same mesh, 1-D and 2-D
        ("A4", (Shard(0),), "A4", (Shard(1),), (10, 6)),
        ("A4", (Shard(1),), "A4", (Shard(0),), (6, 10)),
        ("A22", (Shard(0), Shard(1)), "A22", (Shard(1), Shard(0)), (7, 9)),
        ("A22", (Shard(0), Shard(0)), "A22", (Shard(1), Shard(1)), (9, 7)),
        ("W24", (Shard(1), Shard(0)), "W24", (Shard(0), Shard(1)), (5, 11)),
        # negative shard dims, as torch's test_redistribute_negative_shard_dim
        ("A4", (Shard(-1),), "B4", (Shard(-2),), (6, 10)),
        ("A22", (Shard(-1), Replicate()), "A22", (Replicate(), Shard(-1)), (5, 7)),
        ("A4", (Shard(0),), "A4", (Shard(-1),), (6, 10)),
        # Partial destinations of integers and booleans, as DTensor makes them from a value
        ("A4", (Shard(0),), "B4", (Partial("sum"),), (6, 4), "int64"),
        ("A4", (Shard(0),), "A4", (Partial("max"),), (6, 4), "int32"),
        ("A22", (Shard(0), Replicate()), "B22", (Partial("avg"), Shard(1)), (6, 4), "int64"),
        ("A4", (Shard(1),), "C4", (Partial("min"),), (3, 4), "bool"),
        ("A22", (Partial("sum"), Shard(0)), "C22", (Shard(1), Partial("sum")), (5, 3)),
        ("A4", (Partial("max"),), "B22", (Partial("max"), Shard(0)), (5, 3), "int64"),
    ]
    for src, sp, dst, dp, shape, *dtype in extra:
        cases.append({"src": src, "sp": sp, "dst": dst, "dp": dp, "shape": shape,
                      "dtype": (dtype or ["float32"])[0], "how": "plain",
                      "reduce": "all_reduce"})
    return cases


def _shape(nested) -> tuple[int, ...]:
    out = []
    while isinstance(nested, list):
        out.append(len(nested))
        nested = nested[0]
    return tuple(out)


def _glob(shape, dtype, seed: int):
    import torch

    n = 1
    for s in shape:
        n *= s
    vals = (torch.arange(n, dtype=torch.int64) * 7 + seed) % 97
    if dtype == torch.bool:
        return (vals % 3 == 0).reshape(shape)
    if dtype.is_complex:
        return torch.complex(vals.float(), -vals.float()).to(dtype).reshape(shape)
    return vals.to(dtype).reshape(shape)


def _bytes(t) -> bytes:
    import torch

    if t.numel() == 0:
        return b""
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.reshape(-1))
    return flat.view(torch.uint8).numpy().tobytes()


def _partial_source(glob, mesh, sp):
    """A DTensor with Partial placements ``sp`` on ``mesh`` whose reduction is known: the rank
    at linear index ``j`` over the Partial mesh axes holds (its shards of) ``glob + j``; returns
    it and the reduced global value."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    axes = [i for i, p in enumerate(sp) if p.is_partial()]
    sizes = [mesh.size(i) for i in axes]
    count = 1
    for s in sizes:
        count *= s
    parts = torch.stack([glob + j for j in range(count)])
    op = sp[axes[0]].reduce_op
    try:  # None where torch cannot compute it (the refusals)
        value = {"sum": lambda: parts.sum(0), "avg": lambda: parts.sum(0) / count,
                 "max": lambda: parts.amax(0), "min": lambda: parts.amin(0)}[op]().to(glob.dtype)
    except (RuntimeError, NotImplementedError):
        value = None
    coord = mesh.get_coordinate()
    j = 0
    if coord is not None:
        for i, s in zip(axes, sizes):
            j = j * s + coord[i]
    held = [Replicate() if p.is_partial() else p for p in sp]
    rep = distribute_tensor((glob + j).to(glob.dtype), mesh, held, src_data_rank=None)
    # the spec itself: from_local(shape=torch.Size([])) reads a 0-d shape as "not given"
    spec = type(rep._spec)(mesh, tuple(sp), tensor_meta=rep._spec.tensor_meta)
    return DTensor(rep.to_local(), spec, requires_grad=False), value


def _noncontig(dt):
    """``dt`` with a non-contiguous local tensor of the same values."""
    import torch
    from torch.distributed.tensor import DTensor

    local = dt.to_local()
    view = torch.stack([local, local], -1)[..., 0] if local.dim() else local
    return DTensor.from_local(view, dt.device_mesh, dt.placements, run_check=False,
                              shape=dt.shape, stride=dt.stride())


def _expected(value, dst, dp):
    """What DTensor holds for ``value`` with ``dp`` on ``dst``: its own local cut, a Partial
    made from the replica by its own ``redistribute_local_tensor``."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
    from torch.distributed.tensor._redistribute import redistribute_local_tensor

    held = [Replicate() if p.is_partial() else p for p in dp]
    want = distribute_tensor(value, dst, held, src_data_rank=None)
    if any(p.is_partial() for p in dp) and dst.get_coordinate() is not None:
        spec = type(want._spec)(dst, tuple(want.placements[:0]) + tuple(
            p if p.is_partial() else q for p, q in zip(dp, want.placements)),
            tensor_meta=want._spec.tensor_meta)
        want = DTensor(redistribute_local_tensor(want.to_local(), want._spec, spec), spec,
                       requires_grad=False)
    return want


class _Check:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []
        self.count = 0

    def same(self, res, want, what: str) -> None:
        """``res`` (meshcast's) equals ``want`` (DTensor's) on this rank: None off the
        destination mesh, else local bytes, dtype, placements, mesh, shape and stride."""
        if want.device_mesh.get_coordinate() is None:
            if res is not None:
                self.failures.append(f"{what}: rank {self.rank} outside dst got {type(res)}")
            return
        if res is None:
            self.failures.append(f"{what}: rank {self.rank} got None")
            return
        a, b = res.to_local(), want.to_local()
        got = (tuple(a.shape), a.dtype, tuple(res.placements), res.device_mesh.mesh.tolist(),
               tuple(res.shape), tuple(res.stride()), res.requires_grad)
        exp = (tuple(b.shape), b.dtype, tuple(want.placements), want.device_mesh.mesh.tolist(),
               tuple(want.shape), tuple(want.stride()), False)
        if got != exp:
            self.failures.append(f"{what}: rank {self.rank}: meta {got} != DTensor's {exp}")
        elif _bytes(a) != _bytes(b):
            self.failures.append(f"{what}: rank {self.rank}: local bytes differ from DTensor's")

    def call(self, what: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` and None, or None and the error it raised (a failure)."""
        self.count += 1
        if os.environ.get("PORT_DEBUG"):  # progress on stderr, to find a case that waits
            print(f"R{self.rank} {time.monotonic():.1f} {what}", file=sys.stderr, flush=True)
        try:
            return fn(*args, **kwargs), None
        except Exception as exc:
            if os.environ.get("PORT_DEBUG"):
                print(f"R{self.rank} FAIL {what}: {exc!r}"[:600], file=sys.stderr, flush=True)
            self.failures.append(f"{what}: rank {self.rank}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:300] if str(exc) else ''}")
            return None, exc


def _run_case(check: _Check, meshes, case: dict, seed: int) -> None:
    import torch
    from torch.distributed.tensor import distribute_tensor

    dtype = getattr(torch, case["dtype"])
    glob = _glob(case["shape"], dtype, seed)
    src, dst = meshes[case["src"]], meshes[case["dst"]]
    sp, dp = case["sp"], case["dp"]
    what = (f"#{seed} {case['dtype']}{list(case['shape'])} {case['src']}{list(sp)} -> "
            f"{case['dst']}{list(dp)} {case['how']}")
    if any(p.is_partial() for p in sp):
        dt, value = _partial_source(glob, src, sp)
    else:
        dt, value = distribute_tensor(glob, src, list(sp), src_data_rank=None), glob
    if case["how"] == "noncontig":
        dt = _noncontig(dt)
    want = _expected(value, dst, dp)
    opts = [{}, {"strategy": "send_recv"}, {"strategy": "broadcast"}, {"strategy": "allgather"}]
    res, exc = check.call(what, mc.reshard_dtensor, dt, dst, list(dp), timeout=30,
                                                     reduce_partial=case["reduce"],
                                                     **opts[seed % 4])
    if exc is None:
        check.same(res, want, what)
    # DTensor's own redistribute on the same mesh gives the same (it refuses to make Partial:
    # "for internal use only")
    if src is dst and not any(p.is_partial() for p in dp):
        try:  # gloo itself cannot gather some dtypes (int16, uint16, float8): DTensor fails
            ref = dt.redistribute(dst, list(dp))
        except RuntimeError:
            ref = None
        if ref is not None and res is not None:
            check.same(res, ref, what + " vs redistribute")


def _redistribute_port_job(rank: int) -> tuple[int, list[str]]:
    from torch.distributed.device_mesh import DeviceMesh

    meshes = {name: DeviceMesh("cpu", ranks) for name, ranks in MESHES.items()}
    check = _Check(rank)
    for seed, case in enumerate(_cases()):
        _run_case(check, meshes, case, seed)
    _special_cases(check, meshes)
    return check.count, check.failures


def _special_cases(check: _Check, meshes) -> None:
    """Scalars, 1-element tensors, _StridedShard of FSDP2 + TP, parameters that require grad,
    a non-contiguous global tensor, Partial reductions DTensor cannot compute."""
    import torch
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    def move(what, *args):
        return check.call(what, mc.reshard_dtensor, *args, timeout=30)

    a22, b22, b4, a4 = meshes["A22"], meshes["B22"], meshes["B4"], meshes["A4"]
    # 0-d and 1-element tensors
    for dtype in (torch.float32, torch.int64, torch.bool, torch.complex64, torch.bfloat16):
        scalar = _glob((), dtype, 3)
        dt = distribute_tensor(scalar, a22, [Replicate(), Replicate()], src_data_rank=None)
        for dst, dp in ((b4, [Replicate()]), (a22, [Replicate(), Replicate()])):
            res, exc = move(f"scalar {dtype} -> {dp}", dt, dst, dp)
            if exc is None:
                check.same(res, _expected(scalar, dst, dp), f"scalar {dtype} -> {dp}")
        one = _glob((1,), dtype, 5)
        dt = distribute_tensor(one, a4, [Shard(0)], src_data_rank=None)
        for dst, dp in ((b22, [Shard(0), Shard(0)]), (a4, [Replicate()]), (meshes["C4"],
                                                                          [Shard(0)])):
            res, exc = move(f"1-element {dtype} -> {dp}", dt, dst, dp)
            if exc is None:
                check.same(res, _expected(one, dst, dp), f"1-element {dtype} -> {dp}")
    # Partial scalar (a loss), sum and max
    for op in ("sum", "max"):
        dt, value = _partial_source(torch.tensor(5.0), a4, (Partial(op),))
        res, exc = move(f"Partial({op}) scalar", dt, b4, [Replicate()])
        if exc is None:
            check.same(res, _expected(value, b4, [Replicate()]), f"Partial({op}) scalar")
    # _StridedShard of FSDP2 + TP (column-parallel weight) as source and destination
    fsdp_tp = [_StridedShard(0, split_factor=2), Shard(0)]
    for shape in ((8, 3), (7, 4), (3, 2)):
        glob = _glob(shape, torch.float32, 11)
        dt = distribute_tensor(glob, a22, fsdp_tp, src_data_rank=None)
        for dst, dp in ((b4, [Shard(0)]), (a22, [Shard(0), Replicate()]), (b22, fsdp_tp),
                        (meshes["C22"], [Replicate(), Shard(1)])):
            what = f"FSDP2+TP {shape} -> {dst.mesh.tolist()} {dp}"
            res, exc = move(what, dt, dst, dp)
            if exc is None:
                check.same(res, _expected(glob, dst, dp), what)
    # negative dims in _StridedShard, a non-contiguous strided local tensor
    glob = _glob((6, 7), torch.float32, 13)
    neg = [_StridedShard(-1, split_factor=2), Shard(-1)]
    dt = _noncontig(distribute_tensor(glob, a22, fsdp_tp, src_data_rank=None))
    for dst, dp in ((b22, neg), (a22, neg), (b4, [Shard(-1)])):
        what = f"negative strided {dst.mesh.tolist()} {dp}"
        res, exc = move(what, dt, dst, dp)
        if exc is None:
            check.same(res, _expected(glob, dst, dp), what)
    # a parameter that requires grad (the result does not: docs/dtensor.md)
    glob = _glob((6, 5), torch.float32, 2)
    param = torch.nn.Parameter(distribute_tensor(glob, a4, [Shard(1)], src_data_rank=None))
    res, exc = move("requires_grad parameter", param, b22, [Shard(0), Shard(1)])
    if exc is None:
        check.same(res, _expected(glob, b22, [Shard(0), Shard(1)]), "requires_grad parameter")
    # a non-contiguous global tensor (a transpose): same values, contiguous result stride
    glob = _glob((5, 7), torch.float32, 4).t()
    dt = distribute_tensor(glob, a22, [Shard(0), Shard(1)], src_data_rank=None)
    res, exc = move("transposed global", dt, b4, [Shard(1)])
    if exc is None:
        check.same(res, _expected(glob.contiguous(), b4, [Shard(1)]), "transposed global")
    _state_dict(check, meshes)
    _refusals(check, meshes)


def _state_dict(check: _Check, meshes) -> None:
    """The same kinds of tensors in one ``reshard_state_dict`` call, from several meshes to
    several others: a scalar, a size-0 dim, a Partial, FSDP2 + TP, bool, complex, a parameter."""
    import torch
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    a22, b22, b4, a4, c4 = (meshes[k] for k in ("A22", "B22", "B4", "A4", "C4"))
    fsdp_tp = [_StridedShard(0, split_factor=2), Shard(0)]
    plain = {  # name: (global, source mesh, placements, destination mesh, placements)
        "scalar": (_glob((), torch.float32, 1), a22, [Replicate()] * 2, b4, [Replicate()]),
        "empty": (_glob((0, 5), torch.int64, 2), a4, [Shard(1)], b22, [Shard(0), Shard(1)]),
        "w": (_glob((7, 4), torch.bfloat16, 3), a22, fsdp_tp, c4, [Shard(0)]),
        "mask": (_glob((5, 3), torch.bool, 4), a4, [Shard(0)], a22, [Shard(1), Shard(0)]),
        "z": (_glob((3, 6), torch.complex64, 5), b22, [Shard(1), Shard(1)], a4, [Shard(1)]),
    }
    state = {name: distribute_tensor(g, src, sp, src_data_rank=None)
             for name, (g, src, sp, _, _) in plain.items()}
    state["mask"] = torch.nn.Parameter(state["mask"], requires_grad=False)
    state["grad"], value = _partial_source(_glob((6, 5), torch.float32, 6), a22,
                                           (Partial("sum"), Shard(0)))
    plain["grad"] = (value, a22, None, b22, [Shard(1), Replicate()])
    layouts = {name: (dst, dp) for name, (_, _, _, dst, dp) in plain.items()}
    out, exc = check.call("state dict", mc.reshard_state_dict, state, layouts, timeout=30)
    for name, (g, _, _, dst, dp) in plain.items():
        if exc is None:
            check.same(out.get(name), _expected(g, dst, dp), f"state dict {name}")


def _refusals(check: _Check, meshes) -> None:
    """Partial reductions DTensor cannot compute over gloo: meshcast raises on every rank
    of both meshes (not only on the source), naming the reason; placements that are no
    sequence (None), refused on every rank with a clear TypeError."""
    import torch
    from torch.distributed.tensor import Partial, Shard, distribute_tensor

    dt = distribute_tensor(_glob((4, 3), torch.float32, 1), meshes["A4"], [Shard(0)])
    try:
        mc.reshard_dtensor(dt, meshes["C4"], None, timeout=30)
    except TypeError as exc:
        if "placements must be a list or tuple" not in str(exc):
            check.failures.append(f"placements None: rank {check.rank}: unclear error {exc}")
    else:
        check.failures.append(f"placements None: rank {check.rank}: no error")
    for dtype, op in ((torch.int64, "avg"), (torch.complex64, "max")):
        what = f"Partial({op}) of {dtype}"
        dt, _ = _partial_source(_glob((4, 3), dtype, 1), meshes["A4"], (Partial(op),))
        if check.rank > 5:  # outside both meshes: None at once (docs/dtensor.md)
            if mc.reshard_dtensor(dt, meshes["C4"], [Shard(0)], timeout=30) is not None:
                check.failures.append(f"{what}: rank {check.rank}: not None")
            continue
        try:
            mc.reshard_dtensor(dt, meshes["C4"], [Shard(0)], timeout=30)
        except ValueError as exc:
            if "could not be reduced" not in str(exc):
                check.failures.append(f"{what}: rank {check.rank}: unclear error {exc}")
        except Exception as exc:
            check.failures.append(f"{what}: rank {check.rank}: {type(exc).__name__}: {exc}")
        else:
            check.failures.append(f"{what}: rank {check.rank}: no error")


def test_torch_redistribute_cases_across_meshes() -> None:
    results = mc.launch(_redistribute_port_job, WORLD, hosts=4, timeout=400)
    failures = [f for _, fs in results for f in fs]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])
    assert len({count for count, _ in results}) == 1  # every rank ran every case
    assert results[0][0] == 519
