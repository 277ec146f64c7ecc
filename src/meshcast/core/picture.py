"""A text picture of a layout: which rank holds which indices of one tensor dimension."""

from __future__ import annotations

from collections.abc import Sequence

from .checks import as_index, as_shape
from .layout import Layout

__all__ = ["layout_picture"]

_MAX_WIDTH = 96


def layout_picture(layout: Layout, shape: Sequence[int], dim: int = 0) -> str:
    """One line per rank of ``layout``'s mesh: a strip of dimension ``dim`` of a tensor of
    ``shape`` with ``#`` where the rank holds the index, and its runs in local order, e.g.
    ``rank 1  ....##......##..  4:6 12:14``. A fused dimension's parts are named above the strip.
    Dimensions longer than 96 indices are not drawn (the runs are still listed)."""
    shape = as_shape(shape)
    if not 0 <= as_index(dim, "dim") < len(shape):
        raise ValueError(f"dim {dim} is not a dimension of shape {shape}")
    n = shape[dim]
    draw = n <= _MAX_WIDTH
    width = max(len(str(r)) for r in layout.mesh.devices)
    lines = []
    split = layout.splits(len(shape))[dim]
    if split.parts and draw:
        ruler = "".join(p.name[0] * p.size for p in split.parts)
        lines.append(f"{'parts':<{width + 5}}  {ruler}")
    for rank in layout.mesh.devices:
        region = layout.region(rank, shape)
        runs = region.runs[dim]
        strip = ""
        if draw:
            cells = ["."] * n
            for a, b in runs:
                cells[a:b] = "#" * (b - a)
            strip = "".join(cells) + "  "
        where = " ".join(f"{a}:{b}" for a, b in runs) or "-"
        lines.append(f"rank {rank:<{width}}  {strip}{where}")
    return "\n".join(lines)
