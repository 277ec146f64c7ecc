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
