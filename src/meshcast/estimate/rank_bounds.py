"""The per-rank and per-host terms of the lower bound (:mod:`meshcast.estimate.lower_bound`,
whose module docstring and docs/scheduling.md give the arguments): what each receiver, each
source tile's holders and each host's ranks must spend, given that an operation carries data
of one unit slice at most and a rank runs its operations one after another."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..core.task import ReshardTask
from ..core.topology import Topology
from ..core.units import GBIT

__all__ = ["RankTiles", "holders_bound", "host_bound", "rank_bound", "rank_tiles"]


def _rank_matrix(tiles: list[tuple[int, ...]], index: dict[int, int]) -> np.ndarray:
    out = np.zeros((len(tiles), len(index)))
    for t, ranks in enumerate(tiles):
        for r in ranks:
            out[t, index[r]] = 1.0
    return out


class RankTiles(NamedTuple):
    """The ranks of a task (sorted): each one's host, and tile x rank matrices (1.0 where the
    rank holds the source tile / needs the destination tile)."""

    host: np.ndarray
    held: np.ndarray
    wanted: np.ndarray


def rank_tiles(task: ReshardTask, topology: Topology) -> RankTiles:
    """The ranks of ``task`` (sorted), each one's host, and its tile x rank matrices."""
    dec = task.decomposition
    ranks = sorted(set(task.src.mesh.devices) | set(task.dst.mesh.devices))
    index = {r: i for i, r in enumerate(ranks)}
    return RankTiles(
        np.array([topology.hosts_by_rank[r] for r in ranks], dtype=np.int64),
        _rank_matrix(dec.holders_of_tile, index),
        _rank_matrix(dec.receivers_of_tile, index),
    )


def rank_bound(
    topology: Topology,
    per_rank: RankTiles,
    s: np.ndarray,
    t: np.ndarray,
    nbytes: np.ndarray,
    held_host: np.ndarray,
    wanted_host: np.ndarray,
) -> float:
    """The per-rank latency bound (module doc); ``s, t, nbytes``: unit slices by tile pair;
    ``held_host`` / ``wanted_host``: tile x host, some rank of the host holds / needs the tile."""
    lat = topology.latency_us * 1e-6
    rank_host, held, wanted = per_rank  # src tile x rank, dst tile x rank
    count = np.zeros((len(held), len(wanted)))
    weight = np.zeros_like(count)
    count[s, t] = 1.0
    weight[s, t] = nbytes
    # receivers: slices wanted and not held
    n_recv = (count.sum(axis=0) @ wanted) - ((count @ wanted) * held).sum(axis=0)
    b_recv = (weight.sum(axis=0) @ wanted) - ((weight @ wanted) * held).sum(axis=0)
    # senders: every slice some receiver lacks needs an operation from one of its holders, and
    # the holders of one source tile hold no other tile: ceil(slices / holders) ops for one of them
    overlap = held @ wanted.T  # src tile x dst tile: receivers that hold it already
    lacks = wanted.sum(axis=1)[t] - overlap[s, t] > 0  # per pair: some receiver lacks it
    n_tile = np.bincount(s[lacks], minlength=len(held)).astype(float)
    holders = np.maximum(held.sum(axis=1), 1.0)
    fastest = max(
        topology.intra_gbps,
        *(g * k for g, k in zip(topology.nic_in_gbps, topology.nics_per_host)),
        *(g * k for g, k in zip(topology.nic_out_gbps, topology.nics_per_host)),
    ) * GBIT
    # a slice no rank of the receiver's host holds reaches it either in one operation that crosses
    # into the host (lat + bytes over one inbound NIC) or in two or more (an AllGather member
    # contributes a part it received before): lat + min(bytes / NIC, lat), not bytes / fastest
    nic_in = np.array(topology.nic_in_gbps, dtype=float)[rank_host] * GBIT
    held_by_host = held_host.T.astype(float)  # host x src tile
    off_bytes = np.zeros(len(rank_host))
    off_cost = np.zeros(len(rank_host))
    for rate in np.unique(nic_in):
        on = nic_in == rate
        extra = np.minimum(weight / rate, lat)
        for mat, out in ((weight, off_bytes), (extra, off_cost)):
            per_host = mat.sum(axis=0)[None, :] - held_by_host @ mat  # host x dst tile
            out[on] = (per_host[rank_host[on]] * wanted[:, on].T).sum(axis=1)
    per_rank = n_recv * lat + np.maximum(b_recv - off_bytes, 0.0) / fastest + off_cost
    # senders: a slice no receiver of which sits on a holder host crosses a NIC in every
    # operation that carries it, at most at the fastest single outbound NIC's rate
    nic = max(topology.nic_out_gbps) * GBIT
    cross = (wanted_host.astype(float) @ held_host.T.astype(float))[t, s] == 0
    move = np.where(lacks, nbytes / np.where(cross, nic, fastest), 0.0)  # transfer seconds
    x_tile = np.bincount(s, weights=move, minlength=len(held))
    x_max = np.zeros(len(held))
    np.maximum.at(x_max, s, move)
    per_tile = holders_bound(n_tile, holders, x_tile, x_max, lat)
    return float(max(per_rank.max(initial=0.0), per_tile.max(initial=0.0)))


def holders_bound(n: np.ndarray, k: np.ndarray, work: np.ndarray, most: np.ndarray,
                  lat: float) -> np.ndarray:
    """Per source tile: the least time in which its ``k`` holders (they hold no other tile) can
    run the operations that carry its ``n`` slices some receiver lacks, ``work`` seconds of
    transfer in all, at most ``most`` seconds of it in one operation (an operation carries data
    of one unit slice at most).

    A holder that runs ``m`` operations is busy at least ``m * lat`` plus the transfer it
    carries, and carries at most ``m * most``; the holders run ``n`` operations at least. So in
    time ``T`` a holder carries at most ``c(m) = min(m * most, T - m * lat)``, and ``T`` is
    feasible only if some split of at least ``n`` operations lets the holders carry ``work``.
    ``c`` is concave in ``m``, so for N operations in all the best split is the even one, and
    more than ``n + k - 1`` operations only add start-ups (then every holder can carry its
    share of ``work`` already); for each N the least ``T`` is the root of a piecewise-linear
    function, found exactly."""
    out = np.zeros(len(n))
    for i in np.flatnonzero(n > 0).tolist():
        ni, ki = int(n[i]), int(k[i])
        out[i] = min(_least_time(ni + extra, ki, float(work[i]), float(most[i]), lat)
                     for extra in range(ki))
    return out


def _least_time(ops: int, k: int, work: float, most: float, lat: float) -> float:
    """The least ``T`` with ``sum over holders of min(m * most, T - m * lat)^+ >= work`` when
    ``ops`` operations are spread evenly over ``k`` holders, and at least the start-ups of the
    busiest holder (infinite if they cannot carry ``work``)."""
    q, extra = divmod(ops, k)
    groups = [(c, m) for c, m in ((extra, q + 1), (k - extra, q)) if c and m]
    if sum(c * m for c, m in groups) * most < work * (1 - 1e-12):
        return math.inf
    return max(max(m for _, m in groups) * lat, _root(groups, work, most, lat))


def _root(groups: list[tuple[int, int]], work: float, most: float, lat: float) -> float:
    """The least ``T`` at which ``c`` holders of ``m`` operations each (``groups``) carry
    ``work``: the root of a nondecreasing piecewise-linear function."""

    def carried(t: float) -> float:
        return sum(c * max(min(m * most, t - m * lat), 0.0) for c, m in groups)

    bends = sorted({m * lat for _, m in groups} | {m * (lat + most) for _, m in groups})
    prev = bends[0]
    for bend in bends:
        if carried(bend) >= work:
            rising = sum(c for c, m in groups if m * lat <= prev < m * (lat + most))
            return prev + (work - carried(prev)) / rising if rising else bend
        prev = bend
    return bends[-1]


def host_bound(
    topology: Topology,
    per_rank: RankTiles,
    s: np.ndarray,
    t: np.ndarray,
    nbytes: np.ndarray,
    held_host: np.ndarray,
    wanted_host: np.ndarray,
    need_any: np.ndarray,
) -> float:
    """The per-host rank-time bound (module doc). ``s, t, nbytes``: unit slices by tile pair;
    ``held_host`` / ``wanted_host``: tile x host, some rank of the host holds / needs the tile;
    ``need_any``: per pair, some host needs it and holds no copy."""
    if not len(s):
        return 0.0
    lat = topology.latency_us * 1e-6
    size = np.array([len(r) for r in topology.hosts], dtype=float)
    rank_host, held, wanted = per_rank  # src tile x rank, dst tile x rank
    best = 0.0
    # the pairs of each destination tile (only those can have receivers on a host)
    by_t = np.argsort(t, kind="stable")
    first = np.searchsorted(t[by_t], np.arange(len(wanted) + 1))
    # receiving: k ranks of host h lack the slice
    for h in np.flatnonzero(wanted_host.any(axis=0)).tolist():
        cols = np.flatnonzero(rank_host == h)
        tiles = np.flatnonzero(wanted_host[:, h])
        idx = np.concatenate([by_t[first[x] : first[x + 1]] for x in tiles.tolist()])
        sh, th, bh = s[idx], t[idx], nbytes[idx]
        k = wanted[:, cols].sum(axis=1)[th]
        held_h = held[:, cols]
        if held_h.any():
            k = k - (held_h @ wanted[:, cols].T)[sh, th]
        tr = bh / (topology.nic_in_gbps[h] * GBIT)
        recv = np.where(
            held_host[sh, h],
            k * lat + np.minimum(k * tr, lat),
            k * lat + tr + (k - 1) * np.minimum(tr, lat),
        )
        best = max(best, float(recv[k > 0].sum()) / size[h])
    # sending: slices held on one host alone that some other host needs
    alone = (held_host.sum(axis=1) == 1)[s]
    go = np.flatnonzero(alone & need_any)
    if len(go):
        owner = held_host.argmax(axis=1)[s[go]]
        nic_out = np.array(topology.nic_out_gbps) * GBIT
        busy = np.bincount(owner, weights=lat + nbytes[go] / nic_out[owner], minlength=len(size))
        best = max(best, float((busy / size).max()))
    return best
