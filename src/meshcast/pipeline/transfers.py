"""The boundary transfers of a pipeline step: every tensor of every microbatch in each direction,
planned once, in the one global order every rank derives from the clock table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..planning.planner import plan
from .graph import StageGraph, TensorEdge
from .schedules import Action, ClockTable

__all__ = ["Transfer", "build_transfers", "describe", "replicated_spec"]


@dataclass(frozen=True)
class Transfer:
    """One boundary tensor of one microbatch in one direction."""

    order: tuple[int, ...]
    kind: str  # "F": activation from edge.src to edge.dst; "B": its gradient back
    edge: TensorEdge
    microbatch: int
    plan: Plan
    sender: Mesh
    receiver: Mesh
    send_layout: Layout
    gather: Plan | None  # receiver side: its layout -> replicated on its mesh (None: replicated)


def replicated_spec(ndim: int) -> str:
    """The layout spec of a tensor replicated on every device of a mesh."""
    return "R" * ndim


def describe(t: Transfer) -> str:
    """What ``t`` moves, for messages (``x of microbatch 2``, ``gradient of x of ...``)."""
    name = t.edge.name if t.kind == "F" else f"gradient of {t.edge.name}"
    return f"{name} of microbatch {t.microbatch}"


def build_transfers(
    graph: StageGraph,
    meshes: Sequence[Mesh],
    table: ClockTable,
    layouts: Mapping[str, tuple[str, str]],
    topology: Topology,
    strategy: str,
    free_communication: bool,
) -> list[Transfer]:
    """Every transfer of one step, sorted by (production clock, producer, edge, direction,
    microbatch); each distinct task is planned once with ``strategy`` on ``topology``."""
    plans: dict[tuple, Plan] = {}

    def planned(task: ReshardTask) -> Plan:
        key = (task.shape, task.dtype, task.src, task.dst)
        if key not in plans:
            plans[key] = plan(task, topology, strategy=strategy)
        return plans[key]

    out: list[Transfer] = []
    for index, edge in enumerate(graph.edges):
        full = replicated_spec(len(edge.shape))
        src_spec, dst_spec = layouts.get(edge.name, (full, full))
        a, b = meshes[edge.src], meshes[edge.dst]
        for kind, (s_mesh, s_spec, r_mesh, r_spec) in (
            ("F", (a, src_spec, b, dst_spec)),
            ("B", (b, dst_spec, a, src_spec)),
        ):
            send_layout = Layout(s_mesh, s_spec)
            if free_communication:
                task = ReshardTask((1,), "uint8", Layout(s_mesh, "R"), Layout(r_mesh, "R"))
                gather = None
            else:
                recv_layout = Layout(r_mesh, r_spec)
                task = ReshardTask(edge.shape, edge.dtype, send_layout, recv_layout)
                gather = None if r_spec == full else planned(
                    ReshardTask(edge.shape, edge.dtype, recv_layout, Layout(r_mesh, full)))
            producer = edge.src if kind == "F" else edge.dst
            for mb in range(table.num_microbatches):
                clock = table.clock_of(producer, Action(kind, mb))
                out.append(Transfer(
                    (clock, producer, index, 0 if kind == "F" else 1, mb), kind, edge, mb,
                    planned(task), s_mesh, r_mesh, send_layout, gather,
                ))
    out.sort(key=lambda t: t.order)
    return out
