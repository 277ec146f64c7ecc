"""The runtime: run plans on ``torch.distributed`` (imports torch; the planning core does not).

- :func:`reshard` runs a plan on every rank it involves (execute.py): one executor (runner.py)
  walks a rank's operations, a transport moves the bytes (``transport="p2p"``,
  transport_p2p.py, or ``"collectives"``, transport_collectives.py);
- :func:`reshard_many` runs many plans in bounded buckets of packed messages (many.py);
- :func:`connect` joins two separately launched jobs into a :class:`JointGroup` (joint.py,
  rendezvous.py), which ``reshard_many(..., group=)`` takes;
- :func:`launch` starts local processes with a gloo group for examples and tests (launch.py);
- :func:`detect_topology` reads which host each rank is on (detect.py);
- :func:`quantize_shard` and :func:`combine_amax` convert shards to FP8 on the sending side,
  exactly as the whole tensor (convert.py);
- :func:`shard_of` takes a rank's shard (a region of one or several boxes) of a whole tensor
  (tensors.py);
- :func:`transfer_stats` returns the byte counters the runtime fills as it sends (stats.py).
"""

from .convert import combine_amax, partial_amax, quantize, quantize_shard, scales_of
from .detect import detect_topology
from .errors import ReshardError
from .execute import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_TIMEOUT, reshard
from .groups import group_cache
from .joint import JointGroup
from .launch import LaunchError, launch
from .many import ManyStats, last_many_stats, reshard_many
from .rendezvous import connect, disconnect
from .stats import TransferStats, reset_transfer_stats, transfer_stats
from .tensors import shard_of

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_TIMEOUT",
    "JointGroup",
    "LaunchError",
    "ManyStats",
    "ReshardError",
    "TransferStats",
    "combine_amax",
    "connect",
    "detect_topology",
    "disconnect",
    "group_cache",
    "last_many_stats",
    "launch",
    "partial_amax",
    "quantize",
    "quantize_shard",
    "reset_transfer_stats",
    "reshard",
    "reshard_many",
    "scales_of",
    "shard_of",
    "transfer_stats",
]
