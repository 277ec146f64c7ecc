"""``meshcast cluster up|down|status|exec``: an emulated multi-host cluster of network namespaces.

    meshcast cluster up --hosts 2 [--nic-gbit 1] [--latency-ms 0.1] [--name mc]
    meshcast cluster status
    meshcast cluster exec --host 1 -- python worker.py   # run inside host 1's namespace
    meshcast cluster torchrun --nproc-per-node 2 -- train.py   # torchrun on every host
    meshcast cluster down [--name mc | --all]

Needs root. See docs/cluster.md.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from ..cluster.cluster import MAX_HOSTS, check_name
from .common import UsageError, integer, number


def cluster_name(text: str) -> str:
    """``--name``: a cluster name as :func:`meshcast.cluster.cluster.check_name` accepts it."""
    try:
        return check_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Sub-actions of ``meshcast cluster``."""
    sub = parser.add_subparsers(dest="action", required=True)

    def name_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--name", type=cluster_name, default="mc",
                       help="cluster name: 'mc' (default) or 'mc-<words>'; namespaces are "
                            "<name>-sw and <name>-h<i>")

    up = sub.add_parser("up", help="create the namespaces, bridge and shaped links")
    up.add_argument("--hosts", type=integer(1, MAX_HOSTS), required=True,
                    help="number of emulated hosts")
    up.add_argument("--nic-gbit", type=number(0.0), default=1.0,
                    help="bandwidth of each host's link, per direction, Gbit/s (default 1)")
    up.add_argument("--latency-ms", type=number(0.0, strict=False), default=0.1,
                    help="added one-way latency between hosts, ms (needs netem; default 0.1)")
    name_arg(up)

    down = sub.add_parser("down", help="remove a cluster (also the leftovers of a crash)")
    name_arg(down)
    down.add_argument("--all", action="store_true",
                      help="remove every namespace named mc-* (all clusters on this machine)")
    down.add_argument("--no-kill", action="store_true",
                      help="do not end processes still running inside the namespaces")

    status = sub.add_parser("status", help="list the clusters that exist and their shaping")
    status.add_argument("--name", type=cluster_name, default=None, help="only this cluster")

    ex = sub.add_parser("exec", help="run a command inside one host's namespace")
    ex.add_argument("--host", type=integer(0), required=True, help="host index (0-based)")
    name_arg(ex)
    ex.add_argument("--timeout", type=number(0.0), default=None,
                    help="kill it after this many seconds")
    ex.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command and its arguments")

    tr = sub.add_parser("torchrun", help="run torchrun on every host (one node per host)")
    name_arg(tr)
    tr.add_argument("--nproc-per-node", type=integer(1), default=1,
                    help="ranks per host (torchrun's --nproc-per-node; default 1)")
    tr.add_argument("--port", type=integer(1, 65535), default=None,
                    help="rendezvous port on host 0 (default: a free one; give it with --node)")
    tr.add_argument("--node", type=integer(0, MAX_HOSTS - 1), action="append", default=None,
                    help="start only this host's node (repeatable; default: every host)")
    tr.add_argument("--timeout", type=number(0.0), default=None,
                    help="stop every node after this many seconds (default: no limit)")
    tr.add_argument("argv", nargs=argparse.REMAINDER,
                    help="-- then the script and its arguments (or -m module ...)")


def run(args: argparse.Namespace) -> int:
    """Dispatch to the sub-action; :class:`ClusterError` becomes exit status 1."""
    from ..cluster import ClusterError

    try:
        actions = {"up": _up, "down": _down, "status": _status, "exec": _exec,
                   "torchrun": _torchrun}
        return actions[args.action](args)
    except ClusterError as exc:
        print(f"meshcast cluster: error: {exc}", file=sys.stderr)
        return 1


def _up(args: argparse.Namespace) -> int:
    from ..cluster import Cluster

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cluster = Cluster.up(args.hosts, args.nic_gbit, args.latency_ms, name=args.name)
    for w in caught:
        print(f"note: {w.message}", file=sys.stderr)
    _describe(cluster)
    return 0


def _down(args: argparse.Namespace) -> int:
    from ..cluster import down, down_all

    kill = not args.no_kill
    removed = down_all(kill=kill) if args.all else down(args.name, kill=kill)
    print(f"removed {', '.join(removed)}" if removed else "nothing to remove")
    return 0


def _status(args: argparse.Namespace) -> int:
    from ..cluster import Cluster, ClusterError, list_clusters

    groups = list_clusters()
    if args.name is not None:
        groups = {k: v for k, v in groups.items() if k == args.name}
    if not groups:
        print("no emulated cluster (no mc-* namespaces)")
        return 0
    for name, namespaces in groups.items():
        try:
            cluster = Cluster.detect(name)
        except (ClusterError, ValueError) as exc:
            print(f"{name}: leftovers {', '.join(namespaces)} ({exc})")
            continue
        if cluster is not None:
            _describe(cluster)
    return 0


def _describe(cluster) -> None:
    pids = cluster.pids()
    print(f"cluster {cluster.name}: {cluster.num_hosts} hosts, {cluster.nic_gbit:g} Gbit/s per "
          f"host and direction, +{cluster.latency_ms:g} ms one way; switch netns "
          f"{cluster.switch_netns}")
    for h in range(cluster.num_hosts):
        shaping = cluster.shaping(h)
        out, inn = shaping["egress"], shaping["ingress"]
        print(f"  host {h}: netns {cluster.netns(h)}, {cluster.iface} "
              f"{', '.join(cluster.addresses(h))}, out {out.rate_gbit:g} Gbit/s "
              f"({'+'.join(out.qdiscs)}), in {inn.rate_gbit:g} Gbit/s ({'+'.join(inn.qdiscs)}), "
              f"{len(pids[cluster.netns(h)])} processes")
    print(f"  ranks of host H: `meshcast cluster exec --name {cluster.name} --host H -- CMD` "
          f"(GLOO_SOCKET_IFNAME={cluster.iface}, MASTER_ADDR={cluster.host_addr(0)})")


def _exec(args: argparse.Namespace) -> int:
    import subprocess

    from ..cluster import Cluster, ClusterError, spawn_in_host

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise UsageError("give the command after --: meshcast cluster exec --host 0 -- ip addr")
    cluster = Cluster.detect(args.name)
    if cluster is None:
        raise ClusterError(f"no cluster {args.name!r}; run `meshcast cluster up` first")
    if args.host >= cluster.num_hosts:
        raise UsageError(f"--host {args.host}: cluster {cluster.name!r} has hosts 0 to "
                         f"{cluster.num_hosts - 1}")
    proc = spawn_in_host(cluster, args.host, argv)
    try:
        return proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        print(f"meshcast cluster: killed after {args.timeout:g} s", file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=10)
        return 130


def _torchrun(args: argparse.Namespace) -> int:
    from ..cluster import Cluster, ClusterError, start_torchrun, wait_torchrun

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        print("meshcast cluster torchrun: error: give the script after --, e.g. "
              "meshcast cluster torchrun --nproc-per-node 2 -- train.py", file=sys.stderr)
        return 2
    if args.nproc_per_node < 1:
        print(f"meshcast cluster torchrun: error: --nproc-per-node must be at least 1, got "
              f"{args.nproc_per_node}", file=sys.stderr)
        return 2
    if args.timeout is not None and not args.timeout > 0:
        print(f"meshcast cluster torchrun: error: --timeout must be positive, got {args.timeout}",
              file=sys.stderr)
        return 2
    if args.port is not None and not 0 < args.port < 65536:
        print(f"meshcast cluster torchrun: error: --port must be in 1..65535, got {args.port}",
              file=sys.stderr)
        return 2
    if args.node is not None and args.port is None:
        print("meshcast cluster torchrun: error: --node needs --port (the same on every node)",
              file=sys.stderr)
        return 2
    cluster = Cluster.detect(args.name)
    if cluster is None:
        raise ClusterError(f"no cluster {args.name!r}; run `meshcast cluster up` first")
    for h in args.node or ():
        if not 0 <= h < cluster.num_hosts:
            print(f"meshcast cluster torchrun: error: --node must be in 0..{cluster.num_hosts - 1}"
                  f", got {h}", file=sys.stderr)
            return 2
    procs = start_torchrun(cluster, args.nproc_per_node, argv, port=args.port, hosts=args.node)
    try:
        codes = wait_torchrun(procs, float("inf") if args.timeout is None else args.timeout)
    except KeyboardInterrupt:
        codes = wait_torchrun(procs, 0.0)
    hosts = args.node or list(range(cluster.num_hosts))
    print("meshcast cluster torchrun: " + ", ".join(
        f"host {h} exit {c}" + (" (stopped)" if c < 0 else "") for h, c in zip(hosts, codes)),
        file=sys.stderr)
    return next((c if c > 0 else 1 for c in codes if c != 0), 0)
