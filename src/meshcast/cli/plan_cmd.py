"""``meshcast plan``: plan one resharding and print its summary (or its JSON)."""

from __future__ import annotations

import argparse

from ..layout import Layout
from ..lower_bound import lower_bound
from ..planner import BALANCES, STRATEGIES, plan
from ..simulate import simulate
from ..task import ReshardTask
from .common import parse_shape, topology_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast plan``."""
    parser.add_argument("--shape", type=parse_shape, required=True, help="e.g. 1024,1024,512")
    parser.add_argument("--dtype", default="float32", help="element type (default float32)")
    parser.add_argument("--src", type=Layout.parse, required=True, help="e.g. 2x4:S0RR")
    parser.add_argument("--dst", type=Layout.parse, required=True, help="e.g. 2x4@8:RRS0")
    parser.add_argument("--strategy", default=None,
                        help=" | ".join(STRATEGIES) + " (default broadcast; with --balance auto: "
                        "chosen per slice)")
    parser.add_argument("--balance", default="none", help=" | ".join(BALANCES))
    parser.add_argument(
        "--topology",
        default=None,
        help="preset name or uniform:D (default: last mesh axis = one host)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--timeline", default=None, metavar="OUT.PNG",
                        help="with --topology: draw the simulated schedule per host NIC")


def run(args: argparse.Namespace) -> int:
    """Plan and print."""
    task = ReshardTask(args.shape, args.dtype, args.src, args.dst)
    topology = topology_for(args.topology, task)
    strategy = args.strategy
    if strategy is None and args.balance != "auto":
        strategy = "broadcast"
    result = plan(task, topology, strategy=strategy, balance=args.balance)
    print(result.to_json(indent=None) if args.json else result.summary())
    if topology is None:
        if args.timeline:
            raise ValueError("--timeline needs --topology (the simulator needs link speeds)")
        return 0
    report = simulate(result, topology)
    bound = lower_bound(task, topology)
    if not args.json:
        efficiency = bound / report.time_s if report.time_s > 0 else 1.0
        print(f"\nsimulated time: {report.time_s * 1e3:.3f} ms")
        print(f"lower bound:    {bound * 1e3:.3f} ms")
        print(f"efficiency:     {efficiency:.1%} (lower bound / simulated)")
    if args.timeline:
        report.plot(args.timeline, title=f"{task.describe()}  [{result.strategy}/{result.balance}]")
        if not args.json:
            print(f"timeline written to {args.timeline}")
    return 0
