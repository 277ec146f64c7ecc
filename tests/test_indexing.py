"""``meshcast.core.indexing`` and ``planning.exact_rounds.by_round``: the same arrays as
the numpy routines they stand for, through the table where keys are small and by sorting or
binary search where they are not."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from meshcast.core.indexing import concat_ranges, position_coder, unique_inverse, unique_rows
from meshcast.planning.exact_rounds import by_round

keys = st.lists(st.integers(0, 60), max_size=40) | st.lists(st.integers(0, 10**12), max_size=40)


@settings(max_examples=80, deadline=None)
@given(keys)
def test_unique_inverse_is_numpys(values):
    a = np.array(values, dtype=np.int64)
    distinct, inverse = unique_inverse(a)
    want, want_inverse = np.unique(a, return_inverse=True)
    assert distinct.tolist() == want.tolist() and inverse.tolist() == want_inverse.tolist()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 12), st.integers(0, 20), st.integers(0, 2**32 - 1))
def test_unique_rows_is_numpys(rows, cols, seed):
    m = np.random.default_rng(seed).random((rows, cols)) < 0.4
    if rows > 2:
        m[-1] = m[0]  # a repeated row
    distinct, inverse = unique_rows(m)
    want, want_inverse = np.unique(m, axis=0, return_inverse=True)
    assert distinct.shape == want.shape and (distinct == want).all()
    assert inverse.tolist() == want_inverse.ravel().tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 4)), max_size=12))
def test_concat_ranges(ranges):
    starts = np.array([a for a, _ in ranges], dtype=np.int64)
    counts = np.array([c for _, c in ranges], dtype=np.int64)
    item, flat = concat_ranges(starts, counts)
    assert item.tolist() == [i for i, (_, c) in enumerate(ranges) for _ in range(c)]
    assert flat.tolist() == [x for a, c in ranges for x in range(a, a + c)]


def test_position_coder_by_table_and_by_search():
    for ranks in ([0, 3, 4, 9], [5, 10**9, 10**12]):  # small ids: a table; huge: a search
        r = np.array(ranks, dtype=np.int64)
        assert position_coder(r)(r[::-1]).tolist() == list(range(len(ranks)))[::-1]


def test_by_round_skips_empty_rounds():
    slots = np.array([0, 0, 2, 2, 2, 5])
    assert [x.tolist() for (x,) in by_round(slots, np.arange(6))] == [[0, 1], [2, 3, 4], [5]]
    assert list(by_round(np.zeros(0, dtype=np.int64), np.zeros(0))) == []
