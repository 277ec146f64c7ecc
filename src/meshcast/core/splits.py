"""How one tensor dimension is split over a mesh: the steps of a split, and fused dimensions.

A dimension is split by a sequence of **steps**, each on one mesh axis, applied in order to the
indices a mesh position holds so far (at first all of them):

* ``(axis, 1)``: the indices are chunked over the ``k`` positions of ``axis`` as ``torch.chunk``
  does (chunks of ceil(m/k), trailing ones smaller or empty); DTensor's ``Shard``.
* ``(axis, f)`` with ``f > 1``: the indices are first chunked into ``f`` pieces, each piece is
  chunked over ``axis``, and position ``i`` holds chunk ``i`` of every piece, in order;
  DTensor's ``_StridedShard(dim, split_factor=f)``. Its data is then several runs of the
  dimension (a union of boxes), e.g. the FSDP2 + tensor-parallel weights.

A **fused** dimension is the concatenation of named parts (fused QKV, gate_up), each of its own
size and split its own way: a rank holds, for each part in order, the indices its part's steps
give it. Every index set is increasing, so a rank's local tensor holds its indices in global
order: local order is always global order.

Written per dimension as a token of a layout spec: ``R``; ``S`` then steps, each a mesh-axis
digit with ``[f]`` after it when ``f > 1`` (``S0[2]1`` = ``_StridedShard(sf=2)`` on axis 0,
then ``Shard`` on axis 1); a fused dimension in braces, ``{q=4096:S1+k=1024:S1+v=1024:S1}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .cache import BoundedCache

__all__ = [
    "DimSplit", "Part", "Runs", "chunk_range", "parse_token", "tile_runs", "tiles_of_positions",
]

Step = tuple[int, int]
"""``(mesh axis, split factor)``."""

Runs = list[tuple[int, int]]
"""Increasing, disjoint ``(start, stop)`` runs of one dimension's indices."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_STEPS = re.compile(r"S((?:\d(?:\[\d+\])?)+)")
_STEP = re.compile(r"(\d)(?:\[(\d+)\])?")


@dataclass(frozen=True)
class Part:
    """One named part of a fused dimension: ``size`` indices split by ``steps``."""

    name: str
    size: int
    steps: tuple[Step, ...]

    def token(self) -> str:
        """``q=4096:S1``."""
        return f"{self.name}={self.size}:{steps_token(self.steps)}"


@dataclass(frozen=True)
class DimSplit:
    """How one tensor dimension is split: ``steps``, or (a fused dimension) ``parts``."""

    steps: tuple[Step, ...] = ()
    parts: tuple[Part, ...] = ()

    @property
    def axes(self) -> tuple[int, ...]:
        """The mesh axes this dimension is split over (every part's, each once, in order)."""
        seen: list[int] = []
        for steps in self.step_lists():
            seen += [a for a, _ in steps if a not in seen]
        return tuple(seen)

    @property
    def is_plain(self) -> bool:
        """Whether it is ``Shard`` steps only (each position's indices one chunk, in order)."""
        return not self.parts and all(f == 1 for _, f in self.steps)

    def step_lists(self) -> tuple[tuple[Step, ...], ...]:
        """The steps of each piece: the parts' in order, or this dimension's own."""
        return tuple(p.steps for p in self.parts) if self.parts else (self.steps,)

    def token(self) -> str:
        """The spec token: ``R``, ``S01``, ``S0[2]1`` or ``{q=4096:S1+k=1024:R}``."""
        if self.parts:
            return "{" + "+".join(p.token() for p in self.parts) + "}"
        return steps_token(self.steps)

    def sizes(self) -> tuple[int, ...] | None:
        """The parts' sizes (None: not fused)."""
        return tuple(p.size for p in self.parts) if self.parts else None

    def renumbered(self, new_axis: Mapping[int, int]) -> DimSplit:
        """The same split with each mesh axis ``a`` called ``new_axis[a]``."""
        def steps(s: tuple[Step, ...]) -> tuple[Step, ...]:
            return tuple((new_axis[a], f) for a, f in s)

        if self.parts:
            return DimSplit(parts=tuple(Part(p.name, p.size, steps(p.steps)) for p in self.parts))
        return DimSplit(steps=steps(self.steps))


def steps_token(steps: tuple[Step, ...]) -> str:
    """``R`` or ``S`` followed by the steps."""
    if not steps:
        return "R"
    return "S" + "".join(f"{a}" if f == 1 else f"{a}[{f}]" for a, f in steps)


def _parse_steps(text: str, whole: str) -> tuple[Step, ...]:
    if text == "R":
        return ()
    m = _STEPS.fullmatch(text)
    if m is None:
        raise ValueError(
            f"{text!r} in spec {whole!r} is not a dimension's split: write R, or S followed by "
            f"mesh-axis digits, each with [f] after it for a split factor f > 1 (e.g. S01, S0[2]1)"
        )
    steps = tuple((int(a), int(f) if f else 1) for a, f in _STEP.findall(m.group(1)))
    for _, f in steps:
        if f < 1:
            raise ValueError(f"{text!r} in spec {whole!r} has split factor {f}: it must be >= 1")
    return steps


def _parse_part(text: str, whole: str) -> Part:
    name, eq, rest = text.partition("=")
    size, colon, token = rest.partition(":")
    if not eq or not colon or _NAME.fullmatch(name.strip()) is None or not size.strip().isdigit():
        raise ValueError(
            f"part {text!r} of spec {whole!r} is not NAME=SIZE:SPLIT, e.g. q=4096:S1"
        )
    return Part(name.strip(), int(size), _parse_steps(token.strip(), whole))


def parse_token(text: str, whole: str) -> DimSplit:
    """One dimension's token (module docstring); ``whole`` is the spec, for messages."""
    if text.startswith("{"):
        if not text.endswith("}"):
            raise ValueError(f"fused dimension {text!r} in spec {whole!r} must end with '}}'")
        if len(text) < 3:
            raise ValueError(f"fused dimension {text!r} in spec {whole!r} is empty: list its "
                             f"parts, e.g. {{q=4096:S1+k=1024:S1}}")
        parts = tuple(_parse_part(p, whole) for p in text[1:-1].split("+"))
        names = [p.name for p in parts]
        if len(set(names)) != len(names):
            raise ValueError(f"fused dimension {text!r} in spec {whole!r} repeats a part name")
        return DimSplit(parts=parts)
    return DimSplit(steps=_parse_steps(text, whole))


def chunk_range(length: int, k: int, i: int) -> tuple[int, int]:
    """Chunk ``i`` of ``k`` of ``range(length)`` as ``torch.chunk`` cuts it (maybe empty)."""
    size = -(-length // k) if k else 0
    lo = min(i * size, length)
    return lo, min(lo + size, length)


def _take(runs: Runs, lo: int, hi: int) -> Runs:
    """Local indices ``lo:hi`` of the indices ``runs`` holds, as runs."""
    out: Runs = []
    offset = 0
    for a, b in runs:
        n = b - a
        s, e = max(lo - offset, 0), min(hi - offset, n)
        if s < e:
            out.append((a + s, a + e))
        offset += n
        if offset >= hi:
            break
    return out


def _merged(runs: Runs) -> Runs:
    out: Runs = []
    for a, b in runs:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        elif b > a:
            out.append((a, b))
    return out


def _apply(tiles: list[Runs], step: Step, k: int) -> list[Runs]:
    """Each tile's runs split by ``step`` into ``k`` tiles (tile ``t`` -> ``t * k + i``)."""
    _, f = step
    out: list[Runs] = []
    for runs in tiles:
        m = sum(b - a for a, b in runs)
        size = -(-m // f)  # the non-empty pieces of chunk_range(m, f, j): at most min(f, m)
        pieces = [(lo, min(lo + size, m)) for lo in range(0, m, size)] if m else []
        for i in range(k):
            held: Runs = []
            for lo, hi in pieces:
                a, b = chunk_range(hi - lo, k, i)
                held += _take(runs, lo + a, lo + b)
            out.append(_merged(held))
    return out


def _piece_tiles(size: int, steps: tuple[Step, ...], mesh_shape: tuple[int, ...]) -> list[Runs]:
    tiles: list[Runs] = [[(0, size)] if size else []]
    for step in steps:
        tiles = _apply(tiles, step, mesh_shape[step[0]])
    return tiles


_TILE_RUNS: BoundedCache[tuple, tuple[np.ndarray, np.ndarray, np.ndarray, int]] = BoundedCache(
    "core.tile_runs", 256, "the runs of strided / fused dimensions by (split, size, mesh shape)")


def tile_runs(
    split: DimSplit, size: int, mesh_shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``(starts, stops, tiles, count)``: the non-empty runs of a dimension of ``size``, in
    increasing order, each with the tile holding it (tiles number the pieces' chunks: a fused
    dimension's parts in order, each part's chunks row-major over its steps' axes); ``count``
    tiles in all. The runs partition ``range(size)``. Kept (read-only arrays) by ``(split, size,
    mesh_shape)``: every rank's region of a layout reads the same runs."""
    key = (split, int(size), tuple(mesh_shape))
    return _TILE_RUNS.get_or_make(key, lambda: _tile_runs(split, key[1], key[2]))


def _tile_runs(
    split: DimSplit, size: int, mesh_shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    sizes = split.sizes()  # their sum is the size: Layout.check_shape
    rows: list[tuple[int, int, int]] = []
    base = offset = 0
    for steps, n in zip(split.step_lists(), sizes or (size,)):
        tiles = _piece_tiles(n, steps, mesh_shape)
        rows += [(offset + a, offset + b, base + t) for t, runs in enumerate(tiles)
                 for a, b in runs]
        base, offset = base + len(tiles), offset + n
    rows.sort()
    table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    table.flags.writeable = False
    return table[:, 0], table[:, 1], table[:, 2], base


def tiles_of_positions(
    split: DimSplit, coords: np.ndarray, mesh_shape: tuple[int, ...]
) -> list[np.ndarray]:
    """For each piece (part, or the dimension itself), the tile each mesh position holds of it:
    arrays of shape ``(positions,)``; ``coords`` is ``(positions, mesh ndim)``."""
    out = []
    base = 0
    for steps in split.step_lists():
        tile = np.zeros(len(coords), dtype=np.int64)
        count = 1
        for a, _ in steps:
            tile = tile * mesh_shape[a] + coords[:, a]
            count *= mesh_shape[a]
        out.append(base + tile)
        base += count
    return out
