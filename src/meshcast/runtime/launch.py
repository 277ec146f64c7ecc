"""Start ``world_size`` processes joined by a gloo process group: local processes (loopback,
optionally with emulated hosts) or ranks inside the hosts of an emulated cluster.

All spawning goes through :func:`rank_environment` (what one rank needs to know) and
:func:`run_rank` (start one rank given those variables). Every rank is ``python -m
meshcast.runtime._rank JOB_DIR``: on loopback a local process (the parent holds the TCP store), on
a :class:`~meshcast.runtime.hosts.HostProvider` (such as :class:`meshcast.cluster.Cluster`, which
starts it inside its host's network namespace) a process of its host (rank 0 on host 0 holds the
store). ``fn`` and ``args`` travel as a pickle file together
with ``multiprocessing``'s spawn preparation data, and each rank's result or traceback comes back
as one (``rank<R>.pkl``). A rank's stderr passes through the launcher (to ``sys.stderr``), which
keeps its last lines: a rank that dies before reporting is shown with them. Both paths report
alike.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..core.topology import Topology
from .detect import TOPOLOGY_ENV
from .hosts import HostProvider
from .ranks import AFTER_RETURN, LaunchError, run_ranks

__all__ = [
    "HostProvider",
    "LaunchError",
    "MissingMainGuardError",
    "format_failure",
    "launch",
    "rank_environment",
    "run_rank",
]

STORE_ENV = "MESHCAST_STORE_OWNER"
"""``launcher`` (the parent holds the TCP store, loopback) or ``rank0`` (rank 0 creates it)."""
IMPORTING_MAIN_ENV = "MESHCAST_RANK_IMPORTING_MAIN"
"""Set (to the script's path) in a rank while it imports the main script to find ``fn``."""


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
    else:  # one host, whatever a launching process's own job says (a launch inside a rank)
        env["LOCAL_RANK"] = str(rank)
        env["LOCAL_WORLD_SIZE"] = str(world_size)
        env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env[TOPOLOGY_ENV] = "0", "1", ""
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
        try:  # nobody leaves while a peer may still be talking to it (or to the store)
            dist.barrier()
        except Exception as exc:  # a peer failed: a consequence, shown after the cause
            raise RuntimeError(f"rank {rank}: {AFTER_RETURN} ({str(exc).splitlines()[0]})"
                               ) from None
    finally:
        dist.destroy_process_group()
    return result


def format_failure(exc: BaseException) -> str:
    """How a rank reports the exception it is handling: ``Type: message``, then the traceback."""
    return f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


class MissingMainGuardError(RuntimeError):
    """:func:`launch` was called while a rank imported the main script: the script has no
    ``if __name__ == "__main__":`` guard around the code that starts the job."""


def _refuse_inside_rank_import() -> None:
    script = os.environ.get(IMPORTING_MAIN_ENV)
    if script:
        raise MissingMainGuardError(
            f"meshcast.launch was called while rank {os.environ.get('RANK', '?')} was importing "
            f"the main script {script} to find the function to run: the script has no "
            "`if __name__ == \"__main__\":` guard. Every rank imports the main script (as "
            "multiprocessing's spawn does); put the code that starts the job under that guard."
        )


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *,
    hosts: int | Topology | None = None,
    cluster: HostProvider | None = None,
    args: Sequence[Any] = (),
    timeout: float = 120.0,
) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``world_size`` new processes joined by a gloo process group and
    return the results in rank order.

    Without ``cluster`` the processes are local (loopback). ``hosts`` then emulates a cluster for
    planning: a number of hosts (ranks split into equal consecutive blocks) or a
    :class:`~meshcast.Topology`, which each rank finds through
    :func:`meshcast.runtime.detect_topology`.

    With ``cluster`` (a :class:`meshcast.cluster.Cluster`, see docs/cluster.md; needs root; or any
    :class:`~meshcast.runtime.hosts.HostProvider`) the ranks run inside the hosts' network
    namespaces: ranks split into equal consecutive blocks over
    the cluster's hosts (``hosts``, if given, must equal its number of hosts), gloo bound to the
    cluster's interface, rank 0 on host 0 holding the TCP store, and
    :func:`~meshcast.runtime.detect_topology` returning ``cluster.topology(ranks_per_host)``.

    ``fn`` may be a function of a script run as ``__main__``: every rank imports the script again
    (by path, as ``multiprocessing``'s spawn does), so keep the script's work under ``if __name__
    == "__main__":``; a script without that guard fails with an error saying so. ``fn`` and
    ``args`` must be picklable (``fn`` defined at module level) and so must the results.

    ``timeout`` bounds the whole run (plus 30 s of start-up) and every collective inside it; when
    a rank fails the others get 15 s to report, then every process left is stopped, and
    :class:`LaunchError` names the failed ranks with their tracebacks (a rank that died before it
    could report: its exit code and the last lines of its stderr). Ranks' stderr passes through to
    ``sys.stderr``; their stdout is the launcher's.
    """
    _refuse_inside_rank_import()
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

    def start(rank: int, argv: list[str], base: dict[str, str]) -> subprocess.Popen:
        env = rank_environment(rank, world_size, store.port, topology, timeout)
        return subprocess.Popen(argv, env={**base, **env}, stderr=subprocess.PIPE)

    return run_ranks(fn, args, world_size, timeout, start, dict(os.environ))


# -- hosts of a provider (an emulated cluster) -----------------------------------------------
def _launch_cluster(
    fn: Callable[..., Any],
    world_size: int,
    hosts: int | Topology | None,
    cluster: HostProvider,
    args: tuple[Any, ...],
    timeout: float,
) -> list[Any]:
    if not isinstance(cluster, HostProvider):
        raise TypeError(
            "cluster must be a meshcast.cluster.Cluster (or another "
            f"meshcast.runtime.hosts.HostProvider), got {type(cluster).__name__}"
        )
    n = cluster.num_hosts
    if hosts is not None and (isinstance(hosts, bool) or hosts != n):
        raise ValueError(
            f"hosts={hosts!r} conflicts with cluster={cluster.name!r} of {n} hosts: with cluster= "
            "the hosts and the topology are the cluster's (leave hosts out)"
        )
    if world_size % n:
        raise ValueError(f"world_size={world_size} must be a multiple of the cluster's {n} hosts")
    per_host = world_size // n
    cluster.ensure_up()
    topology = cluster.topology(per_host)
    port = cluster.free_port(0)
    base = dict(os.environ)
    base.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d warns of no reverse DNS per rank

    def start(rank: int, argv: list[str], base: dict[str, str]) -> subprocess.Popen:
        env = rank_environment(rank, world_size, port, topology, timeout,
                               master_addr=cluster.host_addr(0), store_owner="rank0")
        return cluster.spawn(rank // per_host, argv, {**base, **env}, stderr=subprocess.PIPE)

    return run_ranks(fn, args, world_size, timeout, start, base)


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
