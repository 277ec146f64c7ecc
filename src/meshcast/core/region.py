"""The part of a global tensor one rank holds: per dimension, increasing runs of indices.

A rank's local tensor holds the product of its runs, each dimension's runs concatenated in
order (local order is global order, see splits.py). Most layouts give one run per dimension: the
region is then one box and :meth:`Region.local` is the box-relative slice. Every operation of a
plan lies inside one run per dimension of each region it touches (the planner cuts unit slices
at every run's ends), so it reads or writes one rectangular view of the local tensor.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from .boxes import Box
from .coverage import fmt_box

__all__ = ["Region"]


class Region:
    """Per dimension, the increasing ``(start, stop)`` runs a rank holds (a small value)."""

    __slots__ = ("_offsets", "_starts", "runs")

    def __init__(self, runs: Sequence[Sequence[tuple[int, int]]]) -> None:
        self.runs: tuple[tuple[tuple[int, int], ...], ...] = tuple(
            tuple((int(a), int(b)) for a, b in dim) for dim in runs
        )
        self._starts = [[a for a, _ in dim] for dim in self.runs]
        self._offsets = [list(itertools.accumulate((b - a for a, b in dim), initial=0))
                         for dim in self.runs]

    @classmethod
    def of_box(cls, box: Box) -> Region:
        """The region of one box."""
        return cls([[(s.start, s.stop)] if s.stop > s.start else [] for s in box])

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the local tensor."""
        return tuple(off[-1] for off in self._offsets)

    @property
    def size(self) -> int:
        """Elements held."""
        return math.prod(self.shape)

    @property
    def box(self) -> Box | None:
        """The one box this region is, or None if it is several."""
        if any(len(dim) > 1 for dim in self.runs):
            return None
        return tuple(slice(*dim[0]) if dim else slice(0, 0) for dim in self.runs)

    def boxes(self) -> Iterator[tuple[Box, tuple[slice, ...]]]:
        """Every box of the region with its slice of the local tensor, in local order."""
        per_dim = [
            [(slice(a, b), slice(o, o + b - a)) for (a, b), o in zip(dim, off)]
            for dim, off in zip(self.runs, self._offsets)
        ]
        for combo in itertools.product(*per_dim):
            yield tuple(g for g, _ in combo), tuple(loc for _, loc in combo)

    def local(self, box: Box) -> tuple[slice, ...]:
        """``box`` (global coordinates, inside one run per dimension) as slices of the local
        tensor; ValueError if it is not inside the region that way."""
        out = []
        for d, s in enumerate(box):
            starts = self._starts[d]
            j = bisect.bisect_right(starts, s.start) - 1
            if s.stop == s.start and (j < 0 or s.start > self.runs[d][j][1]):
                out.append(slice(0, 0))  # an empty box is inside any region
                continue
            if j < 0 or s.stop > self.runs[d][j][1]:
                raise ValueError(
                    f"box {fmt_box(box)} is not inside one run of region {self} in dimension {d}"
                )
            a = self._offsets[d][j] + s.start - starts[j]
            out.append(slice(a, a + s.stop - s.start))
        return tuple(out)

    def indices(self) -> tuple[np.ndarray, ...]:
        """Per dimension, the global index of each local index (for ``np.ix_``)."""
        return tuple(
            np.concatenate([np.arange(a, b) for a, b in dim]) if dim else np.zeros(0, np.int64)
            for dim in self.runs
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Region) and self.runs == other.runs

    def __hash__(self) -> int:
        return hash(self.runs)

    def __repr__(self) -> str:
        return "Region(" + " x ".join(
            "+".join(f"{a}:{b}" for a, b in dim) or "-" for dim in self.runs) + ")"
