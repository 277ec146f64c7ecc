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
    # nothing crosses hosts (copies only): no latency is owed, the bound is the tasks' own, 0
    local = ReshardTask((16, 17), "float32", Layout(Mesh([0, 1]), "RR"), Layout(Mesh([0]), "RR"))
    assert joint_lower_bound([local], Topology.uniform(2, 2, latency_us=30.0)) == 0.0


def test_two_job_model_sizes_and_exact_values() -> None:
    import torch

    from meshcast.bench.weight_jobs import model_tasks, size_config, values

    for mib in (16, 1536):
        tasks = model_tasks(size_config(mib))
        nbytes = sum(t.nbytes for t in tasks.values())
        assert 0.8 * mib < nbytes / 2**20 < 1.25 * mib  # about the size asked for
        assert all(t.dtype == "bfloat16" for t in tasks.values())
    assert sum(t.nbytes for t in model_tasks(size_config(1536)).values()) >= 2**30  # >= 1 GiB
    task = ReshardTask((6, 10), "bfloat16", Layout(Mesh([0, 1]), "S0R"),
                       Layout(Mesh([4, 5]), "RS0"))
    full = values(task, 3, (slice(0, 6), slice(0, 10)), 2)
    box = (slice(3, 6), slice(5, 10))
    assert torch.equal(values(task, 3, box, 2), full[box])  # any box: the same elements
    assert torch.equal(full.float() * 8, (full.float() * 8).round())  # exact in bfloat16
    assert not torch.equal(values(task, 3, box, 1), values(task, 3, box, 2))


def test_two_job_rows_take_the_slowest_rank_of_both_jobs() -> None:
    from meshcast.cli.bench_weight_jobs import summary

    ranks = [{"meshcast": {"times": [1.0, 4.0], "peak": 5, "nic": 100, "bad": []}},
             {"meshcast": {"times": [2.0, 1.0], "peak": 9, "nic": None, "bad": []}}]
    assert summary("meshcast", ranks, 2) == (3.0, 100, 9)
    ranks[1]["meshcast"]["bad"] = ["wte.weight"]
    with pytest.raises(RuntimeError, match="meshcast: wrong weights"):
        summary("meshcast", ranks, 2)


def test_a_host_subset_refuses_hosts_the_cluster_does_not_have() -> None:
    from meshcast.cluster import Cluster
    from meshcast.cluster.subset import HostSubset

    fake = Cluster("mc-x", 4, 1.0, 0.0)  # never built: plain data
    part = HostSubset(fake, [2, 3])
    assert (part.num_hosts, part.host_addr(0), part.name) == (2, fake.host_addr(2), "mc-x[2,3]")
    assert part.topology(2).hosts == ((0, 1), (2, 3))
    with pytest.raises(ValueError, match="distinct hosts of cluster 'mc-x'"):
        HostSubset(fake, [3, 4])


def test_the_fp8_row_keeps_block_aligned_matrices_in_fp8_and_checks_their_rounding() -> None:
    import torch

    from meshcast import quantize
    from meshcast.bench.weight_fp8 import engine_specs, fp8_tasks, wrong_fp8

    src = Layout(Mesh([0, 1]), "S0R")
    tasks = {"w": ReshardTask((256, 512), "bfloat16", src, Layout(Mesh([2, 3]), "RS0")),
             "cut": ReshardTask((256, 200), "bfloat16", src, Layout(Mesh([2, 3]), "RS0")),
             "b": ReshardTask((384,), "bfloat16", Layout(Mesh([0, 1]), "S0"),
                              Layout(Mesh([2, 3]), "R"))}
    engine = {"w": Layout(Mesh([0, 1]), "RS0"), "cut": Layout(Mesh([0, 1]), "RS0"),
              "b": Layout(Mesh([0, 1]), "R")}  # the destinations in the engine's own ranks
    specs = engine_specs(tasks, engine)
    assert {n: str(s.dtype) for n, s in specs.items()} == {
        "w": "torch.float8_e4m3fn", "w_scale_inv": "torch.float32",
        "cut": "torch.bfloat16", "b": "torch.bfloat16"}  # 200 / 2 columns cut a block
    assert tuple(specs["w_scale_inv"].shape) == (2, 4)
    assert [t.dtype for t in fp8_tasks(tasks, engine).values()] == [
        "float8_e4m3fn", "bfloat16", "bfloat16"]
    full = (torch.arange(256 * 512).view(256, 512) % 251 - 125).to(torch.bfloat16) / 8
    q, scales = quantize(full, "float8_e4m3fn", (128, 128))
    assert wrong_fp8({"w": q, "w_scale_inv": scales}, {"w": full}) == []
    bad = q.clone()
    bad.view(torch.uint8)[5, 7] ^= 0x40  # one wrong FP8 value
    assert wrong_fp8({"w": bad, "w_scale_inv": scales}, {"w": full}) == ["w"]
