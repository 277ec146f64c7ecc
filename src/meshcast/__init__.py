"""meshcast: move sharded tensors from one device mesh to another as fast as the network allows.

The planning core (meshes, layouts, tasks, plans, :func:`execute_local`) needs numpy only; the
runtime that moves data over ``torch.distributed`` imports torch when first used.
"""

from .core.cache import CacheInfo, cache_info, clear_caches
from .core.fused import fused_part_index, fused_part_views, fused_tasks, part_layout, part_names
from .core.job import job_topology
from .core.layout import Box, Layout, Placement, Replicate, Shard, StridedShard
from .core.local import execute_local, gather, scatter
from .core.mesh import Mesh
from .core.names import Fuse, Piece, Stack, map_weights
from .core.picture import layout_picture
from .core.plan import AllGather, Broadcast, Copy, Op, Plan, Send, check_plan
from .core.region import Region
from .core.scales import FP8_MAX, scale_layout, scale_piece
from .core.stacked import index_layout, index_local
from .core.task import ReshardTask, UnitSlice
from .core.topology import Topology
from .estimate.lower_bound import (
    LowerBound,
    joint_lower_bound,
    lower_bound,
    lower_bound_details,
)
from .estimate.simulate import SimReport, simulate, simulate_many, time_floor
from .planning.amax import AmaxPlan, combine_local, plan_amax
from .planning.many import (
    DEFAULT_BUCKET_BYTES,
    build_schedule,
    clear_plan_cache,
    plan_cache_info,
    plan_many,
)
from .planning.planner import BALANCES, STRATEGIES, plan
from .planning.rank import rank_plan

__all__ = [
    "BALANCES",
    "DEFAULT_BUCKET_BYTES",
    "FP8_MAX",
    "STRATEGIES",
    "AllGather",
    "AmaxPlan",
    "Box",
    "Broadcast",
    "CacheInfo",
    "Copy",
    "Fuse",
    "Layout",
    "LowerBound",
    "Mesh",
    "Op",
    "Piece",
    "Placement",
    "Plan",
    "Region",
    "Replicate",
    "ReshardTask",
    "Send",
    "Shard",
    "SimReport",
    "Stack",
    "StridedShard",
    "Topology",
    "UnitSlice",
    "build_schedule",
    "cache_info",
    "check_plan",
    "clear_caches",
    "clear_plan_cache",
    "combine_local",
    "execute_local",
    "fused_part_index",
    "fused_part_views",
    "fused_tasks",
    "gather",
    "index_layout",
    "index_local",
    "job_topology",
    "joint_lower_bound",
    "layout_picture",
    "lower_bound",
    "lower_bound_details",
    "map_weights",
    "part_layout",
    "part_names",
    "plan",
    "plan_amax",
    "plan_cache_info",
    "plan_many",
    "rank_plan",
    "scale_layout",
    "scale_piece",
    "scatter",
    "simulate",
    "simulate_many",
    "time_floor",
]

__version__ = "0.1.0"

# The runtime imports torch, so its names load on first use: `import meshcast` stays numpy-only.
_RUNTIME_EXPORTS = frozenset(
    {
        "JointGroup",
        "LaunchError",
        "ReshardError",
        "TransferStats",
        "combine_amax",
        "connect",
        "detect_topology",
        "disconnect",
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
    }
)


# DTensor and whole-model resharding (meshcast.interop) import torch too.
_INTEROP_EXPORTS = frozenset(
    {"REDUCTIONS", "ParamSpec", "SyncResult", "WeightSync", "WeightSyncError", "gpt_mapping",
     "layout_from_dtensor", "llama_mapping", "reshard_dtensor", "reshard_state_dict"})


def __getattr__(name: str):
    """Lazy exports of :mod:`meshcast.runtime` (``meshcast.reshard``, ``meshcast.launch``,
    ``meshcast.reshard_many``, ...) and :mod:`meshcast.interop` (``meshcast.reshard_dtensor``,
    ``meshcast.layout_from_dtensor``, ``meshcast.reshard_state_dict``)."""
    if name in _RUNTIME_EXPORTS:
        from . import runtime

        return getattr(runtime, name)
    if name in _INTEROP_EXPORTS:
        from . import interop

        return getattr(interop, name)
    raise AttributeError(f"module 'meshcast' has no attribute {name!r}")
