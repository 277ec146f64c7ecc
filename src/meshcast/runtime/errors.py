"""The runtime's error type."""

from __future__ import annotations

__all__ = ["ReshardError"]


class ReshardError(RuntimeError):
    """A transfer failed or timed out; the message names this rank, the ranks that failed first,
    what they and this rank were doing, and the elapsed time.

    ``ranks`` holds the ranks involved (plan ranks), ``failed`` the ones that failed first (a
    rank that died, stopped or raised; empty where that is unknown).
    """

    def __init__(
        self, message: str, ranks: tuple[int, ...] = (), failed: tuple[int, ...] = ()
    ) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.failed = tuple(failed)
