"""Byte counters filled by the runtime as it hands messages to the backend (instrumentation, not
estimates): the tests use them to check how many bytes cross host boundaries."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = [
    "TransferStats",
    "record_send",
    "reset_transfer_stats",
    "set_hosts_source",
    "transfer_stats",
]


@dataclass
class TransferStats:
    """Totals for the messages this process has sent since the last reset.

    ``cross_host_bytes`` counts messages whose receiver sits on another host: on the real hosts
    where meshcast knows them (the job's environment, as :func:`meshcast.job_topology` reads it,
    or a :func:`meshcast.detect_topology` already gathered), else by the plan's topology;
    ``hosts_from`` says which, for the last transfer. ``by_peer`` maps each receiving rank to the
    bytes sent to it.
    """

    messages: int = 0
    sent_bytes: int = 0
    cross_host_bytes: int = 0
    cross_host_messages: int = 0
    by_peer: dict[int, int] = field(default_factory=dict)
    hosts_from: str = ""

    def copy(self) -> TransferStats:
        """An independent copy."""
        return TransferStats(
            self.messages,
            self.sent_bytes,
            self.cross_host_bytes,
            self.cross_host_messages,
            dict(self.by_peer),
            self.hosts_from,
        )


_lock = threading.Lock()
_stats = TransferStats()


def record_send(dst: int, nbytes: int, cross_host: bool) -> None:
    """Count one message of ``nbytes`` handed to the backend for rank ``dst``."""
    with _lock:
        _stats.messages += 1
        _stats.sent_bytes += nbytes
        _stats.by_peer[dst] = _stats.by_peer.get(dst, 0) + nbytes
        if cross_host:
            _stats.cross_host_bytes += nbytes
            _stats.cross_host_messages += 1


def set_hosts_source(source: str) -> None:
    """Say where the host map used for ``cross_host_bytes`` came from (:class:`TransferStats`)."""
    with _lock:
        _stats.hosts_from = source


def transfer_stats() -> TransferStats:
    """A snapshot of this process's counters."""
    with _lock:
        return _stats.copy()


def reset_transfer_stats() -> None:
    """Zero this process's counters."""
    global _stats
    with _lock:
        _stats = TransferStats()
