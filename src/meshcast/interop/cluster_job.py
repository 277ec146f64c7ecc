"""Run ``fn(rank, *args)`` on every rank of a job on the emulated cluster, or on loopback.

A stop-gap until :func:`meshcast.launch` takes ``cluster=``: :func:`run_job` brings up an emulated
cluster (:mod:`meshcast.cluster`, needs root) of ``world // ranks_per_host`` hosts whose links are
shaped to ``nic_gbit``, starts one process per rank inside its host (``python -m
meshcast.interop.cluster_job``), and collects each rank's pickled result. Where the cluster is not
available it falls back to :func:`meshcast.launch` with an emulated topology (loopback, unshaped)
and says so. Each rank sees the job's :class:`~meshcast.Topology` in ``$MESHCAST_TOPOLOGY``.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from ..topology import Topology

__all__ = ["run_job"]


def run_job(
    fn: Callable[..., Any],
    world: int,
    ranks_per_host: int,
    *,
    nic_gbit: float = 1.0,
    args: Sequence[Any] = (),
    timeout: float = 300.0,
    loopback: bool = False,
) -> tuple[list[Any], str]:
    """Results of ``fn(rank, *args)`` in rank order, and where it ran (a one-line description).

    ``fn`` must be a module-level function (found again by module and name; a script's function
    by the script's path, so keep its work under ``if __name__ == "__main__":``).
    """
    from ..cluster import Cluster, available, start_job, wait_job

    ok, why = available()
    if loopback or not ok:
        import meshcast

        topo = Topology.uniform(world // ranks_per_host, ranks_per_host, nic_gbps=nic_gbit)
        results = meshcast.launch(fn, world, hosts=topo, args=args, timeout=timeout)
        reason = "--loopback" if loopback else why
        return results, f"loopback, unshaped ({reason}); {topo.num_hosts} hosts x {ranks_per_host}"
    hosts = world // ranks_per_host
    with tempfile.TemporaryDirectory(prefix="meshcast-job-") as tmp, Cluster.up(
        hosts, nic_gbit=nic_gbit, latency_ms=0.0, name=f"mc-job{os.getpid() % 100000}"
    ) as cluster:
        topo = cluster.topology(ranks_per_host)
        module = fn.__module__
        path = sys.modules[module].__file__ if module == "__main__" else None
        spec = {"module": module, "path": path, "name": fn.__name__, "out": tmp,
                "timeout": timeout}
        with open(os.path.join(tmp, "args.pkl"), "wb") as f:
            pickle.dump(tuple(args), f)
        env = {**os.environ, "MESHCAST_TOPOLOGY": json.dumps(topo.to_json()),
               "OMP_NUM_THREADS": "1"}
        procs = start_job(
            cluster, [sys.executable, "-m", "meshcast.interop.cluster_job", json.dumps(spec)],
            ranks_per_host, env=env,
        )
        codes = wait_job(procs, timeout + 30)
        results, errors = [], []
        for r in range(world):
            path = os.path.join(tmp, f"rank{r}.pkl")
            if not os.path.exists(path):
                errors.append(f"rank {r}: exit code {codes[r]}, no result")
                continue
            with open(path, "rb") as f:
                ok_r, value = pickle.load(f)
            if ok_r:
                results.append(value)
            else:
                errors.append(f"rank {r}: {value}")
        if errors:
            raise RuntimeError("cluster job failed:\n" + "\n".join(errors[:4]))
        where = (f"emulated cluster: {hosts} hosts x {ranks_per_host} ranks, NICs shaped to "
                 f"{nic_gbit:g} Gbit/s each way")
        return results, where


def _worker(spec: dict[str, Any]) -> None:
    import datetime
    import traceback

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    out = os.path.join(spec["out"], f"rank{rank}.pkl")
    try:
        with open(os.path.join(spec["out"], "args.pkl"), "rb") as f:
            args = pickle.load(f)
        if spec.get("path"):  # a script's function: load the file under another name
            from importlib import util as importlib_util

            loader = importlib_util.spec_from_file_location("_meshcast_job_main", spec["path"])
            module = importlib_util.module_from_spec(loader)
            sys.modules["_meshcast_job_main"] = module
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(spec["module"])
        fn = getattr(module, spec["name"])
        dist.init_process_group(
            "gloo", timeout=datetime.timedelta(seconds=spec["timeout"])
        )
        try:
            value = fn(rank, *args)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        result = (True, value)
    except BaseException as exc:
        result = (False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    with open(out, "wb") as f:
        pickle.dump(result, f)
    if not result[0]:
        sys.exit(1)


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
