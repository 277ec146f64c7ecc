"""``meshcast plan``: plan one resharding and print its summary (or its JSON)."""

from __future__ import annotations

import argparse

from ..layout import Layout
from ..planner import BALANCES, STRATEGIES, plan
from ..task import ReshardTask
from .common import parse_shape, topology_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast plan``."""
    parser.add_argument("--shape", type=parse_shape, required=True, help="e.g. 1024,1024,512")
    parser.add_argument("--dtype", default="float32", help="element type (default float32)")
    parser.add_argument("--src", type=Layout.parse, required=True, help="e.g. 2x4:S0RR")
    parser.add_argument("--dst", type=Layout.parse, required=True, help="e.g. 2x4@8:RRS0")
    parser.add_argument("--strategy", default="broadcast", help=" | ".join(STRATEGIES))
    parser.add_argument("--balance", default="none", help=" | ".join(BALANCES))
    parser.add_argument(
        "--topology",
        default=None,
        help="preset name or uniform:D (default: last mesh axis = one host)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace) -> int:
    """Plan and print."""
    task = ReshardTask(args.shape, args.dtype, args.src, args.dst)
    result = plan(
        task, topology_for(args.topology, task), strategy=args.strategy, balance=args.balance
    )
    print(result.to_json(indent=None) if args.json else result.summary())
    return 0
