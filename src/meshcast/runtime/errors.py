"""The runtime's error type."""

from __future__ import annotations

__all__ = ["ReshardError"]


class ReshardError(RuntimeError):
    """A transfer failed or timed out; the message names this rank, the operation and the ranks
    involved. ``ranks`` holds those ranks (plan ranks)."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = ranks
