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

A call defers SIGINT from its start, not only over its transfers (:func:`call_interrupts`):
in the input agreement it calls the call off on every rank (nothing was sent); where the
agreement has already found every record (its peers go ahead), the transfer reports it at once
as this rank's failure, so no peer waits for a rank that left in between. A caller that does
more than one call's transfers (a weight sync: its version exchange, the transfer, its commit;
interop/weight_sync.py) defers SIGINT over the whole of it (:func:`deferred_interrupts`) and
turns it into its failure where it can; a call made inside reports an interrupt that came
before it at once, as its failure.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

from .p2p import Failures

__all__ = [
    "INTERRUPTED", "Deferral", "call_interrupts", "deferred_interrupts", "interrupts_as_failures",
]

INTERRUPTED = "the middle of its transfers"
"""What the board says this rank was doing when it was interrupted."""


class Deferral:
    """One block in which SIGINT is deferred: ``hit`` once interrupted (within it, or before it
    in a block around it); ``on_first`` runs at the first SIGINT."""

    def __init__(self, on_first: Callable[[], None]) -> None:
        self.hit = False
        self.on_first = on_first


_stack: list[Deferral] = []  # the blocks now open, innermost last (the main thread's)


def _handler(signum: int, frame: object) -> None:
    if any(scope.hit for scope in _stack):  # the second one: leave now
        signal.signal(signal.SIGINT, signal.default_int_handler)
        raise KeyboardInterrupt
    for scope in _stack:
        scope.hit = True
    _stack[-1].on_first()


@contextlib.contextmanager
def _deferred(on_first: Callable[[], None]) -> Iterator[Deferral]:
    scope = Deferral(on_first)
    current = signal.getsignal(signal.SIGINT)
    if (threading.current_thread() is not threading.main_thread()
            or current not in (signal.default_int_handler, _handler)):
        yield scope  # not the main thread, or the program handles SIGINT itself
        return
    nested = current is _handler  # inside another block: the handler is in place already
    pending = nested and any(s.hit for s in _stack)
    _stack.append(scope)
    if not nested:
        signal.signal(signal.SIGINT, _handler)
    try:
        if pending:  # interrupted before this block, in the one around it
            scope.hit = True
            on_first()
        yield scope
    finally:
        _stack.remove(scope)
        if not nested:
            signal.signal(signal.SIGINT, current)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[Deferral]:
    """Within the block, the first SIGINT only sets the yielded :class:`Deferral`'s ``hit`` (the
    block acts on it); a second raises ``KeyboardInterrupt`` at once. Calls made inside report
    it as their failure (:func:`interrupts_as_failures`). Does nothing outside the main thread
    or where the program installed its own SIGINT handler."""
    with _deferred(lambda: None) as scope:
        yield scope


@contextlib.contextmanager
def call_interrupts() -> Iterator[Callable[[], bool]]:
    """Over one call, from its argument checks to its end: the first SIGINT is deferred, and the
    yielded function says whether it came (the agreement then calls the call off, agree.py; the
    transfers report it as this rank's failure, :func:`interrupts_as_failures`). The block ends
    in ``KeyboardInterrupt`` where it came: raised after the block, or from the error the block
    raised. Does nothing inside a block that defers SIGINT already (its caller acts on it), outside
    the main thread, or where the program installed its own SIGINT handler."""
    if _stack:
        yield lambda: False
        return
    with _deferred(lambda: None) as scope:
        try:
            yield lambda: scope.hit
        except Exception as exc:
            if scope.hit:
                raise KeyboardInterrupt(str(exc)) from exc
            raise
    if scope.hit:
        raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_as_failures(failures: Failures) -> Iterator[list[bool]]:
    """Within the block, a SIGINT is recorded in ``failures`` instead of raised (module
    docstring), as is one that came before it within :func:`deferred_interrupts`; yields a
    one-item list, True (once the block ends) where this rank was interrupted. Does nothing
    outside the main thread or where the program installed its own SIGINT handler."""
    state = [False]
    reporters: list[threading.Thread] = []

    def report() -> None:
        reporter = threading.Thread(target=failures.error, name="meshcast-interrupt",
                                    args=(INTERRUPTED, KeyboardInterrupt("SIGINT (Ctrl-C)")))
        reporter.start()
        reporters.append(reporter)

    try:
        with _deferred(report) as scope:
            yield state
    finally:
        for reporter in reporters:
            reporter.join()
        state[0] = scope.hit
