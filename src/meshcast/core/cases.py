"""The benchmark cases of PAPER.md section 5, as tasks (used by the demo, tests and benches)."""

from __future__ import annotations

from dataclasses import dataclass

from .layout import Layout
from .mesh import Mesh
from .task import ReshardTask

__all__ = ["ONE_TO_M_MESHES", "PAPER_CASES", "PaperCase", "one_to_m_task"]


@dataclass(frozen=True)
class PaperCase:
    """One n-to-m case: meshes as (hosts, devices per host), layouts in the paper's notation."""

    number: int
    src_mesh: tuple[int, int]
    dst_mesh: tuple[int, int]
    src_spec: str
    dst_spec: str
    shape: tuple[int, ...] = (1024, 1024, 512)
    note: str = ""

    def task(self, dtype: str = "int32", scale: int = 1) -> ReshardTask:
        """The task with disjoint meshes (destination ranks follow the source ranks).

        ``scale`` divides the first dimension, e.g. ``scale=32`` turns 2 GiB into 64 MiB.
        """
        if self.shape[0] % scale:
            raise ValueError(f"scale={scale} must divide the first dimension {self.shape[0]}")
        shape = (self.shape[0] // scale, *self.shape[1:])
        src = Mesh.from_range(0, self.src_mesh)
        dst = Mesh.from_range(src.size, self.dst_mesh)
        return ReshardTask(shape, dtype, Layout(src, self.src_spec), Layout(dst, self.dst_spec))

    @property
    def name(self) -> str:
        """Short label, e.g. ``case3 RS0R->S0RR``."""
        return f"case{self.number} {self.src_spec}->{self.dst_spec}"


PAPER_CASES: tuple[PaperCase, ...] = (
    PaperCase(1, (2, 4), (2, 4), "S0RR", "S0RR", note="same layout"),
    PaperCase(2, (2, 4), (2, 4), "RRR", "S0RR", note="source fully replicated"),
    PaperCase(3, (2, 4), (2, 4), "RS0R", "S0RR"),
    PaperCase(4, (2, 4), (2, 4), "RS01R", "S01RR", note="fully sharded both sides"),
    PaperCase(5, (2, 4), (2, 4), "S1RR", "S0RR"),
    PaperCase(6, (2, 4), (3, 4), "S0RR", "S0RR", (3072, 1024, 170), note="2 -> 3 hosts"),
    PaperCase(7, (1, 4), (2, 4), "S1RR", "RRR"),
    PaperCase(8, (2, 4), (2, 4), "RS0R", "RRS0"),
)
"""The eight n-to-m cases; tensor 1024x1024x512 int32 (2 GiB) unless noted."""

ONE_TO_M_MESHES: tuple[tuple[int, int], ...] = (
    (1, 1),
    (1, 2),
    (1, 3),
    (1, 4),
    (2, 2),
    (3, 2),
    (4, 2),
)
"""Destination meshes of the 1-to-m suite; the source is one device."""


def one_to_m_task(
    dst_mesh: tuple[int, int], nbytes: int = 2**30, dtype: str = "int32"
) -> ReshardTask:
    """1-to-m: a replicated 1-D tensor of ``nbytes`` from rank 0 to every device of ``dst_mesh``."""
    n = nbytes // 4 if dtype == "int32" else nbytes
    src = Mesh.from_range(0, (1, 1))
    dst = Mesh.from_range(1, dst_mesh)
    return ReshardTask((n,), dtype, Layout(src, "R"), Layout(dst, "R"))
