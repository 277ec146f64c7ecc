"""The exact :func:`meshcast.simulate` time of a plan made of per-rank copies followed by network
operations in rank-disjoint rounds, on a topology where no NIC serves two ranks, evaluated round
by round with numpy and no operation built (:mod:`meshcast.planning.large`'s certificate).

Why exact: no transfer ever shares a NIC, so every operation takes ``latency`` plus its bytes at
its route's rate, and starts when its ranks are free (their previous operation in plan order has
ended). Within a round the ranks are disjoint, so the round is evaluated at once; the float
operations are the simulator's (``(start + lat) + bytes / rate``, copies ``start + bytes /
intra`` one after another), so the result is the same number. Rounds arrive one at a time (an
iterable), so that a plan of millions of operations costs memory in one round.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from ..core.indexing import position_coder
from ..core.topology import Topology
from .items import Nets

__all__ = ["Round", "by_round", "rounds_end", "sends_rounds_time"]

Round = tuple[np.ndarray, np.ndarray, np.ndarray | None]
"""One round: the ranks of its operations (positions among the plan's sorted ranks, from
:func:`~meshcast.core.indexing.position_coder`; one row per operation when the third item is
None, else flat, operation ``i`` with ``counts[i]`` of them), each operation's seconds of
transfer, and ``counts``."""


def rounds_end(topology: Topology, copy_end: dict[int, float], ranks: np.ndarray,
               rounds: Iterable[Round]) -> float:
    """When the last operation of ``rounds`` (:data:`Round`) ends, every rank (the sorted
    ``ranks``) free once its copies end (``copy_end``, seconds per rank)."""
    lat = topology.latency_us * 1e-6
    free = np.array([copy_end.get(r, 0.0) for r in ranks.tolist()], dtype=np.float64)
    end_all = max(copy_end.values(), default=0.0)
    for who, dur, counts in rounds:
        if counts is None:
            end = (free[who].max(axis=1) + lat) + dur
            free[who] = end[:, None]
        else:
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
            end = (np.maximum.reduceat(free[who], starts) + lat) + dur
            free[who] = np.repeat(end, counts)
        end_all = max(end_all, float(end.max(initial=0.0)))
    return end_all


def by_round(slots: np.ndarray, *arrays: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    """The parts of ``arrays`` (one item per operation, in plan order) in each non-empty round of
    the non-decreasing ``slots``."""
    cuts = np.flatnonzero(slots[1:] != slots[:-1]) + 1
    bounds = np.concatenate(([0], cuts, [len(slots)])).tolist()
    for a, b in itertools.pairwise(bounds):
        if a < b:
            yield tuple(x[a:b] for x in arrays)


def sends_rounds_time(
    topology: Topology,
    copy_end: dict[int, float],
    rounds: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]],
    nets: Nets | None = None,
) -> float:
    """The exact :func:`meshcast.simulate` time (module doc) of a plan of per-rank copies ending
    at ``copy_end`` then sends in rank-disjoint rounds, each round ``(snd, rcv, nbytes)``: sends
    ``snd[k] -> rcv[k]`` of ``nbytes[k]`` bytes, on a topology where no NIC serves two ranks."""
    nets = Nets(topology) if nets is None else nets
    ranks = np.array(sorted(topology.hosts_by_rank), dtype=np.int64)
    nic_of = np.array([nets.nic[r] for r in ranks.tolist()], dtype=np.int64)
    host_of = np.array([nets.host_of[r] for r in ranks.tolist()], dtype=np.int64)
    out_bw, in_bw = np.array(nets.out_bw), np.array(nets.in_bw)
    code = position_coder(ranks)

    def timed() -> Iterator[Round]:
        for snd, rcv, nbytes in rounds:
            a, b = code(snd), code(rcv)
            rate = np.where(
                host_of[a] == host_of[b],
                nets.intra,
                np.minimum(out_bw[nic_of[a]], in_bw[nic_of[b]]),
            )
            yield np.stack((a, b), axis=1), nbytes / rate, None

    return rounds_end(topology, copy_end, ranks, timed())
