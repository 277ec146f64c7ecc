"""Traffic shaping of a host link with ``tc``: ``tbf`` at the NIC's rate, optionally behind a
``netem`` delay, and reading back what the kernel has configured."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.units import GBIT
from ._net import tc, tc_json

__all__ = ["LinkShaping", "read_shaping", "shape_link"]


@dataclass(frozen=True)
class LinkShaping:
    """What tc has configured on one direction of one host link (read back from the kernel)."""

    device: str
    netns: str
    rate_gbit: float
    burst_bytes: int
    delay_ms: float
    qdiscs: tuple[str, ...]


def _rate_arg(gbit: float) -> str:
    return f"{round(gbit * 1e9)}bit"


def _burst_bytes(gbit: float) -> int:
    # One millisecond of traffic, and at least two 64 KiB GSO segments, so that tbf neither
    # splits the veth's GSO packets nor starves at high rates.
    return max(2 * 65536, round(gbit * GBIT / 1000))


def shape_link(netns: str, dev: str, gbit: float, delay_ms: float) -> None:
    """Shape the egress of ``dev`` in ``netns`` to ``gbit`` Gbit/s, after ``delay_ms`` of netem
    delay when positive."""
    tbf = ["tbf", "rate", _rate_arg(gbit), "burst", str(_burst_bytes(gbit)), "latency", "20ms"]
    if delay_ms > 0:
        tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
           f"{round(delay_ms * 1000)}us", netns=netns)
        tc("qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf, netns=netns)
    else:
        tc("qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf, netns=netns)


_DELAY_RE = re.compile(r"\bdelay (\d+(?:\.\d+)?)(s|ms|us|ns)\b")
_UNIT_MS = {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}


def read_shaping(netns: str, dev: str) -> LinkShaping:
    """Read the tbf rate and netem delay configured on ``dev`` in ``netns`` back from the kernel."""
    qdiscs = tc_json("qdisc", "show", "dev", dev, netns=netns)
    kinds = tuple(q.get("kind", "?") for q in qdiscs)
    rate = 0.0
    burst = 0
    for q in qdiscs:
        if q.get("kind") == "tbf":
            opts = q.get("options", {})
            rate = float(opts.get("rate", 0)) * 8 / 1e9  # bytes/s -> Gbit/s
            burst = int(opts.get("burst", 0))
    delay = 0.0
    if "netem" in kinds:
        m = _DELAY_RE.search(tc("qdisc", "show", "dev", dev, netns=netns))
        if m:
            delay = float(m.group(1)) * _UNIT_MS[m.group(2)]
    return LinkShaping(dev, netns, rate, burst, delay, kinds)
