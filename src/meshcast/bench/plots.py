"""Figures of the resharding benchmark, in the style of the paper's (effective bandwidth bars per
case and method; 1-to-m: bandwidth against the number of receivers). matplotlib is imported
inside the functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PLOT_METHODS: tuple[str, ...] = (
    "send_recv/none",
    "allgather/none",
    "broadcast/none",
    "broadcast/size",
    "broadcast/order",
    "auto",
    "gather-scatter",
    "per-rank-p2p",
)
"""The methods drawn (the paper's send/recv, all-gather, naive / load balance only / ours, plus our
``auto`` and the two baselines); every method is in the tables and the JSON."""

_LABELS = {
    "send_recv/none": "send/recv",
    "allgather/none": "all-gather",
    "broadcast/none": "broadcast (naive)",
    "broadcast/size": "broadcast + load balance",
    "broadcast/order": "broadcast + order (paper)",
    "auto": "auto (meshcast)",
    "gather-scatter": "gather-scatter (DTensor-style)",
    "per-rank-p2p": "per-rank p2p",
}


def _value(row: dict[str, Any]) -> float | None:
    return row.get("bandwidth_gbit")


def plot_n_to_m(rows: Sequence[dict[str, Any]], path: str, title: str) -> None:
    """Grouped bars: effective bandwidth (tensor bytes / time) per n-to-m case and method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [r for r in rows if r["suite"] == "n-to-m"]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    methods = [m for m in PLOT_METHODS if any(r["method"] == m for r in rows)]
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(cases) + 3), 4.2))
    width = 0.8 / max(1, len(methods))
    x = np.arange(len(cases))
    for i, m in enumerate(methods):
        vals = []
        for c in cases:
            row = next((r for r in rows if r["case"] == c and r["method"] == m), None)
            v = _value(row) if row else None
            vals.append(np.nan if v is None else v)
        ax.bar(x + (i - (len(methods) - 1) / 2) * width, vals, width, label=_LABELS.get(m, m))
    ax.set_xticks(x, [c.replace("case", "case ") for c in cases])
    ax.set_ylabel("effective bandwidth (Gbit/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_one_to_m(rows: Sequence[dict[str, Any]], path: str, title: str) -> None:
    """Effective bandwidth against the number of receivers: left, one destination host with more
    devices (1x1 .. 1x4); right, more hosts of 2 devices (1x1, 2x2, 3x2, 4x2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["suite"] == "1-to-m"]
    methods = [m for m in PLOT_METHODS if any(r["method"] == m for r in rows)]
    panels = (
        ("one host, more devices", ("1x1", "1x2", "1x3", "1x4")),
        ("more hosts (2 devices each)", ("1x1", "2x2", "3x2", "4x2")),
    )
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, (name, keys) in zip(axes, panels):
        for m in methods:
            pts = []
            for k in keys:
                row = next((r for r in rows if r["case"] == k and r["method"] == m), None)
                if row is not None and _value(row) is not None:
                    pts.append((row["receivers"], _value(row), k))
            if pts:
                ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], marker="o", label=_LABELS.get(m, m)
                )
        ax.set_xticks(sorted({r["receivers"] for r in rows if r["case"] in keys}))
        ax.set_xlabel("receivers (devices of the destination mesh)")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("effective bandwidth (Gbit/s)")
    axes[1].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
