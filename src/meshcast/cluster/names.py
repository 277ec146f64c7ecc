"""Names and addresses of an emulated cluster: the constants of its layout, what a cluster may be
called, and which namespaces of ours exist (grouped by cluster)."""

from __future__ import annotations

import re

from ..core.topology import EMULATED_INTRA_GBPS
from ._net import PREFIX, list_netns

__all__ = [
    "BRIDGE",
    "DEFAULT_NAME",
    "IFACE",
    "INTRA_GBPS",
    "MAX_HOSTS",
    "NETNS_RE",
    "SUBNET",
    "check_name",
    "list_clusters",
]

#: Name of the default cluster (``meshcast cluster up`` without ``--name``).
DEFAULT_NAME = "mc"
#: The private /24 used for host addresses; host ``h`` is ``SUBNET.(h+1)``. Only ever configured
#: inside our own namespaces, so it cannot clash with the machine's networks.
SUBNET = "10.213.0"
#: The interface of each host namespace (what ``GLOO_SOCKET_IFNAME`` names).
IFACE = "mc0"
#: Bridge inside the switch namespace.
BRIDGE = "br0"
#: Intra-host bandwidth used by :meth:`Cluster.topology` (Gbit/s):
#: :data:`meshcast.core.topology.EMULATED_INTRA_GBPS`.
INTRA_GBPS = EMULATED_INTRA_GBPS
#: Largest cluster: one /24.
MAX_HOSTS = 250

_NAME_RE = re.compile(r"^mc(-[a-z0-9]+)*$")
#: A namespace of a cluster: group 1 the cluster's name, group 3 the host number (None: switch).
NETNS_RE = re.compile(r"^(mc(?:-[a-z0-9]+)*)-(sw|h(\d+))$")
_RESERVED = re.compile(r"^(sw|h\d+)$")


def check_name(name: str) -> str:
    """Validate a cluster name: ``mc`` or ``mc-`` followed by lowercase words joined by ``-``."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > 48:
        raise ValueError(
            f"cluster name {name!r} must be 'mc' or start with 'mc-' (lowercase letters, digits "
            "and '-', at most 48 characters)"
        )
    if _RESERVED.match(name.rsplit("-", 1)[-1]) and name != DEFAULT_NAME:
        raise ValueError(f"cluster name {name!r} must not end in '-sw' or '-h<digits>'")
    return name


def list_clusters() -> dict[str, list[str]]:
    """``{cluster name: [its namespaces]}`` for every namespace of ours (``mc-*``) that exists.

    Probe namespaces (``mc-probe-<pid>``) left by a crash are listed under their own name.
    """
    groups: dict[str, list[str]] = {}
    for ns in list_netns():
        if not ns.startswith(PREFIX):
            continue
        m = NETNS_RE.match(ns)
        groups.setdefault(m.group(1) if m else ns, []).append(ns)
    return groups
