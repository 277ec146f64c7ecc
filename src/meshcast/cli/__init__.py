"""The ``meshcast`` command line: ``meshcast plan``, ``meshcast layout``, ``meshcast demo``,
``meshcast bench ...``.

Each command lives in its own module with ``add_arguments(parser)`` and ``run(args) -> int``;
heavy imports (torch, matplotlib) happen inside ``run`` so that ``--help`` stays fast. A bad
argument is one line on stderr naming the flag and its rule, exit status 2 (argument types of
:mod:`meshcast.cli.common`, or :class:`~meshcast.cli.common.UsageError` from a command); any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .. import __version__
from .common import ArgumentParser, UsageError

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("meshcast.cli.plan_cmd", "plan a resharding and print its summary or JSON"),
    "layout": ("meshcast.cli.layout_cmd", "draw which rank holds which part of a layout"),
    "demo": ("meshcast.cli.demo", "the main job: run the paper's cases and print a comparison"),
    "cluster": ("meshcast.cli.cluster_cmd", "emulated multi-host cluster: up, down, status, exec"),
}

# `meshcast bench NAME` -> (module, one-line help)
BENCHES: dict[str, tuple[str, str]] = {
    "plan-speed": ("meshcast.cli.bench_plan_speed", "time decomposition and planning"),
    "model-plans": ("meshcast.cli.bench_model_plans", "whole-model weight syncs on paper"),
    "planner": ("meshcast.cli.bench_planner", "plan quality: simulated time / lower bound"),
    "pipeline": ("meshcast.cli.bench_pipeline", "pipeline schedules: simulated step times"),
    "weights": ("meshcast.cli.bench_weights", "weight sync: meshcast vs gather+broadcast"),
    "resharding": ("meshcast.cli.bench_resharding", "resharding suites: measured and simulated"),
}


def _add(subparsers, name: str, module: str, help_text: str) -> None:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    mod = importlib.import_module(module)
    mod.add_arguments(parser)
    parser.set_defaults(run_command=mod.run, command_parser=parser)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (sub-parsers are :class:`~meshcast.cli.common.ArgumentParser`
    too: one-line errors)."""
    parser = ArgumentParser(prog="meshcast", description=(
        "Plan, run and measure cross-mesh resharding: meshcast plan, layout, demo, cluster, "
        "bench. Each command's --help says more."))
    parser.add_argument("--version", action="version", version=f"meshcast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        _add(sub, name, module, help_text)
    bench = sub.add_parser("bench", help="benchmarks (timings live here, never in tests)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    for name, (module, help_text) in BENCHES.items():
        _add(bench_sub, name, module, help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``meshcast`` script; returns the exit status (2: a bad argument)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a bad argument (already printed)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        return int(args.run_command(args) or 0)
    except UsageError as exc:
        print(f"{args.command_parser.prog}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
