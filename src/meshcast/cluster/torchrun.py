"""Run the real ``torchrun`` across the hosts of an emulated cluster, one node per host.

Each host's namespace runs one torchrun agent (``ip netns exec <name>-h<i> torchrun ...``) with
the settings that multi-node torchrun needs there and that are easy to miss:

* c10d rendezvous at host 0's address, ``--rdzv-conf is_host=true`` on host 0 (torchrun cannot
  tell that the endpoint is its own address inside a namespace) and ``false`` elsewhere;
* ``--local-addr`` = the host's own address (all namespaces share one hostname, so the agents
  would otherwise advertise the same name);
* ``GLOO_SOCKET_IFNAME`` / ``TP_SOCKET_IFNAME`` = the cluster's interface, plus the rest of
  :meth:`Cluster.host_env` (``MESHCAST_HOST`` ...), in the agent's environment, which its
  workers inherit.

Torchrun then sets ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE`` ... in every worker,
from which :func:`meshcast.job_topology` reads the hosts. Free of torch (torchrun runs in the
child processes).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .cluster import Cluster
from .spawn import free_port, spawn_in_host

__all__ = ["run_torchrun", "start_torchrun", "torchrun_command", "torchrun_executable",
           "wait_torchrun"]

GRACE_S = 15.0
"""Seconds the other nodes get to finish once one node has failed, before they are stopped."""


def torchrun_executable() -> list[str]:
    """The ``torchrun`` next to this Python (the real command), else ``python -m
    torch.distributed.run`` (the same program)."""
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if os.access(exe, os.X_OK):
        return [exe]
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def torchrun_command(
    cluster: Cluster,
    host: int,
    nproc_per_node: int,
    argv: Sequence[str],
    *,
    port: int,
    rdzv_id: str | None = None,
    torchrun_args: Sequence[str] = (),
    job_hosts: Sequence[int] | None = None,
) -> list[str]:
    """The torchrun command line of the node on ``host`` (run it inside ``cluster.netns(host)``
    with :meth:`Cluster.host_env` in its environment, as :func:`start_torchrun` does).

    ``argv`` is the training script and its arguments (``["train.py", "--lr", "1"]``, or
    ``["-m", "package.module"]``); ``port`` the rendezvous port on host 0; ``torchrun_args``
    extra torchrun options placed before the script. ``job_hosts``: the hosts of this job (default
    every host; two jobs on one cluster each take some), in node order, rendezvous at the first.
    """
    if isinstance(argv, (str, bytes)) or not argv:
        raise ValueError(f"argv must be a non-empty list (the script and its arguments), got "
                         f"{argv!r}")
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) \
            or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a positive integer, got {nproc_per_node!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be a TCP port number, got {port!r}")
    addr = cluster.host_addr(host)
    hosts = list(range(cluster.num_hosts)) if job_hosts is None else list(job_hosts)
    if host not in hosts:
        raise ValueError(f"host {host} is not one of the job's hosts {hosts}")
    return [
        *torchrun_executable(),
        "--nnodes", str(len(hosts)),
        "--nproc-per-node", str(nproc_per_node),
        "--node-rank", str(hosts.index(host)),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{cluster.host_addr(hosts[0])}:{port}",
        "--rdzv-id", rdzv_id or f"{cluster.name}-{port}",
        "--rdzv-conf", f"is_host={'true' if host == hosts[0] else 'false'}",
        "--local-addr", addr,
        "--max-restarts", "0",
        *map(str, torchrun_args),
        *map(str, argv),
    ]


def start_torchrun(
    cluster: Cluster,
    nproc_per_node: int,
    argv: Sequence[str],
    *,
    port: int | None = None,
    hosts: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
    rdzv_id: str | None = None,
    torchrun_args: Sequence[str] = (),
    job_hosts: Sequence[int] | None = None,
    **popen_kwargs: Any,
) -> list[subprocess.Popen]:
    """Start the torchrun agent of every host (or of ``hosts`` only, when each node is started
    separately: then give the same ``port`` to all) inside its namespace; return the Popens in
    host order. ``env`` (default ``os.environ``) is updated by :meth:`Cluster.host_env`. Each
    agent starts a session of its own, so :func:`wait_torchrun` can stop it with its workers.
    ``job_hosts``: the job runs on these hosts only (:func:`torchrun_command`).
    """
    every = range(cluster.num_hosts) if job_hosts is None else job_hosts
    port = free_port(cluster, every[0]) if port is None else port
    chosen = every if hosts is None else hosts
    popen_kwargs.setdefault("start_new_session", True)
    procs: list[subprocess.Popen] = []
    try:
        for host in chosen:
            cmd = torchrun_command(cluster, host, nproc_per_node, argv, port=port,
                                   rdzv_id=rdzv_id, torchrun_args=torchrun_args,
                                   job_hosts=job_hosts)
            procs.append(spawn_in_host(cluster, host, cmd, env, **popen_kwargs))
    except BaseException:
        _stop(procs, 0.0)
        raise
    return procs


def _stop(procs: Sequence[subprocess.Popen], grace: float) -> None:
    """SIGTERM each agent still running (torchrun passes it to its workers), SIGKILL the whole
    session of any that is still there after ``grace`` seconds."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()


def wait_torchrun(procs: Sequence[subprocess.Popen], timeout: float) -> list[int]:
    """Wait for the agents; return their exit codes in order. When one fails, the others get
    :data:`GRACE_S` seconds to finish; agents still running then, or when ``timeout`` seconds
    have passed, are stopped with their workers (their codes are then negative or non-zero)."""
    deadline = time.monotonic() + timeout
    failed_at = None
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            break
        time.sleep(0.05)
    _stop(procs, 10.0)
    return [p.wait(timeout=10) for p in procs]


def run_torchrun(
    cluster: Cluster,
    nproc_per_node: int,
    argv: Sequence[str],
    *,
    timeout: float,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    rdzv_id: str | None = None,
    torchrun_args: Sequence[str] = (),
    **popen_kwargs: Any,
) -> list[int]:
    """Run ``torchrun ... argv`` on every host of ``cluster``, ``nproc_per_node`` ranks each;
    return each host's exit code (0 when all its workers succeeded). Torchrun numbers the nodes
    (``GROUP_RANK``; ranks ``GROUP_RANK * nproc_per_node ...``) in the order of their addresses:
    host ``h`` is node ``h`` on clusters of up to 9 hosts. See :func:`start_torchrun` and
    :func:`wait_torchrun`."""
    procs = start_torchrun(cluster, nproc_per_node, argv, port=port, env=env, rdzv_id=rdzv_id,
                           torchrun_args=torchrun_args, **popen_kwargs)
    return wait_torchrun(procs, timeout)
