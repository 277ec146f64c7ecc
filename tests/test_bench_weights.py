"""``meshcast bench weights``' library code (meshcast.bench.weight_sync): a job's per-rank
results become one row, wrong weights are an error, and the joint lower bound of the tasks."""

from __future__ import annotations

import pytest

from meshcast import Layout, Mesh, ReshardTask, Topology, lower_bound
from meshcast.bench.weight_sync import joint_lower_bound, summarise


def _rank(times, peak, nic, bad=()):
    return {"times": times, "peak": peak, "nic_bytes": nic, "bad": list(bad), "nic_known": True,
            "nbytes": 1000}


def test_a_row_is_the_median_of_the_slowest_rank_per_sync() -> None:
    results = [_rank([1.0, 3.0, 2.0], 10, 400), _rank([2.0, 1.0, 2.5], 30, 0)]
    assert summarise("meshcast", results, 3) == ("meshcast", 2.5, 400, 30, 1000)
    unknown = [{**r, "nic_known": False} for r in results]
    assert summarise("meshcast", unknown, 3)[2] is None


def test_wrong_weights_are_an_error_naming_them() -> None:
    results = [_rank([1.0], 0, 0, ["wte.weight"]), _rank([1.0], 0, 0, ["lm_head.weight"])]
    with pytest.raises(RuntimeError, match=r"full-tensor: wrong weights \['lm_head.weight', "):
        summarise("full-tensor", results, 1)


def test_joint_lower_bound_adds_the_inbound_bytes_of_all_tasks() -> None:
    topo = Topology.uniform(2, 2, nic_gbps=1.0, latency_us=0.0)
    task = ReshardTask((1024, 256), "float32", Layout(Mesh([0, 1]), "S0R"),
                       Layout(Mesh([2, 3]), "RR"))
    one = lower_bound(task, topo)
    assert joint_lower_bound([task], topo) == pytest.approx(one)
    assert joint_lower_bound([task, task], topo) == pytest.approx(2 * one)
