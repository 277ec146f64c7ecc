"""The operations of ``"auto"``'s own method before they are ordered: per unit slice, senders
from the outbound LP of the lower bound (rounded slice by slice), optional striping over
holder NICs, optional chunking, and broadcast or point-to-point, each as an :class:`Item`
(its ranks, NIC directions and estimated duration) for the schedulers of
:mod:`meshcast.planning.dispatch`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

from ..core.boxes import Box, box_size, split_box
from ..core.ops import Broadcast, Copy, Op, Send, broadcast_chain
from ..core.task import ReshardTask, SliceInfo
from ..core.topology import Topology
from ..core.units import GBIT
from ..estimate.lower_bound import LowerBound

__all__ = ["Item", "Nets", "OwnItems", "op_items", "own_items"]

STRIPE_SHARE = 4
"""A slice is striped over its holders' NICs when it is larger than 1/4 of a source NIC's fair
share of all outbound bytes (docs/scheduling.md, step 3): smaller ones are not worth a cut."""
CHUNK_LATENCIES = 64
"""Chunks are at least this many start-ups' worth of bytes at the slowest NIC (so a chunk's
latency costs at most 1/64 of its transfer), and at least 1/8 of the bound's bytes per NIC."""
MAX_CHUNKS = 16
"""A broadcast is cut into at most this many chunks. Set once; not derived."""
SEQ_STRIDE = 64
"""Order keys of slice ``i``'s items start at ``i * 64``, so that the items of one slice stay
together in the schedulers' tie-break order (a key is only a tie-break: a slice with more than
64 items overlapping the next one's keys is harmless)."""


class Nets:
    """Per-rank NIC ids and per-NIC bandwidth (bytes/s); NIC load in seconds."""

    def __init__(self, topology: Topology) -> None:
        self.host_of = topology.hosts_by_rank
        self.nic, host_of_nic = topology.global_nics()
        self.out_bw = [topology.nic_out_gbps[h] * GBIT for h in host_of_nic]
        self.in_bw = [topology.nic_in_gbps[h] * GBIT for h in host_of_nic]
        self.out_load = [0.0] * len(host_of_nic)
        self.in_load = [0.0] * len(host_of_nic)
        self.rank_load: dict[int, float] = {}
        self.rank_busy: dict[int, float] = {}  # seconds of items per rank (start-ups included)
        self.lat = topology.latency_us * 1e-6
        self.intra = topology.intra_gbps * GBIT


class OwnItems(NamedTuple):
    """What :func:`own_items` builds: the items, whether a slice went point-to-point, and
    whether striping, or chunking, changed anything (``chunked``: whether a broadcast was large
    enough to chunk, with ``chunk`` on or off). A switch that changed nothing gives the same items
    on or off."""

    items: list[Item]
    used_p2p: bool
    striped: bool
    chunked: bool


class Item(NamedTuple):
    """An op with what list scheduling needs: its ranks, NIC resources and estimated duration."""

    op: Op
    ranks: tuple[int, ...]
    nics: tuple[int, ...]  # 2*nic for outbound, 2*nic+1 for inbound
    dur: float
    order: int


def _split_weighted(box: Box, weights: list[float]) -> list[Box | None]:
    """``box`` cut along its longest dimension in proportion to ``weights`` (None: empty part).
    A 0-d box (one element) is not cut: the first part is all of it."""
    if not box:
        return [box] + [None] * (len(weights) - 1)
    dim = max(range(len(box)), key=lambda d: box[d].stop - box[d].start)
    lo, hi = box[dim].start, box[dim].stop
    total = sum(weights)
    cuts = [lo]
    acc = 0.0
    for w in weights[:-1]:
        acc += w
        cuts.append(lo + round((hi - lo) * acc / total))
    cuts.append(hi)
    return [
        (*box[:dim], slice(a, b), *box[dim + 1 :]) if b > a else None
        for a, b in itertools.pairwise(cuts)
    ]


def _broadcast_item(nets: Nets, sender: int, dsts: list[int], box: Box, nbytes: int, order: int,
                   charge: bool = True) -> Item:
    """A broadcast (or a send) from ``sender`` along :func:`~meshcast.core.ops.broadcast_chain`,
    each receiving host led by its receiver whose NIC has received least; charges NIC loads."""
    nic = nets.nic
    chain = broadcast_chain(Broadcast(sender, tuple(dsts), box), nets.host_of)
    ordered: list[int] = list(chain[0][1])
    chain_nics: list[int] = []
    rates: list[float] = []
    prev = sender
    fan = bool(ordered)
    for first, rest in chain[1:]:
        members = [first, *rest]
        lead = min(members, key=lambda r: (nets.in_load[nic[r]], members.index(r)))
        ordered.append(lead)
        ordered.extend(r for r in members if r != lead)
        fan = fan or len(members) > 1
        chain_nics += [2 * nic[prev], 2 * nic[lead] + 1]
        rates += [nets.out_bw[nic[prev]], nets.in_bw[nic[lead]]]
        prev = lead
    if fan:
        rates.append(nets.intra)
    dur = nets.lat + nbytes / min(rates or [nets.intra])
    if charge:
        for k, rate in zip(chain_nics, rates):
            if k & 1:
                nets.in_load[k >> 1] += nbytes / rate
            else:
                nets.out_load[k >> 1] += nbytes / rate
        for r in (sender, *ordered):
            nets.rank_load[r] = nets.rank_load.get(r, 0.0) + nbytes
            nets.rank_busy[r] = nets.rank_busy.get(r, 0.0) + dur
    op: Op = (
        Send(sender, ordered[0], box)
        if len(ordered) == 1
        else Broadcast(sender, tuple(ordered), box)
    )
    return Item(op, (sender, *ordered), tuple(dict.fromkeys(chain_nics)), dur, order)


def own_items(
    task: ReshardTask,
    topology: Topology,
    slices: list[SliceInfo],
    lbd: LowerBound,
    *,
    stripe: bool,
    chunk: bool,
    p2p: bool,
) -> OwnItems:
    """Senders and collectives for every slice of ``task`` (module doc), largest slice first:
    ``stripe`` cuts large slices over their holders' NICs, ``chunk`` cuts large broadcasts,
    ``p2p`` sends point-to-point where that is cheaper."""
    builder = _OwnItems(task, topology, slices, lbd, stripe=stripe, chunk=chunk, p2p=p2p)
    for sl in sorted(slices, key=lambda s: (-s.nbytes, s.index)):
        builder.add(sl)
    return OwnItems(builder.items, builder.used_p2p, builder.striped, builder.chunked)


def op_items(ops: Sequence[Op], topology: Topology, itemsize: int) -> list[Item]:
    """An item per ``Send`` and ``Broadcast`` of ``ops`` (elements of ``itemsize`` bytes), each
    receiving host of a broadcast led as in :func:`own_items`; an item's ``order`` is its
    operation's index."""
    nets = Nets(topology)
    return [_broadcast_item(nets, op.src, [op.dst] if isinstance(op, Send) else list(op.dsts),
                            op.box, box_size(op.box) * itemsize, k)
            for k, op in enumerate(ops) if isinstance(op, (Send, Broadcast))]


class _OwnItems:
    """The state of :func:`own_items` while it walks the slices: NIC loads, LP quotas, items."""

    def __init__(self, task: ReshardTask, topology: Topology, slices: list[SliceInfo],
                 lbd: LowerBound, *, stripe: bool, chunk: bool, p2p: bool) -> None:
        self.nets = nets = Nets(topology)
        self.topology, self.itemsize = topology, task.itemsize
        self.stripe, self.chunk, self.p2p = stripe, chunk, p2p
        self.quota: dict[tuple[int, ...], dict[int, float]] = {
            g: {h: f * b for h, f in zip(g, fr)}
            for g, b, fr in zip(lbd.groups, lbd.group_bytes, lbd.fractions)
        }
        n_src_nics = len({nets.nic[r] for sl in slices for r in sl.holders}) or 1
        self.fair_share = sum(lbd.group_bytes) / n_src_nics
        min_bw = min(nets.out_bw + nets.in_bw)
        lb_s = max(lbd.inbound_s, lbd.outbound_s)
        self.chunk_bytes = max(CHUNK_LATENCIES * nets.lat * min_bw, lb_s * min_bw / 8, 1.0)
        self.items: list[Item] = []
        self.used_p2p = self.striped = self.chunked = False
        self.seq = 0

    def _push(self, sender: int, dsts: list[int], box: Box, nbytes: int) -> None:
        self.items.append(_broadcast_item(self.nets, sender, dsts, box, nbytes, self.seq))

    def add(self, sl: SliceInfo) -> None:
        """The items of one slice."""
        nets, host_of = self.nets, self.nets.host_of
        self.seq = sl.index * SEQ_STRIDE
        for r in sl.local:
            self.items.append(Item(Copy(r, sl.box), (r,), (), sl.nbytes / nets.intra, self.seq))
        if not sl.remote:
            return
        holder_hosts = tuple(dict.fromkeys(host_of[r] for r in sl.holders))
        held = set(holder_hosts)
        foreign = [r for r in sl.remote if host_of[r] not in held]
        if not foreign:  # every receiver sits on a host that holds the slice: intra-host only
            for h, group in _by_host(sl.remote, host_of).items():
                self._push(_least_loaded_holder(sl.holders, h, nets), group, sl.box, sl.nbytes)
            return
        q = self.quota.get(tuple(sorted(holder_hosts)), {})
        units = self._senders(sl, holder_hosts, foreign, q)
        if len(units) > 1:
            boxes = _split_weighted(sl.box, [w for _, w in units])
            parts = [(s, b) for (s, _), b in zip(units, boxes) if b is not None]
        else:
            parts = [(units[0][0], sl.box)]
        for snd, box in parts:
            self._part(sl, snd, box, foreign, q)

    def _senders(self, sl: SliceInfo, holder_hosts: tuple[int, ...], foreign: list[int],
                 q: dict[int, float]) -> list[tuple[int, float]]:
        """(sender rank, weight) per stripe: :meth:`_striped` when striping may pay, else (or
        where one stripe is best) one sender on the host with the largest LP quota left."""
        nets, nic = self.nets, self.nets.nic
        units: list[tuple[int, float]] = []
        if self.stripe and sl.nbytes > self.fair_share / STRIPE_SHARE and (
            len(holder_hosts) > 1 or len({nic[r] for r in sl.holders}) > 1
        ):
            units = self._striped(sl, foreign)
            self.striped = self.striped or len(units) > 1
        if len(units) < 2:
            h = max(holder_hosts,
                    key=lambda x: (q.get(x, 0.0), -_host_out(nets, x, self.topology), -x))
            units = [(_least_loaded_holder(sl.holders, h, nets), 1.0)]
        return units

    def _striped(self, sl: SliceInfo, foreign: list[int]) -> list[tuple[int, float]]:
        """(sender rank, bytes) per stripe of ``sl``: its bytes water-filled over the holder NICs
        that have sent least (each NIC's least busy holder sends), over as many NICs as make the
        slice done soonest by the estimate ``max(level + lat, busiest foreign receiver + k * lat
        + bytes at its inbound NIC)``: ``level`` the senders' NIC seconds once they carry their
        stripes, ``k`` the stripes (each a start-up for every receiver). So a slice goes whole
        where the receivers' start-ups cost more than the senders' imbalance, and is cut where
        one holder NIC would carry more than its share (e.g. 7 slices from 5 holder hosts: five
        go whole, the last two in two stripes each)."""
        nets, nic, lat = self.nets, self.nets.nic, self.nets.lat
        units = []  # (NIC seconds so far, bytes/s, sender, position)
        for k in dict.fromkeys(nic[r] for r in sl.holders):
            on_k = [r for r in sl.holders if nic[r] == k]
            snd = min(on_k, key=lambda r: (nets.rank_busy.get(r, 0.0), on_k.index(r)))
            units.append((nets.out_load[k], nets.out_bw[k], snd, len(units)))
        units.sort()
        receivers = max(nets.rank_busy.get(r, 0.0) + sl.nbytes / nets.in_bw[nic[r]]
                        for r in foreign)
        best: tuple[float, list[tuple[int, float]]] = (math.inf, [])
        for k in range(1, len(units) + 1):
            head = units[:k]
            level = (sl.nbytes + sum(o * bw for o, bw, _, _ in head)) / sum(u[1] for u in head)
            if level < head[-1][0]:  # the k-th NIC would carry nothing
                break
            done = max(level + lat, receivers + k * lat)
            if done < best[0]:
                best = (done, [(snd, (level - o) * bw) for o, bw, snd, _ in head])
        return [(snd, w) for snd, w in best[1] if w > 0]

    def _part(self, sl: SliceInfo, snd: int, box: Box, foreign: list[int],
              q: dict[int, float]) -> None:
        """The items of one stripe ``box`` sent by ``snd``: to its own host's receivers and the
        foreign ones (point-to-point when cheaper, else broadcast, chunked when large), then to
        receivers on other holder hosts from a holder on their own host."""
        nets, host_of = self.nets, self.nets.host_of
        nbytes = box_size(box) * self.itemsize
        h = host_of[snd]
        q[h] = q.get(h, 0.0) - nbytes
        dsts = [r for r in sl.remote if host_of[r] == h] + foreign
        others = [r for r in sl.remote if host_of[r] != h and r not in foreign]
        if self.p2p and len(dsts) > 1 and _sends_cheaper(nets, snd, len(dsts), nbytes):
            self.used_p2p = True
            for r in dsts:
                self._push(snd, [r], box, nbytes)
                self.seq += 1
            dsts = []
        pieces = [box]
        large = bool(dsts) and nbytes > 2 * self.chunk_bytes
        self.chunked = self.chunked or large
        if self.chunk and large:
            k = min(MAX_CHUNKS, math.ceil(nbytes / self.chunk_bytes))
            pieces = list(split_box(box, k) or [box])
        for piece in pieces:
            if dsts:
                self._push(snd, dsts, piece, box_size(piece) * self.itemsize)
                self.seq += 1
        if others:
            for hh, group in _by_host(others, host_of).items():
                self._push(_least_loaded_holder(sl.holders, hh, nets), group, box, nbytes)
                self.seq += 1


def _sends_cheaper(nets: Nets, snd: int, n_dsts: int, nbytes: int) -> bool:
    """Whether ``n_dsts`` point-to-point sends beat one broadcast from ``snd`` (tiny slices to
    few receivers, where the start-ups dominate)."""
    bw = nets.out_bw[nets.nic[snd]]
    return nets.lat * n_dsts + n_dsts * nbytes / bw < nets.lat + nbytes / bw


def _by_host(ranks: list[int] | tuple[int, ...], host_of: dict[int, int]) -> dict[int, list[int]]:
    by_host: dict[int, list[int]] = {}
    for r in ranks:
        by_host.setdefault(host_of[r], []).append(r)
    return by_host


def _host_out(nets: Nets, h: int, topology: Topology) -> float:
    first = sum(topology.nics_per_host[:h])
    return sum(nets.out_load[first : first + topology.nics_per_host[h]])


def _least_loaded_holder(holders: tuple[int, ...], host: int, nets: Nets) -> int:
    """The holder on ``host`` whose NIC and rank have sent the least."""
    on = [r for r in holders if nets.host_of[r] == host]
    return min(
        on, key=lambda r: (nets.out_load[nets.nic[r]], nets.rank_load.get(r, 0.0), on.index(r))
    )
