"""Helpers shared by the command-line tools."""

from __future__ import annotations

import argparse

from ..task import ReshardTask
from ..topology import PRESETS, Topology


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1024,1024,512"`` -> (1024, 1024, 512)."""
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shape {text!r} must be integers separated by commas"
        ) from None


def topology_for(spec: str | None, task: ReshardTask) -> Topology | None:
    """``--topology``: a preset name, ``uniform:D`` (D devices per host), or None (mesh rows)."""
    if spec is None:
        return None
    top_rank = max(max(task.src.mesh.devices), max(task.dst.mesh.devices))
    if spec.startswith("uniform:"):
        per_host = int(spec.split(":", 1)[1])
        return Topology.uniform(top_rank // per_host + 1, per_host)
    if spec in PRESETS:
        per_host = PRESETS[spec][0]
        return Topology.preset(spec, top_rank // per_host + 1)
    raise ValueError(f"--topology {spec!r}: give a preset ({', '.join(PRESETS)}) or uniform:D")
