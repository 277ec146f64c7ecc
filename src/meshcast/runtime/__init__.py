"""The runtime: run plans on ``torch.distributed`` (imports torch; the planning core does not).

- :func:`reshard` runs a plan on every rank it involves (execute.py): one executor (runner.py)
  walks a rank's operations, a transport moves the bytes (``transport="p2p"``,
  transport_p2p.py, or ``"collectives"``, transport_collectives.py);
- :func:`reshard_many` runs many plans in bounded buckets of packed messages (many.py);
- :func:`connect` joins two separately launched jobs into a :class:`JointGroup` (joint.py,
  rendezvous.py), which ``reshard_many(..., group=)`` takes;
- :func:`launch` starts local processes with a gloo group for examples and tests (launch.py);
- :func:`detect_topology` reads which host each rank is on (detect.py);
- :func:`transfer_stats` returns the byte counters the runtime fills as it sends (stats.py).
"""

from .detect import detect_topology
from .errors import ReshardError
from .execute import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_TIMEOUT, reshard
from .groups import group_cache
from .joint import JointGroup
from .launch import LaunchError, launch
from .many import ManyStats, last_many_stats, reshard_many
from .rendezvous import connect, disconnect
from .stats import TransferStats, reset_transfer_stats, transfer_stats

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_TIMEOUT",
    "JointGroup",
    "LaunchError",
    "ManyStats",
    "ReshardError",
    "TransferStats",
    "connect",
    "detect_topology",
    "disconnect",
    "group_cache",
    "last_many_stats",
    "launch",
    "reset_transfer_stats",
    "reshard",
    "reshard_many",
    "transfer_stats",
]
