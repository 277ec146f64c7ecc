"""Integer keys and bool rows to sorted orders and dense codes, in linear time where their
range allows (numpy's general routines sort)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["concat_ranges", "position_coder", "unique_inverse", "unique_rows"]

TABLE_FACTOR = 4
"""A lookup table is used when the keys' range is at most this many times their count (plus a
small constant): then building it costs no more than a few passes over the keys."""


def _table_fits(top: int, count: int) -> bool:
    return top <= TABLE_FACTOR * count + 4096


def unique_inverse(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for a 1-D array of non-negative integers: the
    sorted distinct keys and each key's position among them (int64), the same arrays. Through a
    table over the keys' range (linear time) where that range is small enough, else by sorting
    (16.8 M keys: about 0.3 s against 1.5 s)."""
    keys = np.asarray(keys, dtype=np.int64).ravel()
    top = int(keys.max()) + 1 if len(keys) else 0
    if (len(keys) and keys.min() < 0) or not _table_fits(top, len(keys)):
        distinct, inverse = np.unique(keys, return_inverse=True)
        return distinct, inverse.ravel().astype(np.int64, copy=False)
    present = np.zeros(top, dtype=bool)
    present[keys] = True
    code = np.cumsum(present, dtype=np.int64) - 1
    return np.flatnonzero(present), code[keys]


def position_coder(distinct: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Keys (among the sorted distinct non-negative ``distinct``) to their positions in it:
    through a table where the keys' range is small enough, else a binary search."""
    top = int(distinct[-1]) + 1 if len(distinct) else 0
    if _table_fits(top, len(distinct)):
        table = np.zeros(top, dtype=np.int64)
        table[distinct] = np.arange(len(distinct))
        return table.__getitem__
    return lambda keys: np.searchsorted(distinct, keys)


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)`` for a 2-D bool array, the same arrays,
    with each row packed into bits first (eight columns a byte: the packed rows sort in the
    same order)."""
    packed = np.packbits(rows, axis=1)
    keys, inverse = np.unique(packed, axis=0, return_inverse=True)
    return np.unpackbits(keys, axis=1, count=rows.shape[1]).astype(bool), inverse.ravel()


def concat_ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges ``starts[i] : starts[i] + counts[i]``: each element's range ``i`` and the
    element, flat (``np.repeat(np.arange(n), counts)`` and the ranges concatenated), without a
    loop; the ranges themselves when every one has one element."""
    counts = np.asarray(counts, dtype=np.int64)
    if len(counts) and counts.min() == counts.max() == 1:
        return np.arange(len(counts)), np.asarray(starts, dtype=np.int64)
    if not counts.any():
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    item = np.repeat(np.arange(len(counts)), counts)
    ends = np.cumsum(counts)
    return item, np.arange(int(ends[-1])) + np.repeat(starts - ends + counts, counts)
