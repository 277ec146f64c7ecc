"""``meshcast bench pipeline``: the simulate mode runs; bad real-run arguments are clear errors
(the real runs themselves take minutes: a benchmark, run by hand, see docs/pipeline.md)."""

from __future__ import annotations

import pytest

from meshcast.bench.pipeline_sim import COLUMNS, step_times
from meshcast.cli import main
from meshcast.pipeline import chain_links


def test_cluster_mode_needs_two_hosts(capsys) -> None:
    # changed on purpose (issue 11): the flag's type checks it, one line naming it
    assert main(["bench", "pipeline", "--cluster", "1"]) == 2
    err = capsys.readouterr().err
    assert "argument --cluster: must be an integer >= 2, got '1'" in err and err.count("\n") == 1


def test_a_mode_is_required(capsys) -> None:
    # changed on purpose (issue 11): main() returns the exit status 2 instead of raising
    assert main(["bench", "pipeline"]) == 2
    assert "one of the arguments --simulate --cluster is required" in capsys.readouterr().err


def test_step_times_of_the_sweep() -> None:
    free = step_times(4, 16, 1.0, 2.0, chain_links(4, 0.0))
    assert set(free) == set(COLUMNS) and set(free.values()) == {57.0}
    busy = step_times(4, 16, 1.0, 2.0, chain_links(4, 1.0))
    assert busy[("eager_1f1b", True)] == 78.0 < busy[("1f1b", True)] == 88.0 < busy[("1f1b", False)]


def test_simulate_mode_prints_both_tables(capsys) -> None:
    pytest.importorskip("torch")
    assert main(["bench", "pipeline", "--simulate", "--microbatches", "4", "--gbps", "10"]) == 0
    out = capsys.readouterr().out
    assert "Sweep" in out and "GPT 4x4" in out and "U-Transformer 2x4" in out


def test_cluster_runs_are_summarised_per_model_strategy_and_schedule() -> None:
    pytest.importorskip("torch")
    from meshcast.bench.pipeline_runs import CLUSTER_RUNS, cluster_jobs, summarise_runs

    jobs = cluster_jobs(2, 2, 4, 3, 1.0, ["gpt"])
    assert [j.label for j in jobs] == [f"gpt|{s}|{k}" for s, k, _ in CLUSTER_RUNS]
    # 4 ranks, 2 per stage; the slowest rank of each timed step counts (the first step does not)
    results = [[{"seconds": [9.0, 0.5 + r * 0.1, 1.0], "stage": r // 2,
                 "peak_activation_bytes": 2**20 * (r + 1)} for _ in jobs] for r in range(4)]
    rows = summarise_runs(jobs, results)
    row = rows[("gpt", "send_recv", "1f1b")]
    assert row["step_s"] == 0.9 and row["samples"] == jobs[0].batch_size / 0.9
    assert row["peaks"] == [2 * 2**20, 4 * 2**20] and row["job"] is jobs[0]
