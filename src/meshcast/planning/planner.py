"""From a task to a plan: which sender, which collective, in what order.

Planning is a pure function of its arguments: the same plan on every rank and every machine.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from ..core.job import topology_for_meshes
from ..core.layout import split_box
from ..core.plan import AllGather, Broadcast, Copy, Op, Plan, Send
from ..core.task import ReshardTask, iter_slices
from ..core.topology import Topology

__all__ = ["BALANCES", "STRATEGIES", "plan"]

STRATEGIES = ("send_recv", "allgather", "broadcast")
"""Communication strategies (PAPER.md sections 2-3)."""

BALANCES = ("none", "size", "order", "auto")
"""How senders (and order) are chosen among the holders of a slice: ``"none"`` takes the first
holder (the paper's "Naive"); ``"size"`` the holder on the host that has sent the fewest bytes so
far ("Load balance only"); ``"order"`` chooses senders and order jointly (the paper's "Ours":
seeded greedy rounds plus a bounded search, :mod:`meshcast.planning.balance`); ``"auto"`` is our
method (LP senders, striping, per-slice strategy, list scheduling, checked by simulation)."""


class _SenderChooser:
    """Picks a holder for each transfer according to the balance method."""

    def __init__(self, balance: str, topology: Topology, itemsize: int) -> None:
        self._balance = balance
        self._host_of = topology._host_of
        self._itemsize = itemsize
        self._host_load: dict[int, int] = defaultdict(int)
        self._rank_load: dict[int, int] = defaultdict(int)

    def __call__(self, holders: tuple[int, ...], nbytes: int) -> int:
        if self._balance == "none" or len(holders) == 1:
            choice = holders[0]
        else:
            host_load, rank_load, host_of = self._host_load, self._rank_load, self._host_of
            choice = min(holders, key=lambda r: (host_load[host_of[r]], rank_load[r]))
        self._host_load[self._host_of[choice]] += nbytes
        self._rank_load[choice] += nbytes
        return choice


def plan(
    task: ReshardTask,
    topology: Topology | None = None,
    strategy: str | None = None,
    balance: str | None = None,
) -> Plan:
    """Plan ``task``: decompose it into unit slices and choose, for each, how it moves.

    ``topology`` says which ranks share a host and how fast they talk; without one, inside a job
    the job's real hosts are read from its environment (:func:`meshcast.job_topology`: torchrun,
    ``meshcast.launch``; same on every rank, no collective), and outside a job the last axis of
    each mesh is taken to span one host (the paper's (hosts, devices) convention), with default
    bandwidths. ``strategy`` is one of :data:`STRATEGIES`, ``balance`` one of :data:`BALANCES`.
    With neither given, ``balance="auto"`` chooses per slice among the strategies and is never
    slower in :func:`meshcast.simulate` than any fixed strategy x balance (above
    :data:`meshcast.planning.balance.AUTO_SIM_LIMIT` unit slices: by more than a relative 2e-9, when
    its one plan is certified optimal against the lower bound). A strategy alone keeps the old
    default
    ``balance="none"``; a balance alone uses ``strategy="broadcast"`` (``"auto"``: any).
    """
    if not isinstance(task, ReshardTask):
        raise TypeError(f"task must be a meshcast.ReshardTask, got {task!r}")
    if strategy is None and balance is None:
        balance = "auto"
    elif balance is None:
        balance = "none"
    if strategy is None and balance != "auto":
        strategy = "broadcast"
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is unknown; choose one of {', '.join(STRATEGIES)}")
    if balance not in BALANCES:
        raise ValueError(f"balance={balance!r} is unknown; choose one of {', '.join(BALANCES)}")
    topology = topology_for_meshes(topology, task.src.mesh, task.dst.mesh)
    if balance == "auto":
        from .balance import auto_plan

        return auto_plan(task, topology, strategy)
    assert strategy is not None
    if balance == "order":
        from .balance import order_plan

        return order_plan(task, topology, strategy)

    choose = _SenderChooser(balance, topology, task.itemsize)
    host_of = topology._host_of
    emit_slice = _STRATEGY_EMITTERS[strategy]
    ops: list[Op] = []
    fallbacks: list[tuple[int, str]] = []
    for sl in iter_slices(task):
        for r in sl.local:
            ops.append(Copy(r, sl.box))
        if sl.remote:
            emit_slice(ops, fallbacks, sl.index, sl.box, sl.holders, sl.remote, sl.nbytes, choose,
                       host_of)
    return Plan(task, tuple(ops), strategy, balance, topology, tuple(fallbacks))


_Emitter = Callable[..., None]


def _emit_send_recv(ops, fallbacks, i, box, holders, remote, nbytes, choose, host_of) -> None:
    for r in remote:
        ops.append(Send(choose(holders, nbytes), r, box))


def _emit_broadcast(ops, fallbacks, i, box, holders, remote, nbytes, choose, host_of) -> None:
    sender = choose(holders, nbytes)
    ops.append(Send(sender, remote[0], box) if len(remote) == 1 else Broadcast(sender, remote, box))


def _emit_allgather(ops, fallbacks, i, box, holders, remote, nbytes, choose, host_of) -> None:
    by_host: dict[int, list[int]] = {}
    for r in remote:
        by_host.setdefault(host_of[r], []).append(r)
    for h, group in by_host.items():
        parts = split_box(box, len(group)) if len(group) > 1 else None
        if parts is None:
            why = (
                f"one receiver on host {h}"
                if len(group) == 1
                else f"slice too small to split among {len(group)} receivers on host {h}"
            )
            fallbacks.append((i, why))
            for r in group:
                ops.append(Send(choose(holders, nbytes), r, box))
            continue
        part_bytes = nbytes // len(group)
        for r, part in zip(group, parts):
            ops.append(Send(choose(holders, part_bytes), r, part))
        ops.append(AllGather(tuple(group), box, parts))


_STRATEGY_EMITTERS: dict[str, _Emitter] = {
    "send_recv": _emit_send_recv,
    "allgather": _emit_allgather,
    "broadcast": _emit_broadcast,
}
