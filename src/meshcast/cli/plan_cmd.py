"""``meshcast plan``: plan one resharding and print its summary (or its JSON).

The defaults are :func:`meshcast.plan`'s: no ``--strategy`` and no ``--balance`` plans with
``balance="auto"``; a strategy alone keeps ``balance="none"``; a balance alone uses the broadcast
strategy.
"""

from __future__ import annotations

import argparse

from ..core.task import ReshardTask
from ..estimate.lower_bound import lower_bound
from ..estimate.simulate import simulate
from ..planning.planner import BALANCES, STRATEGIES, plan
from .common import (
    UsageError,
    choice,
    dtype_arg,
    layout_arg,
    output_file,
    shape_arg,
    topology_for,
    topology_spec,
    working,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast plan``."""
    parser.add_argument("--shape", type=shape_arg, required=True, help="e.g. 1024,1024,512")
    parser.add_argument("--dtype", type=dtype_arg, default="float32",
                        help="element type (default float32)")
    parser.add_argument("--src", type=layout_arg, required=True, help="e.g. 2x4:S0RR")
    parser.add_argument("--dst", type=layout_arg, required=True, help="e.g. 2x4@8:RRS0")
    parser.add_argument("--strategy", type=choice(STRATEGIES), default=None,
                        help=" | ".join(STRATEGIES) + " (default: as meshcast.plan, i.e. chosen "
                        "per slice by balance auto; with --balance: broadcast)")
    parser.add_argument("--balance", type=choice(BALANCES), default=None,
                        help=" | ".join(BALANCES) + " (default: as meshcast.plan, i.e. auto; "
                        "with --strategy: none)")
    parser.add_argument("--topology", type=topology_spec, default=None,
                        help="preset name or uniform:D (default: last mesh axis = one host)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--timeline", type=output_file(), default=None, metavar="OUT.PNG",
                        help="with --topology: draw the simulated schedule per host NIC")


def run(args: argparse.Namespace) -> int:
    """Plan and print."""
    if args.timeline and args.topology is None:
        raise UsageError("--timeline needs --topology (the simulator needs link speeds)")
    try:
        task = ReshardTask(args.shape, args.dtype, args.src, args.dst)
    except (ValueError, TypeError, OverflowError) as exc:
        raise UsageError(f"--shape/--dtype/--src/--dst do not fit together: {exc}") from None
    topology = topology_for(args.topology, task)
    with working("meshcast plan: planning"):
        result = plan(task, topology, strategy=args.strategy, balance=args.balance)
    print(result.to_json(indent=None) if args.json else result.summary())
    if topology is None or (args.json and not args.timeline):
        return 0  # (the JSON has no simulated time: nothing to simulate)
    with working("meshcast plan: simulating the plan, computing the lower bound"):
        report = simulate(result, topology)
        bound = lower_bound(task, topology)
    if not args.json:
        efficiency = bound / report.time_s if report.time_s > 0 else 1.0
        print(f"\nsimulated time: {report.time_s * 1e3:.3f} ms")
        print(f"lower bound:    {bound * 1e3:.3f} ms")
        print(f"efficiency:     {efficiency:.1%} (lower bound / simulated)")
    if args.timeline:
        try:
            report.plot(args.timeline,
                        title=f"{task.describe()}  [{result.strategy}/{result.balance}]")
        except OSError as exc:
            raise UsageError(f"--timeline {args.timeline}: {exc.strerror or exc}") from None
        if not args.json:
            print(f"timeline written to {args.timeline}")
    return 0
