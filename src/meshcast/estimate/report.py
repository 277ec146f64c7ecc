"""What :func:`meshcast.simulate` reports: per-operation times, bytes per host, the NICs each
operation loaded, and a Gantt chart of them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SimReport"]


@dataclass(frozen=True)
class SimReport:
    """What :func:`simulate` found.

    ``start_s[i]`` / ``end_s[i]``: when operation ``i`` of the plan started (its ranks free) and
    finished; ``transfer_s[i]``: when it began moving bytes (after its latency). ``op_nics[i]``:
    the NICs it loads, as indices into ``nic_names``. ``host_bytes_out[h]`` / ``host_bytes_in[h]``:
    bytes leaving / entering host ``h`` through its NICs (int64; exact Python ints, dtype object,
    in the rare case that a count exceeds int64).
    """

    time_s: float
    start_s: np.ndarray
    transfer_s: np.ndarray
    end_s: np.ndarray
    host_bytes_out: np.ndarray
    host_bytes_in: np.ndarray
    op_nics: tuple[tuple[int, ...], ...]
    nic_names: tuple[str, ...]
    kinds: tuple[str, ...]

    @property
    def timeline(self) -> list[tuple[int, str, float, float]]:
        """``[(op index, kind, start_s, end_s), ...]`` sorted by start time."""
        order = np.lexsort((np.arange(len(self.start_s)), self.start_s))
        return [
            (int(i), self.kinds[i], float(self.start_s[i]), float(self.end_s[i])) for i in order
        ]

    def nic_intervals(self) -> dict[str, list[tuple[float, float, int]]]:
        """``{nic name: [(begin_s, end_s, op index), ...]}``: when each NIC carried which op."""
        out: dict[str, list[tuple[float, float, int]]] = {n: [] for n in self.nic_names}
        for i, nics in enumerate(self.op_nics):
            for k in nics:
                out[self.nic_names[k]].append(
                    (float(self.transfer_s[i]), float(self.end_s[i]), i)
                )
        return out

    def summary(self) -> str:
        """Time and bytes per host, one line each."""
        lines = [f"simulated time: {self.time_s * 1e3:.3f} ms over {len(self.start_s)} ops"]
        for h, (o, i) in enumerate(zip(self.host_bytes_out, self.host_bytes_in)):
            if o or i:
                lines.append(f"  host {h}: out {int(o)} B, in {int(i)} B")
        return "\n".join(lines)

    def plot(self, path: str, title: str = "") -> None:
        """Draw the schedule as a Gantt chart, one row per NIC direction, into ``path`` (PNG)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        intervals = {k: v for k, v in self.nic_intervals().items() if v}
        rows = list(intervals)
        fig_h = max(2.0, 0.35 * len(rows) + 1.2)
        fig, ax = plt.subplots(figsize=(11, fig_h))
        colours = plt.get_cmap("tab20")
        for y, name in enumerate(rows):
            bars = [(b * 1e3, max(e - b, 0.0) * 1e3) for b, e, _ in intervals[name]]
            faces = [colours(i % 20) for _, _, i in intervals[name]]
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=faces, edgecolor="black", lw=0.2)
        ax.set_yticks(range(len(rows)), rows)
        ax.invert_yaxis()
        ax.set_xlabel("time (ms)")
        ax.set_xlim(0, max(self.time_s * 1e3, 1e-9) * 1.02)
        ax.set_title(title or f"simulated schedule: {self.time_s * 1e3:.3f} ms")
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
