"""Pipeline parallelism on top of meshcast: schedules, a step-time simulator, stage graphs.

Everything importable from here is plain Python (no torch): clock tables of the GPipe, 1F1B and
eager-1F1B schedules (:func:`schedule`), the pipeline simulator (:func:`simulate_pipeline`) and
the description of what each stage receives and sends (:class:`StageGraph`). Torch code lives in
submodules imported explicitly: :mod:`meshcast.parallel.tensor_parallel` and :mod:`meshcast.models`.
"""

from .graph import StageGraph, TensorEdge
from .schedules import SCHEDULES, Action, ClockTable, Schedule, schedule, stage_order
from .simulator import Link, PipelineTiming, TransferTiming, chain_links, simulate_pipeline

__all__ = [
    "SCHEDULES",
    "Action",
    "ClockTable",
    "Link",
    "PipelineTiming",
    "Schedule",
    "StageGraph",
    "TensorEdge",
    "TransferTiming",
    "chain_links",
    "plot_schedule",
    "schedule",
    "simulate_pipeline",
    "stage_order",
]


def plot_schedule(table: ClockTable, path: str, *, title: str | None = None) -> None:
    """Draw ``table`` as a clock chart (stages down, clocks across) into the image file ``path``.

    Needs matplotlib (imported here, not by ``import meshcast.pipeline``).
    """
    from .plot import plot_schedule as _plot

    _plot(table, path, title=title)
