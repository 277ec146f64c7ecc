"""Layouts: how a tensor is split and replicated over a mesh.

A layout is a small immutable value, written per tensor dimension (the paper's notation): ``R`` =
not split, ``S0`` = split along mesh axis 0, ``S01`` = split along axes 0 and 1 (axis 0 major).
Mesh axes that split no dimension hold replicas. The same layout can be given DTensor-style, one
placement per mesh axis: ``[Shard(0), Replicate()]`` equals ``"S0R"`` on a 2-D mesh.

Uneven sizes follow ``torch.chunk`` / DTensor: a dimension of size n split k ways gets chunks of
ceil(n/k); trailing chunks may be smaller or empty. A dimension split over several axes is chunked
over each axis in turn (major axis first), as DTensor does for ``[Shard(0), Shard(0)]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .boxes import Box, box_shape, box_size, split_box
from .checks import as_index, as_shape
from .mesh import Mesh

__all__ = [
    "Box",
    "Layout",
    "Placement",
    "Replicate",
    "Shard",
    "box_shape",
    "box_size",
    "split_box",
]

@dataclass(frozen=True)
class Shard:
    """DTensor-style placement: this mesh axis splits tensor dimension ``dim``."""

    dim: int

    def __post_init__(self) -> None:
        as_index(self.dim, "Shard.dim")


@dataclass(frozen=True)
class Replicate:
    """DTensor-style placement: this mesh axis holds replicas."""


Placement = Shard | Replicate

_TOKEN = re.compile(r"R|S\d+")


def _parse_spec(spec: str) -> tuple[tuple[int, ...], ...]:
    text = spec.replace(",", "").replace(" ", "")
    tokens = _TOKEN.findall(text)
    if "".join(tokens) != text or (not tokens and spec != ""):
        raise ValueError(
            f"spec {spec!r} is not a layout: write one token per tensor dimension, R or S followed "
            f"by mesh-axis digits, e.g. 'S0RR', 'RS01R' or 'S0,R,R'"
        )
    return tuple(tuple(int(c) for c in tok[1:]) for tok in tokens)


def _from_placements(placements: Sequence[Any], mesh: Mesh) -> dict[int, tuple[int, ...]]:
    if len(placements) != mesh.ndim:
        raise ValueError(
            f"spec has {len(placements)} placements but the mesh has {mesh.ndim} axes: "
            f"give one Shard/Replicate per mesh axis"
        )
    dims: dict[int, tuple[int, ...]] = {}
    for axis, p in enumerate(placements):
        if isinstance(p, Shard):
            dims[p.dim] = (*dims.get(p.dim, ()), axis)
        elif not isinstance(p, Replicate):
            raise TypeError(f"spec[{axis}] must be meshcast.Shard or meshcast.Replicate, got {p!r}")
    return dims


class Layout:
    """Where a tensor lives: a :class:`Mesh` plus how each tensor dimension is split over it.

    ``Layout(mesh, "S0RR")``, ``Layout(mesh, "S0,R,R")`` and
    ``Layout(mesh, [Shard(0), Replicate()])`` are all accepted; ``Layout(mesh, "")`` is the
    layout of a 0-d tensor (replicated on every rank). A layout given as placements does
    not fix the tensor rank: unnamed dimensions are replicated.
    """

    __slots__ = ("_dims", "_mesh", "_ndim")

    def __init__(self, mesh: Mesh | Any, spec: str | Sequence[Placement]) -> None:
        self._mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
        if isinstance(spec, str):
            per_dim = _parse_spec(spec)
            self._ndim: int | None = len(per_dim)
            dims = {d: axes for d, axes in enumerate(per_dim) if axes}
        elif isinstance(spec, Sequence):
            self._ndim = None
            dims = _from_placements(spec, self._mesh)
        else:
            raise TypeError(
                f"spec must be a string like 'S0RR' or a list of placements, got {spec!r}"
            )
        used: dict[int, int] = {}
        for d, axes in sorted(dims.items()):
            for a in axes:
                if a >= self._mesh.ndim:
                    raise ValueError(
                        f"spec {self._spec_text(dims)!r} uses mesh axis {a}, but the mesh has "
                        f"{self._mesh.ndim} axes (0..{self._mesh.ndim - 1})"
                    )
                if a in used:
                    raise ValueError(
                        f"spec {self._spec_text(dims)!r} uses mesh axis {a} twice (dimensions "
                        f"{used[a]} and {d}); each mesh axis splits at most one dimension once"
                    )
                used[a] = d
        self._dims: tuple[tuple[int, tuple[int, ...]], ...] = tuple(sorted(dims.items()))

    def _spec_text(self, dims: dict[int, tuple[int, ...]]) -> str:
        n = self._ndim if self._ndim is not None else (max(dims, default=-1) + 1)
        return "".join("S" + "".join(map(str, dims[d])) if d in dims else "R" for d in range(n))

    @classmethod
    def parse(cls, text: str) -> Layout:
        """From the CLI notation ``SHAPE[@FIRST]:SPEC``, e.g. ``"2x4@8:RRS0"``: a 2x4 mesh of
        consecutive ranks starting at 8, with layout ``RRS0``."""
        mesh_text, sep, spec = text.partition(":")
        shape_text, _, first = mesh_text.partition("@")
        try:
            shape = tuple(int(s) for s in shape_text.split("x"))
            start = int(first) if first else 0
        except ValueError:
            shape, start = (), 0
        if not sep or not shape or not spec:
            raise ValueError(
                f"layout {text!r} is not of the form SHAPE[@FIRST]:SPEC, e.g. '2x4:S0RR' or "
                f"'2x4@8:RRS0'"
            )
        return cls(Mesh.from_range(start, shape), spec)

    # -- properties -------------------------------------------------------------------------
    @property
    def mesh(self) -> Mesh:
        """The mesh of ranks the tensor lives on."""
        return self._mesh

    @property
    def ndim(self) -> int | None:
        """Tensor rank fixed by the spec, or None for a placement-style layout."""
        return self._ndim

    @property
    def spec(self) -> str:
        """The paper's notation, e.g. ``"S0RR"`` (placement-style: up to the last split dim)."""
        return self._spec_text(dict(self._dims))

    @property
    def placements(self) -> tuple[Placement, ...]:
        """DTensor-style placements, one per mesh axis."""
        out: list[Placement] = [Replicate()] * self._mesh.ndim
        for d, axes in self._dims:
            for a in axes:
                out[a] = Shard(d)
        return tuple(out)

    def dim_axes(self, ndim: int) -> tuple[tuple[int, ...], ...]:
        """Mesh axes splitting each of ``ndim`` tensor dimensions (empty tuple = not split)."""
        self.check_ndim(ndim)
        dims = dict(self._dims)
        return tuple(dims.get(d, ()) for d in range(ndim))

    def check_ndim(self, ndim: int, argument: str = "shape") -> None:
        """Raise ValueError (naming ``argument``) unless this layout fits a tensor of ``ndim``
        dimensions."""
        if self._ndim is not None and ndim != self._ndim:
            raise ValueError(
                f"{argument} has {ndim} dimensions but layout spec {self.spec!r} has {self._ndim} "
                f"tokens: give one token per tensor dimension"
            )
        if self._dims and self._dims[-1][0] >= ndim:
            raise ValueError(
                f"{argument} has {ndim} dimensions but the layout shards dimension "
                f"{self._dims[-1][0]}"
            )

    # -- geometry ---------------------------------------------------------------------------
    def tile_bounds(self, shape: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per tensor dimension, the (starts, stops) of its chunks in chunk order."""
        shape = as_shape(shape)
        mesh_shape = self._mesh.shape
        out = []
        for n, axes in zip(shape, self.dim_axes(len(shape))):
            starts = np.zeros(1, dtype=np.int64)
            lengths = np.full(1, n, dtype=np.int64)
            for a in axes:
                k = mesh_shape[a]
                chunk = -(-lengths // k)  # ceil
                i = np.arange(k, dtype=np.int64)
                # i * chunk < length wherever it is used (chunk = ceil(length / k)), so int64 never
                # overflows; lo + min(chunk, length - lo) rather than (i + 1) * chunk likewise
                inside = i[None, :] < -(-lengths[:, None] // np.maximum(chunk[:, None], 1))
                lo = np.where(inside, i[None, :] * chunk[:, None], lengths[:, None])
                hi = lo + np.minimum(chunk[:, None], lengths[:, None] - lo)
                starts = (starts[:, None] + lo).reshape(-1)
                lengths = (hi - lo).reshape(-1)
            out.append((starts, starts + lengths))
        return out

    def tile_of_positions(self, ndim: int) -> np.ndarray:
        """Array ``(mesh.size, ndim)``: chunk index of each dimension held at each mesh position."""
        coords = np.stack(np.unravel_index(np.arange(self._mesh.size), self._mesh.shape), axis=1)
        mesh_shape = self._mesh.shape
        out = np.zeros((self._mesh.size, ndim), dtype=np.int64)
        for d, axes in enumerate(self.dim_axes(ndim)):
            for a in axes:
                out[:, d] = out[:, d] * mesh_shape[a] + coords[:, a]
        return out

    def num_tiles(self, ndim: int) -> tuple[int, ...]:
        """Number of chunks of each tensor dimension."""
        mesh_shape = self._mesh.shape
        return tuple(int(np.prod([mesh_shape[a] for a in axes])) for axes in self.dim_axes(ndim))

    def box(self, rank: int, shape: Sequence[int]) -> Box | None:
        """The region of a global tensor of ``shape`` that ``rank`` holds (None: not in mesh)."""
        shape = as_shape(shape)
        pos = self._mesh.position(rank)
        if pos is None:
            self.check_ndim(len(shape))
            return None
        coords = np.unravel_index(pos, self._mesh.shape)
        mesh_shape = self._mesh.shape
        result = []
        for n, axes in zip(shape, self.dim_axes(len(shape))):
            start, length = 0, n
            for a in axes:
                chunk = -(-length // mesh_shape[a])
                lo = min(int(coords[a]) * chunk, length)
                hi = min(lo + chunk, length)
                start, length = start + lo, hi - lo
            result.append(slice(start, start + length))
        return tuple(result)

    def shard_shape(self, rank: int, shape: Sequence[int]) -> tuple[int, ...] | None:
        """Shape of the shard ``rank`` holds, or None if it is not in the mesh."""
        box = self.box(rank, shape)
        return None if box is None else box_shape(box)

    # -- value semantics --------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Layout)
            and self._mesh == other._mesh
            and self._dims == other._dims
            and self._ndim == other._ndim
        )

    def __hash__(self) -> int:
        return hash((self._mesh, self._dims, self._ndim))

    def __repr__(self) -> str:
        if self._ndim is None:
            return f"Layout({self._mesh!r}, {list(self.placements)!r})"
        return f"Layout({self._mesh!r}, {self.spec!r})"

    def notation(self) -> str:
        """CLI form ``2x4@8:S0RR``."""
        return f"{self._mesh.notation()}:{self.spec}"

    def to_json(self) -> dict[str, Any]:
        """Plain-data form."""
        data: dict[str, Any] = {"mesh": self._mesh.to_json()}
        if self._ndim is None:
            data["placements"] = [
                {"shard": p.dim} if isinstance(p, Shard) else "replicate" for p in self.placements
            ]
        else:
            data["spec"] = self.spec
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        """Inverse of :meth:`to_json`."""
        mesh = Mesh.from_json(data["mesh"])
        if "spec" in data:
            return cls(mesh, data["spec"])
        return cls(
            mesh,
            [Replicate() if p == "replicate" else Shard(p["shard"]) for p in data["placements"]],
        )
