"""Start ``world_size`` processes joined by a gloo process group: local processes (loopback,
optionally with emulated hosts) or ranks inside the hosts of an emulated cluster.

All spawning goes through :func:`rank_environment` (what one rank needs to know) and
:func:`run_rank` (start one rank given those variables). On loopback each rank is a
``multiprocessing`` spawn child and the parent holds the TCP store; on a
:class:`meshcast.cluster.Cluster` each rank is ``python -m meshcast.runtime._rank JOB_DIR`` started
inside its host's network namespace (``ip netns exec``: a ``multiprocessing`` child cannot enter a
namespace), rank 0 on host 0 holds the store, ``fn`` and ``args`` travel as a pickle file and each
rank's result or traceback comes back as one (``rank<R>.pkl``). Both paths report alike.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import os
import pickle
import queue
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..topology import Topology
from .detect import TOPOLOGY_ENV

if TYPE_CHECKING:
    from ..cluster import Cluster

__all__ = ["LaunchError", "launch", "rank_environment", "run_rank"]

STORE_ENV = "MESHCAST_STORE_OWNER"
"""``launcher`` (the parent holds the TCP store, loopback) or ``rank0`` (rank 0 creates it)."""
GRACE_S = 15.0
"""Seconds the other ranks get to report once one rank has failed."""
STARTUP_S = 30.0
"""Seconds allowed on top of ``timeout`` for process start-up (imports, joining the group)."""

Report = tuple[int, bool, Any]  # (rank, ok, result or traceback text)


class LaunchError(RuntimeError):
    """One or more ranks of :func:`launch` failed; ``failures`` maps rank -> error text."""

    def __init__(self, message: str, failures: dict[int, str]) -> None:
        super().__init__(message)
        self.failures = failures


def rank_environment(
    rank: int,
    world_size: int,
    port: int,
    topology: Topology | None,
    timeout: float,
    *,
    master_addr: str = "127.0.0.1",
    store_owner: str = "launcher",
) -> dict[str, str]:
    """The environment variables one rank of :func:`launch` runs with (torchrun's names).

    ``store_owner`` is ``"launcher"`` (the parent process holds the TCP store at
    ``master_addr:port``) or ``"rank0"`` (rank 0 creates it there).
    """
    if store_owner not in ("launcher", "rank0"):
        raise ValueError(f"store_owner must be 'launcher' or 'rank0', got {store_owner!r}")
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(port),
        "MESHCAST_TIMEOUT": str(timeout),
        STORE_ENV: store_owner,
        "OMP_NUM_THREADS": "1",
    }
    if topology is not None:
        host = topology.host_of(rank)
        env["LOCAL_RANK"] = str(topology.hosts[host].index(rank))
        env["LOCAL_WORLD_SIZE"] = str(len(topology.hosts[host]))
        env["GROUP_RANK"] = str(host)
        env[TOPOLOGY_ENV] = json.dumps(topology.to_json())
    else:
        env["LOCAL_RANK"] = str(rank)
        env["LOCAL_WORLD_SIZE"] = str(world_size)
    return env


def run_rank(env: dict[str, str], fn: Callable[..., Any], args: Sequence[Any]) -> Any:
    """Run one rank: set ``env``, join the gloo process group through the job's store (held by
    the launcher, or created here on rank 0), call ``fn(rank, *args)``, leave the group, return
    the result."""
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=float(env["MESHCAST_TIMEOUT"]))
    owner = rank == 0 and env.get(STORE_ENV) == "rank0"
    store = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        world,
        is_master=owner,
        timeout=timeout,
        wait_for_workers=False,
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        result = fn(rank, *args)
        dist.barrier()  # nobody leaves while a peer may still be talking to it (or to the store)
    finally:
        dist.destroy_process_group()
    return result


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


def _child(env: dict[str, str], fn: Callable[..., Any], args: Sequence[Any], out: Any) -> None:
    rank = int(env["RANK"])
    try:
        result = run_rank(env, fn, args)
        out.put((rank, True, pickle.dumps(result)))
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        out.put((rank, False, _error_text(exc)))


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *,
    hosts: int | Topology | None = None,
    cluster: Cluster | None = None,
    args: Sequence[Any] = (),
    timeout: float = 120.0,
) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``world_size`` new processes joined by a gloo process group and
    return the results in rank order.

    Without ``cluster`` the processes are local (loopback). ``hosts`` then emulates a cluster for
    planning: a number of hosts (ranks split into equal consecutive blocks) or a
    :class:`~meshcast.Topology`, which each rank finds through
    :func:`meshcast.runtime.detect_topology`.

    With ``cluster`` (a :class:`meshcast.cluster.Cluster`, see docs/cluster.md; needs root) the
    ranks run inside the hosts' network namespaces: ranks split into equal consecutive blocks over
    the cluster's hosts (``hosts``, if given, must equal its number of hosts), gloo bound to the
    cluster's interface, rank 0 on host 0 holding the TCP store, and
    :func:`~meshcast.runtime.detect_topology` returning ``cluster.topology(ranks_per_host)``.
    ``fn`` may then also be a function of a script run as ``__main__`` (found again by path, as
    with ``multiprocessing``'s spawn: keep the script's work under ``if __name__ ==
    "__main__":``).

    ``fn`` and ``args`` must be picklable (``fn`` defined at module level) and so must the
    results. ``timeout`` bounds the whole run (plus 30 s of start-up) and every collective inside
    it; when a rank fails the others get 15 s to report, then every process left is stopped, and
    :class:`LaunchError` names the failed ranks with their tracebacks.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    if cluster is not None:
        return _launch_cluster(fn, world_size, hosts, cluster, tuple(args), float(timeout))
    topology = _topology(hosts, world_size)
    return _launch_local(fn, world_size, topology, tuple(args), float(timeout))


# -- loopback -------------------------------------------------------------------------------------
def _launch_local(
    fn: Callable[..., Any],
    world_size: int,
    topology: Topology | None,
    args: tuple[Any, ...],
    timeout: float,
) -> list[Any]:
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = []
    try:
        for rank in range(world_size):
            env = rank_environment(rank, world_size, store.port, topology, timeout)
            p = ctx.Process(target=_child, args=(env, fn, args, out), daemon=True)
            p.start()
            procs.append(p)

        def fetch(wait_s: float) -> list[Report]:
            reports = []
            try:
                reports.append(out.get(timeout=wait_s))
                while True:
                    reports.append(out.get_nowait())
            except queue.Empty:
                pass
            return [(r, ok, pickle.loads(v) if ok else v) for r, ok, v in reports]

        def exited() -> dict[int, int | None]:
            return {r: p.exitcode for r, p in enumerate(procs) if not p.is_alive()}

        results = _collect(world_size, timeout, fetch, exited)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        out.close()
    return results


# -- emulated cluster ---------------------------------------------------------------------------
def _launch_cluster(
    fn: Callable[..., Any],
    world_size: int,
    hosts: int | Topology | None,
    cluster: Cluster,
    args: tuple[Any, ...],
    timeout: float,
) -> list[Any]:
    from ..cluster import Cluster, ClusterError, free_port, spawn_in_host

    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a meshcast.cluster.Cluster, got {type(cluster).__name__}")
    n = cluster.num_hosts
    if hosts is not None and (isinstance(hosts, bool) or hosts != n):
        raise ValueError(
            f"hosts={hosts!r} conflicts with cluster={cluster.name!r} of {n} hosts: with cluster= "
            "the hosts and the topology are the cluster's (leave hosts out)"
        )
    if world_size % n:
        raise ValueError(f"world_size={world_size} must be a multiple of the cluster's {n} hosts")
    per_host = world_size // n
    if not cluster.exists():
        raise ClusterError(f"cluster {cluster.name!r} is not up (no namespace of it exists)")
    topology = cluster.topology(per_host)
    port = free_port(cluster, 0)
    job = tempfile.mkdtemp(prefix="meshcast-launch-")
    procs: list[subprocess.Popen] = []
    try:
        with open(os.path.join(job, "job.pkl"), "wb") as f:
            pickle.dump((_preparation(), pickle.dumps((fn, args))), f)
        base = dict(os.environ)
        base.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d warns of no reverse DNS per rank
        for rank in range(world_size):
            env = rank_environment(
                rank,
                world_size,
                port,
                topology,
                timeout,
                master_addr=cluster.host_addr(0),
                store_owner="rank0",
            )
            argv = [sys.executable, "-m", "meshcast.runtime._rank", job]
            procs.append(spawn_in_host(cluster, rank // per_host, argv, {**base, **env}))
        seen: set[int] = set()

        def fetch(wait_s: float) -> list[Report]:
            reports = []
            for rank in range(world_size):
                path = os.path.join(job, f"rank{rank}.pkl")
                if rank not in seen and os.path.exists(path):
                    seen.add(rank)
                    with open(path, "rb") as f:
                        ok, value = pickle.load(f)
                    reports.append((rank, ok, pickle.loads(value) if ok else value))
            if not reports:
                time.sleep(min(wait_s, 0.1))
            return reports

        def exited() -> dict[int, int | None]:
            return {r: c for r, p in enumerate(procs) if (c := p.poll()) is not None}

        return _collect(world_size, timeout, fetch, exited)
    finally:
        _stop(procs)
        shutil.rmtree(job, ignore_errors=True)


def _preparation() -> dict[str, Any]:
    """What a rank needs to find ``fn`` again: ``multiprocessing``'s spawn preparation data
    (``sys.path``, working directory, the main script's path or module name)."""
    data = mp_spawn.get_preparation_data("meshcast-rank")
    data.pop("authkey", None)
    data.pop("start_method", None)
    main = data.get("init_main_from_path")
    if main is not None and not os.path.isfile(main):  # python -c, stdin, a notebook
        del data["init_main_from_path"]
    return data


def _stop(procs: Iterable[subprocess.Popen]) -> None:
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


# -- shared ---------------------------------------------------------------------------------------
def _collect(
    world_size: int,
    timeout: float,
    fetch: Callable[[float], list[Report]],
    exited: Callable[[], dict[int, int | None]],
) -> list[Any]:
    """Gather every rank's report; raise :class:`LaunchError` for failed, crashed or late ranks.

    ``fetch(wait_s)`` returns new reports (waiting up to ``wait_s`` for one); ``exited()`` the exit
    codes of the ranks whose process has ended. The caller stops the processes afterwards.
    """
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}

    def take(reports: list[Report]) -> None:
        for rank, ok, value in reports:
            if ok:
                results[rank] = value
            else:
                failures[rank] = value

    deadline = time.monotonic() + timeout + STARTUP_S
    while len(results) + len(failures) < world_size and time.monotonic() < deadline:
        reports = fetch(0.2)
        take(reports)
        if not reports:
            for rank, code in exited().items():
                if rank not in results and rank not in failures:
                    time.sleep(0.5)  # a report in flight: a moment before calling it a crash
                    take(fetch(0.0))
                    if rank not in results and rank not in failures:
                        failures[rank] = f"exited with code {code} without a result"
        if failures:  # the others should fail fast too; do not wait out the full timeout
            deadline = min(deadline, time.monotonic() + GRACE_S)
    for r in range(world_size):
        if r not in results and r not in failures:
            failures[r] = "did not finish in time (stopped)"
    if failures:
        first = min(failures, key=lambda r: ("did not finish" in failures[r], r))
        lines = [f"meshcast.launch: ranks {sorted(failures)} of {world_size} failed"]
        lines.append(f"rank {first}: {failures[first]}")
        for r in sorted(failures):
            if r != first:
                lines.append(f"rank {r}: {failures[r].splitlines()[0]}")
        raise LaunchError("\n".join(lines), failures)
    return [results[r] for r in range(world_size)]


def _topology(hosts: int | Topology | None, world_size: int) -> Topology | None:
    if hosts is None:
        return None
    if isinstance(hosts, Topology):
        hosts.covers(range(world_size))
        return hosts
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise ValueError(f"hosts must be a positive number of hosts or a Topology, got {hosts!r}")
    if world_size % hosts:
        raise ValueError(f"hosts={hosts} must divide world_size={world_size} evenly")
    return Topology.uniform(hosts, world_size // hosts)
