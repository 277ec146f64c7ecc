"""``meshcast demo``: the main job. Plans the paper's eight cases with each strategy."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from ..cases import PAPER_CASES
from ..plan import _fmt_bytes
from ..planner import STRATEGIES, plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast demo``."""
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        help="divide the paper's tensors' first dimension by this (default 1)",
    )


def planning_table(scale: int = 1) -> Table:
    """Per case and strategy: operations, bytes across hosts, busiest NIC in and out."""
    table = Table(title="Plans for the paper's n-to-m cases (hosts = mesh rows)")
    for column in ("case", "strategy", "ops", "across hosts", "max host in", "max host out"):
        table.add_column(column, justify="left" if column in ("case", "strategy") else "right")
    for case in PAPER_CASES:
        task = case.task("int32", scale)
        for i, strategy in enumerate(STRATEGIES):
            p = plan(task, strategy=strategy)
            per_host = p.bytes_per_host().values()
            table.add_row(
                case.name if i == 0 else "",
                strategy,
                str(len(p.ops)),
                _fmt_bytes(p.cross_host_bytes()),
                _fmt_bytes(max(v for _, v in per_host)),
                _fmt_bytes(max(o for o, _ in per_host)),
                end_section=i == len(STRATEGIES) - 1,
            )
    return table


def run(args: argparse.Namespace) -> int:
    """Print the planning comparison."""
    console = Console()
    console.print(planning_table(args.scale))
    return 0
