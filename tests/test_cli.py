"""The command line: `meshcast plan` prints a summary or a plan that loads back exactly, with the
API's defaults; every bad flag of every command is one line naming the flag and its rule (exit
status 2, no traceback), checked before any work; `--version`; progress on stderr."""

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

import meshcast as mc
from meshcast.cli import build_parser, main
from meshcast.cli import plan_cmd as plan_cmd_module
from meshcast.cli.common import PROGRESS_ENV

MESHCAST = os.path.join(os.path.dirname(sys.executable), "meshcast")
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
TASK = mc.ReshardTask(
    (1024, 1024, 512), "int32", mc.Layout.parse("2x4:S0RR"), mc.Layout.parse("2x4@8:RRS0")
)


def _cli(*argv: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real console script."""
    return subprocess.run([MESHCAST, *argv], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_plan_summary(capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "2x4:S0RR -> 2x4@8:RRS0" in out and "broadcast         4     2.00 GiB" in out


def test_plan_json(capsys):
    assert main([*ARGS, "--json"]) == 0
    plan = mc.Plan.from_json(capsys.readouterr().out)
    assert plan == mc.plan(TASK, strategy="broadcast")


def test_a_0_d_shape_is_empty(capsys):
    for empty in ("", "()"):
        assert main(["plan", "--shape", empty, "--src", "2:", "--dst", "2@2:", "--json"]) == 0
        plan = mc.Plan.from_json(capsys.readouterr().out)
        assert plan.task.shape == () and plan == mc.plan(mc.ReshardTask(
            (), "float32", mc.Layout.parse("2:"), mc.Layout.parse("2@2:")))


@pytest.mark.parametrize(
    "flags, api",
    [
        ([], {}),
        (["--strategy", "send_recv"], {"strategy": "send_recv"}),
        (["--balance", "size"], {"balance": "size"}),
        (["--balance", "auto"], {"balance": "auto"}),
        (["--strategy", "allgather", "--balance", "order"],
         {"strategy": "allgather", "balance": "order"}),
    ],
)
def test_plan_defaults_are_the_apis(capsys, flags, api):
    """No --strategy and no --balance plans exactly as `meshcast.plan(task)` (balance auto); each
    flag alone as the same keyword alone."""
    assert main([*ARGS[:-2], *flags, "--json"]) == 0
    assert mc.Plan.from_json(capsys.readouterr().out) == mc.plan(TASK, **api)
    if not flags:
        assert mc.plan(TASK).balance == "auto"


def test_plan_bad_input_is_a_clear_error(capsys):
    # changed on purpose (issue 11): the rule comes from the flag's type, named by argparse
    assert main([*ARGS[:-1], "multicast"]) == 2
    err = capsys.readouterr().err
    assert "argument --strategy: 'multicast' is unknown" in err
    assert err.count("\n") == 1


def test_console_script_and_no_torch_import():
    """The script runs, and the planning core never imports torch."""
    code = (
        "import sys, meshcast; from meshcast.cli import main; "
        "main(['plan','--shape','8,8','--src','2:S0R','--dst','2@2:RS0','--json']); "
        "assert 'torch' not in sys.modules, 'planning imported torch'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # changed on purpose (issue 11): the CLI's defaults are the API's (balance auto)
    task = mc.ReshardTask((8, 8), "float32", mc.Layout.parse("2:S0R"), mc.Layout.parse("2@2:RS0"))
    assert mc.Plan.from_json(out.stdout) == mc.plan(task)
    assert json.loads(out.stdout)["balance"] == "auto"


def test_version():
    done = _cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"meshcast {mc.__version__}\n"
    assert importlib.metadata.version("meshcast") == mc.__version__  # one source


# -- bad flags ------------------------------------------------------------------------------------
PLAN = ["plan", "--shape", "8,8", "--src", "2:S0R", "--dst", "2@2:RS0"]
BAD = [
    # (argv, the flag the one line must name, a piece of its rule)
    ([*PLAN, "--topology", "uniform:0"], "--topology", "from 1 to 4194304"),
    # a host is built rank by rank: 10^20 raised OverflowError, 2^63 - 1 MemoryError, 10^9 ran
    # for minutes
    ([*PLAN, "--topology", "uniform:99999999999999999999"], "--topology", "from 1 to 4194304"),
    ([*PLAN, "--topology", "uniform:1000000000"], "--topology", "from 1 to 4194304"),
    ([*PLAN, "--topology", "uniform:x"], "--topology", "integer"),
    ([*PLAN, "--topology", "p4"], "--topology", "preset"),
    ([*PLAN, "--topology", "uniform:2", "--timeline", "/no/such/dir/x.png"], "--timeline",
     "folder that exists"),
    ([*PLAN, "--topology", "uniform:2", "--timeline", "x.txt"], "--timeline", ".png"),
    ([*PLAN, "--timeline", "x.png"], "--timeline", "needs --topology"),
    (["plan", "--shape", "8,-1", "--src", "2:S0R", "--dst", "2@2:RS0"], "--shape", ">= 0"),
    (["plan", "--shape", "8x8", "--src", "2:S0R", "--dst", "2@2:RS0"], "--shape", "commas"),
    (["plan", "--shape", f"{2**63},8", "--src", "2:S0R", "--dst", "2@2:RS0"], "--shape",
     "at most 2**63 - 1"),
    (["plan", "--shape", "8,8,8", "--src", "2:S0R", "--dst", "2@2:RS0"], "--shape", "3 dim"),
    ([*PLAN, "--dtype", "float33"], "--dtype", "supported"),
    (["plan", "--shape", "8,8", "--src", "2:S0Q", "--dst", "2@2:RS0"], "--src", "token"),
    (["plan", "--shape", "8,8", "--src", "2:S0R", "--dst", "2@x:RS0"], "--dst", "SHAPE"),
    ([*PLAN, "--strategy", "multicast"], "--strategy", "choose one of"),
    ([*PLAN, "--balance", "fast"], "--balance", "choose one of"),
    (["plan", "--src", "2:S0R"], "--shape", "required"),
    (["bench", "planner", "--tasks", "-1"], "--tasks", ">= 0"),
    (["bench", "planner", "--seed", "-3"], "--seed", ">= 0"),
    (["bench", "planner", "--preset", "p5"], "--preset", "choose one of"),
    (["bench", "planner", "--worst", "many"], "--worst", "integer"),
    (["bench", "plan-speed", "--repeats", "0"], "--repeats", ">= 1"),
    (["bench", "pipeline", "--simulate", "--stages", "0"], "--stages", ">= 1"),
    (["bench", "pipeline", "--simulate", "--microbatches", "0"], "--microbatches", ">= 1"),
    (["bench", "pipeline", "--simulate", "--ratios", "1,-2"], "--ratios", ">= 0"),
    (["bench", "pipeline", "--simulate", "--gbps", "10,0"], "--gbps", "> 0"),
    (["bench", "pipeline", "--simulate", "--tflops", "nan"], "--tflops", "> 0"),
    (["bench", "pipeline", "--cluster", "1"], "--cluster", ">= 2"),
    (["bench", "pipeline", "--cluster", "2", "--steps", "1"], "--steps", ">= 2"),
    (["bench", "pipeline", "--cluster", "2", "--models", "bert"], "--models", "choose from"),
    (["bench", "pipeline", "--cluster", "2", "--nic-gbit", "0"], "--nic-gbit", "> 0"),
    (["bench", "pipeline", "--cluster", "2", "--simulate"], "--simulate", "not allowed"),
    (["bench", "weights", "--embd", "100"], "--embd", "multiple of 8"),
    (["bench", "weights", "--layers", "0"], "--layers", ">= 1"),
    (["bench", "weights", "--methods", "rsync"], "--methods", "choose from"),
    (["bench", "weights", "--reps", "0"], "--reps", ">= 1"),
    (["bench", "weights", "--jobs", "3"], "--jobs", "from 1 to 2"),
    (["bench", "weights", "--jobs", "2", "--size", "0"], "--size", "> 0"),
    (["bench", "resharding", "--size", "-1"], "--size", "positive"),
    (["bench", "resharding", "--size", "lots"], "--size", "MiB"),
    (["bench", "resharding", "--reps", "0"], "--reps", ">= 1"),
    (["bench", "resharding", "--warmup", "-1"], "--warmup", ">= 0"),
    (["bench", "resharding", "--methods", "x"], "--methods", "choose from"),
    (["bench", "resharding", "--suite", "2-to-m"], "--suite", "choose one of"),
    (["bench", "resharding", "--topology", "p4"], "--topology", "choose one of"),
    (["bench", "resharding", "--topology", "p3.8xlarge"], "--topology", "--simulate"),
    (["bench", "resharding", "--simulate", "--cases", "case9"], "--cases", "not in suite"),
    (["bench", "resharding", "--markdown", "/no/such.json"], "--markdown", "readable file"),
    (["bench", "resharding", "--out", "/proc/version/x"], "--out", "folder"),
    (["bench", "resharding", "--timeout", "-5"], "--timeout", "> 0"),
    (["bench", "resharding", "--simulate", "--size", "1MiB"], "--size", "power of two"),
    (["bench", "resharding", "--simulate", "--suite", "1-to-m", "--size", "3"], "--size",
     "multiple of 4"),
    (["bench", "resharding", "--markdown", "/proc/version"], "--markdown", "not the JSON"),
    (["plan", "--shape", "8,8", "--src", "2:S0R", "--dst", "1000000x1000000@8:S0R"], "--dst",
     "at most 4,194,304"),
    (["demo", "--mib", "3"], "--mib", "even"),
    (["demo", "--reps", "0"], "--reps", ">= 1"),
    (["demo", "--scale", "0"], "--scale", ">= 1"),
    (["demo", "--scale", "100000"], "--scale", "must divide 1024"),
    (["demo", "--nic-gbit", "-1"], "--nic-gbit", "> 0"),
    (["cluster", "up", "--hosts", "0"], "--hosts", "from 1 to 250"),
    (["cluster", "up", "--hosts", "2", "--nic-gbit", "0"], "--nic-gbit", "> 0"),
    (["cluster", "up", "--hosts", "2", "--latency-ms", "-1"], "--latency-ms", ">= 0"),
    (["cluster", "up", "--hosts", "2", "--name", "Bad_Name"], "--name", "'mc-'"),
    (["cluster", "down", "--name", "x"], "--name", "'mc-'"),
    (["cluster", "status", "--name", "mc_"], "--name", "'mc-'"),
    (["cluster", "exec", "--host", "-1", "--", "true"], "--host", ">= 0"),
    (["cluster", "exec", "--host", "0", "--timeout", "0", "--", "true"], "--timeout", "> 0"),
    (["cluster"], "action", "required"),
    (["bench"], "bench", "required"),
    ([*PLAN, "--nope"], "--nope", "unrecognized"),
]


def _one_line_error(err: str, flag: str, rule: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("meshcast") and ": error: " in lines[0], err
    assert flag in lines[0] and rule in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, flag, rule", BAD, ids=[" ".join(b[0][:4]) for b in BAD])
def test_bad_flag_is_one_line_naming_it(capsys, argv, flag, rule):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    _one_line_error(err, flag, rule)
    assert out == ""  # checked before any work (nothing printed first)


@pytest.mark.parametrize(
    "argv, flag, rule",
    [
        ([*PLAN, "--topology", "uniform:0"], "--topology", "from 1 to 4194304"),
        ([*PLAN, "--topology", "uniform:9223372036854775807"], "--topology", "from 1 to 4194304"),
        ([*PLAN, "--topology", "uniform:2", "--timeline", "/no/such/dir/x.png"], "--timeline",
         "exists"),
        (["bench", "planner", "--tasks", "-1"], "--tasks", ">= 0"),
        (["demo", "--mib", "5"], "--mib", "even"),
    ],
)
def test_bad_flag_through_the_console_script(argv, flag, rule):
    """The issue's examples, through the installed `meshcast` script: exit status 2."""
    done = _cli(*argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    _one_line_error(done.stderr, flag, rule)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of every command that takes options."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for sub in subs:
        for name, child in sub.choices.items():
            yield from _commands(child, (*path, name))


def test_every_typed_flag_rejects_garbage_in_one_line(capsys):
    """Every option of every command that converts its value does so with a checking type of
    meshcast.cli.common (not bare int/float) and rejects nonsense in one line naming it."""
    checked = 0
    for path, parser in _commands(build_parser()):
        for action in parser._actions:
            if action.type is None or not action.option_strings:
                continue
            assert action.type not in (int, float), (path, action.option_strings)
            flag = action.option_strings[-1]
            garbage = "/proc/version/x" if action.type.__name__ == "output_dir" else "x!@"
            assert main([*path, flag, garbage]) == 2, (path, flag)
            out, err = capsys.readouterr()
            _one_line_error(err, flag, "")
            assert out == ""
            checked += 1
    assert checked >= 40


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only bad arguments become one-liners: a ValueError from inside the work propagates."""

    def broken(*args, **kwargs):
        raise ValueError("a bug, not a bad argument")

    monkeypatch.setattr(plan_cmd_module, "plan", broken)
    with pytest.raises(ValueError, match="a bug"):
        main(PLAN)


def test_help_exits_zero(capsys):
    assert main(["plan", "--help"]) == 0
    assert "--timeline" in capsys.readouterr().out


# -- progress -------------------------------------------------------------------------------------
def test_bench_planner_reports_progress():
    """A long command says how far it is on stderr (here every step: $MESHCAST_PROGRESS_S=0)."""
    done = _cli("bench", "planner", "--tasks", "2", "--worst", "0",
                env={**os.environ, PROGRESS_ENV: "0"}, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("meshcast bench planner:")]
    assert [ln.split(": ")[2].split(" ")[0] for ln in lines[:-1]] == [f"{k}/10" for k in
                                                                       range(1, 11)]
    assert lines[-1].endswith("done")
    assert "suite: 2 random tasks" in done.stdout


def test_bench_plan_speed_rows_and_suite_line(capsys):
    """Every row of the table is there with its unit slices, and the suite's small tasks are
    counted (a benchmark: the times themselves are not asserted)."""
    from meshcast.cli.bench_plan_speed import large_rows, small_rows

    assert main(["bench", "plan-speed", "--suite", "3", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    for name, task, _ in small_rows():
        row = next(line for line in out.splitlines() if name in line)
        assert f"{len(task.decomposition):,}" in row
    assert "tasks of at most 64 unit slices" in out and "load average" in out
    assert [len(t.decomposition) for _, t, _ in large_rows()] == [16384] + [262144] * 3


def test_demo_plan_only(capsys):
    assert main(["demo", "--plan-only"]) == 0
    out = capsys.readouterr().out
    assert "case2 RRR->S0RR" in out and "Real run" not in out


def test_demo_runs_every_strategy_exactly(capsys, monkeypatch):
    """The real run, small: 16 processes (emulated cluster where possible, else loopback), every
    strategy checked exactly by the ranks; the table has a row per strategy; the wait for the
    ranks is reported on stderr."""
    monkeypatch.setenv(PROGRESS_ENV, "0")
    assert main(["demo", "--mib", "2", "--reps", "1"]) == 0
    out, err = capsys.readouterr()
    assert "WRONG" not in out
    measured = out.split("Measured on", 1)[1]
    for strategy in ("send_recv", "allgather", "broadcast", "auto (plan() default)"):
        row = next(line for line in measured.splitlines() if f" {strategy} " in line)
        assert row.rstrip(" │").endswith("yes"), row
    assert ("emulated cluster" in out) or ("LOOPBACK" in out)
    assert "meshcast demo: 16 ranks x 4 strategies: running for 0 s" in err
    assert "meshcast demo: 16 ranks x 4 strategies: done in" in err


def test_layout_picture(capsys):
    assert main(["layout", "4:S0[2]R", "--shape", "13,4"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "rank 0  ##.....##....  0:2 7:9",
        "rank 1  ..##.....##..  2:4 9:11",
        "rank 2  ....##.....##  4:6 11:13",
        "rank 3  ......#......  6:7",
    ]
    assert main(["layout", "2:{q=4:S0+k=2:R}R", "--shape", "7,2"]) == 2
    assert "--shape has 7 indices in dimension 0" in capsys.readouterr().err
