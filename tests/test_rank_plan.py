"""``meshcast.rank_plan``: one rank's operations equal the full plan filtered by that rank, in
plan order; on the regular family (every source rank sends one slice to every destination rank,
above AUTO_SIM_LIMIT slices, no NIC shared) they come without building the plan."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshcast as mc
from meshcast.core.ops import op_to_json
from meshcast.planning import planner
from meshcast.planning.rank import regular_family


def all_to_all(a: int, c: int, rows: int = 1, cols: int = 1, dtype: str = "float32",
               src: str = "S01R", dst: str = "RS01", same_mesh: bool = False, seed: int = -1
               ) -> tuple[mc.ReshardTask, mc.Topology]:
    """``a x 8`` ranks to ``c x 8`` ranks (disjoint unless ``same_mesh``) on ``h100x8`` hosts;
    with ``seed >= 0`` each mesh lists its ranks in a shuffled order."""
    first = 0 if same_mesh else a * 8
    meshes = [np.arange(0, a * 8).reshape(a, 8), np.arange(first, first + c * 8).reshape(c, 8)]
    if seed >= 0:
        rng = np.random.default_rng(seed)
        meshes = [rng.permutation(m.ravel()).reshape(m.shape) for m in meshes]
    task = mc.ReshardTask(
        (a * 8 * c * 8 * rows, c * 8 * cols), dtype,
        mc.Layout(mc.Mesh(meshes[0]), src), mc.Layout(mc.Mesh(meshes[1]), dst),
    )
    hosts = a if same_mesh else a + c
    return task, mc.Topology.preset("h100x8", hosts)


def filtered(p: mc.Plan, rank: int) -> tuple[mc.Op, ...]:
    return tuple(p.ops[i] for i in p.ops_of(rank))


def check_every_rank(task: mc.ReshardTask, topo: mc.Topology, **options) -> None:
    """rank_plan of every rank (and one rank outside the job) equals the full plan filtered."""
    mc.clear_caches(["planning.plan", "planning.rank"])
    mine = {r: mc.rank_plan(task, topo, r, **options) for r in [*topo.ranks, 10**6]}
    full = mc.plan(task, topo, cache=False, **options)
    for r, ops in mine.items():
        assert ops == filtered(full, r), r
    assert sum(len(ops) for ops in mine.values()) >= len(full.ops)


@settings(max_examples=12, deadline=None)
@given(
    a=st.integers(9, 11),
    c=st.integers(8, 10),
    rows=st.integers(1, 2),
    cols=st.integers(1, 3),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(-1, 3),
)
def test_regular_family_equals_filtered_plan(a, c, rows, cols, dtype, seed):
    task, topo = all_to_all(a, c, rows, cols, dtype, seed=seed)
    assert regular_family(task, topo) is not None  # the fast path applies
    check_every_rank(task, topo)


def test_fast_path_builds_no_plan(monkeypatch):
    task, topo = all_to_all(9, 9)
    mc.clear_caches(["planning.plan", "planning.rank"])

    def refuse(*args, **kwargs):
        raise AssertionError("the full plan was built")

    monkeypatch.setattr(planner, "auto_plan", refuse)
    ops = mc.rank_plan(task, topo, 3)
    assert len(ops) == 72 and all(isinstance(op, mc.Send) and op.src == 3 for op in ops)
    assert mc.rank_plan(task, topo, 80) and mc.rank_plan(task, topo, 500) == ()
    assert mc.cache_info()["planning.plan"].size == 0
    monkeypatch.undo()
    assert ops == filtered(mc.plan(task, topo), 3)
    assert mc.rank_plan(task, topo, 3, strategy="broadcast", balance="auto") == ops


@pytest.mark.parametrize(
    "case",
    [
        dict(same_mesh=True),  # every rank holds part of what it needs: copies, no family
        dict(src="S0R"),  # 8 holders per source tile (and under AUTO_SIM_LIMIT slices)
        dict(balance="none"),  # a fixed plan
    ],
)
def test_fallback_equals_filtered_plan(case):
    options = {k: case.pop(k) for k in ("balance",) if k in case}
    task, topo = all_to_all(9, 9, **case)
    check_every_rank(task, topo, **options)
    if not options:
        assert regular_family(task, topo) is None
    assert mc.cache_info()["planning.plan"].size == 1  # built once, filtered per rank


def test_fallback_on_shared_nics():
    task, _ = all_to_all(9, 8)
    topo = mc.Topology.uniform(17, 8, nic_gbps=100.0)  # one NIC per 8 ranks: no certificate
    assert regular_family(task, topo) is None
    mc.clear_caches(["planning.plan"])
    p = mc.plan(task, topo)
    for r in (0, 71, 72, 135):
        assert mc.rank_plan(task, topo, r) == filtered(p, r)


def test_cached_plan_is_filtered():
    task, topo = all_to_all(9, 9)
    mc.clear_caches(["planning.plan", "planning.rank"])
    p = mc.plan(task, topo)
    assert mc.rank_plan(task, topo, 7) == filtered(p, 7)
    assert mc.cache_info()["planning.rank"].size == 0  # served from the plan, no family made


def test_bad_arguments():
    task, topo = all_to_all(9, 9)
    with pytest.raises(TypeError, match="rank must be an integer, got '3'"):
        mc.rank_plan(task, topo, "3")
    with pytest.raises(TypeError, match="rank must be an integer, got True"):
        mc.rank_plan(task, topo, True)
    with pytest.raises(ValueError, match="strategy='ring' is unknown"):
        mc.rank_plan(task, topo, 0, strategy="ring")
    with pytest.raises(TypeError, match=r"task must be a meshcast\.ReshardTask"):
        mc.rank_plan(None, topo, 0)


def test_same_in_two_processes():
    """Pure and deterministic: a fresh process computes the same operations (by their JSON)."""
    code = (
        "import json, sys; sys.path.insert(0, 'tests'); import meshcast as mc;"
        "from meshcast.core.ops import op_to_json;"
        "from test_rank_plan import all_to_all;"
        "task, topo = all_to_all(9, 10, seed=1);"
        "ops = [op for r in (5, 100) for op in mc.rank_plan(task, topo, r)];"
        "print(json.dumps([op_to_json(op) for op in ops]))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    task, topo = all_to_all(9, 10, seed=1)
    here = [op_to_json(op) for r in (5, 100) for op in mc.rank_plan(task, topo, r)]
    assert json.loads(other) == here and len(here) == 80 + 72
