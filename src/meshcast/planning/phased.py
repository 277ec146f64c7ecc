"""The phased order of :mod:`.large` for NICs shared by several ranks: each NIC's ranks cut into
groups whose start-ups overlap the other groups' transfers.

Latin-square rounds over all ranks start every transfer of a round together: all the ranks of a
NIC pay their start-up at once and the NIC idles meanwhile, then they share it. Here the ranks of
each NIC are cut into ``g`` groups, the groups run their rounds a start-up apart, and so take
turns on the NIC (:func:`phased_sends`); ``g`` comes from a closed-form cost model
(:func:`phase_model`). ``docs/scheduling.md`` ("Phased order") has the measurements.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from ..core.boxes import Box
from ..core.ops import Op, Send
from ..core.topology import Topology
from ..core.units import GBIT
from .stagger import lead_pieces

__all__ = [
    "Bipartite", "Components", "Phased", "bipartite_components", "epoch_cuts", "phase_model",
    "phased_sends",
]


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


class Components(NamedTuple):
    """Sends that fall into disjoint complete bipartite graphs, each with its own multiplicity:
    the connected components of the graph of sends (ranks as nodes), in each of which every
    sender sends to every receiver the same number of times, no rank on both sides. Per send:
    its ``component``, its sender's and receiver's index among the component's senders and
    receivers (rank order) and its place among its pair's sends; per component: how many
    senders and receivers it has and its multiplicity ``k``. A one-box all-to-all is one
    component; the k-box shuffles of strided layouts (``S01[k]R -> S01R``) are one per group of
    ranks that exchange (docs/concepts.md, "Shards of several boxes: cost")."""

    senders: np.ndarray
    receivers: np.ndarray
    component: np.ndarray
    i: np.ndarray
    j: np.ndarray
    nth: np.ndarray
    n_senders: np.ndarray
    n_receivers: np.ndarray
    k: np.ndarray

    def latin_rounds(self) -> np.ndarray:
        """A round per send such that the sends of one round share no rank, as few as the
        busiest rank needs: in each component the Latin square ``(i + j) mod K`` (``K`` the larger
        side), a pair's ``k`` sends in ``k`` consecutive rounds."""
        b = self.component
        return ((self.i + self.j) % np.maximum(self.n_senders, self.n_receivers)[b]
                * self.k[b] + self.nth)

    def split(self) -> Iterator[tuple[np.ndarray, Bipartite]]:
        """Per component, in turn: the indices of its sends (in the given order) and its
        :class:`Bipartite` form."""
        by_component = np.argsort(self.component, kind="stable")
        cuts = np.flatnonzero(np.diff(self.component[by_component])) + 1
        for sub in np.split(by_component, cuts):
            b = int(self.component[sub[0]])
            s_ranks = np.empty(int(self.n_senders[b]), dtype=np.int64)
            r_ranks = np.empty(int(self.n_receivers[b]), dtype=np.int64)
            s_ranks[self.i[sub]], r_ranks[self.j[sub]] = self.senders[sub], self.receivers[sub]
            yield sub, Bipartite(s_ranks, r_ranks, self.i[sub], self.j[sub], self.nth[sub],
                                 int(self.k[b]))


def bipartite_components(senders: list[int], remotes: list[tuple[int, ...]]) -> Components | None:
    """The :class:`Components` of sends ``senders[x] -> remotes[x]`` (one receiver each), None where
    they are not such graphs (a rank on both sides, or a component in which some sender does
    not send to some receiver as often as to the others). Vectorised: linear in sends."""
    n = len(senders)
    if not n or any(len(r) != 1 for r in remotes):
        return None
    snd = np.array(senders, dtype=np.int64)
    rcv = np.array([r[0] for r in remotes], dtype=np.int64)
    s_ranks, gi = np.unique(snd, return_inverse=True)
    r_ranks, gj = np.unique(rcv, return_inverse=True)
    if np.intersect1d(s_ranks, r_ranks).size:
        return None
    gi, gj = gi.ravel(), gj.ravel()
    ns, nr = len(s_ranks), len(r_ranks)
    components = _components(gi, gj, ns, nr)
    if components is None:
        return None
    s_comp, r_comp = components
    n_senders, n_receivers = np.bincount(s_comp), np.bincount(r_comp)
    pair = gi * nr + gj
    pairs, per_pair = np.unique(pair, return_counts=True)
    pair_comp = s_comp[pairs // nr]
    complete = n_senders * n_receivers
    k = np.bincount(s_comp[gi]) // complete
    if ((np.bincount(pair_comp, minlength=len(complete)) != complete).any()
            or (per_pair != k[pair_comp]).any()):
        return None
    by_pair = np.argsort(pair, kind="stable")
    nth = np.empty(n, dtype=np.int64)
    nth[by_pair] = np.arange(n) - np.searchsorted(pair[by_pair], pair[by_pair], side="left")
    return Components(snd, rcv, s_comp[gi], _index_in_component(s_comp)[gi],
                      _index_in_component(r_comp)[gj], nth, n_senders, n_receivers, k)


def _components(gi: np.ndarray, gj: np.ndarray, ns: int, nr: int
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """The connected components of the bipartite graph of edges ``gi[x] -- gj[x]`` (``ns``
    senders, ``nr`` receivers, every one on an edge) as dense labels per sender and per receiver,
    by propagating the least sender index; None where that takes more than three passes (a
    complete bipartite component settles in two: its least sender reaches every receiver, which
    reach every sender).
    """
    s_label = np.arange(ns, dtype=np.int64)
    for _ in range(3):
        r_label = np.full(nr, ns, dtype=np.int64)
        np.minimum.at(r_label, gj, s_label[gi])
        settled = np.full(ns, ns, dtype=np.int64)
        np.minimum.at(settled, gi, r_label[gj])
        if (settled == s_label).all():
            _, dense = np.unique(s_label, return_inverse=True)
            return dense.ravel(), dense.ravel()[r_label]
        s_label = settled
    return None


def _index_in_component(comp: np.ndarray) -> np.ndarray:
    """Per rank of one side (in rank order, ``comp`` its component): its index among its
    component's ranks of that side."""
    order = np.argsort(comp, kind="stable")
    index = np.empty(len(comp), dtype=np.int64)
    index[order] = np.arange(len(order)) - np.searchsorted(comp[order], comp[order], side="left")
    return index


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
    the bottleneck) the least divisor ``g`` (2 for an even ``per_nic``) and ``rounds *
    max(per_nic * transfer, lat + q * transfer) + (2 g - 2) * lat`` (halves still hide part of
    each start-up)."""
    latin = rounds * (lat + per_nic * transfer)
    costs = {}
    for g in range(2, per_nic + 1):
        q = per_nic // g
        if per_nic % g == 0 and per_nic * transfer <= lat + q * transfer:
            costs[g] = rounds * (lat + q * transfer) + (2 * g - 2) * lat
    if not costs:
        g = next(g for g in range(2, per_nic + 1) if per_nic % g == 0)
        return g, (rounds * max(per_nic * transfer, lat + per_nic // g * transfer)
                   + (2 * g - 2) * lat), latin
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
    """Sends that form complete bipartite graphs (:func:`bipartite_components`) in the phased
    order, each component on its own (:func:`_phased_component`), one component after another
    in the plan (they share no rank); None where the order does not apply to every component.
    The gain is the least of the components' where no NIC serves two of them (the time is then
    the slowest component's), else None."""
    components = bipartite_components(senders, remotes)
    if components is None:
        return None
    nic, _ = topology.global_nics()
    n = len(senders)
    epoch, cuts = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    orders, gains, nics = [], [], []
    for sub, graph in components.split():
        one = _phased_component(graph, nbytes[sub], topology, nic)
        if one is None:
            return None
        order, epoch[sub], cuts[sub], gain = one
        orders.append(sub[order])
        gains.append(gain)
        nics.append(np.unique([nic[r] for r in (*graph.s_ranks.tolist(), *graph.r_ranks.tolist())]))
    shared = len(np.unique(np.concatenate(nics))) < sum(len(x) for x in nics)
    gain = None if shared or None in gains else min(gains)
    return Phased(_with_lead_pieces(np.concatenate(orders), senders, remotes, boxes, cuts, epoch),
                  gain)


def _phased_component(graph: Bipartite, nbytes: np.ndarray, topology: Topology, nic: list[int]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float | None] | None:
    """The phased order of one complete bipartite graph (every sender ``k`` times to every
    receiver), for NICs that all serve the same number (two or more) of its senders and of its
    receivers, or, where the two sides' NICs differ, an even number each; None otherwise:
    the order of its sends, each send's epoch and lead pieces (:func:`epoch_cuts`), and the
    modelled gain (:class:`Phased`).

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
    s_ranks, r_ranks, i, j, nth, k = graph
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
    order = np.lexsort((np.arange(len(i)), gs, rounds, epoch))
    return order, epoch, epoch_cuts(g)[epoch, gs], gain


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
    pieces (:func:`~.stagger.lead_pieces`), so its block runs ``cuts`` start-ups later."""
    ops: list[Op] = [Send(senders[p], remotes[p][0], boxes[p]) for p in order.tolist()]
    snd = np.asarray(senders, dtype=np.int64)[order]
    key = epoch[order] * (int(snd.max()) + 1 if len(snd) else 1) + snd
    _, first = np.unique(key, return_index=True)  # first send of each (epoch, sender)
    first = np.sort(first[cuts[order][first] > 0])
    out: list[Op] = []
    done = 0
    for k in first.tolist():
        out += ops[done:k]
        out += lead_pieces(ops[k], int(cuts[order[k]]))
        done = k + 1
    out += ops[done:]
    return out
