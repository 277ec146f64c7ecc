"""Hypothesis strategies for random meshes, layouts and resharding tasks (shared by tests)."""

from __future__ import annotations

import itertools
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


# -- layouts whose shards are several boxes (strided steps, fused dimensions) --------------------
def _steps_token(draw, axes: list[int], max_factor: int = 4) -> str:
    """``R`` or ``S`` then a random order of ``axes`` (each maybe dropped), each with a random
    split factor 1-4 (``[1]`` written out sometimes: it is plain ``Shard``)."""
    order = [a for a in draw(st.permutations(axes)) if draw(st.booleans()) or len(axes) == 1]
    if not order:
        return "R"
    out = "S"
    for a in order:
        f = draw(st.integers(1, max_factor))
        out += f"{a}" if f == 1 and draw(st.booleans()) else f"{a}[{f}]"
    return out


@st.composite
def part_sizes(draw, n: int) -> list[int]:
    """2-4 sizes (some maybe 0) adding up to ``n``."""
    k = draw(st.integers(2, 4))
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=k - 1, max_size=k - 1)))
    bounds = [0, *cuts, n]
    return [b - a for a, b in itertools.pairwise(bounds)]


@st.composite
def rich_specs(draw, mesh: mc.Mesh, shape: tuple[int, ...]) -> str:
    """A spec for ``shape`` on ``mesh``, each dimension plain, strided (split factors 1-4) or
    fused (2-4 named parts of random sizes, each with its own steps over the dimension's axes,
    ``R`` parts and parts on different axes included). Each mesh axis splits one dimension."""
    ndim = len(shape)
    dims: list[list[int]] = [[] for _ in range(ndim)]
    for axis in range(mesh.ndim):
        target = draw(st.integers(-1, ndim - 1))  # -1: the axis holds replicas
        if target >= 0:
            dims[target].append(axis)
    tokens = []
    for d, axes in enumerate(dims):
        kind = draw(st.sampled_from(["plain", "strided", "fused"]))
        if kind == "fused" and shape[d] > 0:
            parts = [
                f"p{i}={size}:" + (_steps_token(draw, axes) if axes and draw(st.integers(0, 3))
                                   else "R")
                for i, size in enumerate(draw(part_sizes(shape[d])))
            ]
            tokens.append("{" + "+".join(parts) + "}")
        elif axes:
            tokens.append(_steps_token(draw, axes, 4 if kind == "strided" else 1))
        else:
            tokens.append("R")
    return "".join(tokens)


@st.composite
def rich_tasks(draw, dtype: str = "int32", max_devices: int = 8) -> mc.ReshardTask:
    """A task between strided / fused / plain layouts on meshes that are disjoint, overlapping
    or identical; shapes uneven, with empty pieces (and empty dimensions)."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 12), min_size=ndim, max_size=ndim)))
    src_mesh = draw(meshes(max_devices=max_devices, rank_pool=12))
    relation = draw(st.sampled_from(["disjoint", "overlapping", "identical"]))
    if relation == "identical":
        dst_mesh = src_mesh
    else:
        dst_mesh = draw(meshes(max_devices=max_devices, rank_pool=12))
        if relation == "disjoint":
            dst_mesh = mc.Mesh(dst_mesh.array + 12)
    src = mc.Layout(src_mesh, draw(rich_specs(src_mesh, shape)))
    dst = mc.Layout(dst_mesh, draw(rich_specs(dst_mesh, shape)))
    return mc.ReshardTask(shape, dtype, src, dst)
