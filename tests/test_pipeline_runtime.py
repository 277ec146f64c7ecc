"""The pipeline runtime on real gloo processes against the same model trained in one process.

One ``meshcast.launch`` of 4 ranks runs every job (process start with torch costs seconds): both
models, every schedule x every strategy on 2 stages x 2 ranks (tensor-parallel 2 inside each
stage), plus unequal tensor-parallel degrees, sharded boundary layouts, and 3 stages where the
U-Transformer's skip goes to a non-adjacent stage. Each job trains 2 SGD steps (momentum 0.9) on
4 microbatches. The parent trains the whole model in one process on the whole batch and compares
the losses and the final parameters of every rank's (tensor-parallel) stage.

Tolerance: float32 everywhere. The pipelined run adds the same numbers in another order: the
row-parallel layers sum two partial products (tensor parallelism), and gradients are accumulated
over 4 microbatches instead of one batched sum. Reordering a sum of K float32 terms changes it by
about sqrt(K) (at worst K) units of roundoff (6e-8) of the terms' magnitude; the longest sums here
have K <= 256 terms of magnitude <= 1, and two steps carry the difference once. Measured worst case
over all jobs: 1.2e-7 absolute on parameters and losses. We allow ``atol=1e-5, rtol=1e-4``, a
hundred times that, and check that every job's parameters moved by more than a hundred times the
tolerance (so a missing or doubled update cannot pass).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

import meshcast  # noqa: E402
from meshcast.models import gpt, utransformer  # noqa: E402
from meshcast.pipeline import SCHEDULES  # noqa: E402
from meshcast.training.training import (  # noqa: E402
    TrainJob,
    build_model,
    build_stage,
    reference_training,
    run_jobs,
)

GPT_CFG = gpt.GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=32)
UT_CFG = utransformer.UTransformerConfig(in_dim=8, dim=16, levels=2, n_head=2, seq_len=16)
MODELS = {"gpt": GPT_CFG, "utransformer": UT_CFG}
STRATEGIES = ("send_recv", "allgather", "broadcast")
ATOL, RTOL = 1e-5, 1e-4
STRIDED = "gpt tp 2->2 strided"


def _jobs() -> list[TrainJob]:
    jobs = [
        TrainJob(model, cfg, ((0, 1), (2, 3)), sched, strat, label=f"{model} {sched} {strat}")
        for model, cfg in MODELS.items()
        for sched in SCHEDULES
        for strat in STRATEGIES
    ]
    # unequal tensor-parallel degrees (rank 1 idle), sharded layouts on both sides
    jobs += [
        TrainJob("gpt", GPT_CFG, ((0,), (2, 3)), "eager_1f1b", "broadcast",
                 layouts=(("hidden", ("RRR", "RS1R")),), label="gpt tp 1->2 sharded"),
        TrainJob("gpt", GPT_CFG, ((0, 1), (3,)), "1f1b", "allgather",
                 layouts=(("hidden", ("S1RR", "RRR")),), label="gpt tp 2->1 sharded"),
        TrainJob("gpt", GPT_CFG, ((0, 1), (2, 3)), "eager_1f1b", "send_recv",
                 layouts=(("hidden", ("RRS1", "RS1R")),), label="gpt tp 2->2 sharded"),
        # strided boundary layouts (shards of several boxes, uneven pieces) on both sides
        TrainJob("gpt", GPT_CFG, ((0, 1), (2, 3)), "1f1b", "allgather",
                 layouts=(("hidden", ("RS1[2]R", "RRS1[3]")),), label=STRIDED),
    ]
    # three stages: the skip of level 0 goes from stage 0 to stage 2
    jobs += [
        TrainJob(model, cfg, ((0,), (1,), (2, 3)), sched, "broadcast", num_microbatches=4,
                 label=f"{model} 3 stages {sched}")
        for model, cfg in MODELS.items()
        for sched in ("1f1b", "eager_1f1b")
    ]
    return jobs


JOBS = _jobs()


@pytest.fixture(scope="module")
def results() -> list[list[dict]]:
    """Per rank, per job: what :func:`run_jobs` returned."""
    return meshcast.launch(run_jobs, 4, args=(JOBS,), timeout=240)


def _check(job: TrainJob, per_rank: list[dict]) -> None:
    want_losses, trained = reference_training(job)
    initial = build_model(job)
    ranks_seen = set()
    for got in per_rank:
        stage = got["stage"]
        if stage is None:
            continue
        ranks = job.stage_ranks[stage]
        ranks_seen.add(got["rank"])
        tp_rank, tp = ranks.index(got["rank"]), len(ranks)
        if stage == job.num_stages - 1:
            torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want_losses),
                                       atol=ATOL, rtol=RTOL)
        else:
            assert got["losses"] == [None] * job.steps
        want = build_stage(job, trained, stage, tp_rank, tp).state_dict()
        before = build_stage(job, initial, stage, tp_rank, tp).state_dict()
        assert sorted(got["state"]) == sorted(want)
        moved = 0.0
        for name, value in want.items():
            torch.testing.assert_close(got["state"][name], value, atol=ATOL, rtol=RTOL,
                                       msg=lambda m, n=name: f"{job.label}, {n}: {m}")
            moved = max(moved, float((value - before[name]).abs().max()))
        assert moved > 100 * ATOL, (job.label, stage, moved)
        assert got["peak_activation_bytes"] > 0
    assert ranks_seen == {r for s in job.stage_ranks for r in s}


@pytest.mark.parametrize("index", range(len(JOBS)), ids=[j.label for j in JOBS])
def test_pipelined_tensor_parallel_training_matches_one_process(results, index: int) -> None:
    _check(JOBS[index], [results[r][index] for r in range(4)])


def test_peak_activations_follow_the_schedule(results) -> None:
    """Stage 0 of 2 holds m, 2 and 3 microbatches (GPipe, 1F1B, eager-1F1B; m = 4)."""
    peak = {}
    for index, job in enumerate(JOBS):
        if job.model == "gpt" and job.strategy == "broadcast" and job.stage_ranks == (
                (0, 1), (2, 3)) and not job.layouts:
            peak[job.schedule] = results[0][index]["peak_activation_bytes"]
    per_microbatch = peak["gpipe"] / 4
    assert peak["1f1b"] == 2 * per_microbatch and peak["eager_1f1b"] == 3 * per_microbatch


def test_a_strided_boundary_layout_changes_no_bit(results) -> None:
    """The boundary only moves bytes: with strided layouts on both sides the run is bit for bit
    the one with replicated boundaries (same model, ranks, schedule, strategy)."""
    labels = [job.label for job in JOBS]
    strided, plain = labels.index(STRIDED), labels.index("gpt 1f1b allgather")
    for rank in range(4):
        got, want = results[rank][strided], results[rank][plain]
        assert got["losses"] == want["losses"]
        assert sorted(got["state"]) == sorted(want["state"])
        for name, value in want["state"].items():
            assert torch.equal(got["state"][name], value), (rank, name)


def test_a_failing_stage_raises_on_every_rank() -> None:
    job = TrainJob("gpt", GPT_CFG, ((0, 1), (2, 3)), "1f1b", "broadcast", timeout=30,
                   fail_on=(2, 1), label="failing")
    with pytest.raises(meshcast.LaunchError) as info:
        meshcast.launch(run_jobs, 4, args=([job],), timeout=90)
    failures = info.value.failures
    assert sorted(failures) == [0, 1, 2, 3]
    assert "injected failure" in failures[2]
    for rank in (0, 1, 3):
        first = failures[rank].splitlines()[0]
        assert "PipelineError" in first or "ReshardError" in first, first
        assert "did not finish in time" not in first


class _Stage(torch.nn.Module):
    """Stage 0 sends ``h`` and a bfloat16 ``u`` that stage 1 ignores (its gradient is None);
    stage 1 makes ``y``, raising once in its first forward when ``fail``."""

    def __init__(self, stage: int, fail: bool = False) -> None:
        super().__init__()
        torch.manual_seed(stage)
        self.stage, self.lin, self.fail = stage, torch.nn.Linear(8, 8), fail

    def forward(self, d: dict) -> dict:
        if self.stage == 0:
            h = self.lin(d["x"])
            return {"h": h, "u": h.to(torch.bfloat16)}
        if self.fail:
            self.fail = False
            raise RuntimeError("injected once")
        return {"y": self.lin(d["h"])}


def _misuse_job(rank: int) -> list:
    """2 ranks, one stage each: arguments that differ on one rank, one that rank 1 alone
    refuses, a timeout every rank refuses; a runtime whose step fails
    once, then asked for another step; one given a batch that does not split into equal
    microbatches; one that runs two good steps."""
    from meshcast.pipeline import StageGraph, TensorEdge
    from meshcast.pipeline.runtime import PipelineError, PipelineRuntime

    graph = StageGraph(2, (TensorEdge("h", 0, 1, (4, 8)),
                           TensorEdge("u", 0, 1, (4, 8), "bfloat16")), (("x", 0),), (("y", 1),))
    meshes = (meshcast.Mesh([0]), meshcast.Mesh([1]))

    def runtime(m: int, module, strategy: str = "broadcast", timeout: float = 30):
        return PipelineRuntime(module, graph, meshes, schedule="1f1b", num_microbatches=m,
                               loss_fn=torch.nn.functional.mse_loss, strategy=strategy,
                               timeout=timeout)

    seen = []
    for args in ((2 if rank == 0 else 4,), (2, "bogus" if rank == 1 else "broadcast"),
                 (2, "broadcast", 0)):  # differ; refused on rank 1 alone; refused everywhere
        try:
            runtime(args[0], _Stage(rank), *args[1:])
            seen.append("no error")
        except ValueError as exc:
            seen.append(str(exc))
    x, target = torch.ones(8, 8), torch.zeros(8, 8)
    for fail, batches in ((True, 2), (False, 1), (False, 2)):  # each after the one before
        pipe = runtime(2, _Stage(rank, fail))
        for _ in range(batches):
            uneven = batches == 1
            try:
                result = pipe.train_step({"x": x[:7] if uneven else x},
                                         target[:7] if uneven else target)
                seen.append(result.loss if rank == 1 else "ok")
            except (ValueError, meshcast.ReshardError, PipelineError) as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
    return seen


def test_misuse_is_refused_and_a_failed_step_spends_the_runtime() -> None:
    """Arguments that differ on one rank, or that one rank refuses (told to the others at
    once, and the runtimes after still pair up): ValueError at construction on every rank; a failed
    step raises on every rank naming the failure, the next step says to build a new runtime; a
    batch of unequal microbatches is refused; a bfloat16 edge whose gradient is None works."""
    seen = meshcast.launch(_misuse_job, 2, timeout=120)
    assert [s[1] for s in seen] == [  # told at once to the rank that waits for it
        "rank 0: ranks [1] refused their PipelineRuntime arguments (rank 1: ValueError: "
        "strategy='bogus' is unknown; choose one of ('send_recv', 'allgather', 'broadcast')); "
        "every rank passes the same arguments except stage_module",
        "strategy='bogus' is unknown; choose one of ('send_recv', 'allgather', 'broadcast')"]
    assert [s[2] for s in seen] == ["timeout must be a positive number of seconds, got 0"] * 2
    for built, _, _, failed, spent, uneven, good, again in seen:  # each runtime after the last
        assert "num_microbatches=" in built and "other arguments" in built, built
        assert "injected once" in failed, failed  # the one failure, on both ranks
        assert "build a new PipelineRuntime" in spent and "injected once" in spent, spent
        assert "does not split into 2 equal microbatches" in uneven, uneven
        assert good == again and "Error" not in str(good), (good, again)
    assert seen[0][5].startswith("ValueError") and "input 'x' has a batch of 7" in seen[0][5]
    assert isinstance(seen[1][6], float)  # the loss, computed with a bfloat16 edge unused


def test_importing_the_pipeline_package_does_not_import_torch() -> None:
    code = ("import sys, meshcast, meshcast.pipeline; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class _Skip(torch.nn.Module):
    """Three stages: 0 sends ``h`` to 1 (float64 where the graph says float32: its transfer is
    refused) and ``skip`` to 2, 1 sends ``h1`` to 2."""

    def __init__(self, stage: int, fault: str = "dtype") -> None:
        super().__init__()
        self.stage, self.lin, self.fault = stage, torch.nn.Linear(4, 4), fault

    def forward(self, d: dict) -> dict:
        if self.stage == 0:
            h = self.lin(d["x"])
            return {"h": h.double() if self.fault == "dtype" else h, "skip": h}
        if self.fault == "hang":  # rank 2 of stage 1: stuck in its forward past the timeout
            time.sleep(8)
        if self.stage == 1:
            return {"h1": self.lin(d["h"])}
        return {"y": self.lin(d["h1"] + d["skip"])}


def _skip_job(rank: int, fault: str = "dtype") -> str:
    from meshcast.pipeline import StageGraph, TensorEdge
    from meshcast.pipeline.runtime import PipelineError, PipelineRuntime

    graph = StageGraph(3, (TensorEdge("h", 0, 1, (3, 4)), TensorEdge("skip", 0, 2, (3, 4)),
                           TensorEdge("h1", 1, 2, (3, 4))), (("x", 0),), (("y", 2),))
    meshes = (meshcast.Mesh([0]), meshcast.Mesh([1, 2]), meshcast.Mesh([3]))
    stage = {0: 0, 1: 1, 2: 1, 3: 2}[rank]
    pipe = PipelineRuntime(_Skip(stage, fault if rank in (0, 2) else ""), graph, meshes,
                           schedule="1f1b", num_microbatches=2,
                           loss_fn=torch.nn.functional.mse_loss, layouts={"h": ("RR", "S0R")},
                           timeout=30 if fault == "dtype" else 3)
    try:
        pipe.train_step({"x": torch.ones(6, 4)}, torch.zeros(6, 4))
        return "no error"
    except (ValueError, meshcast.ReshardError, PipelineError) as exc:
        return f"{type(exc).__name__}: {exc}"


def test_a_refused_transfer_is_named_on_every_rank_not_taken_for_another_plan() -> None:
    """The boundary groups' calls are made by each transfer's ranks only, so the ranks' counts
    of calls differ: a refusal by rank 0 is not read as a plan that differs on another rank."""
    for rank, text in enumerate(meshcast.launch(_skip_job, 4, timeout=90)):
        assert "local has dtype torch.float64 on rank 0" in text, (rank, text)
        assert "another plan" not in text, (rank, text)


def test_a_rank_stuck_in_its_stage_is_named_by_where_the_others_wait() -> None:
    """Rank 2 (stage 1 with rank 1) sleeps in its forward: a rank whose wait times out names it,
    from the notes of the ranks' waits (runtime/whereabouts.py: rank 2 waits for its own
    computation only), and the others give up the step with that message or their own (a rank
    timing out at the same instant may find the notes gone with the waits that ended)."""
    told = meshcast.launch(_skip_job, 4, args=("hang",), timeout=90)
    assert all(t.startswith("PipelineError: ") for t in told), told
    assert any("global ranks [2] are computing (waited for, not waiting)" in told[rank]
               for rank in (0, 1, 3)), told
