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

import os
import subprocess
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._net import (
    ClusterError,
    delete_netns,
    exec_in_netns,
    free_port_in_netns,
    ip,
    ip_json,
    netns_pids,
)
from .names import (
    BRIDGE,
    DEFAULT_NAME,
    IFACE,
    INTRA_GBPS,
    MAX_HOSTS,
    NETNS_RE,
    SUBNET,
    check_name,
    list_clusters,
)
from .probe import available, netem_available, require_available
from .shaping import LinkShaping, read_shaping, shape_link

if TYPE_CHECKING:
    from ..core.topology import Topology

__all__ = [
    "DEFAULT_NAME",
    "IFACE",
    "INTRA_GBPS",
    "MAX_HOSTS",
    "SUBNET",
    "Cluster",
    "ClusterWarning",
    "LinkShaping",
    "available",
    "check_name",
    "down",
    "down_all",
    "list_clusters",
    "netem_available",
    "nic_tx_bytes",
]


class ClusterWarning(UserWarning):
    """Part of the requested emulation is not available on this kernel (e.g. netem)."""


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
        require_available()
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
            shape_link(ns, IFACE, self.nic_gbit, self.latency_ms)  # host -> switch
            shape_link(sw, port, self.nic_gbit, 0.0)  # switch -> host

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
        hosts = sorted(int(m.group(3)) for n in names if (m := NETNS_RE.match(n)) and m.group(3))
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

    # -- processes (what :func:`meshcast.launch` needs of a host provider) ----------------------
    def spawn(
        self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.Popen:
        """Start ``argv`` inside ``host``'s network namespace; return its Popen.

        The child's environment is ``env`` (default: this process's environment) updated with
        :meth:`host_env` (``GLOO_SOCKET_IFNAME``, ``MASTER_ADDR`` = host 0's address,
        ``MESHCAST_HOST`` ...): the cluster's settings win, since an inherited ``MASTER_ADDR`` or
        interface name would be wrong inside the namespace. ``popen_kwargs`` go to
        :class:`subprocess.Popen` (``stdout``, ``stderr``, ``cwd``, ``start_new_session`` ...).

        ``ip netns exec`` execs ``argv`` in place, so the returned pid is the program's own:
        signalling or waiting on it behaves as for a plain Popen. Processes left running are ended
        by :meth:`down`.
        """
        if isinstance(argv, (str, bytes)) or not argv:
            raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
        if "env" in popen_kwargs or "args" in popen_kwargs:
            raise TypeError("spawn_in_host: pass env= and argv positionally, not in popen_kwargs")
        ns = self.netns(host)
        full_env = dict(os.environ if env is None else env)
        full_env.update(self.host_env(host))
        return exec_in_netns(ns, argv, full_env, **popen_kwargs)

    def free_port(self, host: int = 0, timeout: float = 15.0) -> int:
        """A TCP port the kernel reports free on ``host`` (for ``MASTER_PORT``)."""
        return free_port_in_netns(self.netns(host), timeout)

    def ensure_up(self) -> None:
        """Raise :class:`ClusterError` if no namespace of this cluster exists."""
        if not self.exists():
            raise ClusterError(f"cluster {self.name!r} is not up (no namespace of it exists)")

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
