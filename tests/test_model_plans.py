"""Whole-model weight syncs on paper (meshcast.bench.model_plans, ``meshcast bench model-plans``):
the task lists of the full models (counted, not planned), and tiny versions planned, checked,
moved with the reference executor and simulated as one job. Exact facts only, never a time."""

from __future__ import annotations

import numpy as np
import pytest

import meshcast as mc
from meshcast.bench.model_plans import (
    MoeSizes,
    kimi_k2_tasks,
    llama70b_tasks,
    split_layers,
    sync_order,
)
from meshcast.cli import main

TINY_LLAMA = dict(layers=3, hidden=24, heads=4, kv_heads=2, head_dim=4, intermediate=40,
                  vocab=36, pp=2, tp=2, dp=2, dtype="float32")
TINY_MOE = MoeSizes(layers=3, dense_layers=1, hidden=16, dense_intermediate=24, experts=8,
                    shared=1, expert_intermediate=6, heads=2, q_lora=6, kv_lora=4, qk_nope=2,
                    qk_rope=2, v_head=2, vocab=20)


def llama_params(layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, **_) -> int:
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    return layers * (attention + 3 * hidden * intermediate + 2 * hidden) + 2 * vocab * hidden \
        + hidden


def kimi_params(m: MoeSizes) -> int:
    attention = (m.q_lora * m.hidden + m.q_lora + m.heads * (m.qk_nope + m.qk_rope) * m.q_lora
                 + (m.kv_lora + m.qk_rope) * m.hidden + m.kv_lora
                 + m.heads * (m.qk_nope + m.v_head) * m.kv_lora + m.hidden * m.heads * m.v_head
                 + 2 * m.hidden)
    moe = (m.experts * m.hidden + m.experts + 3 * m.experts * m.expert_intermediate * m.hidden
           + 3 * m.shared * m.expert_intermediate * m.hidden)
    return (m.layers * attention + m.dense_layers * 3 * m.dense_intermediate * m.hidden
            + (m.layers - m.dense_layers) * moe + 2 * m.vocab * m.hidden + m.hidden)


def test_full_models_have_the_published_sizes():
    llama = llama70b_tasks()
    assert len(llama.tasks) == 80 * 9 + 3
    assert llama.num_params == llama_params(80, 8192, 64, 8, 128, 28672, 128256)
    assert llama.num_params == 70_553_706_496
    assert llama.topology.num_hosts == 12 and llama.topology.nics_per_host == (8,) * 12
    kimi = kimi_k2_tasks()
    assert len(kimi.tasks) == 1 + 61 * 9 + 3 + 60 * 8 + 2
    assert kimi.num_params == kimi_params(MoeSizes()) == 1_026_408_232_448
    assert kimi.topology.num_hosts == 48
    assert {t.src.mesh.size for t in kimi.tasks} == {32} and {t.dst.mesh.size for t in
                                                              kimi.tasks} == {128}
    experts = [t for n, t in zip(kimi.names, kimi.tasks) if ".mlp.experts." in n]
    assert len(experts) == 180 and {t.shape[0] for t in experts} == {384}
    assert {(t.src.spec, t.dst.spec) for t in experts} == {("S01RR", "S01RR")}


def test_split_layers():
    assert [len(r) for r in split_layers(61, 8)] == [8, 8, 8, 8, 8, 7, 7, 7]
    assert split_layers(2, 3) == [range(0, 1), range(1, 2), range(2, 2)]


@pytest.mark.parametrize("kind", ["llama", "kimi"])
def test_tiny_model_plans_are_cached_checked_and_exact(kind):
    if kind == "llama":
        sync = llama70b_tasks(**TINY_LLAMA)
        assert len(sync.tasks) == 3 * 9 + 3
        assert sync.num_params == llama_params(**TINY_LLAMA)
    else:
        sync = kimi_k2_tasks(TINY_MOE, pp=2, stage_hosts=2, engine_hosts=2, gpus_per_host=2,
                             dtype="float32")
        assert len(sync.tasks) == 1 + 3 * 9 + 3 + 2 * 8 + 2
        assert sync.num_params == kimi_params(TINY_MOE)
    mc.clear_plan_cache()
    plans = mc.plan_many(sync.tasks, sync.topology)
    again = mc.plan_many(sync.tasks, sync.topology)
    assert all(a is b for a, b in zip(plans, again)) and len(again) == len(sync.tasks)
    assert mc.plan_cache_info()["hits"] == 1
    rng = np.random.default_rng(0)
    for plan in plans:
        plan.check()
        x = rng.standard_normal(plan.task.shape).astype(np.float32)
        out = mc.execute_local(plan, mc.scatter(x, plan.task.src))
        assert np.array_equal(mc.gather(out, plan.task.dst), x)
    joint = mc.simulate_many(plans)
    assert len(joint.start_s) == sum(len(p.ops) for p in plans)
    assert joint.time_s >= mc.joint_lower_bound(sync.tasks, sync.topology)
    assert joint.time_s >= max(mc.simulate(p).time_s for p in plans)


def test_simulate_many_of_one_plan_is_simulate():
    sync = llama70b_tasks(**TINY_LLAMA)
    plan = mc.plan_many(sync.tasks, sync.topology)[3]
    one, many = mc.simulate(plan), mc.simulate_many([plan])
    assert one.time_s == many.time_s and one.kinds == many.kinds
    for field in ("start_s", "transfer_s", "end_s", "host_bytes_in", "host_bytes_out"):
        assert np.array_equal(getattr(one, field), getattr(many, field))
    with pytest.raises(ValueError, match="at least one plan"):
        mc.simulate_many([])


def test_sync_order_takes_broadcasts_first_then_stages_in_turn():
    sync = kimi_k2_tasks(TINY_MOE, pp=2, stage_hosts=2, engine_hosts=2, gpus_per_host=2)
    order = sync_order(sync.tasks)
    assert sorted(order) == list(range(len(sync.tasks)))
    experts = [k for k, n in enumerate(sync.names) if ".mlp.experts." in n]
    assert order[-len(experts):] == [experts[0], experts[3], experts[1], experts[4], experts[2],
                                     experts[5]]  # layer 1 on stage 0, layer 2 on stage 1
    first = [sync.names[k] for k in order[:3]]
    assert first == ["model.embed_tokens.weight", "model.layers.2.input_layernorm.weight",
                     "model.layers.0.input_layernorm.weight"]


def test_bench_model_plans_command(capsys):
    assert main(["bench", "model-plans", "--layers", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    llama, kimi = llama70b_tasks(layers=1), kimi_k2_tasks(MoeSizes(layers=1))
    assert f"Llama-70B {llama.num_params:,}, Kimi-K2 {kimi.num_params:,}" in out
    assert "1.3 s: Kimi-K2, 256 training GPUs" in out and "1.447 s" in out
    assert main(["bench", "model-plans", "--layers", "0"]) == 2
