"""One rank's operations of a plan (:func:`rank_plan`), computed directly where the plan is a
regular family, without building every rank's list.

The regular family: ``"auto"`` above :data:`~meshcast.planning.budgets.AUTO_SIM_LIMIT` unit
slices on a topology where no NIC serves two ranks, for a task in which every source tile has
one holder and every destination tile one receiver (all distinct, the two meshes disjoint) and
every (source tile, destination tile) pair is one unit slice: every source rank sends one slice
to every destination rank. :func:`~meshcast.planning.large.large_plan` orders those sends in the
Latin-square rounds ``(i + j) mod K`` (sender ``i``, receiver ``j`` in rank order), so a rank
takes part in one send per round and its sends, in plan order, are its pairs sorted by round:
computable from the rank alone. ``"auto"`` keeps that plan when its exact time meets the lower
bound (the certificate); the certificate is computed once per task and topology, vectorised,
without building an operation (:func:`~meshcast.planning.exact_rounds.sends_rounds_time`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from ..core.boxes import Box
from ..core.cache import BoundedCache
from ..core.ops import Op, Send
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..estimate.lower_bound import host_matrix, lower_bound_details
from ..estimate.rank_bounds import rank_tiles, receiving_times
from .budgets import AUTO_SIM_LIMIT, CERTIFY_TOL
from .exact_rounds import sends_rounds_time
from .large import unshared_nics
from .planner import PLAN_CACHE, plan, plan_key

__all__ = ["RANK_CACHE", "RegularFamily", "rank_plan", "regular_family"]


class RegularFamily(NamedTuple):
    """The shared part of a regular family (module doc): the sender of each source tile and the
    receiver of each destination tile, each one's index among its side's ranks in rank order,
    the unit slice of each (source tile, destination tile) pair, and the round count ``K``."""

    sender: np.ndarray
    receiver: np.ndarray
    s_index: np.ndarray
    r_index: np.ndarray
    pair: np.ndarray
    rounds: int


RANK_CACHE: BoundedCache[tuple[ReshardTask, Topology], tuple[RegularFamily | None]] = (
    BoundedCache("planning.rank", 16,
                 "rank_plan's regular families ((None,): not one) by (task, topology)"))
""":func:`regular_family` by (task, resolved topology), as a 1-tuple: a few arrays of one
integer per unit slice or rank (about 2 MB for 262,144 slices);
``meshcast.clear_caches(["planning.rank"])`` empties it."""


def _structure(task: ReshardTask) -> RegularFamily | None:
    """The family's arrays when ``task`` has its shape (module doc), else None."""
    dec = task.decomposition
    holders, receivers = dec.holders_of_tile, dec.receivers_of_tile
    if any(len(h) != 1 for h in holders) or any(len(r) != 1 for r in receivers):
        return None
    sender = np.array([h[0] for h in holders], dtype=np.int64)
    receiver = np.array([r[0] for r in receivers], dtype=np.int64)
    n_s, n_r = len(sender), len(receiver)
    if (len(np.unique(sender)) != n_s or len(np.unique(receiver)) != n_r
            or np.intersect1d(sender, receiver).size or len(dec) != n_s * n_r):
        return None
    pair = np.full((n_s, n_r), -1, dtype=np.int64)
    pair[dec.src_tile, dec.dst_tile] = np.arange(len(dec), dtype=np.int64)
    if (pair < 0).any():  # some pair holds two slices, another none
        return None
    s_index = np.argsort(np.argsort(sender, kind="stable"), kind="stable")
    r_index = np.argsort(np.argsort(receiver, kind="stable"), kind="stable")
    return RegularFamily(sender, receiver, s_index, r_index, pair, max(n_s, n_r))


def _certified(task: ReshardTask, topology: Topology, fam: RegularFamily) -> bool:
    """Whether the Latin-square plan's exact time meets the lower bound, as ``"auto"``'s large
    path checks it before keeping that plan (:mod:`meshcast.planning.auto`). The sends come
    round by round straight from the pair table (the order within a round does not change the
    time: its ranks are disjoint), so no array of one item per send is built."""
    n_s, n_r = fam.pair.shape
    s_tile, r_tile = np.argsort(fam.s_index), np.argsort(fam.r_index)  # the tile at each index
    sizes = task.decomposition.sizes() * task.itemsize
    senders = fam.sender[s_tile]

    def rounds() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for r in range(fam.rounds):
            j = (r - np.arange(n_s)) % fam.rounds
            ok = j < n_r
            rcv_tile = r_tile[j[ok]]
            yield senders[ok], fam.receiver[rcv_tile], sizes[fam.pair[s_tile[ok], rcv_tile]]

    exact = sends_rounds_time(topology, {}, rounds())
    return any(exact <= bound() * (1 + CERTIFY_TOL) for bound in (
        lambda: _receiver_bound(task, topology, fam, sizes),
        lambda: lower_bound_details(task, topology).unmargined_s))


def _receiver_bound(task: ReshardTask, topology: Topology, fam: RegularFamily,
                    nbytes: np.ndarray) -> float:
    """The lower bound's per-rank term (:func:`~meshcast.estimate.rank_bounds.receiving_times`)
    of the receiver of the largest destination tile, from that tile's pairs alone (``nbytes``:
    each unit slice's bytes): the same number the whole bound computes for it, so never above
    the whole bound, and a certificate that holds against it holds against the whole bound
    (which is computed only otherwise)."""
    dec = task.decomposition
    t = int(np.argmax(np.bincount(dec.dst_tile, nbytes, minlength=fam.pair.shape[1])))
    per_rank = rank_tiles(task, topology)
    held = host_matrix(dec.holders_of_tile, topology.hosts_by_rank, topology.num_hosts)
    s = np.arange(fam.pair.shape[0])
    pair_bytes = nbytes[fam.pair[:, t]].astype(np.float64)
    times = receiving_times(topology, per_rank, s, np.full_like(s, t), pair_bytes, held)
    return float(times[per_rank.wanted_rank[per_rank.wanted_tile == t]].max())


def regular_family(task: ReshardTask, topology: Topology) -> RegularFamily | None:
    """The regular family of ``task`` on the resolved ``topology`` (module doc) when
    ``"auto"`` plans it as Latin-square rounds (above ``AUTO_SIM_LIMIT`` slices, no NIC shared,
    certified), else None. Cached (:data:`RANK_CACHE`)."""
    return RANK_CACHE.get_or_make((task, topology), lambda: (_family(task, topology),))[0]


def _family(task: ReshardTask, topology: Topology) -> RegularFamily | None:
    if len(task.decomposition) <= AUTO_SIM_LIMIT or not unshared_nics(topology):
        return None
    fam = _structure(task)
    return fam if fam is not None and _certified(task, topology, fam) else None


def _boxes(task: ReshardTask, ks: np.ndarray) -> list[Box]:
    """The boxes of unit slices ``ks`` (as ``Decomposition.boxes()`` has them)."""
    dec = task.decomposition
    columns = [[slice(a, b) for a, b in zip(lo[i[ks]].tolist(), hi[i[ks]].tolist())]
               for lo, hi, i in zip(dec.starts, dec.stops, dec.idx)]
    return list(zip(*columns)) if columns else [() for _ in range(len(ks))]


def _own_sends(task: ReshardTask, fam: RegularFamily, rank: int) -> tuple[Op, ...]:
    """``rank``'s sends of the Latin-square plan, in plan order (by round: one per round)."""
    hit = np.flatnonzero(fam.sender == rank)
    if hit.size:
        s = int(hit[0])
        ts = np.argsort((fam.s_index[s] + fam.r_index) % fam.rounds, kind="stable")
        boxes = _boxes(task, fam.pair[s, ts])
        return tuple(map(Send, [rank] * len(ts), fam.receiver[ts].tolist(), boxes))
    hit = np.flatnonzero(fam.receiver == rank)
    if not hit.size:
        return ()
    t = int(hit[0])
    ss = np.argsort((fam.s_index + fam.r_index[t]) % fam.rounds, kind="stable")
    boxes = _boxes(task, fam.pair[ss, t])
    return tuple(map(Send, fam.sender[ss].tolist(), [rank] * len(ss), boxes))


def rank_plan(
    task: ReshardTask,
    topology: Topology | None,
    rank: int,
    strategy: str | None = None,
    balance: str | None = None,
) -> tuple[Op, ...]:
    """The operations ``rank`` takes part in, in plan order: exactly
    ``[p.ops[i] for i in p.ops_of(rank)]`` for ``p = meshcast.plan(task, topology, strategy,
    balance)`` (same arguments, same defaults; empty for a rank that takes no part).

    Where the plan is a regular family (:mod:`meshcast.planning.rank`: ``"auto"`` on a task in
    which every source rank sends one slice to every destination rank, above ``AUTO_SIM_LIMIT``
    slices, no NIC shared, the Latin-square plan certified against the lower bound), the
    operations come from ``rank`` directly, without building the plan: once per task and
    topology a vectorised pass over the slices (the certificate, cached), then work in the
    rank's own operations. Everywhere else, and when the plan is in the plan cache already,
    the whole plan is built (:func:`meshcast.plan`, cached) and filtered. Pure and
    deterministic, like :func:`meshcast.plan`."""
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer):
        raise TypeError(f"rank must be an integer, got {rank!r}")
    key = plan_key(task, topology, strategy, balance)
    task, topology, strategy, balance = key
    cached = PLAN_CACHE.get(key)
    if cached is None and balance == "auto" and strategy in (None, "broadcast"):
        fam = regular_family(task, topology)
        if fam is not None:
            return _own_sends(task, fam, int(rank))
    p = cached if cached is not None else plan(task, topology, strategy, balance)
    return tuple(p.ops[i] for i in p.ops_of(int(rank)))
