"""The fixed strategies: each unit slice moves by one strategy, senders chosen one at a time.

``balance="none"`` takes the first holder of a slice (the paper's "Naive"); ``"size"`` the
holder on the host that has sent the fewest bytes so far ("Load balance only").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

from ..core.boxes import Box, split_box
from ..core.ops import AllGather, Broadcast, Copy, Op, Send
from ..core.plan import Plan
from ..core.task import ReshardTask, iter_slices
from ..core.topology import Topology

__all__ = ["STRATEGIES", "allgather_groups", "fixed_plan"]

STRATEGIES = ("send_recv", "allgather", "broadcast")
"""Communication strategies (PAPER.md sections 2-3)."""


class _SenderChooser:
    """Picks a holder for each transfer according to the balance method."""

    def __init__(self, balance: str, topology: Topology) -> None:
        self._balance = balance
        self._host_of = topology.hosts_by_rank
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


def allgather_groups(
    index: int,
    box: Box,
    remote: tuple[int, ...],
    host_of: dict[int, int],
    fallbacks: list[tuple[int, str]],
) -> Iterator[tuple[list[int], tuple[Box, ...] | None]]:
    """The ``"allgather"`` strategy's cut of unit slice ``index``: per receiving host, its
    receivers and the parts of ``box`` each receives before they all-gather, or None when the
    host falls back to point-to-point (one receiver, or a slice too small to split); each
    fallback is appended to ``fallbacks`` with its reason."""
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
            fallbacks.append((index, why))
        yield group, parts


def fixed_plan(task: ReshardTask, topology: Topology, strategy: str, balance: str) -> Plan:
    """The plan of ``strategy`` (one of :data:`STRATEGIES`) with senders chosen by ``balance``
    (``"none"`` or ``"size"``), operations in slice order."""
    choose = _SenderChooser(balance, topology)
    host_of = topology.hosts_by_rank
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
    for group, parts in allgather_groups(i, box, remote, host_of, fallbacks):
        if parts is None:
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
