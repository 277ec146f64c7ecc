"""The command line: `meshcast plan` prints a summary or a plan that loads back exactly."""

import json
import subprocess
import sys

import meshcast as mc
from meshcast.cli import main

ARGS = [
    "plan",
    "--shape",
    "1024,1024,512",
    "--dtype",
    "int32",
    "--src",
    "2x4:S0RR",
    "--dst",
    "2x4@8:RRS0",
    "--strategy",
    "broadcast",
]


def test_plan_summary(capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "2x4:S0RR -> 2x4@8:RRS0" in out and "broadcast         4     2.00 GiB" in out


def test_plan_json(capsys):
    assert main([*ARGS, "--json"]) == 0
    plan = mc.Plan.from_json(capsys.readouterr().out)
    task = mc.ReshardTask(
        (1024, 1024, 512), "int32", mc.Layout.parse("2x4:S0RR"), mc.Layout.parse("2x4@8:RRS0")
    )
    assert plan == mc.plan(task, strategy="broadcast")


def test_plan_bad_input_is_a_clear_error(capsys):
    assert main([*ARGS[:-1], "multicast"]) == 2
    assert "strategy='multicast' is unknown" in capsys.readouterr().err


def test_console_script_and_no_torch_import():
    """The script runs, and the planning core never imports torch."""
    code = (
        "import sys, meshcast; from meshcast.cli import main; "
        "main(['plan','--shape','8,8','--src','2:S0R','--dst','2@2:RS0','--json']); "
        "assert 'torch' not in sys.modules, 'planning imported torch'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["strategy"] == "broadcast"


def test_demo_plan_only(capsys):
    assert main(["demo", "--plan-only"]) == 0
    out = capsys.readouterr().out
    assert "case2 RRR->S0RR" in out and "Real run" not in out


def test_demo_bad_size_is_a_clear_error(capsys):
    assert main(["demo", "--mib", "3"]) == 2
    assert "--mib must be even" in capsys.readouterr().err


def test_demo_runs_every_strategy_exactly(capsys):
    """The real run, small: 16 processes (emulated cluster where possible, else loopback), every
    strategy checked exactly by the ranks; the table has a row per strategy."""
    assert main(["demo", "--mib", "2", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "WRONG" not in out
    measured = out.split("Measured on", 1)[1]
    for strategy in ("send_recv", "allgather", "broadcast", "auto (plan() default)"):
        row = next(line for line in measured.splitlines() if f" {strategy} " in line)
        assert row.rstrip(" │").endswith("yes"), row
    assert ("emulated cluster" in out) or ("LOOPBACK" in out)
