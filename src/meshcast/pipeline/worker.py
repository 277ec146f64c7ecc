"""One rank of a pipeline job started as a plain process (e.g. inside an emulated host).

    python -m meshcast.pipeline.worker JOBS.pkl OUT_DIR

Reads a pickled list of :class:`~meshcast.pipeline.training.TrainJob` from ``JOBS.pkl``, joins
the gloo group of the ``env://`` variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``; rank 0 hosts the store), runs :func:`~meshcast.pipeline.training.run_jobs` and
writes its results to ``OUT_DIR/rank<RANK>.pkl`` (on failure: the traceback to
``OUT_DIR/rank<RANK>.err`` and exit code 1). Used by ``meshcast bench pipeline --cluster``.
"""

from __future__ import annotations

import datetime
import os
import pickle
import sys
import traceback


def main(argv: list[str] | None = None) -> int:
    """Run the jobs of ``argv[0]`` on this rank, results into directory ``argv[1]``."""
    jobs_path, out_dir = (sys.argv[1:] if argv is None else argv)[:2]
    rank = int(os.environ["RANK"])
    try:
        import torch
        import torch.distributed as dist

        from .training import run_jobs

        torch.set_num_threads(1)
        with open(jobs_path, "rb") as f:
            jobs = pickle.load(f)
        timeout = max(j.timeout for j in jobs)
        dist.init_process_group("gloo", init_method="env://",
                                timeout=datetime.timedelta(seconds=timeout))
        try:
            results = run_jobs(rank, jobs, keep_state=False)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(results, f)
        return 0
    except BaseException:  # reported to the parent through a file
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main())
