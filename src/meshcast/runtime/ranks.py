"""The rank processes of :func:`meshcast.launch`: start them, pass their stderr through, collect
their reports, stop what is left.

Every rank is ``python -m meshcast.runtime._rank JOB_DIR`` (started by the caller's ``start``
function: a local process, or one inside an emulated host's namespace). ``JOB_DIR/job.pkl`` holds
``multiprocessing``'s spawn preparation data and the pickled ``(fn, args)``; each rank writes
``(ok, result or traceback)`` to ``JOB_DIR/rank<R>.pkl``. A rank's stderr goes through a pipe to
the launcher's ``sys.stderr``, and its last lines are kept: a rank that dies before it reports
(killed, ``os._exit``, a crash of the interpreter) is shown with its exit code and them.
"""

from __future__ import annotations

import collections
import multiprocessing.spawn as mp_spawn
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["GRACE_S", "STARTUP_S", "LaunchError", "collect", "run_ranks"]

GRACE_S = 15.0
"""Seconds the other ranks get to report once one rank has failed."""
STARTUP_S = 30.0
"""Seconds allowed on top of ``timeout`` for process start-up (imports, joining the group)."""
STDERR_TAIL_LINES = 30
"""Lines of a rank's stderr kept to show when it dies without a report."""
BEFORE_REPORT = "before reporting a result"
NOT_FINISHED = "did not finish in time"
AFTER_RETURN = "its function returned, but leaving the process group failed"
"""What a rank reports when only its final barrier failed (a peer failed first)."""

Report = tuple[int, bool, Any]  # (rank, ok, result or traceback text)


class LaunchError(RuntimeError):
    """One or more ranks of :func:`launch` failed; ``failures`` maps rank -> error text."""

    def __init__(self, message: str, failures: dict[int, str]) -> None:
        super().__init__(message)
        self.failures = failures


def run_ranks(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    world_size: int,
    timeout: float,
    start: Callable[[int, list[str], dict[str, str]], subprocess.Popen],
    base_env: dict[str, str],
) -> list[Any]:
    """Write the job, start every rank with ``start(rank, argv, base_env)`` (a Popen whose stderr
    is a pipe), collect the reports, and stop whatever is left."""
    job = tempfile.mkdtemp(prefix="meshcast-launch-")
    procs: list[subprocess.Popen] = []
    tails: list[StderrTail] = []
    try:
        with open(os.path.join(job, "job.pkl"), "wb") as f:
            pickle.dump((_preparation(), pickle.dumps((fn, args))), f)
        argv = [sys.executable, "-m", "meshcast.runtime._rank", job]
        base_env = _with_meshcast_importable(base_env)
        for rank in range(world_size):
            procs.append(start(rank, argv, base_env))
            tails.append(StderrTail(procs[-1]))
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

        def exited() -> dict[int, int]:
            return {r: c for r, p in enumerate(procs) if (c := p.poll()) is not None}

        return collect(world_size, timeout, fetch, exited,
                        lambda rank, code: tails[rank].describe_exit(code))
    finally:
        _stop(procs)
        for tail in tails:
            tail.join()
        shutil.rmtree(job, ignore_errors=True)


class StderrTail:
    """Passes a rank's stderr through to ``sys.stderr`` line by line (a thread) and keeps the
    last :data:`STDERR_TAIL_LINES` lines."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._thread = threading.Thread(target=self._pump, args=(proc.stderr,), daemon=True,
                                        name=f"meshcast-launch-stderr-{proc.pid}")
        self._thread.start()

    def _pump(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            self.lines.append(line.rstrip("\n"))
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):  # the launcher's stderr is closed: keep the tail only
                pass
        stream.close()

    def join(self) -> None:
        """Wait (briefly: a process the rank started may hold the pipe) for the rest."""
        self._thread.join(timeout=2.0)

    def describe_exit(self, code: int) -> str:
        """The failure text of a rank that exited with ``code`` without a report."""
        self._thread.join(timeout=1.0)  # the last lines, written just before it died
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        tail = "\n".join(f"    {line}" for line in self.lines)
        if not tail:
            return f"{how} {BEFORE_REPORT} (nothing on its stderr)"
        return f"{how} {BEFORE_REPORT}; the end of its stderr:\n{tail}"


def _with_meshcast_importable(env: dict[str, str]) -> dict[str, str]:
    """``env`` where a fresh interpreter finds this meshcast: a rank imports
    ``meshcast.runtime._rank`` before it restores the launcher's ``sys.path``. Installed in a
    site-packages folder it is found anyway; else (a source tree, a ``sys.path`` entry added by
    the caller) its folder goes first on ``PYTHONPATH``."""
    import site

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if here in {*site.getsitepackages(), site.getusersitepackages()}:
        return env
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    return {**env, "PYTHONPATH": os.pathsep.join([here, *rest])}


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


def collect(
    world_size: int,
    timeout: float,
    fetch: Callable[[float], list[Report]],
    exited: Callable[[], dict[int, int]],
    crash_text: Callable[[int, int], str],
) -> list[Any]:
    """Gather every rank's report; raise :class:`LaunchError` for failed, crashed or late ranks.

    ``fetch(wait_s)`` returns new reports (waiting up to ``wait_s`` for one); ``exited()`` the exit
    codes of the ranks whose process has ended; ``crash_text(rank, code)`` the failure text of a
    rank that ended without a report. The caller stops the processes afterwards.
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
                        failures[rank] = crash_text(rank, code)
        if failures:  # the others should fail fast too; do not wait out the full timeout
            deadline = min(deadline, time.monotonic() + GRACE_S)
    for r in range(world_size):
        if r not in results and r not in failures:
            failures[r] = f"{NOT_FINISHED} (stopped)"
    if failures:
        first = min(failures, key=lambda r: (_failure_order(failures[r]), r))
        lines = [f"meshcast.launch: ranks {sorted(failures)} of {world_size} failed"]
        lines.append(f"rank {first}: {failures[first]}")
        for r in sorted(failures):
            if r != first:
                lines.append(f"rank {r}: {failures[r].splitlines()[0]}")
        raise LaunchError("\n".join(lines), failures)
    return [results[r] for r in range(world_size)]


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def _failure_order(text: str) -> int:
    """Which failure to show in full: a rank that died without a report (most likely the cause
    of the others' errors) before one that raised, before one that was stopped, before one whose
    function returned and only the final barrier failed."""
    if BEFORE_REPORT in text:
        return 0
    if AFTER_RETURN in text:
        return 3
    return 2 if text.startswith(NOT_FINISHED) else 1
