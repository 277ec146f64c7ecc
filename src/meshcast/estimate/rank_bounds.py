"""The per-rank and per-host terms of the lower bound (:mod:`meshcast.estimate.lower_bound`,
whose module docstring and docs/scheduling.md give the arguments): what each receiver, each
source tile's holders, each group of ranks that share a tile on a host and each host's ranks
must spend, given that a transfer carries data of one unit slice at most, an all-gather runs
inside one host (and may re-join several slices) and a rank runs its operations one after
another."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..core.indexing import concat_ranges
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..core.units import GBIT

__all__ = [
    "RankTiles", "holders_bound", "host_bound", "host_joins", "pair_index", "rank_bound",
    "rank_tiles", "receiving_times",
]


class RankTiles(NamedTuple):
    """The ranks of a task (sorted) and their tiles: each rank's host, the (tile, rank) entries
    of the source tiles ranks hold and of the destination tiles they need (ranks as positions
    among the sorted ranks; a rank has one tile of a layout, or several of a layout of regions),
    and the holders of each source tile and receivers of each destination tile (counts). Entry
    lists, not tile x rank matrices, so that thousands of tiles and ranks cost memory in ranks."""

    host: np.ndarray
    held_tile: np.ndarray
    held_rank: np.ndarray
    wanted_tile: np.ndarray
    wanted_rank: np.ndarray
    holders: np.ndarray
    receivers: np.ndarray
    mixed: tuple[np.ndarray, np.ndarray, np.ndarray]
    """(rank, source tile, destination tile) for each source tile a rank holds and destination
    tile it needs (ranks on both sides only)."""


def _entries(tiles: list[tuple[int, ...]], index: dict[int, int]) -> tuple[np.ndarray, ...]:
    pairs = [(tile, index[r]) for tile, ranks in enumerate(tiles) for r in ranks]
    out = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    return out[:, 0], out[:, 1]


def rank_tiles(task: ReshardTask, topology: Topology) -> RankTiles:
    """The ranks of ``task`` (sorted) with their hosts and tiles (:class:`RankTiles`)."""
    dec = task.decomposition
    ranks = sorted(set(task.src.mesh.devices) | set(task.dst.mesh.devices))
    index = {r: i for i, r in enumerate(ranks)}
    held_tile, held_rank = _entries(dec.holders_of_tile, index)
    wanted_tile, wanted_rank = _entries(dec.receivers_of_tile, index)
    h_by = np.argsort(held_rank, kind="stable")
    h_first = np.searchsorted(held_rank[h_by], np.arange(len(ranks) + 1))
    entry, at = concat_ranges(h_first[wanted_rank], h_first[wanted_rank + 1]
                              - h_first[wanted_rank])
    return RankTiles(
        np.array([topology.hosts_by_rank[r] for r in ranks], dtype=np.int64),
        held_tile, held_rank, wanted_tile, wanted_rank,
        np.array([len(h) for h in dec.holders_of_tile], dtype=np.int64),
        np.array([len(r) for r in dec.receivers_of_tile], dtype=np.int64),
        (wanted_rank[entry], held_tile[h_by[at]], wanted_tile[entry]),
    )


def pair_index(keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Positions of ``query`` in the sorted unique ``keys`` (tile pairs ``s * n_dst + t``), -1
    where absent."""
    if not len(keys):
        return np.full(len(query), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return np.where(keys[pos] == query, pos, -1)


def host_joins(keys: np.ndarray, n_dst: int, held_host: np.ndarray, host: np.ndarray,
               tile: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each entry ``e`` (a destination tile ``tile[e]`` needed on host ``host[e]``) and each
    source tile ``s`` held on that host (``held_host``: source tile x host, bool) that forms a
    pair ``(s, tile[e])`` in ``keys`` (sorted ``s * n_dst + t``): ``e`` and the pair's position,
    flat. Work in the entries times the tiles held per host, no tile x tile matrix."""
    hs_host, hs_tile = np.nonzero(held_host.T)  # by host, then tile
    first = np.searchsorted(hs_host, np.arange(held_host.shape[1] + 1))
    entry, held = concat_ranges(first[host], first[host + 1] - first[host])
    pair = pair_index(keys, hs_tile[held] * n_dst + tile[entry])
    hit = pair >= 0
    return entry[hit], pair[hit]


def _fastest(topology: Topology) -> float:
    """Bytes/s of the fastest link anything can take: inside a host or all NICs of one."""
    return max(
        topology.intra_gbps,
        *(g * k for g, k in zip(topology.nic_in_gbps, topology.nics_per_host)),
        *(g * k for g, k in zip(topology.nic_out_gbps, topology.nics_per_host)),
    ) * GBIT


def _held_by_receivers(per_rank: RankTiles, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rank, pair) for each pair in ``keys`` (sorted ``s * n_dst + t``) whose destination tile
    the rank needs and whose source tile it holds, flat."""
    rank, src, dst = per_rank.mixed
    pair = pair_index(keys, src * len(per_rank.receivers) + dst)
    return rank[pair >= 0], pair[pair >= 0]


def receiving_times(
    topology: Topology,
    per_rank: RankTiles,
    s: np.ndarray,
    t: np.ndarray,
    nbytes: np.ndarray,
    held_host: np.ndarray,
) -> np.ndarray:
    """Per rank, the least time it spends receiving (module doc: slices wanted and not held);
    ``s, t, nbytes``: unit slices by tile pair, sorted by ``(s, t)``; ``held_host``: tile x host,
    some rank of the host holds the tile. A rank's figure depends on the pairs of its
    destination tiles alone (summed in the same order whatever other pairs are given)."""
    lat = topology.latency_us * 1e-6
    n_ranks, n_dst = len(per_rank.host), len(per_rank.receivers)
    w_tile, w_rank = per_rank.wanted_tile, per_rank.wanted_rank
    keys = s * n_dst + t

    def per_rank_sum(tile_values: np.ndarray) -> np.ndarray:  # over each rank's wanted tiles
        return np.bincount(w_rank, tile_values[w_tile], minlength=n_ranks)

    # slices wanted and not held
    j_rank, j_pair = _held_by_receivers(per_rank, keys)
    n_recv = (per_rank_sum(np.bincount(t, minlength=n_dst).astype(float))
              - np.bincount(j_rank, minlength=n_ranks))
    wanted_bytes = per_rank_sum(np.bincount(t, nbytes, minlength=n_dst))
    b_recv = wanted_bytes - np.bincount(j_rank, nbytes[j_pair], minlength=n_ranks)
    # a slice no rank of the receiver's host holds reaches it either in one operation that crosses
    # into the host (lat + bytes over one inbound NIC) or in two or more (an AllGather member
    # contributes a part it received before), each byte at the fastest link at most:
    # lat + min(bytes / NIC, lat + bytes / fastest), not bytes / fastest
    nic_in = np.array(topology.nic_in_gbps, dtype=float)[per_rank.host] * GBIT
    e, e_pair = host_joins(keys, n_dst, held_host, per_rank.host[w_rank], w_tile)
    off_bytes = wanted_bytes - np.bincount(w_rank[e], nbytes[e_pair], minlength=n_ranks)
    off_cost = np.zeros(n_ranks)
    fastest = _fastest(topology)
    for rate in np.unique(nic_in).tolist():
        on = nic_in == rate
        extra = np.minimum(nbytes / rate, lat + nbytes / fastest)
        held_extra = np.bincount(w_rank[e], extra[e_pair], minlength=n_ranks)
        off_cost[on] = (per_rank_sum(np.bincount(t, extra, minlength=n_dst)) - held_extra)[on]
    one_by_one = n_recv * lat + np.maximum(b_recv - off_bytes, 0.0) / fastest + off_cost
    # or it takes part in an AllGather, one operation for the slices of its box: that start-up,
    # one more for the part it brings unless it holds some of what it needs (a Copy), and its
    # bytes at the fastest link; only where another rank of its host needs one of its tiles
    gather = (lat * (1 + (np.bincount(j_rank, minlength=n_ranks) == 0)) + b_recv / fastest)
    return np.where(_shares_a_tile(per_rank), np.minimum(one_by_one, gather), one_by_one)


def _host_tiles(per_rank: RankTiles) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """The (destination tile, host) groups of the wanted entries: the number of hosts (the key
    is ``tile * n_hosts + host``), the sorted group keys, each entry's group, and each group's
    ranks (how many ranks of the host need the tile)."""
    n_hosts = int(per_rank.host.max(initial=0)) + 1
    key = per_rank.wanted_tile * n_hosts + per_rank.host[per_rank.wanted_rank]
    groups, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    return n_hosts, groups, inverse.ravel(), counts


def _shares_a_tile(per_rank: RankTiles) -> np.ndarray:
    """Per rank: another rank of its host needs one of its destination tiles (so the two may
    re-join it in an AllGather)."""
    _, _, entry_group, counts = _host_tiles(per_rank)
    shared = counts[entry_group] > 1
    return np.bincount(per_rank.wanted_rank[shared], minlength=len(per_rank.host)) > 0


def rank_bound(
    topology: Topology,
    per_rank: RankTiles,
    s: np.ndarray,
    t: np.ndarray,
    nbytes: np.ndarray,
    held_host: np.ndarray,
    cross: np.ndarray,
) -> float:
    """The per-rank latency bound (module doc); ``s, t, nbytes``: unit slices by tile pair,
    sorted by ``(s, t)``; ``held_host``: tile x host, some rank of the host holds the tile;
    ``cross``: per pair, no host both needs and holds it."""
    lat = topology.latency_us * 1e-6
    n_holders, n_receivers = per_rank.holders, per_rank.receivers
    keys = s * len(n_receivers) + t
    per_rank_s = receiving_times(topology, per_rank, s, t, nbytes, held_host)
    # senders: every slice some receiver lacks needs an operation from one of its holders, and
    # the holders of one source tile hold no other tile: ceil(slices / holders) ops for one of them
    overlap = np.bincount(_held_by_receivers(per_rank, keys)[1], minlength=len(keys))
    lacks = n_receivers[t] - overlap > 0  # per pair: some receiver lacks it
    n_tile = np.bincount(s[lacks], minlength=len(n_holders)).astype(float)
    holders = np.maximum(n_holders, 1).astype(float)
    # a slice no receiver of which sits on a holder host crosses a NIC in every operation that
    # carries it, at most at the fastest single outbound NIC's rate
    nic = max(topology.nic_out_gbps) * GBIT
    move = np.where(lacks, nbytes / np.where(cross, nic, _fastest(topology)), 0.0)  # seconds
    x_tile = np.bincount(s, weights=move, minlength=len(n_holders))
    x_max = np.zeros(len(n_holders))
    if len(s):  # s is sorted: one run per source tile
        runs = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))
        x_max[s[runs]] = np.maximum.reduceat(move, runs)
    per_tile = holders_bound(n_tile, holders, x_tile, x_max, lat)
    return float(max(per_rank_s.max(initial=0.0), per_tile.max(initial=0.0),
                     _group_bound(topology, per_rank, keys, t, nbytes, held_host)))


def _group_bound(topology: Topology, per_rank: RankTiles, keys: np.ndarray, t: np.ndarray,
                 nbytes: np.ndarray, held_host: np.ndarray) -> float:
    """The ``m >= 2`` ranks of a host that need one destination tile, ``k`` of whose slices none
    of them holds: each of those slices reaches one of them in an operation of its own (a
    ``Send`` or ``Broadcast``: one slice at most), so one of them runs ``ceil(k / m)`` such
    operations, and one more, an ``AllGather``, unless it takes all ``k`` itself (``k >= 2``: at
    least as many); ``k = 1``: one operation. With bytes (``k >= 2``): the ``B`` bytes of those
    slices that no rank of the host holds cross its inbound NIC into one of them, each operation
    at that NIC's rate at most; a rank in an all-gather that receives ``n_i`` operations of
    ``b_i`` of those bytes is busy ``(n_i + 1) * lat + b_i / NIC`` at least, and the ``n_i`` add
    up to ``k``, the ``b_i`` to ``B``, so the busiest at least the mean,
    ``(k / m + 1) * lat + B / (m * NIC)``; a rank in none takes all: ``k * lat + B / NIC``,
    no less."""
    lat = topology.latency_us * 1e-6
    n_hosts, groups, _, m = _host_tiles(per_rank)
    n_dst = len(per_rank.receivers)
    j_rank, j_pair = _held_by_receivers(per_rank, keys)
    held = np.unique(j_pair * n_hosts + per_rank.host[j_rank])  # (pair, host): a member holds it
    held_group = t[held // n_hosts] * n_hosts + held % n_hosts
    n_held = np.bincount(np.searchsorted(groups, held_group), minlength=len(groups))
    k = np.bincount(t, minlength=n_dst)[groups // n_hosts] - n_held
    ops = np.where(k >= 2, -(-k // np.maximum(m, 1)) + 1, np.minimum(k, 1))
    counted = np.where(m >= 2, ops, 0) * lat
    g_tile, g_host = groups // n_hosts, groups % n_hosts
    e, e_pair = host_joins(keys, n_dst, held_host, g_host, g_tile)
    off = np.maximum(np.bincount(t, nbytes, minlength=n_dst)[g_tile]
                     - np.bincount(e, nbytes[e_pair], minlength=len(groups)), 0.0)
    nic_in = np.array(topology.nic_in_gbps, dtype=float)[g_host] * GBIT
    spread = np.where((m >= 2) & (k >= 2), (k / m + 1) * lat + off / (m * nic_in), 0.0)
    return float(max(counted.max(initial=0.0), spread.max(initial=0.0)))


def holders_bound(n: np.ndarray, k: np.ndarray, work: np.ndarray, most: np.ndarray,
                  lat: float) -> np.ndarray:
    """Per source tile: the least time in which its ``k`` holders (they hold no other tile) can
    run the operations that carry its ``n`` slices some receiver lacks, ``work`` seconds of
    transfer in all, at most ``most`` seconds of it in one operation (an operation carries data
    of one of the tile's slices at most: a transfer one slice, an all-gather's box one
    destination tile, which meets the source tile in one slice).

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


PAIR_CHUNK = 1 << 20
"""Tile pairs per pass of :func:`host_bound`'s receiving term (its temporaries stay small)."""


def _host_receiving(topology: Topology, per_rank: RankTiles, s: np.ndarray, t: np.ndarray,
               nbytes: np.ndarray, held_host: np.ndarray, wanted_host: np.ndarray) -> np.ndarray:
    """Per host, the rank time its ranks must spend receiving (module doc: k ranks of host h
    lack a slice), over one entry per (pair, host that needs its destination tile)."""
    lat = topology.latency_us * 1e-6
    host_of = per_rank.host
    n_hosts, n_dst = held_host.shape[1], len(per_rank.receivers)
    e_tile, e_host = np.nonzero(wanted_host)  # (tile, host) entries, sorted
    e_first = np.searchsorted(e_tile, np.arange(n_dst + 1))
    width = e_first[1:] - e_first[:-1]
    # each entry's ranks that need the tile, minus those that hold the slice already
    w_key = per_rank.wanted_tile * n_hosts + host_of[per_rank.wanted_rank]
    ranks = np.unique(w_key, return_counts=True)[1]
    j_rank, j_pair = _held_by_receivers(per_rank, s * n_dst + t)
    have, n_have = np.unique(j_pair * n_hosts + host_of[j_rank], return_counts=True)
    nic_in = np.array(topology.nic_in_gbps, dtype=float) * GBIT
    fastest = _fastest(topology)
    busy = np.zeros(n_hosts)
    for a in range(0, len(s), PAIR_CHUNK):
        item, entry = concat_ranges(e_first[t[a : a + PAIR_CHUNK]], width[t[a : a + PAIR_CHUNK]])
        pair, host = a + item, e_host[entry]
        k = ranks[entry]
        if len(have):
            k = k - np.append(n_have, 0)[pair_index(have, pair * n_hosts + host)]
        tr = nbytes[pair] / nic_in[host]
        held = held_host[s[pair], host]
        recv = np.where(
            held,
            k * lat + np.minimum(k * tr, lat),
            k * lat + tr + (k - 1) * np.minimum(tr, lat + nbytes[pair] / fastest),
        )
        # two or more ranks of the host need the tile: they may re-join it in an AllGather (one
        # operation for many slices: its start-up counted for none), so the slice costs them at
        # least its bytes at the fastest link on each rank that lacks it, and the start-up and
        # one NIC's time of the operation that brings it into the host if none of it holds it
        inside = (k - np.where(held, 0, 1)) * nbytes[pair] / fastest
        recv = np.where(ranks[entry] > 1,
                        np.minimum(recv, np.where(held, 0.0, lat + tr) + inside), recv)
        busy += np.bincount(host, np.where(k > 0, recv, 0.0), minlength=n_hosts)
    return busy


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
    # the ranks of the task on each host: only they take part in operations
    size = np.maximum(np.bincount(per_rank.host, minlength=held_host.shape[1]), 1).astype(float)
    busy = _host_receiving(topology, per_rank, s, t, nbytes, held_host, wanted_host)
    best = float((busy / size).max(initial=0.0))
    # sending: slices held on one host alone that some other host needs
    alone = (held_host.sum(axis=1) == 1)[s]
    go = np.flatnonzero(alone & need_any)
    if len(go):
        owner = held_host.argmax(axis=1)[s[go]]
        nic_out = np.array(topology.nic_out_gbps) * GBIT
        busy = np.bincount(owner, weights=lat + nbytes[go] / nic_out[owner], minlength=len(size))
        best = max(best, float((busy / size).max()))
    return best
