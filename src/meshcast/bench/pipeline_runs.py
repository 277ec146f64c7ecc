"""The measured pipeline benchmark: both models trained by the pipeline runtime with every
strategy x schedule, GPipe and the free-communication bound (:data:`CLUSTER_RUNS`), on an
emulated cluster of one host per stage (loopback without root). ``meshcast bench pipeline
--cluster N`` prints :func:`summarise_runs`."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["CLUSTER_RUNS", "cluster_jobs", "job_notes", "run_cluster_jobs", "summarise_runs"]

CLUSTER_RUNS: tuple[tuple[str, str, bool], ...] = (
    ("send_recv", "1f1b", False),
    ("send_recv", "eager_1f1b", False),
    ("allgather", "1f1b", False),
    ("allgather", "eager_1f1b", False),
    ("broadcast", "1f1b", False),
    ("broadcast", "eager_1f1b", False),
    ("broadcast", "gpipe", False),
    ("free", "1f1b", True),
    ("free", "eager_1f1b", True),
    ("free", "gpipe", True),
)
"""(strategy, schedule, free communication) of each measured run; send_recv + 1F1B is the
baseline."""


def cluster_jobs(num_stages: int, ranks_per_host: int, microbatches: int, steps: int,
                 nic_gbit: float, models: Sequence[str]) -> list:
    """The runs of ``--cluster``: both models, sized so that on 2 shared CPU cores a boundary
    transfer at 1 Gbit/s takes about as long as a stage's compute of one microbatch."""
    from ..models import gpt, utransformer
    from ..training.training import TrainJob

    configs = {
        # 1 block per stage (n_layer = stages), 64 wide, 256 tokens: per microbatch of 8
        # sequences the hidden state is 512 KiB
        "gpt": (gpt.GPTConfig(vocab_size=64, block_size=256, n_layer=num_stages, n_head=2,
                              n_embd=64), 8),
        # 2 levels, 32 wide at 256 tokens; on 2 stages the first sends hidden (8, 64, 128) and
        # the skips (8, 256, 32), (8, 128, 64): 768 KiB per microbatch of 8
        "utransformer": (utransformer.UTransformerConfig(in_dim=16, dim=32, levels=2, n_head=2,
                                                         seq_len=256), 8),
    }
    ranks = tuple(tuple(range(i * ranks_per_host, (i + 1) * ranks_per_host))
                  for i in range(num_stages))
    jobs = []
    for model in models:
        config, per_mb = configs[model]
        for strategy, sched, free in CLUSTER_RUNS:
            jobs.append(TrainJob(
                model, config, ranks, sched, "broadcast" if free else strategy,
                batch_size=per_mb * microbatches, num_microbatches=microbatches, steps=steps,
                lr=0.01, free_communication=free, timeout=120.0, nic_gbps=nic_gbit,
                label=f"{model}|{strategy}|{sched}",
            ))
    return jobs


def run_cluster_jobs(jobs: list, hosts: int, ranks_per_host: int, nic_gbit: float,
                     timeout: float) -> tuple[list[list[dict]], str]:
    """Run ``jobs`` on an emulated cluster (or on loopback without root, where communication is
    nearly free): per-rank results and a sentence saying where they ran."""
    from ..cluster.job import run_on_emulated_hosts
    from ..training.training import run_jobs

    return run_on_emulated_hosts(
        run_jobs, hosts * ranks_per_host, ranks_per_host, nic_gbit=nic_gbit,
        args=(jobs, False), timeout=timeout, name=f"mc-pipe{os.getpid() % 100000}",
    )


def summarise_runs(jobs: Sequence, results: Sequence[Sequence[dict]]
                   ) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Per (model, strategy, schedule): samples/s and the step time (median over the timed steps
    of the slowest rank, every step starting at a barrier; the first step not timed), the peak
    activation bytes per stage, and the job."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for k, job in enumerate(jobs):
        per_rank = [results[r][k] for r in range(len(results))]
        steps = [max(p["seconds"][s] for p in per_rank) for s in range(1, job.steps)]
        step_s = statistics.median(steps)
        peaks: dict[int, int] = {}
        for p in per_rank:
            peaks[p["stage"]] = max(peaks.get(p["stage"], 0), p["peak_activation_bytes"])
        model, strategy, sched = job.label.split("|")
        rows[(model, strategy, sched)] = {
            "samples": job.batch_size / step_s, "step_s": step_s,
            "peaks": [peaks[i] for i in range(job.num_stages)], "job": job,
        }
    return rows


def job_notes(rows: dict[tuple[str, str, str], dict[str, Any]], models: Sequence[str]
              ) -> list[str]:
    """One line per model: its configuration and the tensors each stage sends."""
    from ..training.training import stage_graph

    notes = []
    for model in models:
        job = rows[(model, "send_recv", "1f1b")]["job"]
        graph = stage_graph(job)
        sends = "; ".join(
            f"stage {i} sends " + ", ".join(f"{e.name}{list(e.shape)}" for e in graph.sends(i))
            for i in range(graph.num_stages - 1))
        notes.append(f"{model}: {job.config}; microbatch {job.microbatch_size} sequences, "
                     f"float32: {sends}")
    return notes
