"""DTensor-style placements of a layout, one per mesh axis, and their plain-data form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .checks import as_index
from .mesh import Mesh
from .splits import DimSplit

__all__ = ["Placement", "Replicate", "Shard", "StridedShard", "placement_json",
           "placement_of_json", "splits_of_placements"]


@dataclass(frozen=True)
class Shard:
    """DTensor-style placement: this mesh axis splits tensor dimension ``dim``."""

    dim: int

    def __post_init__(self) -> None:
        as_index(self.dim, "Shard.dim")


@dataclass(frozen=True)
class StridedShard:
    """DTensor's ``_StridedShard(dim, split_factor)``: this mesh axis splits each of
    ``split_factor`` equal pieces of dimension ``dim`` (see splits.py); 1 is :class:`Shard`."""

    dim: int
    split_factor: int

    def __post_init__(self) -> None:
        as_index(self.dim, "StridedShard.dim")
        if as_index(self.split_factor, "StridedShard.split_factor") < 1:
            raise ValueError(f"StridedShard.split_factor must be >= 1, got {self.split_factor}")


@dataclass(frozen=True)
class Replicate:
    """DTensor-style placement: this mesh axis holds replicas."""


Placement = Shard | StridedShard | Replicate


def splits_of_placements(placements: Sequence[Any], mesh: Mesh) -> dict[int, DimSplit]:
    """How each tensor dimension is split by ``placements`` (applied in mesh-axis order)."""
    if len(placements) != mesh.ndim:
        raise ValueError(
            f"spec has {len(placements)} placements but the mesh has {mesh.ndim} axes: "
            f"give one Shard/Replicate per mesh axis"
        )
    steps: dict[int, tuple[tuple[int, int], ...]] = {}
    for axis, p in enumerate(placements):
        if isinstance(p, (Shard, StridedShard)):
            f = p.split_factor if isinstance(p, StridedShard) else 1
            steps[p.dim] = (*steps.get(p.dim, ()), (axis, f))
        elif not isinstance(p, Replicate):
            raise TypeError(
                f"spec[{axis}] must be meshcast.Shard, StridedShard or Replicate, got {p!r}")
    return {d: DimSplit(steps=s) for d, s in steps.items()}


def placement_json(p: Placement) -> Any:
    """Plain-data form of a placement."""
    if isinstance(p, StridedShard):
        return {"shard": p.dim, "split_factor": p.split_factor}
    return {"shard": p.dim} if isinstance(p, Shard) else "replicate"


def placement_of_json(p: Any) -> Placement:
    """Inverse of :func:`placement_json`."""
    if p == "replicate":
        return Replicate()
    f = p.get("split_factor", 1)
    return Shard(p["shard"]) if f == 1 else StridedShard(p["shard"], f)
