"""What each pipeline stage receives and sends: a small graph of named tensors (plain data).

A model split into stages (:mod:`meshcast.models`) describes its communication as a
:class:`StageGraph`: data inputs (e.g. token ids on stage 0), tensors sent from one stage to a later
one (:class:`TensorEdge`: the hidden state between adjacent stages, skip connections between
non-adjacent ones) and the outputs (e.g. logits on the last stage). Every edge is one resharding
task per microbatch in a real run (source mesh and layout of stage ``src`` to those of ``dst``);
its gradient travels back along the same edge.

A stage is any callable taking ``{name: tensor}`` (its data inputs and received edges) and
returning ``{name: tensor}`` (its sent edges and outputs); :meth:`StageGraph.run_sequential` runs
the stages one after another in one process, the reference a pipelined run must reproduce.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..core.dtypes import dtype_name, itemsize
from ..planning.planner import STRATEGIES
from .simulator import Link

__all__ = [
    "StageGraph",
    "TensorEdge",
    "check_stages",
]


class TensorEdge(NamedTuple):
    """Stage ``src`` sends tensor ``name`` of ``shape`` (per microbatch) and ``dtype`` to the
    later stage ``dst``."""

    name: str
    src: int
    dst: int
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        """Bytes per microbatch."""
        return math.prod(self.shape) * itemsize(self.dtype)


@dataclass(frozen=True)
class StageGraph:
    """The communication of a model split into ``num_stages`` stages.

    ``inputs``: ``(name, stage)`` of each data input (fed from the data loader, not received).
    ``outputs``: ``(name, stage)`` of each model output. ``edges``: tensors between stages, each
    from an earlier to a later stage. Names are unique among what one stage receives and among
    what one stage sends.
    """

    num_stages: int
    edges: tuple[TensorEdge, ...]
    inputs: tuple[tuple[str, int], ...] = ()
    outputs: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        edges = tuple(
            TensorEdge(e.name, e.src, e.dst, tuple(int(s) for s in e.shape), dtype_name(e.dtype))
            for e in (TensorEdge(*e) for e in self.edges)
        )
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "inputs", tuple((str(a), int(s)) for a, s in self.inputs))
        object.__setattr__(self, "outputs", tuple((str(a), int(s)) for a, s in self.outputs))
        n = self.num_stages
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"num_stages must be a positive integer, got {n!r}")
        for e in edges:
            if not 0 <= e.src < e.dst < n:
                raise ValueError(
                    f"edge {e.name!r}: need 0 <= src < dst < {n}, got {e.src}->{e.dst}"
                )
        for name, stage in self.inputs + self.outputs:
            if not 0 <= stage < n:
                raise ValueError(f"{name!r} is on stage {stage}, outside 0..{n - 1}")
        for i in range(n):
            for what, names in (("receives", self.receive_names(i)), ("sends", self.send_names(i))):
                if len(set(names)) != len(names):
                    raise ValueError(f"stage {i} {what} two tensors of one name: {names}")

    def receives(self, stage: int) -> tuple[TensorEdge, ...]:
        """Edges arriving at ``stage``, in graph order."""
        return tuple(e for e in self.edges if e.dst == stage)

    def sends(self, stage: int) -> tuple[TensorEdge, ...]:
        """Edges leaving ``stage``, in graph order."""
        return tuple(e for e in self.edges if e.src == stage)

    def receive_names(self, stage: int) -> tuple[str, ...]:
        """Names ``stage`` gets: its data inputs, then its received edges."""
        return tuple(a for a, s in self.inputs if s == stage) + tuple(
            e.name for e in self.receives(stage)
        )

    def send_names(self, stage: int) -> tuple[str, ...]:
        """Names ``stage`` produces: its sent edges, then its outputs."""
        return tuple(e.name for e in self.sends(stage)) + tuple(
            a for a, s in self.outputs if s == stage
        )

    def links(self, seconds: Callable[[TensorEdge], float]) -> tuple[Link, ...]:
        """Links for :func:`meshcast.pipeline.simulate_pipeline`; ``seconds(edge)`` is the time of
        one transfer of the edge (gradient assumed as long as the activation)."""
        return tuple(Link(e.src, e.dst, seconds(e), seconds(e), e.name) for e in self.edges)

    def run_sequential(
        self,
        stages: Sequence[Callable[[dict[str, Any]], Mapping[str, Any]]],
        data: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Run ``stages`` one after another on one microbatch; returns the model outputs.

        Checks that each stage returns exactly what the graph says it sends.
        """
        if len(stages) != self.num_stages:
            raise ValueError(f"got {len(stages)} stages for a graph of {self.num_stages}")
        sent: dict[tuple[int, str], Any] = {}
        outputs: dict[str, Any] = {}
        for i, stage in enumerate(stages):
            inputs = {a: data[a] for a, s in self.inputs if s == i}
            inputs.update({e.name: sent[(e.src, e.name)] for e in self.receives(i)})
            result = dict(stage(inputs))
            if sorted(result) != sorted(self.send_names(i)):
                raise ValueError(
                    f"stage {i} returned {sorted(result)}, "
                    f"the graph says {sorted(self.send_names(i))}"
                )
            for e in self.sends(i):
                sent[(i, e.name)] = result[e.name]
            outputs.update({a: result[a] for a, s in self.outputs if s == i})
        return outputs

    def describe(self) -> str:
        """One line per stage: what it receives and sends, with shapes."""
        lines = []
        for i in range(self.num_stages):
            recv = [f"{a} (data)" for a, s in self.inputs if s == i] + [
                f"{e.name}{list(e.shape)} from {e.src}" for e in self.receives(i)
            ]
            send = [f"{e.name}{list(e.shape)} to {e.dst}" for e in self.sends(i)] + [
                f"{a} (output)" for a, s in self.outputs if s == i
            ]
            lines.append(f"stage {i}: receives {', '.join(recv) or '-'}; "
                         f"sends {', '.join(send) or '-'}")
        return "\n".join(lines)


def check_stages(graph: StageGraph, meshes: Sequence[Any], strategy: str, world: int,
                 layouts: Mapping[str, Any]) -> None:
    """``ValueError`` unless ``meshes`` (one :class:`meshcast.Mesh` per stage, disjoint, in a
    default group of ``world`` ranks), ``strategy`` and the edges ``layouts`` names fit
    ``graph`` (the pipeline runtime's arguments)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is unknown; choose one of {STRATEGIES}")
    if len(meshes) != graph.num_stages:
        raise ValueError(f"got {len(meshes)} meshes for {graph.num_stages} stages")
    seen: set[int] = set()
    for i, mesh in enumerate(meshes):
        if seen & set(mesh.devices):
            raise ValueError(f"the mesh of stage {i} overlaps another stage's mesh")
        seen |= set(mesh.devices)
    if max(seen) >= world:
        raise ValueError(f"meshes use rank {max(seen)}, the default group has {world} ranks")
    unknown = set(layouts) - {e.name for e in graph.edges}
    if unknown:
        raise ValueError(f"layouts name edges the graph does not have: {sorted(unknown)}")
