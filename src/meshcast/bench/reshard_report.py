"""Output of the resharding benchmark: simulated rows, JSON text, the machine's load and the
markdown tables of a results document."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.topology import Topology
from ..estimate.lower_bound import lower_bound
from ..estimate.simulate import simulate
from .reshard_cases import BASELINES, BenchCase
from .reshard_methods import applies, baseline_model, build_plans


# -- simulation --------------------------------------------------------------------------------
def simulated_rows(
    cases: Sequence[BenchCase],
    methods: Sequence[str],
    topology_of: Callable[[BenchCase], Topology],
    plan_topology_of: Callable[[BenchCase], Topology] | None = None,
) -> list[dict[str, Any]]:
    """For each case and method: simulated seconds (baselines: :func:`baseline_model_s`), lower
    bound, effective bandwidth and efficiency on ``topology_of(case)``; plans are made on
    ``plan_topology_of(case)`` (default: the same topology)."""
    rows = []
    for case in cases:
        topo = topology_of(case)
        ptopo = plan_topology_of(case) if plan_topology_of else topo
        bound = lower_bound(case.task, topo)
        plans, same = build_plans(case.task, ptopo, methods)
        for m in methods:
            reason = applies(case, m)
            row: dict[str, Any] = {
                "suite": case.suite,
                "case": case.key,
                "label": case.label,
                "method": m,
                "nbytes": case.task.nbytes,
                "hosts": case.hosts,
                "devices_per_host": case.devices_per_host,
                "receivers": case.receivers,
                "lower_bound_s": bound,
            }
            if reason:
                row["skipped"] = reason
            else:
                if m in BASELINES:
                    t, across = baseline_model(case, m, topo)
                else:
                    t, across = simulate(plans[m], topo).time_s, plans[m].cross_host_bytes()
                row.update(
                    time_s=t,
                    bandwidth_gbit=case.task.nbytes * 8 / t / 1e9,
                    efficiency=bound / t,
                    cross_host_bytes=across,
                    model="bandwidth model" if m in BASELINES else "simulator",
                )
                if m in same:
                    row["same_plan_as"] = same[m]
            rows.append(row)
    return rows





def dumps(data: Any) -> str:
    """JSON text of benchmark results (NaN/inf written as null)."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, np.generic):
            return x.item()
        return x

    return json.dumps(clean(data), indent=1)


def load_avg() -> list[float]:
    """The machine's 1/5/15-minute load averages."""
    try:
        return list(os.getloadavg())
    except OSError:
        return []




def markdown_report(doc: dict[str, Any]) -> str:
    """Markdown tables (method x case) of a results document: time with efficiency, effective
    bandwidth, bytes across hosts, and (measured runs) simulated / measured."""
    rows = doc["rows"]
    measured = any("sim_ratio" in r for r in rows)
    out = []
    for suite in ("1-to-m", "n-to-m"):
        part = [r for r in rows if r["suite"] == suite]
        if not part:
            continue
        cases = list(dict.fromkeys(r["case"] for r in part))
        methods = list(dict.fromkeys(r["method"] for r in part))
        by = {(r["case"], r["method"]): r for r in part}

        def cell(r: dict[str, Any] | None, what: str) -> str:
            if r is None:
                return ""
            if "skipped" in r:
                return "n/a"
            if "error" in r:
                return "FAILED"
            if what == "time":
                return f"{r['time_s'] * 1e3:.0f} ({r['efficiency']:.2f})"
            if what == "bw":
                return f"{r['bandwidth_gbit']:.3f}"
            if what == "across":
                v = r.get("cross_host_bytes")
                return "-" if v is None else f"{v / 2**20:.0f}"
            if what == "cpu":
                v = r.get("cpu_s_per_gib")
                return "-" if v is None else f"{v:.2f}"
            return f"{r['sim_ratio']:.2f}"

        tables = [
            ("time", "time ms (efficiency = lower bound / time)"),
            ("bw", "effective bandwidth, Gbit/s (tensor bytes / time)"),
            ("across", "MiB across hosts"),
        ]
        if measured:
            tables.append(("sim", "simulated / measured time"))
            tables.append(("cpu", "CPU seconds (all ranks, user + system) per GiB delivered"))
        for what, title in tables:
            out.append(f"**{suite}: {title}**\n")
            out.append("| method | " + " | ".join(cases) + " |")
            out.append("|---|" + "---|" * len(cases))
            for m in methods:
                out.append(
                    f"| {m} | " + " | ".join(cell(by.get((c, m)), what) for c in cases) + " |"
                )
            if what == "time":
                bounds = [f"{by[c, methods[0]]['lower_bound_s'] * 1e3:.0f}" for c in cases]
                out.append("| *lower bound ms* | " + " | ".join(bounds) + " |")
            out.append("")
    return "\n".join(out)
