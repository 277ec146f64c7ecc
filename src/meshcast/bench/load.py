"""Background load for the benchmarks: busy-loop processes started beside a run and always
stopped after it, so that a loaded figure can be reproduced (``meshcast bench resharding
--busy N``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["busy_loops"]


@contextmanager
def busy_loops(n: int) -> Iterator[list[int]]:
    """Run ``n`` processes that spin on a core each (``while True: pass``) for the ``with``
    block; yields their pids; each is killed and waited for at the end, also on an error."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                          stdin=subprocess.DEVNULL))
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
