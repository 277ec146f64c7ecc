"""``meshcast bench resharding``: the paper's resharding microbenchmarks, measured and simulated.

    meshcast bench resharding [--suite 1-to-m|n-to-m|all] [--cluster N | --loopback]
                              [--size 64MiB] [--nic-gbit 1] [--reps 3] [--warmup 1]
                              [--methods M,...] [--cases K,...] [--out DIR]
                              [--busy N] [--intra shm,socket]
    meshcast bench resharding --simulate [--topology p3.8xlarge] [--suite ...]

Measured (default): every case of the suite is one job on an emulated cluster whose hosts are the
meshes' rows (:mod:`meshcast.bench.resharding` says exactly how), every method runs ``--warmup``
+ ``--reps`` times in that job, the median of the timed runs is reported. Every run is checked
exactly; a run with wrong data is reported as a failure (red), gets no numbers, and the command
exits with status 3. Test hook: ``$MESHCAST_BENCH_CORRUPT=METHOD`` (or ``*``) flips one received
byte of that method on one rank.

``--cluster N``: emulated clusters (network namespaces, links shaped to ``--nic-gbit``; root),
cases needing more than N hosts are skipped (default N: all cases fit, 5). ``--loopback``: local
processes, unshaped (hosts exist for planning only). Neither: the cluster where available, else
loopback with the reason.

``--busy N`` starts N busy-loop processes (one core each) before the first job and stops them
after the last, to reproduce a loaded machine. ``--intra shm,socket`` runs every meshcast method
once per intra-host path (``$MESHCAST_INTRA``, docs/runtime.md) in the same job, as rows
``METHOD+shm`` and ``METHOD+socket``. Every row reports the CPU seconds of all ranks (user +
system, from the OS) per GiB delivered to the destination ranks.

``--simulate``: no processes; the same suite on :func:`meshcast.simulate` at the emulated
cluster's payload link speed (``--nic-gbit`` x 1448/1514, as measured: docs/cluster.md), or with
``--topology NAME`` at the paper's scale (1 GiB / 2 GiB) on that preset's links, hosts = mesh rows.
The baselines are timed by a bandwidth model there (the simulator takes plans only).

Output: a table per suite (time, effective bandwidth = tensor bytes / time, bytes across hosts,
efficiency = lower bound / time, simulated time), ``resharding.json`` and PNG figures in ``--out``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

from ..bench import resharding as rb
from ..bench.load import busy_loops
from ..cluster.names import INTRA_GBPS
from ..core.topology import PRESETS
from .common import UsageError, choice, comma_list, integer, number, output_dir

DEFAULT_OUT = "meshcast-bench-resharding"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast bench resharding``."""
    parser.add_argument("--suite", default="all", type=choice(("1-to-m", "n-to-m", "all")),
                        help="1-to-m | n-to-m | all (default all)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--cluster", type=integer(1), metavar="N", default=None,
                       help="emulated clusters of at most N hosts (root)")
    where.add_argument("--loopback", action="store_true", help="local processes, unshaped")
    where.add_argument("--simulate", action="store_true", help="simulator only, no processes")
    parser.add_argument("--topology", type=choice(tuple(PRESETS)), default=None,
                        help="with --simulate: a preset (p3.8xlarge), at the paper's scale")
    parser.add_argument("--size", type=_size, default="64MiB", help="tensor size (default 64MiB)")
    parser.add_argument("--nic-gbit", type=number(0.0), default=1.0, help="emulated NIC rate (1)")
    parser.add_argument("--reps", type=integer(1), default=3, help="timed runs per method (3)")
    parser.add_argument("--warmup", type=integer(0), default=1, help="untimed runs first (1)")
    parser.add_argument("--methods", type=comma_list(rb.METHODS), default=list(rb.METHODS),
                        help="comma-separated: " + ",".join(rb.METHODS))
    parser.add_argument("--cases", default="", help="e.g. 1x1,4x2,case1 (default: the suite)")
    parser.add_argument("--out", type=output_dir, default=DEFAULT_OUT,
                        help=f"output folder ({DEFAULT_OUT})")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    parser.add_argument("--timeout", type=number(0.0), default=600.0,
                        help="seconds per case's job")
    parser.add_argument("--busy", type=integer(0), default=0, metavar="N",
                        help="N busy-loop processes beside the measured run (0)")
    parser.add_argument("--intra", type=comma_list(("shm", "socket")), default=[],
                        help="run meshcast methods once per intra-host path: shm,socket")
    parser.add_argument("--markdown", type=_readable_file, metavar="JSON", default=None,
                        help="print markdown tables of an earlier run's JSON, run nothing")


def _size(text: str) -> str:
    try:
        rb.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _readable_file(text: str) -> str:
    if not os.path.isfile(text) or not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"must be a readable file, got {text!r}")
    return text


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _table(rows: list[dict[str, Any]], title: str, measured: bool):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    cols = ["case", "method", "time ms", "Gbit/s", "MiB across", "efficiency"]
    if measured:
        cols += ["sim ms", "sim/meas", "CPU s/GiB"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("case", "method") else "right")
    last = None
    notes: dict[str, list[str]] = {}
    for i, r in enumerate(rows):
        nxt = rows[i + 1]["case"] if i + 1 < len(rows) else None
        first = r["case"] != last
        last = r["case"]
        name = r["method"] + (f" (= {r['same_plan_as']})" if r.get("same_plan_as") else "")
        case = (
            (r["label"] if r["suite"] == "n-to-m" else f"{r['case']} ({r['label']})")
            if first
            else ""
        )
        if "skipped" in r:
            cells = ["[dim]n/a[/dim]"] + [""] * (len(cols) - 3)
            notes.setdefault(r["skipped"], []).append(f"{r['case']} {r['method']}")
        elif "error" in r:
            cells = [f"[bold red]FAILED: {r['error']}[/bold red]"] + [""] * (len(cols) - 3)
        else:
            across = r.get("cross_host_bytes")
            cells = [
                f"{r['time_s'] * 1e3:.1f}",
                f"{r['bandwidth_gbit']:.3f}",
                _fmt(None if across is None else across / 2**20, ".1f"),
                f"{r['efficiency']:.2f}",
            ]
            if measured:
                cells += [f"{r['sim_s'] * 1e3:.1f}", f"{r['sim_ratio']:.2f}",
                          _fmt(r.get("cpu_s_per_gib"), ".2f")]
        table.add_row(case, name, *cells, end_section=nxt != r["case"])
    if notes:
        table.caption = "n/a: " + "; ".join(f"{', '.join(v)}: {k}" for k, v in notes.items())
        table.caption_justify = "left"
    return table


def _plots(rows: list[dict[str, Any]], out: str, tag: str, what: str) -> list[str]:
    from ..bench.plots import plot_n_to_m, plot_one_to_m

    made = []
    if any(r["suite"] == "n-to-m" and "time_s" in r for r in rows):
        path = os.path.join(out, f"resharding-n-to-m{tag}.png")
        plot_n_to_m(rows, path, f"n-to-m cases, {what}")
        made.append(path)
    if any(r["suite"] == "1-to-m" and "time_s" in r for r in rows):
        path = os.path.join(out, f"resharding-1-to-m{tag}.png")
        plot_one_to_m(rows, path, f"1-to-m, {what}")
        made.append(path)
    return made


def _meta(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    import numpy

    meta: dict[str, Any] = {
        "command": "meshcast " + " ".join(sys.argv[1:]) if sys.argv else "",
        "mode": mode,
        "suite": args.suite,
        "nic_gbit": args.nic_gbit,
        "reps": args.reps,
        "warmup": args.warmup,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Linux {platform.release()}, Python {platform.python_version()}, "
        f"numpy {numpy.__version__}",
        "load_avg_before": rb.load_avg(),
        "busy": getattr(args, "busy", 0),
        "intra": getattr(args, "intra", []),
    }
    return meta


def run(args: argparse.Namespace) -> int:
    """Run (or simulate) the suite, print the tables, write the JSON and the figures."""
    from rich.console import Console

    if args.markdown:
        import json

        with open(args.markdown) as f:
            try:
                report = rb.markdown_report(json.load(f))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise UsageError(f"--markdown {args.markdown}: not the JSON of a meshcast bench "
                                 f"resharding run ({type(exc).__name__}: {exc})") from None
        print(report)
        return 0
    console = Console(width=170)
    keys = [k.strip() for k in args.cases.split(",") if k.strip()]
    if args.topology and not args.simulate:
        raise UsageError("--topology goes with --simulate (measured runs use the emulated hosts)")
    try:
        rb.suite_cases(args.suite, None, keys)
    except ValueError as exc:
        raise UsageError(f"--cases: {exc}") from None
    if not (args.simulate and args.topology):  # (paper scale: sizes of its own)
        try:
            rb.suite_cases(args.suite, rb.parse_size(args.size), keys)
        except ValueError as exc:
            raise UsageError(f"--size {args.size}: {exc}") from None
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: {exc.strerror or exc}") from None
    json_path = os.path.join(args.out, "resharding.json")
    if args.simulate:
        return _run_simulated(args, console, args.methods, keys, json_path)
    return _run_measured(args, console, keys, json_path)


def _measured_cases(args: argparse.Namespace, console, keys: list[str]
                    ) -> tuple[list[rb.BenchCase], bool, str]:
    """(the cases to run, on an emulated cluster?, the mode's description)."""
    cases = rb.suite_cases(args.suite, rb.parse_size(args.size), keys)
    use_cluster = False
    note = ""
    if not args.loopback:
        from ..cluster import available

        ok, why = available()
        if ok:
            use_cluster = True
        elif args.cluster is not None:
            raise UsageError(f"--cluster: the emulated cluster is not available: {why}")
        else:
            note = f"emulated cluster not available ({why}): running on loopback, unshaped"
    if use_cluster and args.cluster is not None:
        too_big = [c.key for c in cases if c.hosts > args.cluster]
        if too_big:
            console.print(f"[yellow]skipped (need more than {args.cluster} hosts): {too_big}")
        cases = [c for c in cases if c.hosts <= args.cluster]
    if not cases:
        raise UsageError(f"--cluster {args.cluster}: no case of the suite fits in that many hosts")
    mode = (
        f"emulated cluster, links shaped to {args.nic_gbit:g} Gbit/s"
        if use_cluster
        else "loopback, unshaped"
    )
    if note:
        console.print(f"[yellow]note: {note}")
    return cases, use_cluster, mode


def _run_measured(args: argparse.Namespace, console, keys: list[str], json_path: str) -> int:
    cases, use_cluster, mode = _measured_cases(args, console, keys)
    methods = args.methods
    import torch  # noqa: F401  (fail early without torch)

    total_runs = rb.count_runs(cases, methods, args.reps, args.warmup, args.nic_gbit,
                               args.intra)
    estimate = rb.estimate_s(cases, methods, args.reps, args.warmup, args.nic_gbit)
    console.print(
        f"resharding bench: {len(cases)} cases x {len(methods)} methods, {mode}, "
        f"{rb.parse_size(args.size) / 2**20:g} MiB, {args.warmup} warm-up + {args.reps} timed "
        f"runs each: {total_runs} runs (identical plans run once)"
    )
    console.print(
        f"estimated total time: {estimate / 60:.1f} min "
        "(start-up per rank + simulated transfer times; a shared machine may be slower)"
    )
    meta = _meta(args, mode)
    meta["estimate_s"] = estimate
    t0 = time.monotonic()
    with busy_loops(args.busy) as pids:
        if pids:
            console.print(f"busy-loop processes beside the run: {pids}")
        results = _run_with_bar(args, console, cases, use_cluster, total_runs)
    meta["duration_s"] = time.monotonic() - t0
    meta["load_avg_after"] = rb.load_avg()
    meta["size_bytes"] = rb.parse_size(args.size)
    rows = results["rows"]
    for suite in ("1-to-m", "n-to-m"):
        part = [r for r in rows if r["suite"] == suite]
        if part:
            console.print(_table(part, f"{suite}, measured ({mode}); median of {args.reps}", True))
    cross = [p["cross_gbps"] for p in results["probes"].values() if "cross_gbps" in p]
    if cross:
        console.print(
            f"link probe (payload, host 0 -> 1, per job): {min(cross):.3f} .. "
            f"{max(cross):.3f} Gbit/s; the simulated times and the lower bounds use "
            "each job's probe (cross-host, intra-host and latency)"
        )
    with open(json_path, "w") as f:
        f.write(rb.dumps({"meta": meta, **results}))
    made = [] if args.no_plots else _plots(rows, args.out, "", mode)
    console.print(f"wrote {json_path}" + "".join(f", {p}" for p in made))
    console.print(f"took {meta['duration_s'] / 60:.1f} min (estimated {estimate / 60:.1f})")
    return _report_failures(console, results["failures"])


def _run_with_bar(args: argparse.Namespace, console, cases: list[rb.BenchCase],
                  use_cluster: bool, total_runs: int) -> dict[str, Any]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} runs"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task_id = bar.add_task("resharding", total=total_runs)
        return rb.run_suite(
            cases,
            args.methods,
            cluster=use_cluster,
            nic_gbit=args.nic_gbit,
            reps=args.reps,
            warmup=args.warmup,
            corrupt=os.environ.get(rb.CORRUPT_ENV) or None,
            timeout=args.timeout,
            progress=lambda n: bar.update(task_id, completed=n),
            log=console.print,
            intra=args.intra,
        )


def _report_failures(console, failures: list[dict[str, Any]]) -> int:
    if failures:
        console.print(
            f"[bold red]{len(failures)} run(s) FAILED (wrong data or a "
            "failed job); they are not reported:"
        )
        for f in failures:
            console.print(f"[bold red]  {f['case']} {f['method']}: {f['error']}")
        return 3
    console.print("every run's data was checked exactly on every receiving rank")
    return 0


def _run_simulated(
    args: argparse.Namespace, console, methods: list[str], keys: list[str], json_path: str
) -> int:
    if args.topology:
        cases = rb.suite_cases(args.suite, None, keys, paper_scale=True)
        topo_of = rb.preset_topology(args.topology)
        what = f"simulated, {args.topology} links, paper scale (1 GiB / 2 GiB)"
        tag = f"-sim-{args.topology}"
    else:
        cases = rb.suite_cases(args.suite, rb.parse_size(args.size), keys)
        gbps = args.nic_gbit * rb.PAYLOAD_FRACTION

        def topo_of(c: rb.BenchCase):
            return c.topology(gbps, INTRA_GBPS, rb.PLAN_LATENCY_US)

        what = (
            f"simulated, emulated cluster's links ({gbps:.3f} Gbit/s payload, {INTRA_GBPS:g} "
            f"Gbit/s inside, {rb.PLAN_LATENCY_US:g} us), {rb.parse_size(args.size) / 2**20:g} MiB"
        )
        tag = "-sim"
    rows = rb.simulated_rows(cases, methods, topo_of)
    for suite in ("1-to-m", "n-to-m"):
        part = [r for r in rows if r["suite"] == suite]
        if part:
            console.print(_table(part, f"{suite}, {what}", False))
    meta = _meta(args, what)
    json_path = json_path.replace("resharding.json", f"resharding{tag}.json")
    with open(json_path, "w") as f:
        f.write(rb.dumps({"meta": meta, "rows": rows}))
    made = [] if args.no_plots else _plots(rows, args.out, tag, what)
    console.print(f"wrote {json_path}" + "".join(f", {p}" for p in made))
    return 0
