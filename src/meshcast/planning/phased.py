"""The phased order of :mod:`.large` for NICs shared by several ranks: each NIC's ranks cut into
groups whose start-ups overlap the other groups' transfers.

Latin-square rounds over all ranks start every transfer of a round together: all the ranks of a
NIC pay their start-up at once and the NIC idles meanwhile, then they share it. Here the ranks of
each NIC are cut into ``g`` groups, the groups run their rounds a start-up apart, and so take
turns on the NIC (:func:`phased_sends`); ``g`` comes from a closed-form cost model
(:func:`phase_model`). ``docs/scheduling.md`` ("Phased order") has the measurements.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core.boxes import Box
from ..core.ops import Op, Send
from ..core.topology import Topology
from ..core.units import GBIT

__all__ = ["Bipartite", "Phased", "complete_bipartite", "epoch_cuts", "phase_model", "phased_sends"]


class Bipartite(NamedTuple):
    """Sends in which every sender sends to every receiver the same number ``k`` of times and
    no rank is on both sides: the sender ranks and the receiver ranks (sorted), each send's
    index into both, and its place among the ``k`` sends of its pair (in the given order)."""

    s_ranks: np.ndarray
    r_ranks: np.ndarray
    i: np.ndarray
    j: np.ndarray
    nth: np.ndarray
    k: int


def complete_bipartite(senders: list[int], remotes: list[tuple[int, ...]]) -> Bipartite | None:
    """The :class:`Bipartite` form of sends ``senders[x] -> remotes[x]`` (one receiver each),
    None where they are not such a graph. ``k > 1`` where each rank holds ``k`` boxes of every
    pair's data (a strided or fused layout, docs/concepts.md)."""
    n = len(senders)
    if not n or any(len(r) != 1 for r in remotes):
        return None
    s_ranks, i = np.unique(np.array(senders, dtype=np.int64), return_inverse=True)
    r_ranks, j = np.unique(np.array([r[0] for r in remotes], dtype=np.int64), return_inverse=True)
    if np.intersect1d(s_ranks, r_ranks).size:
        return None
    pairs = len(s_ranks) * len(r_ranks)
    pair = i.ravel() * len(r_ranks) + j.ravel()
    k = n // pairs
    if n != k * pairs or (np.bincount(pair, minlength=pairs) != k).any():
        return None
    by_pair = np.argsort(pair, kind="stable")
    nth = np.empty(n, dtype=np.int64)
    nth[by_pair] = np.arange(n) - np.searchsorted(pair[by_pair], pair[by_pair], side="left")
    return Bipartite(s_ranks, r_ranks, i.ravel(), j.ravel(), nth, k)


class Phased(NamedTuple):
    """The sends in the phased order, and the modelled time of Latin-square rounds over that of
    the phased order (:func:`phase_model`; None outside the model: where the NICs of the two
    sides serve different numbers of ranks, or the two sides differ in size, where the
    measured ratio was far from the model's)."""

    ops: list[Op]
    gain: float | None


FEWER_GROUPS = 0.01
""":func:`phase_model` takes the fewest groups whose modelled time is within this fraction of the
least: more groups gain little there and leave less room on the NIC for the turns to drift
(measured: 8 groups at 94 % NIC use simulated 30 % above the model, 4 groups matched it). Set
once; not derived."""


def phase_model(per_nic: int, rounds: int, lat: float, transfer: float) -> tuple[int, float, float]:
    """``(g, phased, latin)``: the number of groups ``g`` (a divisor of ``per_nic``, at least 2)
    for NICs of ``per_nic`` ranks each running ``rounds`` operations of ``lat`` start-up and
    ``transfer`` seconds alone on the NIC, and the modelled times of the phased order with ``g``
    groups and of Latin-square rounds over all ranks.

    Model: Latin rounds last ``lat + per_nic * transfer`` each (every rank of a NIC starts
    together, then they share it). With ``g`` groups of ``q = per_nic / g`` ranks a round lasts
    ``lat + q * transfer`` (a group's transfers share the NIC; the other groups' turns fall in
    its start-up) when the turns fit in it (``per_nic * transfer <= lat + q * transfer``), and
    the lead pieces add ``g - 1`` start-ups in the first epoch and one in each later one
    (:func:`epoch_cuts`): ``rounds * (lat + q * transfer) + (2 g - 2) * lat``. The fewest
    groups within :data:`FEWER_GROUPS` of the least such time; where no ``g`` fits (the NIC is
    the bottleneck) ``g = 2`` and ``rounds * max(per_nic * transfer, lat + q * transfer) + 2 *
    lat`` (halves still hide part of each start-up)."""
    latin = rounds * (lat + per_nic * transfer)
    costs = {}
    for g in range(2, per_nic + 1):
        q = per_nic // g
        if per_nic % g == 0 and per_nic * transfer <= lat + q * transfer:
            costs[g] = rounds * (lat + q * transfer) + (2 * g - 2) * lat
    if not costs:
        return 2, rounds * max(per_nic * transfer, lat + per_nic // 2 * transfer) + 2 * lat, latin
    least = min(costs.values())
    g = min(g for g, c in costs.items() if c <= least * (1 + FEWER_GROUPS))
    return g, costs[g], latin


def phased_sends(
    senders: list[int],
    remotes: list[tuple[int, ...]],
    boxes: list[Box],
    nbytes: np.ndarray,
    topology: Topology,
) -> Phased | None:
    """Sends of a complete bipartite graph (every sender once to every receiver) in the phased
    order, for NICs that all serve the same number (two or more) of senders and of receivers,
    or, where the two sides' NICs differ, an even number each; None otherwise.

    The ranks of each NIC are cut into ``g`` groups (:func:`phase_model`, consecutive in rank
    order) and the pairs into ``g`` epochs: in epoch ``e`` sender group ``a`` sends to receiver
    group ``(a + e) mod g``. Each block (a sender group x a receiver group) is a two-level Latin
    square: in each round every sending NIC's group sends to one receiving NIC's group, rank to
    rank, so the transfers on one NIC pair share exactly those two NICs (they move at equal
    rates and end together) and the blocks of an epoch share no rank. In each epoch the first
    operation of each sender of group ``a`` is cut into ``a + 1`` pieces, so its block runs
    ``a`` start-ups behind group 0: the groups' transfers take turns on the NIC while the
    others pay their start-ups. Where the NICs of the two sides serve different numbers of
    ranks, ``g = 2`` and each block is one Latin square over its ranks.
    """
    graph = complete_bipartite(senders, remotes)
    if graph is None:
        return None
    s_ranks, r_ranks, i, j, nth, k = graph
    nic, _ = topology.global_nics()
    s_nic, r_nic = (np.array([nic[r] for r in x.tolist()], dtype=np.int64)
                    for x in (s_ranks, r_ranks))
    s_count, r_count = np.bincount(s_nic)[s_nic], np.bincount(r_nic)[r_nic]
    per_nic = int(s_count[0])
    aligned = bool((s_count == per_nic).all() and (r_count == per_nic).all())
    if per_nic < 2 or (not aligned and ((s_count % 2).any() or (r_count % 2).any())):
        return None  # groups of unequal size load the NICs unevenly (measured slower)
    g, gain = 2, None
    if aligned:
        bw = min(*topology.nic_out_gbps, *topology.nic_in_gbps) * GBIT
        g, phased, latin = phase_model(per_nic, k * max(len(s_ranks), len(r_ranks)),
                                       topology.latency_us * 1e-6, float(nbytes.mean()) / bw)
        if len(s_ranks) == len(r_ranks):  # the model's rounds (measured: within 0.2 %, 2 % on
            # 16-byte slices, where it predicts Latin rounds 2 % faster and they are equal)
            gain = latin / phased
    (s_group, s_dense, s_pos, s_index), (r_group, r_dense, r_pos, r_index) = (
        _nic_groups(x, g) for x in ((s_ranks, s_nic), (r_ranks, r_nic)))
    gs, gr = s_group[i], r_group[j]
    epoch = (gr - gs) % g
    if aligned:  # two-level Latin square: NIC to NIC, then rank to rank
        m = per_nic // g
        n_nics = max(int(s_dense.max()), int(r_dense.max())) + 1
        rounds = ((r_dense[j] - s_dense[i]) % n_nics) * m + (r_pos[j] - s_pos[i]) % m
    else:  # NICs of different sizes on the two sides: one Latin square per block
        n_s, n_r = np.bincount(s_group, minlength=g), np.bincount(r_group, minlength=g)
        rounds = (r_index[j] - s_index[i]) % np.maximum(n_s[gs], n_r[gr])
    rounds = rounds * k + nth  # a pair's k sends in k consecutive rounds
    order = np.lexsort((np.arange(len(senders)), gs, rounds, epoch))
    cuts = epoch_cuts(g)[epoch, gs]
    return Phased(_with_lead_pieces(order, senders, remotes, boxes, cuts, epoch), gain)


def epoch_cuts(g: int) -> np.ndarray:
    """``cuts[e, a]``: the extra start-ups (one-row lead pieces) of sender group ``a`` in epoch
    ``e`` of the phased order with ``g`` groups.

    A delay of ``k`` start-ups shifts a group's turn on the NIC by ``-k`` turns (a round lasts a
    start-up plus one turn), so the groups sharing a NIC take distinct turns when their delays
    are ``g`` consecutive whole numbers. Epoch 0: group ``a`` is delayed ``a``. In epoch ``e``
    sender group ``a`` meets the receivers that met sender group ``a + 1`` in epoch ``e - 1``,
    so its block starts at the later of the two delays; the groups are then bumped, fewest
    first, to consecutive delays again (for ``g = 2``: the second half once per epoch; in all
    about one start-up per epoch instead of ``g - 1``)."""
    cuts = np.zeros((g, g), dtype=np.int64)
    cuts[0] = np.arange(g)
    delay = list(range(g))
    for e in range(1, g):
        base = [max(delay[a], delay[(a + 1) % g]) for a in range(g)]
        last = -1
        for a in sorted(range(g), key=lambda x: (base[x], x)):
            delay[a] = max(base[a], last + 1)
            cuts[e, a] = delay[a] - base[a]
            last = delay[a]
    return cuts


def _nic_groups(side: tuple[np.ndarray, np.ndarray], g: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per rank of ``side`` (ranks, their NICs; ``g`` divides every NIC's count): its group
    (``g`` consecutive blocks of its NIC's ranks in rank order), its NIC's index among the
    side's NICs, its position within its group on its NIC, and its index among its group's
    ranks of all NICs (in rank order)."""
    ranks, nics = side
    size = np.bincount(nics)[nics]
    order = np.lexsort((ranks, nics))
    pos = np.empty(len(ranks), dtype=np.int64)
    starts = np.searchsorted(nics[order], nics[order], side="left")
    pos[order] = np.arange(len(ranks)) - starts
    m = size // g
    _, dense = np.unique(nics, return_inverse=True)
    group = pos // m
    index = np.empty(len(ranks), dtype=np.int64)
    for h in range(g):
        members = np.flatnonzero(group == h)
        index[members] = np.arange(len(members))
    return group, dense.ravel(), pos % m, index


def _with_lead_pieces(
    order: np.ndarray,
    senders: list[int],
    remotes: list[tuple[int, ...]],
    boxes: list[Box],
    cuts: np.ndarray,
    epoch: np.ndarray,
) -> list[Op]:
    """The sends in ``order``; the first send of each sender in each epoch cut into ``cuts + 1``
    pieces along its longest dimension (``cuts`` one-row pieces and the rest, as many as its
    rows allow), so its block runs ``cuts`` start-ups later."""
    ops: list[Op] = [Send(senders[p], remotes[p][0], boxes[p]) for p in order.tolist()]
    snd = np.asarray(senders, dtype=np.int64)[order]
    key = epoch[order] * (int(snd.max()) + 1 if len(snd) else 1) + snd
    _, first = np.unique(key, return_index=True)  # first send of each (epoch, sender)
    first = np.sort(first[cuts[order][first] > 0])
    out: list[Op] = []
    done = 0
    for k in first.tolist():
        out += ops[done:k]
        out += _lead_pieces(ops[k], int(cuts[order[k]]))
        done = k + 1
    out += ops[done:]
    return out


def _lead_pieces(op: Send, cut: int) -> list[Op]:
    """``op`` as ``cut`` one-row pieces along its longest dimension and the rest (fewer where
    its rows do not allow; ``op`` itself for a 0-d box)."""
    box = op.box
    if not box:
        return [op]
    d = max(range(len(box)), key=lambda x: box[x].stop - box[x].start)
    lo, hi = box[d].start, box[d].stop
    cut = max(min(cut, hi - lo - 1), 0)
    pieces: list[Op] = [Send(op.src, op.dst, (*box[:d], slice(x, x + 1), *box[d + 1 :]))
                        for x in range(lo, lo + cut)]
    return [*pieces, Send(op.src, op.dst, (*box[:d], slice(lo + cut, hi), *box[d + 1 :]))]
