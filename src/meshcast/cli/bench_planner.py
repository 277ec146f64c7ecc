"""``meshcast bench planner``: plan quality, as simulated time / lower bound, per balance method.

A seeded suite of random tasks (meshes up to 8 hosts x 8 devices, random layouts, shapes and
dtypes; hosts are mesh rows with the links of the chosen preset) plus the eight paper cases on the
preset. For each method: geometric mean and worst of ``simulate(plan).time_s / lower_bound``.
A benchmark, not a test: it prints figures, it asserts nothing. The suite and its scoring are
:mod:`meshcast.bench.planner_suite`; this module parses arguments and prints.
"""

from __future__ import annotations

import argparse

from ..bench.planner_suite import METHODS, geomean, measure_suite, suite_rows
from ..core.topology import PRESETS
from .common import choice, integer, progress

__all__ = ["METHODS", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast bench planner``."""
    parser.add_argument("--tasks", type=integer(0), default=200,
                        help="random tasks (default 200; 0: the paper cases only)")
    parser.add_argument("--seed", type=integer(0), default=0, help="suite seed (default 0)")
    parser.add_argument("--preset", type=choice(tuple(PRESETS)), default="p3.8xlarge",
                        help=" | ".join(PRESETS))
    parser.add_argument("--worst", type=integer(0), default=5,
                        help="list the N worst tasks of auto")


def run(args: argparse.Namespace) -> int:
    """Run the suite and print the quality table."""
    rows = suite_rows(args.tasks, args.seed, args.preset)
    paper = [(name, task, topo) for name, task, topo, is_paper in rows if is_paper]
    with progress("meshcast bench planner: tasks planned", len(rows)) as advance:
        scores = measure_suite(rows, advance)
    ratios, paper_ratios, seconds, worst = (scores.ratios, scores.paper_ratios, scores.seconds,
                                            scores.worst)
    print(f"suite: {args.tasks} random tasks (seed {args.seed}) + 8 paper cases, "
          f"preset {args.preset}")
    print(f"{'strategy/balance':<20} {'geomean':>8} {'worst':>8} {'paper max':>10} "
          f"{'plan s':>8} {'min':>7}")
    for label in paper_ratios:
        r, pr = ratios.get(label, []), paper_ratios[label]
        print(f"{label:<20} {geomean(r):>8.3f} {max(r, default=float('nan')):>8.3f} "
              f"{max(pr):>10.3f} {seconds[label]:>8.1f} {min(r + pr):>7.3f}")
    print("(min: the smallest ratio of any task, paper cases included; below 1 would mean a plan "
          "beat the lower bound)")
    print("\npaper cases, simulated / lower bound:")
    print(f"{'case':<24}" + "".join(f"{lab:>16}" for lab in paper_ratios))
    for k, (name, _, _) in enumerate(paper):
        print(f"{name:<24}" + "".join(f"{v[k]:>16.3f}" for v in paper_ratios.values()))
    if args.worst:
        print(f"\nworst {args.worst} tasks for auto:")
        for ratio, what in sorted(worst, reverse=True)[: args.worst]:
            print(f"  {ratio:.3f}  {what}")
    return 0
