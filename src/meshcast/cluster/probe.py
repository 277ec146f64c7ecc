"""Whether emulated clusters can be built on this machine: probed once per process (really
creating and deleting a namespace), the answer kept in the bounded cache ``cluster.available``
(``meshcast.clear_caches(["cluster.available"])`` probes again)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NamedTuple

from ..core.cache import BoundedCache
from ._net import PREFIX, ClusterError, delete_netns, ip, tc
from .names import BRIDGE

__all__ = ["Availability", "available", "netem_available", "require_available"]


class Availability(NamedTuple):
    """The probe's answer: clusters can be built (``ok``), why (not), and whether netem works."""

    ok: bool
    reason: str
    netem: bool


_PROBED: BoundedCache[str, Availability] = BoundedCache(
    "cluster.available", 1, "whether emulated clusters (and netem) work here, probed once"
)


def available() -> tuple[bool, str]:
    """Whether emulated clusters can be built here, and why not if they cannot.

    Checks Linux, root, ``ip``/``tc``, then really creates (and deletes) a probe namespace holding a
    veth pair, a bridge and a ``tbf`` qdisc. Also probes ``netem`` (see :func:`netem_available`).
    The answer is cached for the process.
    """
    answer = _PROBED.get_or_make("probe", _probe)
    return answer.ok, answer.reason


def netem_available() -> bool:
    """Whether the kernel has ``sch_netem`` (needed to add latency); probed by :func:`available`."""
    answer = _PROBED.get_or_make("probe", _probe)
    return answer.ok and answer.netem


def require_available() -> None:
    """Raise :class:`ClusterError` saying why if emulated clusters cannot be built here."""
    ok, reason = available()
    if not ok:
        raise ClusterError(f"cannot build an emulated cluster here: {reason}")


def _probe() -> Availability:
    if not sys.platform.startswith("linux"):
        return Availability(False, f"network namespaces need Linux (this is {sys.platform})", False)
    if os.geteuid() != 0:
        return Availability(
            False, "not root: creating network namespaces needs root (CAP_SYS_ADMIN, NET_ADMIN)",
            False,
        )
    try:
        ip("-V")
        tc("-V")
    except ClusterError as exc:
        return Availability(False, str(exc), False)
    probe = f"{PREFIX}probe-{os.getpid()}"
    try:
        return _probe_in(probe)
    finally:
        with contextlib.suppress(ClusterError):
            delete_netns(probe, kill=False)


def _probe_in(probe: str) -> Availability:
    steps = (
        ("network namespaces are unavailable", ("netns", "add", probe), None),
        ("veth interfaces are unavailable",
         ("link", "add", "p0", "type", "veth", "peer", "name", "p1"), probe),
        ("bridges are unavailable", ("link", "add", BRIDGE, "type", "bridge"), probe),
    )
    for what, args, netns in steps:
        try:
            ip(*args, netns=netns)
        except ClusterError as exc:
            return Availability(False, f"{what}: {exc}", False)
    try:
        tc("qdisc", "add", "dev", "p0", "root", "tbf", "rate", "1gbit", "burst", "128k",
           "latency", "20ms", netns=probe)
    except ClusterError as exc:
        return Availability(False, f"the tbf traffic shaper is unavailable: {exc}", False)
    try:
        tc("qdisc", "add", "dev", "p1", "root", "netem", "delay", "1ms", netns=probe)
        netem = True
    except ClusterError:
        netem = False
    reason = "network namespaces, veth, bridge and tbf work" + (
        "" if netem else "; netem is missing, so latency is not emulated"
    )
    return Availability(True, reason, netem)
