"""Clean exit under the real ``torchrun``: a job of 8 gloo ranks that runs reshard (odd strides,
both posting modes, relays on every host), reshard_many, and on the first launch reshard_dtensor
and two pipeline training steps too, checks every result, destroys the process group and exits,
started several times in a row (10 here, ``MESHCAST_EXIT_LAUNCHES=50`` for a longer soak): every
launch must exit with status 0
(no ``terminate called without an active exception``, no thread or pending message outliving a
call)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torchrun_exit_job

JOB = Path(__file__).with_name("torchrun_exit_job.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
LAUNCHES = int(os.environ.get("MESHCAST_EXIT_LAUNCHES", "10"))


@pytest.mark.timeout(1800)
def test_torchrun_jobs_exit_cleanly_every_time(tmp_path: Path) -> None:
    assert TORCHRUN.exists(), f"{TORCHRUN} (torch's launcher) is missing"
    plans = tmp_path / "plans.json"
    torchrun_exit_job.write_plans(plans)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    statuses = []
    for attempt in range(LAUNCHES):
        proc = subprocess.run(
            [str(TORCHRUN), "--standalone", "--nproc-per-node", "8", str(JOB), str(plans),
             *([] if attempt == 0 else ["core"])],
            capture_output=True, text=True, timeout=300, env=env,
        )
        statuses.append(proc.returncode)
        assert proc.returncode == 0, (
            f"launch {attempt + 1}/{LAUNCHES} exited with {proc.returncode}:\n"
            f"{proc.stderr[-4000:]}"
        )
        assert "terminate called" not in proc.stderr
        assert "wrong results" not in proc.stderr
    assert statuses == [0] * LAUNCHES
