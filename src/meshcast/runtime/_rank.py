"""One rank of :func:`meshcast.launch` (started by the launcher, on loopback or inside an emulated
host's network namespace; not meant to be run by hand)::

    python -m meshcast.runtime._rank JOB_DIR

Reads ``JOB_DIR/job.pkl`` (``multiprocessing``'s spawn preparation data, then the pickled
``(fn, args)``), imports the main script again as ``__mp_main__`` (with
:data:`~meshcast.runtime.launch.IMPORTING_MAIN_ENV` set, so that a script without an ``if
__name__ == "__main__":`` guard gets an error saying so instead of starting a job of its own),
runs :func:`meshcast.runtime.launch.run_rank` with this process's environment (set by the
launcher) and writes ``(ok, pickled result or traceback text)`` to ``JOB_DIR/rank<RANK>.pkl``
(atomically, by rename). Exit status 0 on success, 1 on failure.
"""

from __future__ import annotations

import multiprocessing.spawn as mp_spawn
import os
import pickle
import sys

from .launch import IMPORTING_MAIN_ENV, MissingMainGuardError, format_failure, run_rank


class _ImportingMain:
    """While the main script is imported again: :data:`IMPORTING_MAIN_ENV` names it."""

    def __init__(self, preparation: dict) -> None:
        self.script = str(preparation.get("init_main_from_path")
                          or preparation.get("init_main_from_name") or "?")

    def __enter__(self) -> _ImportingMain:
        os.environ[IMPORTING_MAIN_ENV] = self.script
        return self

    def __exit__(self, *exc: object) -> None:
        os.environ.pop(IMPORTING_MAIN_ENV, None)


def _load(job: str):
    """``(fn, args)`` of the job, after importing the main script the way spawn does. An error
    while importing it says so (code outside the ``__main__`` guard runs in every rank)."""
    with open(os.path.join(job, "job.pkl"), "rb") as f:
        preparation, payload = pickle.load(f)
    with _ImportingMain(preparation) as importing:
        try:
            mp_spawn.prepare(preparation)  # sys.path, cwd, the main script as __mp_main__
        except MissingMainGuardError:
            raise
        except Exception as exc:
            raise RuntimeError(
                f"rank {os.environ.get('RANK')} failed while importing the main script "
                f"{importing.script} again to find the function to run (every rank runs the "
                "code of the script that is outside `if __name__ == \"__main__\":`): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    try:
        return pickle.loads(payload)
    except (AttributeError, ImportError) as exc:
        raise RuntimeError(
            f"rank {os.environ.get('RANK')} cannot find the function to run ({exc}): give "
            "launch a function defined at the top level of a module or of the main script file "
            "(not inside `if __name__ == \"__main__\":`, a function, `python -c` or a notebook)"
        ) from exc


def main(argv: list[str] | None = None) -> int:
    """Run the rank of ``$RANK`` of the job in directory ``argv[0]``; 0 on success."""
    job = (sys.argv[1:] if argv is None else argv)[0]
    rank = int(os.environ["RANK"])
    try:
        fn, args = _load(job)
        value = run_rank(dict(os.environ), fn, args)
        result: tuple[bool, bytes | str] = (True, pickle.dumps(value))
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        result = (False, format_failure(exc))
    tmp = os.path.join(job, f"rank{rank}.pkl.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, os.path.join(job, f"rank{rank}.pkl"))
    return 0 if result[0] else 1


if __name__ == "__main__":
    sys.exit(main())
