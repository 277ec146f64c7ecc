"""Start ``world_size`` local processes with a gloo process group, for examples, tests and demos.

All spawning goes through :func:`rank_environment` (what one rank needs to know) and
:func:`run_rank` (start one rank given those variables), so that a later launcher can run a rank
elsewhere (e.g. in a network namespace) by calling ``run_rank`` there with the same variables.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..topology import Topology
from .detect import TOPOLOGY_ENV

__all__ = ["LaunchError", "launch", "rank_environment", "run_rank"]


class LaunchError(RuntimeError):
    """One or more ranks of :func:`launch` failed; ``failures`` maps rank -> error text."""

    def __init__(self, message: str, failures: dict[int, str]) -> None:
        super().__init__(message)
        self.failures = failures


def rank_environment(
    rank: int, world_size: int, port: int, topology: Topology | None, timeout: float
) -> dict[str, str]:
    """The environment variables one rank of :func:`launch` runs with (torchrun's names)."""
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "MESHCAST_TIMEOUT": str(timeout),
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
    """Run one rank: set ``env``, join the gloo process group through the launcher's store, call
    ``fn(rank, *args)``, leave the group, return the result."""
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=float(env["MESHCAST_TIMEOUT"]))
    store = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=False, timeout=timeout
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        result = fn(rank, *args)
        dist.barrier()  # nobody leaves while a peer may still be talking to it
    finally:
        dist.destroy_process_group()
    return result


def _child(env: dict[str, str], fn: Callable[..., Any], args: Sequence[Any], out: Any) -> None:
    rank = int(env["RANK"])
    try:
        result = run_rank(env, fn, args)
        out.put((rank, True, pickle.dumps(result)))
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        out.put((rank, False, text))


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *,
    hosts: int | Topology | None = None,
    args: Sequence[Any] = (),
    timeout: float = 120.0,
) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``world_size`` new local processes joined by a gloo process group
    and return the results in rank order.

    ``hosts`` emulates a cluster: a number of hosts (ranks split into equal consecutive blocks) or
    a :class:`~meshcast.Topology`; each rank then finds it through
    :func:`meshcast.runtime.detect_topology`. ``fn`` and ``args`` must be picklable (``fn``
    defined at module level) and so must the results. ``timeout`` bounds the whole run and every
    collective inside it; when a rank fails the others get a few seconds to report, then are
    stopped, and :class:`LaunchError` names the failed ranks with their tracebacks.
    """
    import torch.distributed as dist

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    topology = _topology(hosts, world_size)
    if not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")

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
    for rank in range(world_size):
        env = rank_environment(rank, world_size, store.port, topology, timeout)
        p = ctx.Process(target=_child, args=(env, fn, tuple(args), out), daemon=True)
        p.start()
        procs.append(p)

    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + timeout + 30.0  # start-up time on top of the work's timeout
    try:
        while len(results) + len(failures) < world_size:
            now = time.monotonic()
            if now > deadline:
                break
            try:
                rank, ok, payload = out.get(timeout=0.2)
            except queue.Empty:
                for rank, p in enumerate(procs):
                    if rank not in results and rank not in failures and not p.is_alive():
                        # give a report in flight a moment to arrive before calling it a crash
                        time.sleep(0.5)
                        _drain(out, results, failures)
                        if rank not in results and rank not in failures:
                            failures[rank] = f"exited with code {p.exitcode} without a result"
                continue
            if ok:
                results[rank] = pickle.loads(payload)
            else:
                failures[rank] = payload
            if failures:  # the others should fail fast too; do not wait out the full timeout
                deadline = min(deadline, time.monotonic() + 15.0)
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
    missing = [r for r in range(world_size) if r not in results and r not in failures]
    for r in missing:
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


def _drain(out: Any, results: dict[int, Any], failures: dict[int, str]) -> None:
    while True:
        try:
            rank, ok, payload = out.get_nowait()
        except queue.Empty:
            return
        if ok:
            results[rank] = pickle.loads(payload)
        else:
            failures[rank] = payload


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
