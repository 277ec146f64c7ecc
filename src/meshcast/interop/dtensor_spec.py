"""Read a DeviceMesh and a DTensor spec whole, as a meshcast :class:`~meshcast.Layout`.

Everything that decides which elements a rank holds is read, the same way on every rank:

* **Placements.** ``Shard(d)``, ``Replicate()`` and ``_StridedShard(d, split_factor)`` with
  any split factor (even or uneven sizes, decodable into a shard order or not): a strided step
  of the layout (core/splits.py: the same chunking as DTensor's ``_split_tensor``), so a rank's
  shard may be several boxes, held in DTensor's local order. ``Partial`` is not a layout:
  :func:`meshcast.reshard_dtensor` reduces a Partial source and makes a Partial destination.
* **Shard order** (torch 2.13's ``DTensorSpec.shard_order``): a tensor dimension sharded over
  several mesh dimensions is chunked over them in that order, first listed major, each chunk
  split again (uneven sizes as ``torch.chunk``, chunk by chunk). That is meshcast's ordered
  spec token: shard order ``(1, 0)`` for dim 0 is ``"S10"``. Checked against DTensor's own
  ``redistribute`` / ``full_tensor()`` by tests/test_dtensor_specs.py.
* **Sub-meshes** (``init_device_mesh(...)["tp"]``, flattened dims): each rank's DeviceMesh is
  one member of a family of meshes cut from the root mesh, a different one per rank. The family
  is read whole (``DeviceMesh._layout.remap_to_tensor``, identical on every rank) and the spec is
  read as replicated over the dimensions the sub-mesh leaves out: on the root mesh (Replicate on
  the root's other dims) when every sub-mesh dim is a root dim, else on the mesh of the whole
  family (axis 0 = which member). Every member is taken to hold the same values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from ..core.layout import Layout
from ..core.layout import Replicate as McReplicate
from ..core.layout import Shard as McShard
from ..core.mesh import Mesh
from ..core.splits import steps_token

__all__ = ["MeshReading", "has_partial", "layout_from_spec", "placement_kind", "read_device_mesh"]


def placement_kind(p: Any) -> str:
    """``"shard"`` (``Shard``, or ``_StridedShard`` with ``split_factor`` 1), ``"strided"`` (a
    ``_StridedShard`` with ``split_factor`` > 1), ``"replicate"``, ``"partial"`` or
    ``"other"``."""
    if isinstance(p, _StridedShard) or type(p).__name__ == "_StridedShard":
        return "shard" if getattr(p, "split_factor", None) == 1 else "strided"
    if isinstance(p, Shard):
        return "shard"
    if isinstance(p, Replicate):
        return "replicate"
    if getattr(p, "is_partial", lambda: False)():
        return "partial"
    return "other"


def has_partial(dt: Any) -> bool:
    """Whether DTensor ``dt`` has a ``Partial`` placement (reduced on its mesh before it moves)."""
    return any(placement_kind(p) == "partial" for p in dt.placements)


class MeshReading:
    """A DeviceMesh read whole: the meshcast ``mesh`` holding every rank of its family, and for
    each DeviceMesh dimension the axis of ``mesh`` it is (other axes of ``mesh`` hold copies)."""

    __slots__ = ("axes", "mesh")

    def __init__(self, mesh: Mesh, axes: tuple[int, ...]) -> None:
        self.mesh = mesh
        self.axes = axes

    def __repr__(self) -> str:
        return f"MeshReading({self.mesh!r}, axes={self.axes})"


def _family(dm: DeviceMesh) -> np.ndarray:
    """Every member of ``dm``'s family, shape ``(members, *dm.shape)``; the same on every rank."""
    root = dm._get_root_mesh() if hasattr(dm, "_get_root_mesh") else dm
    layout, rank_map = getattr(dm, "_layout", None), getattr(dm, "_rank_map", None)
    if layout is None or rank_map is None or not hasattr(layout, "remap_to_tensor"):
        if root is not dm:
            raise ValueError(
                f"device mesh {dm!r} is a sub-mesh, and this torch version does not expose how "
                f"sub-meshes are cut (DeviceMesh._layout); pass the root mesh"
            )
        return dm.mesh.detach().cpu().numpy().reshape(1, *dm.shape)
    full = layout.remap_to_tensor(rank_map).detach().cpu().numpy()
    return full.reshape(-1, *dm.shape).astype(np.int64)


def read_device_mesh(device_mesh: DeviceMesh, argument: str = "device_mesh") -> MeshReading:
    """``device_mesh`` read whole (see the module docstring); identical on every rank."""
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"{argument} must be a torch DeviceMesh, got {type(device_mesh).__name__}")
    family = _family(device_mesh)
    ndim = device_mesh.ndim
    if family.shape[0] == 1:
        return MeshReading(Mesh(family[0]), tuple(range(ndim)))
    root = device_mesh._get_root_mesh()
    root_array = _family(root)[0] if root is not device_mesh else None
    if root_array is not None:
        axes = _root_axes(family, root_array, device_mesh.mesh_dim_names, root.mesh_dim_names)
        if axes is not None:
            return MeshReading(Mesh(root_array), axes)
    return MeshReading(Mesh(family), tuple(range(1, ndim + 1)))


def _root_axes(
    family: np.ndarray,
    root: np.ndarray,
    names: Sequence[str] | None,
    root_names: Sequence[str] | None,
) -> tuple[int, ...] | None:
    """The root dimension each sub-mesh dimension is, or None if the family is not cut from
    ``root`` by fixing the coordinates of the other root dimensions."""
    ranks = family.reshape(-1)
    if ranks.size != root.size or set(ranks.tolist()) != set(root.reshape(-1).tolist()):
        return None
    where = {int(r): i for i, r in enumerate(root.reshape(-1))}
    flat = np.array([where[int(r)] for r in ranks], dtype=np.int64)
    root_coords = np.stack(np.unravel_index(flat, root.shape), axis=1)  # per family element
    sub_coords = np.stack(np.unravel_index(np.arange(ranks.size), family.shape), axis=1)[:, 1:]
    axes: list[int] = []
    for i in range(family.ndim - 1):
        preferred = [root_names.index(names[i])] if names and root_names and \
            names[i] in root_names else []
        candidates = preferred + [a for a in range(root.ndim) if a not in preferred]
        match = next((a for a in candidates if a not in axes and
                      root.shape[a] == family.shape[i + 1] and
                      np.array_equal(root_coords[:, a], sub_coords[:, i])), None)
        if match is None:
            return None
        axes.append(match)
    others = [a for a in range(root.ndim) if a not in axes]
    if not others:
        return tuple(axes)
    member = root_coords[:, others].reshape(family.shape[0], -1, len(others))
    if not np.all(member == member[:, :1]):  # a member must fix the other root coordinates
        return None
    return tuple(axes)


def _steps(
    placements: Sequence[Any], shard_order: Any, ndim: int, argument: str
) -> dict[int, tuple[tuple[int, int], ...]]:
    """``{tensor dim: ((mesh dim, split factor), ...)}`` in the order DTensor applies them:
    the spec's shard order where it has one, else the placements left to right; a
    ``_StridedShard`` with its split factor (splits.py). (A spec has a shard order only where its
    ``_StridedShard`` placements are real strided shards, as views make them, not an encoding of
    the order: ``use_strided_shard_as_shard_order=False``.)"""
    default: dict[int, list[tuple[int, int]]] = {}
    for i, p in enumerate(placements):
        if placement_kind(p) in ("shard", "strided"):
            f = int(getattr(p, "split_factor", 1)) if placement_kind(p) == "strided" else 1
            default.setdefault(p.dim + ndim if p.dim < 0 else p.dim, []).append((i, f))
    if shard_order is None:
        return {d: tuple(v) for d, v in default.items()}
    order: dict[int, tuple[tuple[int, int], ...]] = {}
    for entry in shard_order:
        d, dims = int(entry.tensor_dim), tuple(int(m) for m in entry.mesh_dims)
        if d in order or sorted(dims) != sorted(m for m, _ in default.get(d, [])) or not dims:
            raise ValueError(
                f"{argument}: shard_order {tuple(shard_order)!r} does not match the placements "
                f"{tuple(placements)!r} (each sharded tensor dimension must list exactly the "
                f"mesh dimensions that shard it)"
            )
        factor = dict(default[d])
        order[d] = tuple((m, factor[m]) for m in dims)
    if set(order) != set(default):
        raise ValueError(
            f"{argument}: shard_order {tuple(shard_order)!r} leaves out tensor dimensions "
            f"{sorted(set(default) - set(order))} that the placements shard"
        )
    return order


def _check_placements(placements: Sequence[Any], ndim: int, argument: str) -> None:
    for i, p in enumerate(placements):
        kind = placement_kind(p)
        if kind in ("shard", "strided"):
            dim = p.dim + ndim if p.dim < 0 else p.dim
            if not 0 <= dim < ndim:
                raise ValueError(f"{argument}[{i}] is {p!r}, but the tensor has {ndim} dimensions")
        elif kind == "partial":
            raise ValueError(
                f"{argument}[{i}] is {p!r}: a meshcast layout holds no Partial placement; "
                f"meshcast.reshard_dtensor reduces a Partial source on its mesh and makes a "
                f"Partial destination from the replicated value, as DTensor's redistribute does"
            )
        elif kind != "replicate":
            raise ValueError(
                f"{argument}[{i}] is {p!r}: only Shard, _StridedShard, Replicate and Partial "
                f"placements are supported"
            )


def layout_from_spec(
    device_mesh: DeviceMesh,
    placements: Sequence[Any],
    ndim: int,
    *,
    shard_order: Any = None,
    argument: str = "placements",
    own_mesh: bool = False,
) -> Layout:
    """The meshcast :class:`~meshcast.Layout` of ``placements`` (in ``shard_order``, a torch
    ``ShardOrder``; None: the default, mesh dimensions left to right) on ``device_mesh``, for a
    tensor of ``ndim`` dimensions. Refuses what it cannot read exactly (module docstring).
    ``own_mesh``: read only this rank's own member of a sub-mesh family (its ranks), not the
    family whole (with pipeline parallelism each stage's sub-mesh holds other tensors)."""
    reading = (MeshReading(Mesh(device_mesh.mesh.tolist()), tuple(range(device_mesh.ndim)))
               if own_mesh else read_device_mesh(device_mesh))
    placements = tuple(placements)
    if len(placements) != device_mesh.ndim:
        raise ValueError(
            f"{argument} has {len(placements)} entries but the device mesh has {device_mesh.ndim} "
            f"dimensions: give one placement per mesh dimension"
        )
    _check_placements(placements, ndim, argument)
    steps = {d: tuple((reading.axes[m], f) for m, f in v)
             for d, v in _steps(placements, shard_order, ndim, argument).items()}
    axes_sorted = all([a for a, _ in v] == sorted(a for a, _ in v) for v in steps.values())
    if axes_sorted and all(f == 1 for v in steps.values() for _, f in v):
        ours: list[McShard | McReplicate] = [McReplicate()] * reading.mesh.ndim
        for d, v in steps.items():
            for a, _ in v:
                ours[a] = McShard(d)
        return Layout(reading.mesh, ours)  # expressible as placements
    spec = "".join(steps_token(steps.get(d, ())) for d in range(ndim))
    return Layout(reading.mesh, spec)
