"""The resharding benchmark: the paper's suites, every method, real runs checked byte for byte.

Cases (:func:`suite_cases`): the 1-to-m suite (one source device to each mesh of
:data:`meshcast.core.cases.ONE_TO_M_MESHES`, layout ``R -> R``) and the eight n-to-m cases of
:data:`meshcast.core.cases.PAPER_CASES`, int32, scaled to ``nbytes`` (default 64 MiB). Each case
runs on an emulated cluster whose hosts are the meshes' rows: ``devices_per_host`` = the meshes'
column count, source rows first, then destination rows. A 1-to-m source is one device, alone on
host 0; that host gets ``devices_per_host - 1`` idle ranks so that every host has as many ranks
(idle ranks only join the barriers).

Methods (:data:`METHODS`): ``STRATEGY/BALANCE`` for the three strategies x ``none``, ``size``,
``order``; ``auto`` (``plan(task, topology)``, defaults); and two baselines written directly on
``torch.distributed``:

* ``gather-scatter`` (what DTensor users do today): the source mesh all-gathers the full tensor
  (``full_tensor()``: one all-gather per sharded mesh axis, last axis first, on sub-groups), its
  first rank sends the full tensor to every destination rank (all sends at once), which slices
  its part;
* ``per-rank-p2p`` (pipeline libraries when layouts agree): the source rank at each mesh position
  sends its whole shard to the destination rank at the same position, which slices its part. It
  applies only where both meshes have the same shape and every destination box lies inside the
  matching source box (:func:`applies`): the n-to-m cases 1 and 2 and the 1-to-m mesh (1,1).

Every run (warm-ups included) is checked exactly on every destination rank against the expected
shard (values = linear element index, unique per element); a run whose data is wrong on any rank
is reported as a failure and never timed (:class:`DataError` from :func:`check_results`).
Test hook: ``corrupt=METHOD`` (``"*"``: every method; the CLI reads ``$MESHCAST_BENCH_CORRUPT``)
flips one byte of the received shard on the first destination rank after each run of that method,
before the check.

Time of one run: all ranks leave a barrier, each notes ``time.monotonic()`` before and after the
method, and the run takes ``max(end) - min(start)`` over all ranks (every rank is on this
machine, so they share one monotonic clock; network namespaces do not change clocks).

This module is the benchmark's public face; the code lives in ``reshard_cases`` (cases),
``reshard_methods`` (methods, baseline model), ``reshard_worker`` (one rank of a job),
``reshard_suite`` (the runner) and ``reshard_report`` (simulated rows, JSON, markdown).
"""


from .reshard_cases import (
    BASELINES,
    CORRUPT_ENV,
    FIXED,
    METHODS,
    PAPER_NBYTES,
    PAPER_ONE_TO_M_NBYTES,
    PAYLOAD_FRACTION,
    PLAN_LATENCY_US,
    BenchCase,
    DataError,
    parse_size,
    preset_topology,
    suite_cases,
)
from .reshard_methods import applies, baseline_model, baseline_model_s, build_plans, gather_steps
from .reshard_report import dumps, load_avg, markdown_report, simulated_rows
from .reshard_suite import (
    RANK_START_S,
    RUN_OVERHEAD_S,
    count_runs,
    estimate_s,
    job_methods,
    run_suite,
)
from .reshard_worker import JobSpec, case_worker, check_results, merge_probe

__all__ = [
    "BASELINES",
    "CORRUPT_ENV",
    "FIXED",
    "METHODS",
    "PAPER_NBYTES",
    "PAPER_ONE_TO_M_NBYTES",
    "PAYLOAD_FRACTION",
    "PLAN_LATENCY_US",
    "RANK_START_S",
    "RUN_OVERHEAD_S",
    "BenchCase",
    "DataError",
    "JobSpec",
    "applies",
    "baseline_model",
    "baseline_model_s",
    "build_plans",
    "case_worker",
    "check_results",
    "count_runs",
    "dumps",
    "estimate_s",
    "gather_steps",
    "job_methods",
    "load_avg",
    "markdown_report",
    "merge_probe",
    "parse_size",
    "preset_topology",
    "run_suite",
    "simulated_rows",
    "suite_cases",
]
