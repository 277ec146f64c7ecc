"""Whether strided views share memory (runtime/overlap.py): exact against listing every
element's offset, for random views of one buffer and for the views programs make."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from meshcast.runtime.overlap import may_overlap_itself, may_share_memory  # noqa: E402

BASE = torch.zeros(4096, dtype=torch.int32)


def _offsets(t) -> set[int]:
    out = np.zeros(1, dtype=np.int64)
    for n, s in zip(t.shape, t.stride()):
        out = (out[:, None] + np.arange(n)[None, :] * s).ravel()
    return set((out + t.storage_offset()).tolist()) if t.numel() else set()


views = st.builds(
    lambda dims, offset: BASE.as_strided([n for n, _ in dims], [s for _, s in dims], offset),
    st.lists(st.tuples(st.integers(1, 6), st.integers(0, 48)), min_size=1, max_size=3),
    st.integers(0, 300),
)


@settings(max_examples=400, deadline=None)
@given(views, views)
def test_two_views_share_memory_exactly_when_their_elements_meet(a, b) -> None:
    assert may_share_memory(a, b) == bool(_offsets(a) & _offsets(b))


@settings(max_examples=300, deadline=None)
@given(views)
def test_a_view_that_overlaps_itself_is_never_missed(a) -> None:
    if len(_offsets(a)) < a.numel():
        assert may_overlap_itself(a)


def test_views_of_one_large_tensor_are_decided_without_listing() -> None:
    x = torch.zeros(4096, 4096)
    assert not may_share_memory(x[:, :2048], x[:, 2048:])  # fused columns
    assert may_share_memory(x[:, :2048], x[:, 2047:])
    assert not may_share_memory(x[::2], x[1::2])
    assert may_share_memory(x.t()[:10], x[:, 5])
    assert not may_share_memory(x, torch.zeros(4))  # another storage
    assert not may_overlap_itself(x.t()[::3])
    assert may_overlap_itself(torch.zeros(4).expand(3, 4))


def test_the_first_result_sharing_memory_is_named() -> None:
    from meshcast.runtime.overlap import shared_pair

    x = torch.zeros(64, 48)
    assert shared_pair([("a", x[:, :16]), ("b", x[:, 16:32])], [("s", x[:, 32:])]) is None
    assert shared_pair([("a", x[:, :16]), ("b", x[:, 16:32])], [("s", x[:, 30:])]) == ("b", "s")
    assert shared_pair([("a", x[:, :16])], [("s", x[:, 30:]), ("t", x[:, 8])]) == ("a", "t")
    assert shared_pair([], [("s", x), ("t", x)]) is None  # sources may share memory
    flat = torch.zeros(2000 * 100)  # 2,000 results in one buffer, side by side
    assert shared_pair([(f"o{i}", flat[100 * i: 100 * i + 100]) for i in range(2000)], []) is None
