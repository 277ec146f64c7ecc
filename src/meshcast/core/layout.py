"""Layouts: how a tensor is split and replicated over a mesh.

A layout is a small immutable value, written per tensor dimension (the paper's notation): ``R`` =
not split, ``S0`` = split along mesh axis 0, ``S01`` = split along axes 0 and 1 (axis 0 major).
Mesh axes that split no dimension hold replicas. The same layout can be given DTensor-style, one
placement per mesh axis: ``[Shard(0), Replicate()]`` equals ``"S0R"`` on a 2-D mesh.

Uneven sizes follow ``torch.chunk`` / DTensor: a dimension of size n split k ways gets chunks of
ceil(n/k); trailing chunks may be smaller or empty. A dimension split over several axes is chunked
over each axis in turn (major axis first), as DTensor does for ``[Shard(0), Shard(0)]``.

Beyond one chunk per rank (splits.py): strided steps (``S0[2]1``, DTensor's ``_StridedShard``)
and fused dimensions (``{q=4096:S1+k=1024:S1+v=1024:S1}``, parts split each their own way) give a
rank several runs of a dimension; its shard is then a :class:`~meshcast.core.region.Region` of
several boxes (:meth:`Layout.region`), held in global order.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from .boxes import Box, box_shape, box_size, split_box
from .checks import as_shape
from .mesh import Mesh
from .placements import (
    Placement,
    Replicate,
    Shard,
    StridedShard,
    placement_json,
    placement_of_json,
    splits_of_placements,
)
from .region import Region
from .splits import DimSplit, chunk_range, parse_token, tile_runs, tiles_of_positions

__all__ = [
    "Box",
    "Layout",
    "Placement",
    "Region",
    "Replicate",
    "Shard",
    "StridedShard",
    "box_shape",
    "box_size",
    "split_box",
]

_TOKEN = re.compile(r"R|S(?:\d(?:\[\d+\])?)+|\{[^{}]*\}")


def _parse_spec(spec: str) -> tuple[DimSplit, ...]:
    text = re.sub(r",(?![^{]*\})", "", spec.replace(" ", ""))  # commas between tokens
    tokens = _TOKEN.findall(text)
    if "".join(tokens) != text or (not tokens and spec != ""):
        raise ValueError(
            f"spec {spec!r} is not a layout: write one token per tensor dimension, R or S followed "
            f"by mesh-axis digits, e.g. 'S0RR', 'RS01R' or 'S0,R,R' (strided: 'S0[2]1'; fused: "
            f"'{{q=4096:S1+k=1024:S1}}R')"
        )
    return tuple(parse_token(tok, spec) for tok in tokens)


def _chunk_bounds(n: int, ks: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(starts, stops) of the chunks of a dimension of ``n`` chunked ``ks[0]`` ways, each chunk
    ``ks[1]`` ways, and so on (``torch.chunk`` sizes), in chunk order."""
    starts = np.zeros(1, dtype=np.int64)
    lengths = np.full(1, n, dtype=np.int64)
    for k in ks:
        chunk = -(-lengths // k)  # ceil
        i = np.arange(k, dtype=np.int64)
        # i * chunk < length wherever it is used (chunk = ceil(length / k)), so int64 never
        # overflows; lo + min(chunk, length - lo) rather than (i + 1) * chunk likewise
        inside = i[None, :] < -(-lengths[:, None] // np.maximum(chunk[:, None], 1))
        lo = np.where(inside, i[None, :] * chunk[:, None], lengths[:, None])
        hi = lo + np.minimum(chunk[:, None], lengths[:, None] - lo)
        starts = (starts[:, None] + lo).reshape(-1)
        lengths = (hi - lo).reshape(-1)
    return starts, starts + lengths


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
            dims = {d: split for d, split in enumerate(per_dim) if split.steps or split.parts}
        elif isinstance(spec, Sequence):
            self._ndim = None
            dims = splits_of_placements(spec, self._mesh)
        else:
            raise TypeError(
                f"spec must be a string like 'S0RR' or a list of placements, got {spec!r}"
            )
        self._dims: tuple[tuple[int, DimSplit], ...] = tuple(sorted(dims.items()))
        self._check_axes()

    def _check_axes(self) -> None:
        """Each mesh axis splits at most one dimension, once in each of its pieces."""
        used: dict[int, int] = {}
        for d, split in self._dims:
            for steps in split.step_lists():
                axes = [a for a, _ in steps]
                for a in axes:
                    if a >= self._mesh.ndim:
                        raise ValueError(
                            f"spec {self.spec!r} uses mesh axis {a}, but the mesh has "
                            f"{self._mesh.ndim} axes (0..{self._mesh.ndim - 1})"
                        )
                    if used.get(a, d) != d or axes.count(a) > 1:
                        raise ValueError(
                            f"spec {self.spec!r} uses mesh axis {a} twice (dimensions "
                            f"{used.get(a, d)} and {d}); each mesh axis splits at most one "
                            f"dimension once"
                        )
                    used[a] = d

    @classmethod
    def parse(cls, text: str) -> Layout:
        """From the CLI notation ``SHAPE[@FIRST]:SPEC``, e.g. ``"2x4@8:RRS0"``: a 2x4 mesh of
        consecutive ranks starting at 8, with layout ``RRS0``."""
        if not isinstance(text, str):
            raise TypeError(f"a layout to parse must be a string like '2x4:S0RR', got "
                            f"{type(text).__name__}")
        mesh_text, sep, spec = text.partition(":")
        shape_text, bracket, ranks_text = mesh_text.partition("[")
        shape_text, at, first = shape_text.partition("@")
        try:
            shape = tuple(int(s) for s in shape_text.split("x"))
            start = int(first) if first else 0
            ranks = [int(r) for r in ranks_text.rstrip("]").split(",")] if bracket else None
        except ValueError:
            shape, start, ranks = (), 0, None
        if (at and not first) or (bracket and (at or not ranks_text.endswith("]"))):
            shape = ()  # "@" without the first rank; a rank list with "@" or unclosed
        if not sep or not shape:
            raise ValueError(
                f"layout {text!r} is not of the form SHAPE[@FIRST]:SPEC (or SHAPE[RANKS]:SPEC), "
                f"e.g. '2x4:S0RR', '2x4@8:RRS0' or '2x2[3,1,0,2]:S0R'"
            )
        if ranks is not None:
            if len(ranks) != math.prod(shape):
                raise ValueError(f"layout {text!r}: a {shape_text} mesh needs "
                                 f"{math.prod(shape)} ranks, got {len(ranks)}")
            mesh = Mesh(np.array(ranks).reshape(shape))
        else:
            mesh = Mesh.from_range(start, shape)
        if spec.endswith("..."):  # placement-style: any further dimensions replicated
            return cls(mesh, list(cls(mesh, spec[:-3]).placements))
        return cls(mesh, spec)

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
        dims = dict(self._dims)
        n = self._ndim if self._ndim is not None else (max(dims, default=-1) + 1)
        return "".join(dims[d].token() if d in dims else "R" for d in range(n))

    @property
    def is_plain(self) -> bool:
        """Whether every rank holds one chunk of each dimension (one box), as ``Shard`` and
        ``Replicate`` placements give; False for strided steps and fused dimensions."""
        return all(split.is_plain for _, split in self._dims)

    @property
    def placements(self) -> tuple[Placement, ...]:
        """DTensor-style placements, one per mesh axis (placements apply in mesh-axis order:
        ValueError for a layout they cannot say, e.g. ``S10`` or a fused dimension)."""
        out: list[Placement] = [Replicate()] * self._mesh.ndim
        for d, split in self._dims:
            if split.parts or [a for a, _ in split.steps] != sorted(a for a, _ in split.steps):
                raise ValueError(
                    f"layout {self.spec!r} has no DTensor-style placements: dimension {d} is "
                    f"{'fused' if split.parts else 'split in an order other than the mesh axes'}"
                )
            for a, f in split.steps:
                out[a] = Shard(d) if f == 1 else StridedShard(d, f)
        return tuple(out)

    def splits(self, ndim: int) -> tuple[DimSplit, ...]:
        """How each of ``ndim`` tensor dimensions is split (``DimSplit()``: not split)."""
        self.check_ndim(ndim)
        dims = dict(self._dims)
        return tuple(dims.get(d, DimSplit()) for d in range(ndim))

    def dim_axes(self, ndim: int) -> tuple[tuple[int, ...], ...]:
        """Mesh axes splitting each of ``ndim`` tensor dimensions (empty tuple = not split)."""
        return tuple(split.axes for split in self.splits(ndim))

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

    def check_shape(self, shape: Sequence[int], argument: str = "shape") -> None:
        """Raise ValueError (naming ``argument``) unless this layout fits a tensor of ``shape``:
        its number of dimensions, and each fused dimension's parts adding up to its size."""
        shape = as_shape(shape)
        self.check_ndim(len(shape), argument)
        for d, split in self._dims:
            sizes = split.sizes()
            if sizes is not None and sum(sizes) != shape[d]:
                raise ValueError(
                    f"{argument} has {shape[d]} indices in dimension {d}, but the fused "
                    f"dimension {split.token()} of layout {self.spec!r} has parts of "
                    f"{' + '.join(map(str, sizes))} = {sum(sizes)}"
                )

    # -- geometry ---------------------------------------------------------------------------
    def dim_runs(self, shape: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per tensor dimension, ``(starts, stops, tiles)``: its non-empty runs in increasing order
        and the tile (:meth:`position_tiles`) holding each; they partition the dimension. A
        ``Shard``-only dimension has one run per chunk, in chunk order."""
        shape = as_shape(shape)
        self.check_shape(shape)
        mesh_shape = self._mesh.shape
        out = []
        for n, split in zip(shape, self.splits(len(shape))):
            if split.is_plain:
                starts, stops = _chunk_bounds(n, [mesh_shape[a] for a, _ in split.steps])
                tiles = np.arange(len(starts), dtype=np.int64)
                keep = stops > starts
                out.append((starts[keep], stops[keep], tiles[keep]))
            else:
                starts, stops, tiles, _ = tile_runs(split, n, mesh_shape)
                out.append((starts, stops, tiles))
        return out

    def position_tiles(self, ndim: int) -> list[list[np.ndarray]]:
        """Per tensor dimension, per piece (a fused dimension's parts; else the dimension), the
        tile each mesh position holds: arrays of shape ``(mesh.size,)``. A ``Shard`` dimension's
        tile is the chunk index (row-major over its axes)."""
        coords = np.stack(np.unravel_index(np.arange(self._mesh.size), self._mesh.shape), axis=1)
        return [tiles_of_positions(split, coords, self._mesh.shape)
                for split in self.splits(ndim)]

    def num_tiles(self, ndim: int) -> tuple[int, ...]:
        """Number of tiles of each tensor dimension (chunks; a fused dimension's of all parts)."""
        mesh_shape = self._mesh.shape
        return tuple(
            sum(int(np.prod([mesh_shape[a] for a, _ in steps])) for steps in split.step_lists())
            for split in self.splits(ndim)
        )

    def region(self, rank: int, shape: Sequence[int]) -> Region | None:
        """The part of a global tensor of ``shape`` that ``rank`` holds, or None if it is not in
        the mesh: one box for a plain layout, several for strided or fused ones."""
        shape = as_shape(shape)
        if self.is_plain:
            box = self.box(rank, shape)
            return None if box is None else Region.of_box(box)
        pos = self._mesh.position(rank)
        if pos is None:
            self.check_ndim(len(shape))
            return None
        return self.regions(shape)[rank]

    def regions(self, shape: Sequence[int]) -> dict[int, Region]:
        """Every rank's :meth:`region`, computed together (the runs of each dimension once)."""
        shape = as_shape(shape)
        if self.is_plain:
            return {r: Region.of_box(self.box(r, shape)) for r in self._mesh.devices}
        per_dim = []
        for (starts, stops, tiles), pieces in zip(self.dim_runs(shape),
                                                  self.position_tiles(len(shape))):
            order = np.argsort(tiles, kind="stable")  # runs by tile, increasing within a tile
            bounds = np.searchsorted(tiles[order], np.arange(max(tiles.max(initial=-1) + 2,
                                                                 1)))
            runs_of = [list(zip(starts[order[a:b]].tolist(), stops[order[a:b]].tolist()))
                       for a, b in itertools.pairwise(bounds)]
            per_dim.append((runs_of, pieces))
        out = {}
        for pos, rank in enumerate(self._mesh.devices):
            runs = []
            for runs_of, pieces in per_dim:
                mine = [run for p in pieces if int(p[pos]) < len(runs_of)
                        for run in runs_of[int(p[pos])]]
                runs.append(sorted(mine))
            out[rank] = Region(runs)
        return out

    def box(self, rank: int, shape: Sequence[int]) -> Box | None:
        """The region of a global tensor of ``shape`` that ``rank`` holds (None: not in mesh);
        ValueError where it is several boxes (use :meth:`region`)."""
        shape = as_shape(shape)
        if not self.is_plain:
            region = self.region(rank, shape)
            if region is None or region.box is not None:
                return None if region is None else region.box
            raise ValueError(
                f"rank {rank} holds several boxes of layout {self.spec!r} for shape {shape}: "
                f"{region}; use Layout.region"
            )
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
                lo, hi = chunk_range(length, mesh_shape[a], int(coords[a]))
                start, length = start + lo, hi - lo
            result.append(slice(start, start + length))
        return tuple(result)

    def shard_shape(self, rank: int, shape: Sequence[int]) -> tuple[int, ...] | None:
        """Shape of the (local) shard ``rank`` holds, or None if it is not in the mesh."""
        region = self.region(rank, shape)
        return None if region is None else region.shape

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
        """CLI form ``2x4@8:S0RR`` (a mesh of other ranks: ``2x2[3, 1, 0, 2]:S0R``; a
        placement-style layout, for a tensor of any rank, ends in ``...``), which
        :meth:`parse` reads back."""
        return f"{self._mesh.notation()}:{self.spec}{'...' if self._ndim is None else ''}"

    def to_json(self) -> dict[str, Any]:
        """Plain-data form."""
        data: dict[str, Any] = {"mesh": self._mesh.to_json()}
        if self._ndim is None:
            data["placements"] = [placement_json(p) for p in self.placements]
        else:
            data["spec"] = self.spec
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        """Inverse of :meth:`to_json`; ``ValueError`` for a missing or malformed field."""
        try:
            mesh = Mesh.from_json(data["mesh"])
            if "spec" in data:
                return cls(mesh, data["spec"])
            return cls(mesh, [placement_of_json(p) for p in data["placements"]])
        except KeyError as exc:
            raise ValueError(f"not a complete layout: the field {exc} is missing") from None
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"not a valid layout: {exc}") from None

