"""Waiting for keys of a ``torch.distributed`` store, polled so that Ctrl-C is seen at once.

``Store.wait`` blocks inside the C++ client until every key is there or its timeout passes: a
SIGINT meanwhile is only acted on when it returns, so Ctrl-C while a rank waited for a peer to
come (building a :class:`~meshcast.WeightSync`, :func:`meshcast.connect`,
:func:`meshcast.disconnect`) took effect only after the whole timeout (minutes by default).
Polled with growing pauses instead: the interrupt is raised from the pause.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch.distributed as dist

__all__ = ["POLL_S", "wait_for_keys"]

POLL_S = (1e-3, 0.05)
"""First and longest pause between two looks at the keys: a rank that comes late is seen within
50 ms, and a long wait costs the store about 20 requests a second per waiting rank."""


def wait_for_keys(store: dist.Store, keys: Sequence[str], timeout: float) -> bool:
    """Whether every one of ``keys`` is in ``store`` within ``timeout`` seconds (False: some are
    still missing then). ``KeyboardInterrupt`` is raised as soon as it comes; a store that
    cannot be reached raises its own error."""
    keys = list(keys)
    deadline, pause = time.monotonic() + timeout, POLL_S[0]
    while not store.check(keys):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(2 * pause, POLL_S[1])
    return True
