"""Ctrl-C (SIGINT) during a call: the interrupt becomes this rank's failure of the call.

Python's default handler raises ``KeyboardInterrupt`` wherever the main thread is, which would
leave the call half done: messages posted, later ones never posted, nothing on the error board.
A rank that then lived on (a notebook, a handler that catches the interrupt) left its peers
waiting the whole ``timeout`` for it, named as a rank that "stopped responding", with their
process groups closed by gloo's time-out. While a call moves data, the first SIGINT is instead
reported on the call's board as this rank's failure (by a short-lived thread: the handler may run
while the main thread holds the failure lock); the rank then sends placeholders, as after any
failure, so every rank finishes the call at once and its peers raise naming it, and this rank
raises ``KeyboardInterrupt`` at the end of the call. A second SIGINT raises at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from .p2p import Failures

__all__ = ["INTERRUPTED", "interrupts_as_failures"]

INTERRUPTED = "the middle of its transfers"
"""What the board says this rank was doing when it was interrupted."""


@contextlib.contextmanager
def interrupts_as_failures(failures: Failures) -> Iterator[list[bool]]:
    """Within the block, a SIGINT is recorded in ``failures`` instead of raised (module
    docstring); yields a one-item list, True once interrupted. Does nothing outside the main
    thread or where the program installed its own SIGINT handler."""
    state = [False]
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield state
        return
    reporters: list[threading.Thread] = []

    def handler(signum: int, frame: object) -> None:
        if state[0]:  # the second one: leave now
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        state[0] = True
        reporter = threading.Thread(target=failures.error, name="meshcast-interrupt",
                                    args=(INTERRUPTED, KeyboardInterrupt("SIGINT (Ctrl-C)")))
        reporter.start()
        reporters.append(reporter)

    signal.signal(signal.SIGINT, handler)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for reporter in reporters:
            reporter.join()
