"""Plans do not change under refactoring: the planner benchmark suite's tasks (200 seeded random
tasks plus the paper cases, as ``meshcast bench planner`` builds them) planned with every strategy
x balance give byte-identical JSON to the digests recorded before the architecture change
(``tests/data/plan_digests.json``, 2704 plans).

The suite checks every 20th random task and every paper case (234 plans); set
``MESHCAST_PLAN_IDENTITY=all`` to check all 2704 (about ten minutes on 2 cores). A change that is
meant to change plans re-records the digests with ``python tests/test_plan_identity.py --record``
and says why in its commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from meshcast import ReshardTask, Topology, plan
from meshcast.bench.planner_suite import mesh_rows_topology, random_task
from meshcast.core.cases import PAPER_CASES

DIGESTS = Path(__file__).with_name("data") / "plan_digests.json"
COMBOS = [(s, b) for s in ("send_recv", "allgather", "broadcast")
          for b in ("none", "size", "order", "auto")] + [(None, "auto")]
RANDOM_TASKS = 200


def _rows(every: int) -> Iterator[tuple[str, ReshardTask, Topology]]:
    rng = np.random.default_rng(0)
    for i in range(RANDOM_TASKS):
        task = random_task(rng)  # drawn for every i: the seeded sequence must not shift
        if i % every == 0:
            yield f"random{i}", task, mesh_rows_topology(task, "p3.8xlarge")
    for case in PAPER_CASES:
        task = case.task()
        hosts = max(task.dst.mesh.devices) // 4 + 1
        yield case.name, task, Topology.preset("p3.8xlarge", hosts)


def _digests(every: int) -> dict[str, str]:
    out = {}
    for name, task, topology in _rows(every):
        for strategy, balance in COMBOS:
            p = plan(task, topology, strategy=strategy, balance=balance)
            out[f"{name}|{strategy}|{balance}"] = hashlib.sha256(p.to_json().encode()).hexdigest()
    return out


@pytest.mark.timeout(1800)
def test_plans_are_byte_identical_to_the_recorded_ones() -> None:
    every = 1 if os.environ.get("MESHCAST_PLAN_IDENTITY") == "all" else 20
    recorded = json.loads(DIGESTS.read_text())
    now = _digests(every)
    assert len(now) == (RANDOM_TASKS // every + len(PAPER_CASES)) * len(COMBOS)
    changed = sorted(k for k, v in now.items() if recorded.get(k) != v)
    assert changed == [], f"{len(changed)} plans changed, e.g. {changed[:5]}"


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    DIGESTS.write_text(json.dumps(_digests(1), indent=0, sort_keys=True))
