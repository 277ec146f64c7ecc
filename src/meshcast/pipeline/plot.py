"""Clock charts of pipeline schedules with matplotlib (imported by :func:`plot_schedule` only)."""

from __future__ import annotations

from .schedules import ClockTable

__all__ = ["plot_schedule"]


def plot_schedule(table: ClockTable, path: str, *, title: str | None = None) -> None:
    """Draw ``table``: one row per stage, one cell per clock, forwards blue, backwards green,
    each labelled with its microbatch; idle clocks stay white."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n, clocks = table.num_stages, table.num_clocks
    fig, ax = plt.subplots(figsize=(max(4.0, 0.32 * clocks + 1.2), 0.45 * n + 0.9), dpi=120)
    colors = {"F": "#8fb8e8", "B": "#9ad39a"}
    for t, row in enumerate(table.clocks):
        for i, a in enumerate(row):
            if a is None:
                continue
            ax.add_patch(plt.Rectangle((t, i), 1, 1, facecolor=colors[a.kind], edgecolor="black",
                                       linewidth=0.6))
            ax.text(t + 0.5, i + 0.5, str(a.microbatch), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, clocks)
    ax.set_ylim(n, 0)
    ax.set_yticks([i + 0.5 for i in range(n)], [f"stage {i}" for i in range(n)], fontsize=8)
    step = 1 if clocks <= 24 else 2
    ax.set_xticks([t + 0.5 for t in range(0, clocks, step)],
                  [str(t) for t in range(0, clocks, step)], fontsize=7)
    ax.set_xlabel("clock", fontsize=8)
    ax.tick_params(length=0)
    peaks = ",".join(str(table.peak_inflight(i)) for i in range(n))
    ax.set_title(title or f"{table.name}: n={n}, m={table.num_microbatches}, {clocks} clocks, "
                 f"peak in-flight {peaks}  (blue: forward, green: backward)", fontsize=8)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
