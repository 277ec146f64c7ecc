"""An emulated multi-host cluster on one machine: one network namespace per host.

Layout (``name`` defaults to ``"mc"``; every namespace name starts with ``mc-``)::

    netns <name>-h0                netns <name>-sw                netns <name>-h1
    lo (up), mc0 10.213.0.1/24 ==veth== h0 --+-- br0 --+-- h1 ==veth== mc0 10.213.0.2/24, lo
                                              (bridge, no addresses)

* The bridge lives in a namespace of its own (``<name>-sw``), so nothing at all is created in the
  root namespace: its firewall, routes, ``bridge-nf-call-iptables`` and addresses are never touched,
  and no interface name can clash with the machine's.
* Each host's link is shaped in both directions with ``tbf`` at ``nic_gbit``: host -> switch on
  the host's ``mc0`` (egress), switch -> host on the switch's ``h<i>`` (egress towards the host).
  So a host sends at most ``nic_gbit`` and receives at most ``nic_gbit``, full duplex, like a NIC.
* One-way latency ``latency_ms`` is added with ``netem`` on each host's egress (so host -> host is
  ``latency_ms`` one way). Kernels without ``sch_netem`` get no added latency (a warning says so
  and :attr:`Cluster.latency_ms` is 0.0: it always reports what is configured, read back from tc).
* Ranks of host ``h`` run inside ``<name>-h<h>`` (see :func:`meshcast.cluster.spawn_in_host`) with
  gloo bound to ``mc0``; ranks of one host reach each other over the host's own address, which the
  kernel routes over loopback, so intra-host traffic is not shaped and inter-host traffic is.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.topology import EMULATED_INTRA_GBPS
from ..core.units import GBIT
from ._net import (
    PREFIX,
    ClusterError,
    delete_netns,
    ip,
    ip_json,
    list_netns,
    netns_pids,
    tc,
    tc_json,
)

if TYPE_CHECKING:
    from ..core.topology import Topology

__all__ = [
    "DEFAULT_NAME",
    "IFACE",
    "INTRA_GBPS",
    "SUBNET",
    "Cluster",
    "ClusterWarning",
    "LinkShaping",
    "available",
    "list_clusters",
    "netem_available",
    "nic_tx_bytes",
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
_NETNS_RE = re.compile(r"^(mc(?:-[a-z0-9]+)*)-(sw|h(\d+))$")
_RESERVED = re.compile(r"^(sw|h\d+)$")


class ClusterWarning(UserWarning):
    """Part of the requested emulation is not available on this kernel (e.g. netem)."""


@dataclass(frozen=True)
class LinkShaping:
    """What tc has configured on one direction of one host link (read back from the kernel)."""

    device: str
    netns: str
    rate_gbit: float
    burst_bytes: int
    delay_ms: float
    qdiscs: tuple[str, ...]


# -- availability --------------------------------------------------------------------------------
_NETEM: dict[str, bool] = {}


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """Whether emulated clusters can be built here, and why not if they cannot.

    Checks Linux, root, ``ip``/``tc``, then really creates (and deletes) a probe namespace holding a
    veth pair, a bridge and a ``tbf`` qdisc. Also probes ``netem`` (see :func:`netem_available`).
    The answer is cached for the process.
    """
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "not root: creating network namespaces needs root (CAP_SYS_ADMIN, NET_ADMIN)"
    probe = f"{PREFIX}probe-{os.getpid()}"
    try:
        ip("-V")
        tc("-V")
    except ClusterError as exc:
        return False, str(exc)
    try:
        try:
            ip("netns", "add", probe)
        except ClusterError as exc:
            return False, f"network namespaces are unavailable: {exc}"
        try:
            ip("link", "add", "p0", "type", "veth", "peer", "name", "p1", netns=probe)
        except ClusterError as exc:
            return False, f"veth interfaces are unavailable: {exc}"
        try:
            ip("link", "add", BRIDGE, "type", "bridge", netns=probe)
        except ClusterError as exc:
            return False, f"bridges are unavailable: {exc}"
        try:
            tc("qdisc", "add", "dev", "p0", "root", "tbf", "rate", "1gbit", "burst", "128k",
               "latency", "20ms", netns=probe)
        except ClusterError as exc:
            return False, f"the tbf traffic shaper is unavailable: {exc}"
        try:
            tc("qdisc", "add", "dev", "p1", "root", "netem", "delay", "1ms", netns=probe)
            _NETEM["ok"] = True
        except ClusterError:
            _NETEM["ok"] = False
        return True, "network namespaces, veth, bridge and tbf work" + (
            "" if _NETEM["ok"] else "; netem is missing, so latency is not emulated"
        )
    finally:
        with contextlib.suppress(ClusterError):
            delete_netns(probe, kill=False)


def netem_available() -> bool:
    """Whether the kernel has ``sch_netem`` (needed to add latency); probed by :func:`available`."""
    ok, _ = available()
    return ok and _NETEM.get("ok", False)


def _require() -> None:
    ok, reason = available()
    if not ok:
        raise ClusterError(f"cannot build an emulated cluster here: {reason}")


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
        m = _NETNS_RE.match(ns)
        groups.setdefault(m.group(1) if m else ns, []).append(ns)
    return groups


def _rate_arg(gbit: float) -> str:
    return f"{round(gbit * 1e9)}bit"


def _burst_bytes(gbit: float) -> int:
    # One millisecond of traffic, and at least two 64 KiB GSO segments, so that tbf neither
    # splits the veth's GSO packets nor starves at high rates.
    return max(2 * 65536, round(gbit * GBIT / 1000))


def _shape(netns: str, dev: str, gbit: float, delay_ms: float) -> None:
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


# -- the cluster ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cluster:
    """An emulated cluster of ``num_hosts`` hosts (network namespaces) behind one shaped switch.

    Build one with :meth:`up` (or ``meshcast cluster up``), find an existing one with
    :meth:`detect`, remove it with :meth:`down` (or ``meshcast cluster down``). Usable as a context
    manager: ``with Cluster.up(2) as c: ...`` brings it down on exit.
    """

    name: str
    num_hosts: int
    nic_gbit: float
    latency_ms: float

    # -- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def up(
        cls,
        num_hosts: int,
        nic_gbit: float = 1.0,
        latency_ms: float = 0.1,
        *,
        name: str = DEFAULT_NAME,
    ) -> Cluster:
        """Create the namespaces, bridge, veths, addresses and shaping; return the cluster.

        ``nic_gbit`` is each host's bandwidth per direction (Gbit/s); ``latency_ms`` the added
        one-way host-to-host latency (needs netem; without it a :class:`ClusterWarning` is issued
        and no latency is added). Raises :class:`ClusterError` when not root, when namespaces are
        unavailable, or when a cluster of that name (or a leftover of one) exists. A failure half
        way removes what was made.
        """
        check_name(name)
        if isinstance(num_hosts, bool) or not isinstance(num_hosts, int):
            raise ValueError(f"num_hosts must be an integer, got {num_hosts!r}")
        if not 1 <= num_hosts <= MAX_HOSTS:
            raise ValueError(f"num_hosts must be between 1 and {MAX_HOSTS}, got {num_hosts}")
        for arg, v in (("nic_gbit", nic_gbit), ("latency_ms", latency_ms)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v:
                raise ValueError(f"{arg} must be a non-negative number, got {v!r}")
        if not nic_gbit > 0:
            raise ValueError(f"nic_gbit must be positive, got {nic_gbit!r}")
        _require()
        leftovers = list_clusters().get(name)
        if leftovers:
            raise ClusterError(
                f"cluster {name!r} already exists ({', '.join(leftovers)}); "
                f"run `meshcast cluster down --name {name}` first"
            )
        if latency_ms > 0 and not netem_available():
            warnings.warn(
                f"this kernel has no netem qdisc: latency_ms={latency_ms} is not emulated "
                "(bandwidth shaping is)",
                ClusterWarning,
                stacklevel=2,
            )
            latency_ms = 0.0
        cluster = cls(name, num_hosts, float(nic_gbit), float(latency_ms))
        try:
            cluster._build()
        except BaseException:
            cluster.down()
            raise
        return cluster

    def _build(self) -> None:
        sw = self.switch_netns
        ip("netns", "add", sw)
        ip("link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "forward_delay", "0",
           netns=sw)
        ip("link", "set", BRIDGE, "addrgenmode", "none", netns=sw)
        ip("link", "set", BRIDGE, "up", netns=sw)
        for h in range(self.num_hosts):
            ns, port = self.netns(h), self.switch_port(h)
            ip("netns", "add", ns)
            # Both ends are created directly inside their namespaces: nothing touches the root one.
            ip("link", "add", IFACE, "type", "veth", "peer", "name", port, "netns", sw, netns=ns)
            ip("link", "set", IFACE, "addrgenmode", "none", netns=ns)  # no IPv6 link-local
            ip("link", "set", port, "addrgenmode", "none", netns=sw)
            ip("link", "set", port, "master", BRIDGE, netns=sw)
            ip("addr", "add", f"{self.host_addr(h)}/24", "dev", IFACE, netns=ns)
            ip("link", "set", "lo", "up", netns=ns)
            ip("link", "set", IFACE, "up", netns=ns)
            ip("link", "set", port, "up", netns=sw)
            _shape(ns, IFACE, self.nic_gbit, self.latency_ms)  # host -> switch
            _shape(sw, port, self.nic_gbit, 0.0)  # switch -> host

    def down(self, *, kill: bool = True, timeout: float = 5.0) -> list[str]:
        """Remove every namespace of this cluster that exists (also leftovers of a crash).

        Processes still running inside them are ended first (SIGTERM, then SIGKILL after
        ``timeout`` s) unless ``kill`` is false. Returns the namespaces removed.
        """
        return down(self.name, kill=kill, timeout=timeout)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @classmethod
    def detect(cls, name: str = DEFAULT_NAME) -> Cluster | None:
        """The existing cluster called ``name``, read back from the kernel; None if there is none.

        Raises :class:`ClusterError` if only part of it exists (e.g. after a crash during ``up``):
        run :func:`down` then.
        """
        check_name(name)
        names = set(list_clusters().get(name, []))
        if not names:
            return None
        hosts = sorted(int(m.group(3)) for n in names if (m := _NETNS_RE.match(n)) and m.group(3))
        n = len(hosts)
        broken = f"cluster {name!r} is incomplete ({', '.join(sorted(names))}); run down"
        if f"{name}-sw" not in names or hosts != list(range(n)) or n == 0:
            raise ClusterError(broken)
        try:
            shaping = read_shaping(f"{name}-h0", IFACE)
        except ClusterError:
            raise ClusterError(broken) from None
        if shaping.rate_gbit <= 0:
            raise ClusterError(broken)
        return cls(name, n, round(shaping.rate_gbit, 6), round(shaping.delay_ms, 6))

    # -- names and addresses --------------------------------------------------------------------
    @property
    def switch_netns(self) -> str:
        """Namespace holding the bridge."""
        return f"{self.name}-sw"

    def _check_host(self, host: int) -> int:
        if isinstance(host, bool) or not isinstance(host, int) or not 0 <= host < self.num_hosts:
            raise ValueError(f"host must be in 0..{self.num_hosts - 1}, got {host!r}")
        return host

    def netns(self, host: int) -> str:
        """Network namespace of ``host`` (``<name>-h<host>``)."""
        return f"{self.name}-h{self._check_host(host)}"

    def switch_port(self, host: int) -> str:
        """The switch-side veth of ``host`` (inside :attr:`switch_netns`)."""
        return f"h{self._check_host(host)}"

    def host_addr(self, host: int) -> str:
        """IPv4 address of ``host`` on its interface :data:`IFACE` (``10.213.0.<host+1>``)."""
        return f"{SUBNET}.{self._check_host(host) + 1}"

    @property
    def iface(self) -> str:
        """Interface name inside every host namespace (set as ``GLOO_SOCKET_IFNAME``)."""
        return IFACE

    @property
    def namespaces(self) -> list[str]:
        """All namespaces of this cluster: switch first, then hosts in order."""
        return [self.switch_netns] + [self.netns(h) for h in range(self.num_hosts)]

    def exists(self) -> bool:
        """Whether any namespace of this cluster exists."""
        return bool(list_clusters().get(self.name))

    def host_env(self, host: int) -> dict[str, str]:
        """Environment a process of ``host`` needs: gloo's interface and the master address.

        ``GLOO_SOCKET_IFNAME`` / ``TP_SOCKET_IFNAME`` = :data:`IFACE`; ``MASTER_ADDR`` = host 0's
        address; ``MESHCAST_CLUSTER``, ``MESHCAST_HOST``, ``MESHCAST_HOST_ADDR``,
        ``MESHCAST_NUM_HOSTS`` describe the placement. ``MASTER_PORT``, ``RANK`` etc. are the
        launcher's (see :func:`meshcast.cluster.rank_env`).
        """
        return {
            "GLOO_SOCKET_IFNAME": IFACE,
            "TP_SOCKET_IFNAME": IFACE,
            "MASTER_ADDR": self.host_addr(0),
            "MESHCAST_CLUSTER": self.name,
            "MESHCAST_HOST": str(self._check_host(host)),
            "MESHCAST_HOST_ADDR": self.host_addr(host),
            "MESHCAST_NUM_HOSTS": str(self.num_hosts),
        }

    # -- inspection -----------------------------------------------------------------------------
    def shaping(self, host: int) -> dict[str, LinkShaping]:
        """tc's configuration of ``host``'s link: ``{"egress": host->switch, "ingress": ...}``."""
        return {
            "egress": read_shaping(self.netns(host), IFACE),
            "ingress": read_shaping(self.switch_netns, self.switch_port(host)),
        }

    def pids(self) -> dict[str, list[int]]:
        """Processes running inside each namespace of this cluster."""
        return {ns: netns_pids(ns) for ns in self.namespaces}

    def addresses(self, host: int) -> list[str]:
        """IPv4 addresses (with prefix length) on ``host``'s :data:`IFACE`, read from the kernel."""
        info = ip_json("-4", "addr", "show", "dev", IFACE, netns=self.netns(host))
        return [f"{a['local']}/{a['prefixlen']}" for i in info for a in i.get("addr_info", [])]

    def topology(self, devices_per_host: int, *, intra_gbps: float = INTRA_GBPS) -> Topology:
        """A :class:`meshcast.Topology` matching this cluster: ``devices_per_host`` consecutive
        ranks per host, one NIC per host at :attr:`nic_gbit` in and out, :attr:`latency_ms`."""
        from ..core.topology import Topology

        return Topology.uniform(
            self.num_hosts,
            devices_per_host,
            nic_gbps=self.nic_gbit,
            nics_per_host=1,
            intra_gbps=intra_gbps,
            latency_us=self.latency_ms * 1000.0,
            name=f"cluster:{self.name}",
        )


def down(name: str = DEFAULT_NAME, *, kill: bool = True, timeout: float = 5.0) -> list[str]:
    """Remove every namespace of cluster ``name``, found by name (works after a crash).

    Returns the namespaces removed. See :meth:`Cluster.down`.
    """
    check_name(name)
    removed = []
    # hosts first, switch last: veth peers vanish with either end
    for ns in sorted(list_clusters().get(name, []), key=lambda n: n.endswith("-sw")):
        delete_netns(ns, kill=kill, timeout=timeout)
        removed.append(ns)
    return removed


def down_all(*, kill: bool = True, timeout: float = 5.0) -> list[str]:
    """Remove every namespace whose name starts with ``mc-`` (all clusters, all leftovers)."""
    removed = []
    for group in list_clusters().values():
        for ns in sorted(group, key=lambda n: n.endswith("-sw")):
            delete_netns(ns, kill=kill, timeout=timeout)
            removed.append(ns)
    return removed


def nic_tx_bytes() -> int | None:
    """Bytes sent so far through this host's emulated NIC (``IFACE``), read inside a host's
    namespace; None outside an emulated host."""
    try:
        with open(f"/sys/class/net/{IFACE}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return None
