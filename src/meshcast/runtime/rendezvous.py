"""``meshcast.connect``: two separately launched jobs meet at a rendezvous address and form a
:class:`~meshcast.runtime.joint.JointGroup`, without touching either job's default group.

The rendezvous store is a ``torch.distributed.TCPStore`` at the address, held by the trainer's
rank 0 (kept for the life of that process, so the trainer can meet a restarted engine again);
every other rank of both jobs is a client, which retries until the store is up, so either side may
come first (within ``timeout``).

The two jobs' rank 0 (the *leaders*) meet: each writes an offer under ``meshcast/joint/offer/<job>``
(a fresh token, its world size, ``model``, the protocol version), and acknowledges the pair of
tokens it currently sees; the session is the pair that both have acknowledged. A stale offer (left
by an incarnation of a job that died) is never acknowledged by its owner, so it is simply replaced
when the job comes back: one side restarting can reconnect. The leaders then compare what the
sides declared (``model``, the protocol) and tell their own ranks the session, or the mismatch,
through their job's own store (the default group's store; nothing of the group itself is used).
Every rank then joins the session's gloo group (on a prefix of the rendezvous store named by the
session) and publishes its host (``$MESHCAST_HOST``, else its hostname).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
import uuid
import warnings

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..core.job import with_link_rates
from ..core.topology import Topology
from .errors import ReshardError
from .joint import ROLES, JointGroup, check_role, member_of
from .store_keys import wait_for_keys

__all__ = ["PROTOCOL", "connect", "disconnect"]

PROTOCOL = 1
"""The version of the rendezvous protocol and of the weight-sync records; both sides must match."""
POLL_S = 0.02
_servers: dict[str, dist.TCPStore] = {}
_connects: dict[str, int] = {}
_lock = threading.Lock()


def _job_rank_size(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    if world_size is None:
        world_size = (dist.get_world_size() if dist.is_initialized()
                      else int(os.environ.get("WORLD_SIZE", 1)))
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    return rank, world_size


def _parse(address: str) -> tuple[str, int]:
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address must be 'host:port' (the rendezvous store's), got {address!r}")
    return host.strip("[]"), int(port)


def _rendezvous_store(address: str, serve: bool, timeout: float) -> dist.TCPStore:
    """The store at ``address``: this process's server (made once), else a new client."""
    host, port = _parse(address)
    wait = datetime.timedelta(seconds=timeout)
    with _lock:
        if serve:
            if address not in _servers:
                try:
                    _servers[address] = dist.TCPStore(host, port, is_master=True, timeout=wait,
                                                      wait_for_workers=False)
                except Exception as exc:
                    raise ReshardError(
                        f"meshcast.connect (trainer): cannot hold the rendezvous store at "
                        f"{address}: {str(exc).splitlines()[0] if str(exc) else exc!r} (is "
                        f"another trainer job, or another program, using that address?)"
                    ) from exc
            return _servers[address]
    try:
        return dist.TCPStore(host, port, is_master=False, timeout=wait)
    except Exception as exc:
        raise ReshardError(
            f"meshcast.connect: no rendezvous store at {address} within {timeout:g} s (the "
            f"trainer's rank 0 holds it: is the trainer job running, at that address?): "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc


def connect(
    address: str,
    role: str,
    *,
    model: str = "",
    timeout: float = 300.0,
    rank: int | None = None,
    world_size: int | None = None,
) -> JointGroup:
    """Join the trainer job and the engine job into one :class:`JointGroup`; call it on every
    rank of both jobs (each job passes its own ``role``, ``"trainer"`` or ``"engine"``).

    ``address`` (``"host:port"``) is where the trainer's rank 0 holds the rendezvous store: an
    address of its host that every rank of both jobs can reach. Either job may call first; each
    waits at most ``timeout`` seconds for the other (then :class:`meshcast.ReshardError` names the
    side that did not come). ``model`` describes what the job holds (a name, a config digest):
    if the two sides' differ, both raise ``ValueError`` naming both. ``rank``/``world_size``
    default to the job's default process group (or ``$RANK``/``$WORLD_SIZE``); a job of more than
    one rank needs its default group initialised (its store tells the job's ranks the session).
    Each job's default group is otherwise untouched. After the other side restarted, call
    ``connect`` again (on every rank of the surviving job) to meet its new incarnation.
    """
    check_role(role)
    rank, world_size = _job_rank_size(rank, world_size)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    timeout = float(timeout)
    with _lock:
        number = _connects[address] = _connects.get(address, 0) + 1
    job_key = f"meshcast/connect/{address}/{number}"
    store = None
    if rank == 0:
        try:
            store, info = _lead(address, role, world_size, model, timeout)
        except BaseException as exc:
            _tell_job(job_key, {"error": f"{type(exc).__name__}: {exc}"}, world_size)
            raise
        _tell_job(job_key, info, world_size)
    else:
        info = _hear_job(job_key, timeout)
    if info.get("error"):
        raise ValueError(f"meshcast.connect ({role} rank {rank}): {info['error']}")
    if store is None:  # only now: the leader met the other side on the store that is up now
        store = _rendezvous_store(address, role == ROLES[0] and rank == 0, timeout)
    return _join(store, info, role, rank, timeout, address)


def _lead(address: str, role: str, size: int, model: str,
          timeout: float) -> tuple[dist.Store, dict]:
    """The leader's handshake, again on a new connection when the store goes away meanwhile
    (the store of the other side's previous incarnation, still up when this side came)."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(deadline - time.monotonic(), 1.0)
        store = _rendezvous_store(address, role == ROLES[0], left)
        try:
            return store, _meet(store, role, size, model, left)
        except dist.DistNetworkError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _meet(store: dist.Store, role: str, size: int, model: str, timeout: float) -> dict:
    """The leaders' handshake (module docstring): the session and both sides' offers."""
    other = ROLES[1 - ROLES.index(role)]
    token = uuid.uuid4().hex[:12]
    mine = {"token": token, "size": size, "model": model, "protocol": PROTOCOL}
    store.set(f"meshcast/joint/offer/{role}", json.dumps(mine))
    deadline = time.monotonic() + timeout
    theirs, pair = None, ""
    while True:
        key = f"meshcast/joint/offer/{other}"
        if store.check([key]):
            seen = json.loads(store.get(key).decode())
            # the other side acknowledges a pair before it offers anew: look at the pair we
            # acknowledged once more after reading a new offer, and keep it if it was met
            if pair and store.check([f"meshcast/joint/ack/{pair}/{other}"]):
                break
            if theirs is None or seen["token"] != theirs["token"]:
                theirs = seen
                tokens = {role: token, other: seen["token"]}
                pair = f"{tokens[ROLES[0]]}-{tokens[ROLES[1]]}"
                store.set(f"meshcast/joint/ack/{pair}/{role}", "1")
        if time.monotonic() > deadline:
            raise ReshardError(
                f"meshcast.connect ({role}): the {other} job did not come to the rendezvous "
                f"within {timeout:g} s" + ("" if theirs is None else
                                           " (an offer of an earlier incarnation was there)"))
        time.sleep(POLL_S)
    sides = {role: mine, other: theirs}
    problem = _mismatch(sides)
    return {"session": pair, "sizes": {r: sides[r]["size"] for r in ROLES},
            "model": model, "error": problem}


def _mismatch(sides: dict[str, dict]) -> str | None:
    t, e = sides[ROLES[0]], sides[ROLES[1]]
    if t.get("protocol") != e.get("protocol"):
        return (f"the trainer speaks meshcast's joint protocol {t.get('protocol')} and the engine "
                f"{e.get('protocol')}: run the same meshcast version on both sides")
    if t["model"] != e["model"]:
        return (f"the sides hold different models: the trainer declared model={t['model']!r}, "
                f"the engine model={e['model']!r}")
    return None


def _tell_job(key: str, info: dict, world_size: int) -> None:
    if world_size > 1:
        _job_store().set(key, json.dumps(info))


def _hear_job(key: str, timeout: float) -> dict:
    store = _job_store()
    if not wait_for_keys(store, [key], timeout):
        raise ReshardError(f"meshcast.connect: this job's rank 0 did not say within {timeout:g} s "
                           f"which session it joined (did it call meshcast.connect?)")
    return json.loads(store.get(key).decode())


def _job_store() -> dist.Store:
    if not dist.is_initialized():
        raise RuntimeError("meshcast.connect in a job of several ranks needs the job's default "
                           "process group (init_process_group): its store tells the ranks the "
                           "session")
    return c10d._get_default_store()


def _join(store: dist.Store, info: dict, role: str, rank: int, timeout: float,
          address: str) -> JointGroup:
    """Every rank: join the session's gloo group and learn every joint rank's host."""
    sizes = info["sizes"]
    session = dist.PrefixStore(f"meshcast/joint/s/{info['session']}/", store)
    size = sizes[ROLES[0]] + sizes[ROLES[1]]
    me = (0 if role == ROLES[0] else sizes[ROLES[0]]) + rank
    session.set(f"host/{me}", os.environ.get("MESHCAST_HOST") or socket.gethostname())
    wait = datetime.timedelta(seconds=timeout)
    try:
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", session), me, size, wait)
    except Exception as exc:
        missing = [j for j in range(size) if not session.check([f"host/{j}"])]
        who = ", ".join("{} rank {}".format(*member_of(sizes, j)) for j in missing)
        who = who or "none (a connection failed)"
        raise ReshardError(
            f"meshcast.connect ({role} rank {rank}): the joint group of session "
            f"{info['session']} did not form within {timeout:g} s; missing: {who}",
            tuple(missing), tuple(missing)) from exc
    labels = [v.decode() for v in session.multi_get([f"host/{j}" for j in range(size)])]
    topology = with_link_rates(Topology.from_host_map(dict(enumerate(labels)),
                                                      name="joint group hosts"))
    return JointGroup(role=role, rank=rank, sizes=sizes, store=session,
                      session=info["session"], topology=topology, model=info["model"],
                      timeout=timeout, gloo=gloo, address=address)


def disconnect(group: JointGroup, timeout: float | None = None) -> None:
    """Leave ``group`` on every rank of both jobs together: wait (at most ``timeout``, default
    the group's) until every joint rank has called, so the trainer's rank 0, which holds the
    rendezvous store, outlives every use of it; then drop the backend groups. Ranks that a
    weight sync on the group named as failed are not waited for; others that do not come (dead,
    or the store gone with trainer rank 0) are named in a ``UserWarning`` and the group is left
    all the same."""
    seconds = group.timeout if timeout is None else timeout
    keys = [f"bye/{j}" for j in range(group.size) if j == group.me or j not in group.failed]
    try:
        group.store.set(f"bye/{group.me}", "1")
        why = None
        if not wait_for_keys(group.store, keys, seconds):
            absent = [int(k[4:]) for k in keys if not group.store.check([k])]
            why = f"{group.describe(absent)} did not disconnect within {seconds:g} s"
    except Exception:  # the store went with trainer rank 0
        why = (f"the rendezvous store at {group.address} (held by trainer rank 0) cannot be "
               f"reached, so trainer rank 0 has probably died")
    finally:
        group.close()
    if why is not None:  # leave all the same
        warnings.warn(f"meshcast.disconnect on {group.role} rank {group.rank}: {why}; this rank "
                      f"left without waiting further", UserWarning, stacklevel=2)
