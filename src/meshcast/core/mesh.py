"""Device meshes: n-D arrays of distinct global ranks."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .checks import as_index

__all__ = ["MAX_MESH_RANKS", "Mesh"]


MAX_MESH_RANKS = 1 << 22
"""The most ranks :meth:`Mesh.from_range` makes (4,194,304: a plan of thousands of ranks needs
memory per rank; a mesh of 10^12 ranks from a typo would exhaust it first)."""


class Mesh:
    """An n-D array of distinct global ranks, e.g. ``Mesh([[0, 1, 2, 3], [4, 5, 6, 7]])``.

    A mesh is a small immutable value: equal meshes compare equal and hash alike. In the paper's
    convention a 2-D mesh is (hosts, devices per host).
    """

    __slots__ = ("_devices", "_hash", "_index", "_shape")

    def __init__(self, devices: Any) -> None:
        if isinstance(devices, Mesh):
            devices = devices.array
        try:
            array = np.asarray(devices)
        except ValueError:  # ragged nesting
            raise ValueError(f"devices must be a rectangular array of ranks (every row of one "
                             f"length), got {devices!r:.200}") from None
        if array.ndim == 0:
            raise ValueError(
                f"devices must be an array of ranks with at least one axis, got {devices!r}"
            )
        if array.size == 0:
            raise ValueError(f"devices must not be empty, got shape {array.shape}")
        if array.dtype in (object, np.uint64) and any(
            isinstance(r, (int, np.integer)) and not isinstance(r, bool) and int(r) >= 2**63
            for r in array.reshape(-1)
        ):
            raise ValueError(f"devices must be ranks below 2^63, got {devices!r}")
        if array.dtype == object or not (
            np.issubdtype(array.dtype, np.integer) and array.dtype != np.bool_
        ):
            raise TypeError(f"devices must hold integer ranks, got dtype {array.dtype}")
        flat = [int(r) for r in array.reshape(-1)]
        if min(flat) < 0:
            raise ValueError(f"devices must be non-negative ranks, got {min(flat)}")
        if len(set(flat)) != len(flat):
            seen: set[int] = set()
            dup = next(r for r in flat if r in seen or seen.add(r))
            raise ValueError(f"devices must be distinct ranks; rank {dup} appears more than once")
        self._devices: tuple[int, ...] = tuple(flat)
        self._shape: tuple[int, ...] = tuple(int(s) for s in array.shape)
        self._index: dict[int, int] | None = None

    @classmethod
    def from_range(cls, start: int, shape: int | Sequence[int]) -> Mesh:
        """A mesh of consecutive ranks ``start, start+1, ...`` in row-major order."""
        start = as_index(start, "start")
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dims = tuple(as_index(s, "shape") for s in shape)
        if not dims or 0 in dims:
            raise ValueError(f"shape must have at least one axis and no zero axis, got {shape}")
        if start + math.prod(dims) > 2**63:
            raise ValueError(
                f"ranks must be below 2^63: start={start} with {math.prod(dims)} ranks"
            )
        if math.prod(dims) > MAX_MESH_RANKS:
            raise ValueError(f"a mesh of shape {dims} has {math.prod(dims):,} ranks; meshcast "
                             f"plans meshes of at most {MAX_MESH_RANKS:,}")
        return cls((np.arange(math.prod(dims), dtype=np.int64) + start).reshape(dims))

    @property
    def shape(self) -> tuple[int, ...]:
        """Size of each mesh axis."""
        return self._shape

    @property
    def ndim(self) -> int:
        """Number of mesh axes."""
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of devices."""
        return len(self._devices)

    @property
    def devices(self) -> list[int]:
        """The ranks in row-major order."""
        return list(self._devices)

    @property
    def array(self) -> np.ndarray:
        """The ranks as a (fresh) numpy array of the mesh's shape."""
        return np.array(self._devices, dtype=np.int64).reshape(self._shape)

    def __contains__(self, rank: object) -> bool:
        return rank in self._position()

    def position(self, rank: int) -> int | None:
        """Row-major position of ``rank`` in the mesh, or None if it is not in the mesh."""
        return self._position().get(rank)

    def coords(self, rank: int) -> tuple[int, ...] | None:
        """Mesh coordinates of ``rank``, or None if it is not in the mesh."""
        pos = self.position(rank)
        if pos is None:
            return None
        return tuple(int(c) for c in np.unravel_index(pos, self._shape))

    def _position(self) -> dict[int, int]:
        if self._index is None:
            self._index = {r: i for i, r in enumerate(self._devices)}
        return self._index

    def __iter__(self) -> Iterable[int]:
        return iter(self._devices)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Mesh)
            and self._shape == other._shape
            and self._devices == other._devices
        )

    def __hash__(self) -> int:
        try:  # kept after the first call (of integers only: the same in every process)
            return self._hash
        except AttributeError:  # not computed yet (or a mesh pickled before it was kept)
            self._hash: int = hash((self._shape, self._devices))
            return self._hash

    def notation(self) -> str:
        """Short form ``2x4@8`` when the ranks are consecutive, else the list of ranks."""
        dims = "x".join(map(str, self._shape))
        first = self._devices[0]
        if self._devices == tuple(range(first, first + self.size)):
            return dims if first == 0 else f"{dims}@{first}"
        return f"{dims}{list(self._devices)}"

    def __repr__(self) -> str:
        first = self._devices[0]
        if self._devices == tuple(range(first, first + self.size)):
            return f"Mesh.from_range({first}, {self._shape})"
        return f"Mesh({self.array.tolist()})"

    def to_json(self) -> dict[str, Any]:
        """Plain-data form."""
        return {"shape": list(self._shape), "devices": list(self._devices)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Mesh:
        """Inverse of :meth:`to_json`; ``ValueError`` for a missing or malformed field."""
        try:
            return cls(np.asarray(data["devices"], dtype=np.int64).reshape(data["shape"]))
        except KeyError as exc:
            raise ValueError(f"not a complete mesh: the field {exc} is missing") from None
        except (TypeError, AttributeError, OverflowError) as exc:
            raise ValueError(f"not a valid mesh: {exc}") from None
