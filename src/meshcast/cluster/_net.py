"""Thin wrappers over ``ip`` and ``tc``: every call has a timeout and a clear error.

Nothing here imports torch. Everything this package creates is a *named network namespace* whose
name starts with :data:`PREFIX`; interfaces are created directly inside those namespaces (never in
the root namespace), so deleting the namespaces removes everything.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CMD_TIMEOUT_S",
    "PREFIX",
    "ClusterError",
    "delete_netns",
    "exec_in_netns",
    "free_port_in_netns",
    "ip",
    "ip_json",
    "list_netns",
    "netns_pids",
    "tc",
    "tc_json",
]

#: Every namespace this package creates starts with this string.
PREFIX = "mc-"

#: Upper bound, in seconds, on any single ``ip`` / ``tc`` call.
CMD_TIMEOUT_S = 15.0


class ClusterError(RuntimeError):
    """The emulated cluster could not be created, found, used or removed."""


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        raise ClusterError(f"the {name!r} command (iproute2) is not installed")
    return path


def _run(argv: list[str], *, check: bool = True, timeout: float = CMD_TIMEOUT_S) -> str:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise ClusterError(f"`{' '.join(argv)}` could not run: {exc}") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
        raise ClusterError(f"`{' '.join(argv)}` failed: {msg}")
    return proc.stdout


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """Run ``ip [-n NETNS] ARGS...`` and return its stdout."""
    pre = ["-n", netns] if netns else []
    return _run([_tool("ip"), *pre, *args], check=check)


def tc(*args: str, netns: str | None = None, check: bool = True) -> str:
    """Run ``tc [-n NETNS] ARGS...`` and return its stdout."""
    pre = ["-n", netns] if netns else []
    return _run([_tool("tc"), *pre, *args], check=check)


def _loads(text: str) -> Any:
    text = text.strip()
    return json.loads(text) if text else []


def ip_json(*args: str, netns: str | None = None) -> Any:
    """``ip -j ...`` parsed."""
    pre = ["-n", netns] if netns else []
    return _loads(_run([_tool("ip"), *pre, "-j", *args]))


def tc_json(*args: str, netns: str | None = None) -> Any:
    """``tc -j ...`` parsed."""
    pre = ["-n", netns] if netns else []
    return _loads(_run([_tool("tc"), *pre, "-j", *args]))


def list_netns() -> list[str]:
    """Names of all named network namespaces (``ip netns list``), any owner."""
    names = []
    for line in ip("netns", "list").splitlines():
        # "name" or "name (id: 3)"
        name = line.split(" ", 1)[0].strip()
        if name:
            names.append(name)
    return sorted(names)


def netns_pids(name: str) -> list[int]:
    """Processes whose network namespace is ``name`` (``ip netns pids``)."""
    out = ip("netns", "pids", name, check=False)
    return [int(p) for p in re.findall(r"\d+", out)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie counts as gone: it holds no namespace any more once reaped by its parent
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_netns_processes(name: str, timeout: float = 5.0) -> list[int]:
    """SIGTERM, then after ``timeout`` seconds SIGKILL, every process inside namespace ``name``.

    Only ever called on namespaces of this package (names starting with :data:`PREFIX`): whatever
    runs inside them was started there through :func:`meshcast.cluster.spawn_in_host`.
    Returns the pids that were signalled.
    """
    if not name.startswith(PREFIX):
        raise ClusterError(f"refusing to touch namespace {name!r}: not one of ours ({PREFIX}*)")
    pids = [p for p in netns_pids(name) if p != os.getpid()]
    if not pids:
        return []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        if not any(_alive(p) for p in pids):
            break
    return pids


def delete_netns(name: str, *, kill: bool = True, timeout: float = 5.0) -> None:
    """Delete namespace ``name`` (one of ours), first ending the processes inside if ``kill``."""
    if not name.startswith(PREFIX):
        raise ClusterError(f"refusing to delete namespace {name!r}: not one of ours ({PREFIX}*)")
    if kill:
        kill_netns_processes(name, timeout)
    ip("netns", "delete", name, check=False)
    if name in list_netns():
        raise ClusterError(f"namespace {name!r} could not be deleted")


def exec_in_netns(
    netns: str, argv: Sequence[str], env: Mapping[str, str], **popen_kwargs: Any
) -> subprocess.Popen:
    """Start ``argv`` inside namespace ``netns`` (``ip netns exec``) with exactly ``env``; return
    its Popen. ``ip netns exec`` execs ``argv`` in place, so the pid is the program's own."""
    return subprocess.Popen([_tool("ip"), "netns", "exec", netns, *map(str, argv)], env=dict(env),
                            **popen_kwargs)


def free_port_in_netns(netns: str, timeout: float = 15.0) -> int:
    """A TCP port the kernel reports free inside namespace ``netns``."""
    code = "import socket;s=socket.socket();s.bind(('',0));print(s.getsockname()[1])"
    try:
        out = subprocess.run(
            [_tool("ip"), "netns", "exec", netns, sys.executable, "-c", code],
            capture_output=True, text=True, timeout=timeout, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        raise ClusterError(f"could not find a free port in {netns}: {exc}") from None
    return int(out.strip())
