"""The resharding benchmark's runner: one job per case (all methods inside it), on loopback or
on emulated clusters, every measured row next to its simulated time."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from ..cluster.names import INTRA_GBPS
from ..core.plan import Plan
from ..core.topology import Topology
from ..estimate.lower_bound import lower_bound
from ..estimate.simulate import simulate
from .reshard_cases import BASELINES, METHODS, PAYLOAD_FRACTION, PLAN_LATENCY_US, BenchCase
from .reshard_methods import applies, baseline_model_s, build_plans
from .reshard_report import simulated_rows
from .reshard_worker import (
    INTRA_SEP,
    JobSpec,
    case_worker,
    check_results,
    merge_probe,
    split_intra,
)

RANK_START_S = 1.2
"""Estimated start-up seconds per rank of a job on this 2-core machine (spawn + import torch)."""
RUN_OVERHEAD_S = 0.25
"""Estimated seconds per run beyond its transfer: barriers, the check, poisoning."""


def count_runs(
    cases: Sequence[BenchCase], methods: Sequence[str], reps: int, warmup: int, nic_gbit: float,
    intra: Sequence[str] = (),
) -> int:
    """Runs a measured suite makes (identical plans of a case run once; every meshcast method
    once per mode of ``intra``)."""
    total = 0
    for c in cases:
        topo = c.topology(nic_gbit * PAYLOAD_FRACTION, INTRA_GBPS, PLAN_LATENCY_US)
        total += len(with_intra(job_methods(c, methods, topo)[0], intra)) * (warmup + reps)
    return total


def with_intra(methods: Sequence[str], intra: Sequence[str]) -> list[str]:
    """Each meshcast method once per intra-host mode (``METHOD+MODE``, run with
    ``$MESHCAST_INTRA=MODE``); baselines, and every method when ``intra`` is empty, as they are."""
    return [f"{m}{INTRA_SEP}{mode}" if mode else m
            for m in methods for mode in ([None] if m in BASELINES or not intra else intra)]


def estimate_s(
    cases: Sequence[BenchCase], methods: Sequence[str], reps: int, warmup: int, nic_gbit: float
) -> float:
    """A rough total time of a measured run: rank start-up, the probe, and every run at its
    simulated time at ``nic_gbit`` (slowed by 1.3) plus a fixed overhead."""
    total = 0.0
    for case in cases:
        topo = case.topology(nic_gbit * PAYLOAD_FRACTION, INTRA_GBPS, PLAN_LATENCY_US)
        sims = simulated_rows([case], methods, lambda c, t=topo: t)
        seen: set[Any] = set()
        runs = 0.0
        for row in sims:
            if "time_s" not in row:
                continue
            key = row.get("same_plan_as")
            if key in seen:
                continue
            seen.add(row["method"])
            runs += (warmup + reps) * (1.3 * row["time_s"] + RUN_OVERHEAD_S + 0.01 * case.world)
        total += RANK_START_S * case.world + 3.0 + runs
    return total


class _ProgressWatcher:
    """Polls the file rank 0 writes after each run and reports ``base + count``."""

    def __init__(self, path: str, base: int, callback: Callable[[int], None] | None) -> None:
        import threading

        self.path, self.base, self.callback = path, base, callback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        last = -1
        while not self._stop.wait(0.3):
            try:
                with open(self.path) as f:
                    n = int(f.read() or 0)
            except (OSError, ValueError):
                continue
            if n != last and self.callback:
                last = n
                self.callback(self.base + n)

    def __enter__(self) -> _ProgressWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def job_methods(
    case: BenchCase, methods: Sequence[str], plan_topology: Topology
) -> tuple[list[str], dict[str, Plan], dict[str, str], dict[str, str]]:
    """(methods to run, plans, {method: same plan as}, {method: why it does not apply})."""
    skipped = {m: r for m in methods if (r := applies(case, m))}
    usable = [m for m in methods if m not in skipped]
    plans, same = build_plans(case.task, plan_topology, usable)
    return [m for m in usable if m not in same], plans, same, skipped


def run_suite(
    cases: Sequence[BenchCase],
    methods: Sequence[str] = METHODS,
    *,
    cluster: bool = False,
    nic_gbit: float = 1.0,
    reps: int = 3,
    warmup: int = 1,
    corrupt: str | None = None,
    progress: Callable[[int], None] | None = None,
    timeout: float = 600.0,
    log: Callable[[str], None] | None = None,
    intra: Sequence[str] = (),
) -> dict[str, Any]:
    """Run every case (one job per case, all methods inside it) and return the results.

    ``cluster``: on emulated clusters (:mod:`meshcast.cluster`, root; one per host count, brought
    up once, links shaped to ``nic_gbit``) through ``meshcast.launch(cluster=...)``; otherwise on
    loopback (``launch(hosts=...)``, unshaped: hosts exist for planning only). ``progress`` gets
    the number of runs done so far. Returns ``{"rows": [...], "failures": [...], "probes":
    {...}}``; a method whose data was wrong in any run (or whose job failed) has no timings,
    only an entry in ``failures``. ``intra``: run every meshcast method once per intra-host mode
    (runtime/shm.py; rows named ``METHOD+MODE``), in the same job."""
    import shutil
    import tempfile

    _check_methods(methods, corrupt)
    say = log or (lambda text: None)
    rows: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    probes: dict[str, dict[str, float]] = {}
    pool = _ClusterPool(nic_gbit, say) if cluster else None
    done = 0
    tmp = tempfile.mkdtemp(prefix="meshcast-bench-")
    try:
        for case in cases:
            plan_topo = case.topology(nic_gbit * PAYLOAD_FRACTION, INTRA_GBPS, PLAN_LATENCY_US)
            run_list, plans, same, skipped = job_methods(case, methods, plan_topo)
            run_list = with_intra(run_list, intra)
            path = os.path.join(tmp, f"{case.key}.progress")
            runs = {m: plans[split_intra(m)[0]] for m in run_list if split_intra(m)[0] in plans}
            spec = JobSpec(case, run_list, runs, reps, warmup, corrupt, path, timeout=timeout)
            with _ProgressWatcher(path, done, progress):
                measured, probe, where = _measure_case(spec, pool, timeout, say)
            done += len(run_list) * (warmup + reps)
            if progress:
                progress(done)
            probes[case.key] = probe
            for row in _case_rows(case, with_intra(methods, intra), where, probe, nic_gbit,
                                  (plans, same, skipped), measured):
                if "error" in row:
                    failures.append({"case": case.key, "method": row["method"],
                                     "error": row["error"]})
                    say(f"[bold red]{case.key} {row['method']}: {row['error']}: not reported")
                rows.append(row)
    finally:
        if pool is not None:
            pool.down()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"rows": rows, "failures": failures, "probes": probes}


def _case_rows(
    case: BenchCase, names: list[str], where: str, probe: dict[str, float], nic_gbit: float,
    made: tuple[dict[str, Plan], dict[str, str], dict[str, str]],
    measured: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """The rows of one case's runs ``names`` (``METHOD`` or ``METHOD+MODE``); every row's
    simulated time on the probed links of its intra-host path, one lower bound for all."""
    plans, same, skipped = made
    first = next((split_intra(n)[1] for n in names if split_intra(n)[1]), None)
    bound = lower_bound(case.task, _probed_topology(case, probe, nic_gbit, first))
    rows = []
    for m in names:
        sim_topo = _probed_topology(case, probe, nic_gbit, split_intra(m)[1])
        rows.append(_measured_row(case, m, where, (sim_topo, bound, probe.get("call_s", 0.0)),
                                  plans, same, skipped, measured))
    return rows


def _check_methods(methods: Sequence[str], corrupt: str | None) -> None:
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"method {m!r} is unknown; choose from {', '.join(METHODS)}")
    if corrupt is not None and corrupt != "*" and corrupt not in METHODS:
        raise ValueError(f"corrupt={corrupt!r}: give a method name or '*'")


def _probed_topology(case: BenchCase, probe: dict[str, float], nic_gbit: float,
                     intra: str | None = None) -> Topology:
    """The case's topology with the links the probe measured (planned values where it did not);
    the intra-host rate of the runtime's path ``intra`` (None: the default path), and the
    runtime's chunk as the broadcast chain's ``hop_bytes``."""
    from ..runtime.execute import DEFAULT_CHUNK_BYTES  # torch: only when a run is measured

    inside = probe.get("intra_gbps", INTRA_GBPS)
    topo = case.topology(
        probe.get("cross_gbps", nic_gbit * PAYLOAD_FRACTION),
        inside if intra is None else probe.get(f"intra_gbps{INTRA_SEP}{intra}", inside),
        probe.get("latency_us", PLAN_LATENCY_US),
    )
    return dataclasses.replace(topo, hop_bytes=float(DEFAULT_CHUNK_BYTES))


class _ClusterPool:
    """Emulated clusters by number of hosts, each brought up on first use; :meth:`down` takes
    them all down (reporting, not raising, what fails)."""

    def __init__(self, nic_gbit: float, say: Callable[[str], None]) -> None:
        self.nic_gbit, self.say = nic_gbit, say
        self.clusters: dict[int, Any] = {}

    def get(self, hosts: int) -> Any:
        cl = self.clusters.get(hosts)
        if cl is None:
            from ..cluster import Cluster

            name = f"mc-rb{os.getpid() % 100000}-{hosts}"
            cl = self.clusters[hosts] = Cluster.up(
                hosts, nic_gbit=self.nic_gbit, latency_ms=0.0, name=name
            )
        return cl

    def down(self) -> None:
        for cl in self.clusters.values():
            try:
                cl.down()
            except Exception as exc:  # report, keep taking the others down
                self.say(f"[red]could not take down {cl.name}: {exc}")


def _measure_case(
    spec: JobSpec, pool: _ClusterPool | None, timeout: float, say: Callable[[str], None]
) -> tuple[dict[str, dict[str, Any]], dict[str, float], str]:
    """One case's job: (per method: timings or ``{"error": ...}``, the probe, where it ran)."""
    from ..runtime.launch import launch

    case = spec.case
    where = "loopback"
    try:
        if pool is not None:
            cl = pool.get(case.hosts)
            where = f"cluster {cl.name}"
            results = launch(case_worker, case.world, cluster=cl, args=(spec,), timeout=timeout)
        else:
            results = launch(case_worker, case.world, hosts=case.hosts, args=(spec,),
                             timeout=timeout)
        return check_results(spec, results), merge_probe(results), where
    except Exception as exc:  # a failed job: no method of this case is reported
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        say(f"[red]{case.key}: job failed: {text}")
        return {m: {"error": f"job failed: {text}"} for m in spec.methods}, {}, where


def _measured_row(
    case: BenchCase,
    m: str,
    where: str,
    sim_topo_bound: tuple[Topology, float, float],
    plans: dict[str, Plan],
    same: dict[str, str],
    skipped: dict[str, str],
    measured: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The result row of method ``m`` on ``case``: skipped, failed, or timed with its simulated
    time on the topology of the links the probe measured (with its lower bound); a meshcast
    method's simulated time adds the probe's fixed cost of one call (``call_s``: its agreement
    and end, which the simulator does not model and every timed run includes)."""
    sim_topo, bound, call_s = sim_topo_bound
    name, mode = m, split_intra(m)[1]
    m = split_intra(m)[0]
    row: dict[str, Any] = {
        "suite": case.suite,
        "case": case.key,
        "label": case.label,
        "method": name,
        "hosts": case.hosts,
        "devices_per_host": case.devices_per_host,
        "world": case.world,
        "receivers": case.receivers,
        "nbytes": case.task.nbytes,
        "where": where,
        "lower_bound_s": bound,
    }
    if m in skipped:
        row["skipped"] = skipped[m]
        return row
    if mode is not None:
        row["intra"] = mode
    suffix = "" if mode is None else INTRA_SEP + mode
    got = measured.get(same.get(m, m) + suffix, {"error": "not run"})
    if "error" in got:
        row["error"] = got["error"]
        return row
    sim = (
        baseline_model_s(case, m, sim_topo)
        if m in BASELINES
        else simulate(plans[m], sim_topo).time_s + call_s
    )
    t = got["time_s"]
    row.update(got)
    row.update(
        bandwidth_gbit=case.task.nbytes * 8 / t / 1e9,
        efficiency=bound / t,
        sim_s=sim,
        sim_ratio=sim / t,
        sim_model="bandwidth model" if m in BASELINES else "simulator",
    )
    if m in same:
        row["same_plan_as"] = same[m] + suffix
    return row
