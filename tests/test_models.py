"""The reference models: deterministic init, stage splits equal to the whole model, stage graphs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from meshcast.models import gpt, utransformer  # noqa: E402
from meshcast.pipeline import StageGraph, TensorEdge  # noqa: E402

GPT_CFG = gpt.GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=32)
UT_CFG = utransformer.UTransformerConfig(in_dim=8, dim=16, levels=2, n_head=2, seq_len=16)


def _gpt_case():
    model = gpt.GPT(GPT_CFG, seed=0)
    idx = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    return model, {"idx": idx}, "logits", lambda n: gpt.stage_graph(GPT_CFG, n, 3, 16)


def _ut_case():
    model = utransformer.UTransformer(UT_CFG, seed=0)
    x = torch.randn(3, 16, 8, generator=torch.Generator().manual_seed(1))
    return model, {"x": x}, "out", lambda n: utransformer.stage_graph(UT_CFG, n, 3)


CASES = {"gpt": (_gpt_case, gpt, 4), "utransformer": (_ut_case, utransformer, 5)}


def _full_output(model, data):
    return model(next(iter(data.values())))


def pipelined_step(stages, graph: StageGraph, data, output: str):
    """What a pipeline runtime does for one microbatch: every stage on its own autograd graph,
    tensors detached at stage boundaries, gradients passed back along the same edges."""
    sent, kept = {}, []
    for i, stage in enumerate(stages):
        inputs = {a: data[a] for a, s in graph.inputs if s == i}
        received = {
            e.name: sent[(e.src, e.name)].detach().requires_grad_() for e in graph.receives(i)
        }
        result = stage({**inputs, **received})
        for e in graph.sends(i):
            assert tuple(result[e.name].shape) == e.shape, (e, result[e.name].shape)
            sent[(i, e.name)] = result[e.name]
        kept.append((received, result))
    out = kept[-1][1][output]
    loss = out.square().mean()
    grads = {}  # (src stage, name) -> gradient of that sent tensor
    for i in reversed(range(len(stages))):
        received, result = kept[i]
        if i == len(stages) - 1:
            torch.autograd.backward([loss])
        else:
            names = [e.name for e in graph.sends(i)]
            torch.autograd.backward([result[n] for n in names], [grads[(i, n)] for n in names])
        for e in graph.receives(i):
            grads[(e.src, e.name)] = received[e.name].grad
    return out, loss


@pytest.mark.parametrize("which", CASES)
def test_stages_reproduce_the_model_forward_and_backward(which: str) -> None:
    make, module, max_stages = CASES[which]
    model, data, output, graph_of = make()
    want = _full_output(model, data)
    want.square().mean().backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for n in range(1, max_stages + 1):
        model.zero_grad()
        stages = module.split_stages(model, n)
        graph = graph_of(n)
        # every parameter belongs to exactly one stage
        owned = [id(p) for s in stages for p in s.parameters()]
        assert sorted(owned) == sorted(id(p) for p in model.parameters())
        assert torch.equal(graph.run_sequential(stages, data)[output], want)
        out, _ = pipelined_step(stages, graph, data, output)
        assert torch.equal(out, want)
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, want_grads[name], rtol=1e-5, atol=1e-7)


def test_init_is_deterministic_and_independent_of_the_global_rng() -> None:
    torch.manual_seed(123)
    a = gpt.GPT(GPT_CFG, seed=7)
    torch.manual_seed(456)
    b = gpt.GPT(GPT_CFG, seed=7)
    c = gpt.GPT(GPT_CFG, seed=8)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), n
        if n.endswith("weight") and ".ln_" not in n and not n.startswith("ln_"):
            assert not torch.equal(p, r), n
    u1, u2 = utransformer.UTransformer(UT_CFG, 3), utransformer.UTransformer(UT_CFG, 3)
    assert all(torch.equal(p, q) for p, q in zip(u1.parameters(), u2.parameters()))


def g_run(stages, idx):
    return gpt.stage_graph(GPT_CFG, len(stages), 2, 16).run_sequential(stages, {"idx": idx})[
        "logits"]


def test_gpt_graph() -> None:
    g = gpt.stage_graph(GPT_CFG, 3, batch_size=4, seq_len=16, dtype="bfloat16")
    assert g.edges == (
        TensorEdge("hidden", 0, 1, (4, 16, 32), "bfloat16"),
        TensorEdge("hidden", 1, 2, (4, 16, 32), "bfloat16"),
    )
    assert g.edges[0].nbytes == 4 * 16 * 32 * 2
    assert g.receive_names(0) == ("idx",) and g.send_names(2) == ("logits",)
    assert [list(r) for r in gpt.split_layers(10, 4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [list(r) for r in gpt.split_layers(4, 3, [2, 2, 0])] == [[0, 1], [2, 3], []]
    with pytest.raises(ValueError, match="summing"):
        gpt.split_layers(4, 2, [1, 2])
    model = gpt.GPT(GPT_CFG)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    stages = gpt.split_stages(model, 3, [0, 3, 1])  # stage 0: embedding only
    assert torch.equal(g_run(stages, idx), model(idx))
    with pytest.raises(ValueError, match="num_stages"):
        gpt.split_stages(gpt.GPT(GPT_CFG), 5)


def test_utransformer_skips_go_to_non_adjacent_stages() -> None:
    assert utransformer.split_units(2, 4) == [["down0", "down1"], ["middle"], ["up1"], ["up0"]]
    g = utransformer.stage_graph(UT_CFG, 4, batch_size=2)
    assert g.edges == (
        TensorEdge("hidden", 0, 1, (2, 4, 64)),
        TensorEdge("hidden", 1, 2, (2, 4, 64)),
        TensorEdge("hidden", 2, 3, (2, 8, 32)),
        TensorEdge("skip0", 0, 3, (2, 16, 16)),
        TensorEdge("skip1", 0, 2, (2, 8, 32)),
    )
    assert g.receive_names(3) == ("hidden", "skip0")
    assert g.send_names(0) == ("hidden", "skip0", "skip1")
    # two stages (the paper's setting): both skips cross the one boundary
    g2 = utransformer.stage_graph(UT_CFG, 2, batch_size=2)
    assert {(e.name, e.src, e.dst) for e in g2.edges} == {
        ("hidden", 0, 1), ("skip0", 0, 1), ("skip1", 0, 1)}
    links = g2.links(lambda e: e.nbytes / 1e9)
    assert [(link.src, link.dst, link.name) for link in links] == [
        (0, 1, "hidden"), (0, 1, "skip0"), (0, 1, "skip1")]
    with pytest.raises(ValueError, match="divisible"):
        utransformer.UTransformerConfig(seq_len=10, levels=2)


def test_stage_graph_checks() -> None:
    with pytest.raises(ValueError, match="src < dst"):
        StageGraph(2, (TensorEdge("h", 1, 0, (1,)),))
    with pytest.raises(ValueError, match="two tensors of one name"):
        StageGraph(3, (TensorEdge("h", 0, 2, (1,)), TensorEdge("h", 1, 2, (1,))))
    g = StageGraph(2, (TensorEdge("h", 0, 1, (1,)),), inputs=(("x", 0),), outputs=(("y", 1),))
    with pytest.raises(ValueError, match="returned"):
        g.run_sequential([lambda d: {"oops": 1}, lambda d: {"y": d["h"]}], {"x": 0})
    assert g.run_sequential([lambda d: {"h": d["x"] + 1}, lambda d: {"y": d["h"] * 2}],
                            {"x": 1}) == {"y": 4}
