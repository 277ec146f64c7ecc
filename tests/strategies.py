"""Hypothesis strategies for random meshes, layouts and resharding tasks (shared by tests)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

import meshcast as mc


@st.composite
def meshes(draw, max_devices: int = 16, rank_pool: int = 32) -> mc.Mesh:
    """A 1-3 axis mesh of at most ``max_devices`` distinct ranks drawn from ``range(rank_pool)``."""
    ndim = draw(st.integers(1, 3))
    shape: list[int] = []
    for _ in range(ndim):
        room = max_devices // max(1, math.prod(shape))
        shape.append(draw(st.integers(1, max(1, min(4, room)))))
    ranks = draw(st.permutations(range(rank_pool)))[: math.prod(shape)]
    return mc.Mesh(np.array(ranks).reshape(shape))


@st.composite
def specs(draw, mesh: mc.Mesh, ndim: int) -> str:
    """A random spec string: each mesh axis splits at most one tensor dimension."""
    dims: list[list[int]] = [[] for _ in range(ndim)]
    for axis in draw(st.permutations(range(mesh.ndim))):
        target = draw(st.integers(-1, ndim - 1))  # -1: the axis holds replicas
        if target >= 0:
            dims[target].append(axis)
    return "".join("S" + "".join(map(str, d)) if d else "R" for d in dims)


@st.composite
def tasks(draw, dtype: str = "int32") -> mc.ReshardTask:
    """A random task: meshes disjoint, overlapping or identical; shapes uneven or empty."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    src_mesh = draw(meshes())
    dst_mesh = draw(st.one_of(meshes(), st.just(src_mesh)))
    src = mc.Layout(src_mesh, draw(specs(src_mesh, ndim)))
    dst = mc.Layout(dst_mesh, draw(specs(dst_mesh, ndim)))
    return mc.ReshardTask(shape, dtype, src, dst)


def sample_array(task: mc.ReshardTask) -> np.ndarray:
    """Distinct non-zero values (so a missed write shows), in the task's dtype."""
    n = math.prod(task.shape)
    values = np.arange(1, n + 1) % 251 + 1 if task.dtype != "bool" else np.arange(n) % 2
    return values.astype(task.numpy_dtype).reshape(task.shape)
