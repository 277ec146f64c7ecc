"""What :func:`meshcast.launch` needs of hosts to run ranks in: the :class:`HostProvider` protocol.

The runtime knows no cluster implementation; :class:`meshcast.cluster.Cluster` (an emulated
cluster of network namespaces) is one provider, and any object with these members is another.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..core.topology import Topology

__all__ = ["HostProvider"]


@runtime_checkable
class HostProvider(Protocol):
    """Hosts that :func:`meshcast.launch` (``cluster=``) starts ranks in.

    Rank 0 runs on host 0 and creates the job's TCP store at :meth:`host_addr` ``(0)`` on the
    port :meth:`free_port` ``(0)`` finds; rank ``r`` runs on host ``r // ranks_per_host``.
    """

    name: str
    """Shown in errors."""
    num_hosts: int
    """How many hosts ranks are spread over (in equal consecutive blocks)."""

    def ensure_up(self) -> None:
        """Raise (the provider's own error, saying why) if processes cannot be started now."""
        ...

    def topology(self, devices_per_host: int) -> Topology:
        """The :class:`~meshcast.Topology` the ranks see, ``devices_per_host`` per host."""
        ...

    def host_addr(self, host: int) -> str:
        """The address other hosts reach ``host`` at."""
        ...

    def free_port(self, host: int) -> int:
        """A TCP port free on ``host``."""
        ...

    def spawn(
        self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.Popen:
        """Start ``argv`` on ``host`` with ``env`` (plus what the host needs); its Popen."""
        ...
