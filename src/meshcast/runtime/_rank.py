"""One rank of :func:`meshcast.launch` on an emulated cluster (started inside its host's network
namespace by the launcher; not meant to be run by hand)::

    python -m meshcast.runtime._rank JOB_DIR

Reads ``JOB_DIR/job.pkl`` (``multiprocessing``'s spawn preparation data, then the pickled
``(fn, args)``), runs :func:`meshcast.runtime.launch.run_rank` with this process's environment
(set by the launcher) and writes ``(ok, pickled result or traceback text)`` to
``JOB_DIR/rank<RANK>.pkl`` (atomically, by rename). Exit status 0 on success, 1 on failure.
"""

from __future__ import annotations

import multiprocessing.spawn as mp_spawn
import os
import pickle
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the rank of ``$RANK`` of the job in directory ``argv[0]``; 0 on success."""
    job = (sys.argv[1:] if argv is None else argv)[0]
    rank = int(os.environ["RANK"])
    try:
        with open(os.path.join(job, "job.pkl"), "rb") as f:
            preparation, payload = pickle.load(f)
        mp_spawn.prepare(preparation)  # sys.path, cwd, the main script as __mp_main__
        fn, args = pickle.loads(payload)

        from .launch import run_rank

        value = run_rank(dict(os.environ), fn, args)
        result: tuple[bool, bytes | str] = (True, pickle.dumps(value))
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        from .launch import _error_text

        result = (False, _error_text(exc))
    tmp = os.path.join(job, f"rank{rank}.pkl.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, os.path.join(job, f"rank{rank}.pkl"))
    return 0 if result[0] else 1


if __name__ == "__main__":
    sys.exit(main())
