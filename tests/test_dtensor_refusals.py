"""DTensor arguments that one rank alone gets wrong are refused on every rank at once, under the
real ``torchrun`` (tests/dtensor_refusal_job.py, 4 gloo ranks), and the job goes on exact and
exits 0.

Before: ``reshard_dtensor`` did not tell its peers when it refused its arguments, so they waited
out the whole timeout (300 s by default); with a ``Partial`` source the peers had already
started the reduction on the source mesh, which the refusing rank then paired with its next
call's reduction (a hang, or wrong sums); and a rank that refused and came straight on to its
next call of the same plan met its peers' refused call under the same name and paired with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("dtensor_refusal_job.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
BAD_OWN = "placements[0] is Shard(dim=2), but the tensor has 2 dimensions"
QUICK_S = 10.0  # the job's timeout is 60 s


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("refusals")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    proc = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "4", str(JOB), str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, f"the job exited with {proc.returncode}:\n{proc.stderr[-4000:]}"
    assert "terminate called" not in proc.stderr
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]


@pytest.mark.timeout(400)
def test_one_rank_refusing_its_dtensor_arguments_is_refused_everywhere_at_once(
        reports: list[dict]) -> None:
    for case in ("plain", "partial", "state dict"):
        for rank, report in enumerate(reports):
            kind, text, seconds = report[case]
            assert kind == "ValueError", (case, rank, kind, text)
            assert seconds < QUICK_S, (case, rank, seconds)
            if rank == 3:
                assert text == (BAD_OWN if case != "state dict" else f"layouts['b']: {BAD_OWN}")
                continue
            caller = "reshard_state_dict" if case == "state dict" else "reshard_dtensor"
            assert text.startswith(f"meshcast.{caller} on rank {rank}: "), (case, text)
            assert "rank 3" in text or "ranks [3]" in text, (case, text)
            assert text.endswith("; nothing was sent"), (case, text)


@pytest.mark.timeout(400)
def test_a_keyword_one_rank_passes_and_reshard_dtensor_does_not_take_is_refused_everywhere(
        reports: list[dict]) -> None:
    rule = ("reshard_dtensor got unexpected keyword arguments ['bogus_option'] (it passes "
            "bucket_bytes on to meshcast.reshard_many, nothing else)")
    assert reports[3]["keyword"][:2] == ["TypeError", rule]
    for rank in range(3):
        kind, text, seconds = reports[rank]["keyword"]
        assert kind == "ValueError" and seconds < QUICK_S, (rank, kind, seconds)
        # (told before the others came, or after: rank 3 may be in its next call already)
        assert (f"rank 3 refused its call before joining it (an argument error: {rule})" in text
                or "ranks [3] refused this call before joining it and came on" in text), text
    assert [r["keyword then"] for r in reports] == [True] * 4


@pytest.mark.timeout(400)
def test_a_partial_source_is_not_reduced_before_every_rank_agrees(reports: list[dict]) -> None:
    # rank 3 refuses at once and comes to its next call first: the others' call is refused
    for rank in range(3):
        assert reports[rank]["partial"][1] == (
            f"meshcast.reshard_dtensor on rank {rank}: ranks [3] refused this call before "
            f"joining it and came on to their next call, which met this one: this call is "
            f"refused on every rank, and theirs waits for its own partners; nothing was sent")


@pytest.mark.timeout(400)
def test_the_next_calls_are_exact_on_every_rank(reports: list[dict]) -> None:
    for rank, report in enumerate(reports):
        for case in ("plain then", "partial then", "state dict then"):
            assert report[case] is True, (rank, case)
