"""The single-GPU check script (benchmarks/gpu_check.py) stays runnable: its CPU dry run, with
gloo, does every check it does on a GPU and must pass (issue 12, point 4)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def test_gpu_check_dry_run_on_cpu_passes() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "gpu_check: every check passed"
    assert sum(line.startswith("ok  ") for line in lines) >= 3
