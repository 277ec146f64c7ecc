"""meshcast: move sharded tensors from one device mesh to another as fast as the network allows.

The planning core (meshes, layouts, tasks, plans, :func:`execute_local`) needs numpy only; the
runtime that moves data over ``torch.distributed`` imports torch when first used.
"""

from .job import job_topology
from .layout import Box, Layout, Placement, Replicate, Shard
from .local import execute_local, gather, scatter
from .lower_bound import LowerBound, lower_bound, lower_bound_details
from .mesh import Mesh
from .plan import AllGather, Broadcast, Copy, Op, Plan, Send
from .plan_check import check_plan
from .planner import BALANCES, STRATEGIES, plan
from .simulate import SimReport, simulate, time_floor
from .task import ReshardTask, UnitSlice
from .topology import Topology

__all__ = [
    "BALANCES",
    "STRATEGIES",
    "AllGather",
    "Box",
    "Broadcast",
    "Copy",
    "Layout",
    "LowerBound",
    "Mesh",
    "Op",
    "Placement",
    "Plan",
    "Replicate",
    "ReshardTask",
    "Send",
    "Shard",
    "SimReport",
    "Topology",
    "UnitSlice",
    "check_plan",
    "execute_local",
    "gather",
    "job_topology",
    "lower_bound",
    "lower_bound_details",
    "plan",
    "scatter",
    "simulate",
    "time_floor",
]

__version__ = "0.1.0"

# The runtime imports torch, so its names load on first use: `import meshcast` stays numpy-only.
_RUNTIME_EXPORTS = frozenset(
    {
        "LaunchError",
        "ReshardError",
        "TransferStats",
        "detect_topology",
        "launch",
        "reset_transfer_stats",
        "reshard",
        "transfer_stats",
    }
)


# DTensor and whole-model resharding (meshcast.interop); plan_many & co. need numpy only.
_INTEROP_EXPORTS = frozenset(
    {
        "clear_plan_cache",
        "plan_cache_info",
        "plan_many",
        "reshard_dtensor",
        "reshard_many",
        "reshard_state_dict",
    }
)


def __getattr__(name: str):
    """Lazy exports of :mod:`meshcast.runtime` (``meshcast.reshard``, ``meshcast.launch``, ...)
    and :mod:`meshcast.interop` (``meshcast.reshard_dtensor``, ``meshcast.reshard_many``, ...)."""
    if name in _RUNTIME_EXPORTS:
        from . import runtime

        return getattr(runtime, name)
    if name in _INTEROP_EXPORTS:
        from . import interop

        return getattr(interop, name)
    raise AttributeError(f"module 'meshcast' has no attribute {name!r}")
