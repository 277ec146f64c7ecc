"""Acceptance: Llama-style models parallelized the torchtitan way, under the real ``torchrun``
(tests/fsdp_llama_job.py, 8 gloo ranks), have their model and optimizer state resharded by
meshcast exactly.

The models: token embedding, 2 layers of grouped-query attention (q 4 heads, k/v 2), RMSNorm
and SwiGLU (hidden 42, uneven over 4), final norm, output head; vocab 37 (uneven everywhere).
``parallelize_module`` (vocab-parallel embedding, column-parallel q/k/v/w1/w3/output,
row-parallel wo/w2, sequence-parallel norms), then ``fully_shard`` per layer and on the root,
one Adam step. Cases:

* FSDP2 (dp 4) x TP 2 on ranks 0-7, fp32: ``model.state_dict()`` to TP 4 on ranks 4-7 and to
  two TP 4 engines (a sub-mesh ``["tp"]`` of a (2, 4) root), ``get_model_state_dict`` to TP 2 on
  ranks 1-2; the optimizer state (``exp_avg``, ``exp_avg_sq``, the scalar ``step`` replicated)
  to FSDP 8 and to FSDP 2 x TP 2 on ranks 2-5; ``named_parameters()`` and the optimizer state
  into the parameters' own layouts of a real FSDP2 (dp 2) x TP 4 model (``_StridedShard``
  destinations), loaded with ``load_state_dict`` / ``set_optimizer_state_dict`` and compared.
* HSDP (replicate 2 x shard 2) x TP 2, tied embedding and head, bf16 mixed precision: to TP 4 on
  ranks 0-3 as fp32 and cast to bf16 on the source (meshcast moves the dtype it is given: no
  conversion on the way), the tied parameter itself by ``reshard_dtensor``, the optimizer state
  to FSDP 4 on ranks 4-7.

Every destination shard equals the source's ``full_tensor()`` cut as the destination placements
say (``distribute_tensor(..., src_data_rank=None)``), byte for byte; a plain ``step`` tensor
among DTensors is refused with the documented rule.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("fsdp_llama_job.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
WORLD = 8
CASES = ("fsdp_tp -> tp4", "fsdp_tp dcp -> tp2", "fsdp_tp -> 2 engines x tp4",
         "optim -> fsdp8", "optim -> fsdp2xtp2", "into fsdp2xtp4 model", "hsdp -> tp4",
         "hsdp bf16 -> tp4", "hsdp tied parameter -> tp2", "hsdp optim -> fsdp4")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp_llama")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    proc = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", str(WORLD), str(JOB), str(out)],
        capture_output=True, text=True, timeout=400, env=env,
    )
    assert proc.returncode == 0, f"the job exited with {proc.returncode}:\n{proc.stderr[-4000:]}"
    assert "terminate called" not in proc.stderr
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.timeout(450)
def test_the_sources_are_what_fsdp2_and_tp_make(reports: list[dict]) -> None:
    import meshcast

    assert reports[0]["meshcast"] == meshcast.__file__
    fsdp_tp, hsdp = reports[0]["fsdp_tp placements"], reports[0]["hsdp placements"]
    strided = "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    for name in ("tok_embeddings.weight", "layers.1.attention.wk.weight", "output.weight"):
        assert fsdp_tp[name] == strided
        assert hsdp[name] == f"(Replicate(), {strided[1:]}"
    assert fsdp_tp["layers.0.feed_forward.w2.weight"] == "(Shard(dim=0), Shard(dim=1))"
    assert fsdp_tp["norm.weight"] == "(Shard(dim=0), Replicate())"
    assert all(report["hsdp tied"] is True for report in reports)
    keys = reports[0]["optim keys"]
    assert "layers.0.attention.wq.weight.exp_avg_sq" in keys
    assert "output.weight.step" in keys and len(keys) == 3 * len(fsdp_tp)


@pytest.mark.timeout(450)
def test_every_reshard_is_exact_on_every_rank(reports: list[dict]) -> None:
    for rank, report in enumerate(reports):
        for case in CASES:
            assert report[case] == [], (rank, case, report[case])


@pytest.mark.timeout(450)
def test_a_plain_step_tensor_is_refused_with_the_rule(reports: list[dict]) -> None:
    for report in reports:
        kind, name, text = report["plain step refused"]
        assert (kind, name) == ("error", "TypeError")
        assert text.startswith("state_dict['tok_embeddings.weight.step'] must be a DTensor like "
                               "the other entries"), text
        assert "DTensor.from_local(t, mesh, [Replicate()])" in text
