"""meshcast: move sharded tensors from one device mesh to another as fast as the network allows.

The planning core (meshes, layouts, tasks, plans, :func:`execute_local`) needs numpy only; the
runtime that moves data over ``torch.distributed`` imports torch when first used.
"""

from .layout import Box, Layout, Placement, Replicate, Shard
from .local import execute_local, gather, scatter
from .lower_bound import LowerBound, lower_bound, lower_bound_details
from .mesh import Mesh
from .plan import AllGather, Broadcast, Copy, Op, Plan, Send
from .planner import BALANCES, STRATEGIES, plan
from .simulate import SimReport, simulate
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
    "execute_local",
    "gather",
    "lower_bound",
    "lower_bound_details",
    "plan",
    "scatter",
    "simulate",
]

__version__ = "0.1.0"
