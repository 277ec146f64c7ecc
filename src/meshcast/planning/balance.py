"""Balance methods that choose senders *and* order: ``"order"`` (the paper's) and ``"auto"`` (ours).

Both are pure functions of the task and the topology: randomness is seeded and every search is
bounded by a count of nodes, never by the wall clock, so every rank computes the same plan.

``"order"`` (PAPER.md section 3): randomised greedy rounds of host-disjoint transfers, senders
drawn favouring lightly loaded hosts, best of ``ORDER_TRIALS`` seeded trials; for small instances
a depth-first branch-and-bound search improves on the best trial. Cost model: a transfer starts
when its sender host and all its receiver hosts are free and occupies them for size / bandwidth.

``"auto"``: senders from the outbound LP of :mod:`meshcast.lower_bound` rounded slice by slice,
optional striping (a slice held on several hosts or NICs is cut into parts sent by different
senders), optional chunking, per-slice choice of broadcast or point-to-point, and list
scheduling (round colourings by rank, or by rank and NIC; list schedules; earliest-start and
non-delay dispatch with NICs held only while bytes move; seeded non-delay trials); every variant
plus every fixed strategy x balance plan is simulated and the fastest is kept, then improved by a
seeded local search over the order when it is far above the lower bound. Above
:data:`AUTO_SIM_LIMIT` unit slices one vectorised plan is built (rank-disjoint rounds, and where
NICs are shared also a phased order that overlaps one half of each NIC's start-ups with the other
half's transfers); it is kept when its exact time
(evaluated round by round where no NIC serves two ranks, else simulated) meets the lower bound,
and otherwise compared with the fixed combinations, skipping each one whose quick time floor
shows it cannot be faster. See ``docs/scheduling.md``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import NamedTuple

import numpy as np

from ..core.layout import Box, box_size, split_box
from ..core.plan import AllGather, Broadcast, Copy, Op, Plan, Send, broadcast_chain
from ..core.task import ReshardTask, SliceInfo, iter_slices
from ..core.topology import Topology
from ..estimate.lower_bound import lower_bound_details

__all__ = [
    "AUTO_SEARCH_BUDGET",
    "AUTO_SEARCH_GAP",
    "AUTO_SEARCH_STEPS",
    "AUTO_SIM_LIMIT",
    "AUTO_TRIALS",
    "AUTO_TRIAL_BUDGET",
    "CERTIFY_TOL",
    "FLOOR_TOL",
    "ORDER_NODE_BUDGET",
    "ORDER_TRIALS",
    "SEARCH_MAX_JOBS",
    "SEARCH_NODE_BUDGET",
    "SEED",
    "auto_plan",
    "order_plan",
]

SEED = 20230501
"""Seed of every random choice (the same plan everywhere)."""
ORDER_TRIALS = 100
"""Greedy-round trials of ``"order"`` (the paper's 100)."""
ORDER_NODE_BUDGET = 60_000
"""Job examinations the greedy rounds of ``"order"`` may spend over all trials."""
SEARCH_NODE_BUDGET = 20_000
"""Nodes of the depth-first branch-and-bound search of ``"order"``."""
SEARCH_MAX_JOBS = 12
"""The search runs when an instance has at most this many network transfers."""
AUTO_SIM_LIMIT = 20_000
"""Above this many unit slices ``"auto"`` builds one vectorised plan instead of its candidates,
and checks it against the fixed combinations only where it cannot certify it optimal; below it
but above this many transfers, ``"auto"`` builds one variant of its own plan and no trials."""
FLOOR_TOL = 1e-9
"""Relative float margin under which a fixed plan's quick time floor is trusted to rule it out."""
CERTIFY_TOL = 1e-9
"""Above :data:`AUTO_SIM_LIMIT`, the one plan built is kept without simulating others when its
exact time is within this relative margin of the lower bound (before the bound's own 1e-9 float
margin): then no plan, fixed or not, is faster by more than about 2e-9 relative."""
AUTO_SEARCH_GAP = 1.2
"""``"auto"`` improves its best plan by local search when it simulates above this many times the
lower bound."""
AUTO_SEARCH_STEPS = 200
"""Moves the local search tries at most."""
AUTO_SEARCH_BUDGET = 60_000
"""Operations all the local search's simulations may run together (steps x plan length)."""
AUTO_TRIALS = 16
"""Seeded non-delay dispatch trials (perturbed priorities) per sender choice of ``"auto"``."""
AUTO_TRIAL_BUDGET = 30_000
"""Items all those trials may schedule together (so each trial's simulation stays bounded)."""

_GBIT = 1e9 / 8


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


class _Job(NamedTuple):
    box: Box
    nbytes: int
    holders: tuple[int, ...]
    receivers: tuple[int, ...]
    gather: int  # index of the AllGather this part feeds, or -1


def _skeleton(task: ReshardTask, topology: Topology, strategy: str):
    """Copies, network jobs (sender still open), all-gathers fed by jobs, fallbacks."""
    host_of = topology._host_of
    copies: list[Op] = []
    jobs: list[_Job] = []
    gathers: list[AllGather] = []
    fallbacks: list[tuple[int, str]] = []
    itemsize = task.itemsize
    for sl in iter_slices(task):
        copies.extend(Copy(r, sl.box) for r in sl.local)
        if not sl.remote:
            continue
        if strategy == "broadcast":
            jobs.append(_Job(sl.box, sl.nbytes, sl.holders, sl.remote, -1))
        elif strategy == "send_recv":
            jobs.extend(_Job(sl.box, sl.nbytes, sl.holders, (r,), -1) for r in sl.remote)
        else:
            by_host: dict[int, list[int]] = {}
            for r in sl.remote:
                by_host.setdefault(host_of[r], []).append(r)
            for h, group in by_host.items():
                parts = split_box(sl.box, len(group)) if len(group) > 1 else None
                if parts is None:
                    fallbacks.append(
                        (
                            sl.index,
                            f"one receiver on host {h}"
                            if len(group) == 1
                            else f"slice too small to split among {len(group)} receivers on "
                            f"host {h}",
                        )
                    )
                    jobs.extend(_Job(sl.box, sl.nbytes, sl.holders, (r,), -1) for r in group)
                    continue
                g = len(gathers)
                gathers.append(AllGather(tuple(group), sl.box, parts))
                jobs.extend(
                    _Job(p, box_size(p) * itemsize, sl.holders, (r,), g)
                    for r, p in zip(group, parts)
                )
    return copies, jobs, gathers, fallbacks


def _job_op(job: _Job, sender: int) -> Op:
    if len(job.receivers) == 1:
        return Send(sender, job.receivers[0], job.box)
    return Broadcast(sender, job.receivers, job.box)


# ---------------------------------------------------------------------------------------------
# "order": the paper's joint choice of senders and order
# ---------------------------------------------------------------------------------------------


class _HostModel:
    """The paper's cost model at host granularity (one NIC's bandwidth per host)."""

    def __init__(self, topology: Topology, jobs: list[_Job]) -> None:
        host_of = topology._host_of
        out_bw = [g * _GBIT for g in topology.nic_out_gbps]
        in_bw = [g * _GBIT for g in topology.nic_in_gbps]
        intra = topology.intra_gbps * _GBIT
        self.recv_hosts = [tuple(dict.fromkeys(host_of[r] for r in j.receivers)) for j in jobs]
        self.cands = [tuple(dict.fromkeys(host_of[r] for r in j.holders)) for j in jobs]
        self.dur: list[dict[int, float]] = []
        self.local: list[int | None] = []  # the host that serves the job without its NIC
        for j, rh, cands in zip(jobs, self.recv_hosts, self.cands):
            d: dict[int, float] = {}
            local = None
            for h in cands:
                others = [x for x in rh if x != h]
                if not others:
                    local = h
                    d[h] = j.nbytes / intra
                else:
                    d[h] = j.nbytes / min(out_bw[h], *(in_bw[x] for x in others))
            self.dur.append(d)
            self.local.append(local)

    def hosts(self, j: int, h: int) -> tuple[int, ...]:
        rh = self.recv_hosts[j]
        return rh if h in rh else (h, *rh)

    def makespan(self, order: list[tuple[int, int]], num_hosts: int) -> float:
        """List-schedule ``[(job, sender host), ...]`` in this order; return the makespan."""
        free = [0.0] * num_hosts
        end = 0.0
        for j, h in order:
            hs = self.hosts(j, h)
            s = max(free[x] for x in hs)
            e = s + self.dur[j][h]
            for x in hs:
                free[x] = e
            end = max(end, e)
        return end


def _greedy_rounds(
    model: _HostModel, net: list[int], num_hosts: int, rng: np.random.Generator, budget: int
) -> tuple[list[tuple[int, int]], int]:
    """One randomised trial: rounds of host-disjoint transfers. Returns (order, nodes spent)."""
    remaining = [net[i] for i in rng.permutation(len(net))]
    load = [0.0] * num_hosts
    order: list[tuple[int, int]] = []
    nodes = 0
    mean = (sum(min(model.dur[j].values()) for j in net) / len(net)) if net else 1.0
    mean = mean or 1.0
    while remaining:
        busy: set[int] = set()
        rest: list[int] = []
        for pos, j in enumerate(remaining):
            nodes += 1
            if nodes > budget:  # out of budget: the rest in one pass, least-loaded sender
                rest.extend(remaining[pos:])
                for jj in rest:
                    h = min(model.cands[jj], key=lambda x: (load[x], x))
                    load[h] += model.dur[jj][h]
                    order.append((jj, h))
                return order, nodes
            rh = model.recv_hosts[j]
            if any(x in busy for x in rh):
                rest.append(j)
                continue
            free = [h for h in model.cands[j] if h not in busy]
            if not free:
                rest.append(j)
                continue
            # favour light load: load scaled by a random factor in [1, 1.5)
            noise = rng.random(len(free))
            h = free[int(np.argmin([load[x] / mean * (1 + 0.5 * u) for x, u in zip(free, noise)]))]
            busy.update(model.hosts(j, h))
            load[h] += model.dur[j][h]
            order.append((j, h))
        remaining = rest
    return order, nodes


def _search(
    model: _HostModel, net: list[int], num_hosts: int, incumbent: float, budget: int
) -> list[tuple[int, int]] | None:
    """Depth-first branch and bound over (next transfer, sender); None if nothing better."""
    free = [0.0] * num_hosts
    must = [0.0] * num_hosts  # work every remaining job puts on its receiver hosts
    for j in net:
        for x in model.recv_hosts[j]:
            must[x] += min(model.dur[j].values())
    best: list = [incumbent * (1 - 1e-9), None]
    chosen: list[tuple[int, int]] = []
    nodes = 0
    lpt = sorted(net, key=lambda j: (-max(model.dur[j].values()), j))

    def dfs(todo: list[int], makespan: float) -> None:
        nonlocal nodes
        if nodes >= budget:
            return
        nodes += 1
        if not todo:
            if makespan < best[0]:
                best[0], best[1] = makespan, list(chosen)
            return
        bound = max(makespan, *(free[x] + must[x] for x in range(num_hosts)))
        if bound >= best[0]:
            return
        for k, j in enumerate(todo):
            mind = min(model.dur[j].values())
            rest = todo[:k] + todo[k + 1 :]
            for h in sorted(model.cands[j], key=lambda x: (free[x], x)):
                hs = model.hosts(j, h)
                start = max(free[x] for x in hs)
                end = start + model.dur[j][h]
                saved = [free[x] for x in hs]
                for x in hs:
                    free[x] = end
                for x in model.recv_hosts[j]:
                    must[x] -= mind
                chosen.append((j, h))
                dfs(rest, max(makespan, end))
                chosen.pop()
                for x in model.recv_hosts[j]:
                    must[x] += mind
                for x, v in zip(hs, saved):
                    free[x] = v
                if nodes >= budget:
                    return

    dfs(lpt, 0.0)
    return best[1]


def _pick_rank(holders: tuple[int, ...], host: int, host_of: dict[int, int], load: dict) -> int:
    on_host = [r for r in holders if host_of[r] == host]
    r = min(on_host, key=lambda x: (load.get(x, 0), on_host.index(x)))
    return r


def order_plan(
    task: ReshardTask,
    topology: Topology,
    strategy: str,
    *,
    seed: int = SEED,
    trials: int = ORDER_TRIALS,
    node_budget: int = ORDER_NODE_BUDGET,
    search_budget: int = SEARCH_NODE_BUDGET,
) -> Plan:
    """The paper's ``loadbalance_order``: senders and order chosen jointly (see module doc)."""
    copies, jobs, gathers, fallbacks = _skeleton(task, topology, strategy)
    host_of = topology._host_of
    n_hosts = topology.num_hosts
    model = _HostModel(topology, jobs)
    local = [j for j in range(len(jobs)) if model.local[j] is not None]
    net = [j for j in range(len(jobs)) if model.local[j] is None]
    best: list[tuple[int, int]] | None = None
    best_key = (math.inf, math.inf)
    spent = 0
    for trial in range(max(1, trials)):
        if trial and spent >= node_budget:
            break
        rng = np.random.default_rng([seed, trial])
        order, nodes = _greedy_rounds(model, net, n_hosts, rng, max(1, node_budget - spent))
        spent += nodes
        load = [0.0] * n_hosts
        for j, h in order:
            load[h] += model.dur[j][h]
        key = (model.makespan(order, n_hosts), max(load) - min(load))
        if key < best_key:
            best, best_key = order, key
    assert best is not None
    if 0 < len(net) <= SEARCH_MAX_JOBS:
        found = _search(model, net, n_hosts, best_key[0], search_budget)
        if found is not None:
            best = found
    # the final order: local jobs, then network jobs by their start in the host model
    free = [0.0] * n_hosts
    timed: list[tuple[float, int, int, int]] = []
    for pos, (j, h) in enumerate(best):
        hs = model.hosts(j, h)
        s = max(free[x] for x in hs)
        for x in hs:
            free[x] = s + model.dur[j][h]
        timed.append((s, pos, j, h))
    timed.sort()
    rank_load: dict[int, int] = {}
    ops: list[Op] = list(copies)
    sequence = [(j, model.local[j]) for j in local] + [(j, h) for _, _, j, h in timed]
    left = [len(g.group) for g in gathers]
    for j, h in sequence:
        job = jobs[j]
        r = _pick_rank(job.holders, h, host_of, rank_load)
        rank_load[r] = rank_load.get(r, 0) + job.nbytes
        ops.append(_job_op(job, r))
        if job.gather >= 0:
            left[job.gather] -= 1
            if not left[job.gather]:
                ops.append(gathers[job.gather])
    return Plan(task, tuple(ops), strategy, "order", topology, tuple(fallbacks))


# ---------------------------------------------------------------------------------------------
# "auto": ours
# ---------------------------------------------------------------------------------------------


class _Nets:
    """Per-rank NIC ids and per-NIC bandwidth (bytes/s); NIC load in seconds."""

    def __init__(self, topology: Topology) -> None:
        self.host_of = topology._host_of
        self.nic, host_of_nic = topology.global_nics()
        self.out_bw = [topology.nic_out_gbps[h] * _GBIT for h in host_of_nic]
        self.in_bw = [topology.nic_in_gbps[h] * _GBIT for h in host_of_nic]
        self.out_load = [0.0] * len(host_of_nic)
        self.in_load = [0.0] * len(host_of_nic)
        self.rank_load: dict[int, float] = {}
        self.lat = topology.latency_us * 1e-6
        self.intra = topology.intra_gbps * _GBIT


class _Item(NamedTuple):
    """An op with what list scheduling needs: its ranks, NIC resources and estimated duration."""

    op: Op
    ranks: tuple[int, ...]
    nics: tuple[int, ...]  # 2*nic for outbound, 2*nic+1 for inbound
    dur: float
    order: int


def _bcast_item(nets: _Nets, sender: int, dsts: list[int], box: Box, nbytes: int, order: int,
                charge: bool = True) -> _Item:
    """A broadcast (or a send) from ``sender``: pick a leader per host, charge NIC loads."""
    host_of, nic = nets.host_of, nets.nic
    src_host = host_of[sender]
    groups: dict[int, list[int]] = {src_host: []}
    for r in dsts:
        groups.setdefault(host_of[r], []).append(r)
    ordered: list[int] = list(groups.pop(src_host))
    chain_nics: list[int] = []
    rates: list[float] = []
    prev = sender
    fan = bool(ordered)
    for members in groups.values():
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
    op: Op = (
        Send(sender, ordered[0], box)
        if len(ordered) == 1
        else Broadcast(sender, tuple(ordered), box)
    )
    return _Item(op, (sender, *ordered), tuple(dict.fromkeys(chain_nics)), dur, order)


def _own_items(
    task: ReshardTask,
    topology: Topology,
    slices: list[SliceInfo],
    lbd,
    *,
    stripe: bool,
    chunk: bool,
    p2p: bool,
) -> tuple[list[_Item], bool]:
    """Senders and collectives for every slice (our method). Returns (items, used p2p)."""
    nets = _Nets(topology)
    host_of, nic = nets.host_of, nets.nic
    quota: dict[tuple[int, ...], dict[int, float]] = {
        g: {h: f * b for h, f in zip(g, fr)}
        for g, b, fr in zip(lbd.groups, lbd.group_bytes, lbd.fractions)
    }
    total_out = sum(lbd.group_bytes)
    n_src_nics = len({nic[r] for sl in slices for r in sl.holders}) or 1
    fair_share = total_out / n_src_nics
    min_bw = min(nets.out_bw + nets.in_bw)
    lb_s = max(lbd.inbound_s, lbd.outbound_s)
    chunk_bytes = max(64 * nets.lat * min_bw, lb_s * min_bw / 8, 1.0)
    items: list[_Item] = []
    used_p2p = False
    seq = 0
    for sl in sorted(slices, key=lambda s: (-s.nbytes, s.index)):
        seq = sl.index * 64
        for r in sl.local:
            items.append(_Item(Copy(r, sl.box), (r,), (), sl.nbytes / nets.intra, seq))
        if not sl.remote:
            continue
        holder_hosts = tuple(dict.fromkeys(host_of[r] for r in sl.holders))
        held = set(holder_hosts)
        foreign = [r for r in sl.remote if host_of[r] not in held]
        if not foreign:  # every receiver sits on a host that holds the slice: intra-host only
            by_host: dict[int, list[int]] = {}
            for r in sl.remote:
                by_host.setdefault(host_of[r], []).append(r)
            for h, group in by_host.items():
                snd = _least(sl.holders, h, nets)
                items.append(_bcast_item(nets, snd, group, sl.box, sl.nbytes, seq))
            continue
        q = quota.get(tuple(sorted(holder_hosts)), {})
        # senders: stripe over holder NICs, or one host by LP quota
        units: list[tuple[int, float]] = []  # (sender rank, weight)
        if stripe and sl.nbytes > fair_share / 4 and (len(holder_hosts) > 1 or len(
            {nic[r] for r in sl.holders}
        ) > 1):
            weights = {h: max(q.get(h, 0.0), 0.0) for h in holder_hosts}
            if sum(weights.values()) <= 0:
                weights = {h: 1.0 for h in holder_hosts}
            for h, w in weights.items():
                if w <= sum(weights.values()) / 16:
                    continue
                nics_h = list(dict.fromkeys(nic[r] for r in sl.holders if host_of[r] == h))
                for k in nics_h:
                    ranks_k = [r for r in sl.holders if nic[r] == k]
                    snd = min(ranks_k, key=lambda r: (nets.rank_load.get(r, 0.0), ranks_k.index(r)))
                    units.append((snd, w / len(nics_h)))
        if len(units) < 2:
            h = max(holder_hosts, key=lambda x: (q.get(x, 0.0), -_host_out(nets, x, topology), -x))
            units = [(_least(sl.holders, h, nets), 1.0)]
        parts: list[tuple[int, Box]] = []
        if len(units) > 1:
            boxes = _split_weighted(sl.box, [w for _, w in units])
            parts = [(s, b) for (s, _), b in zip(units, boxes) if b is not None]
        else:
            parts = [(units[0][0], sl.box)]
        itemsize = task.itemsize
        for snd, box in parts:
            nbytes = box_size(box) * itemsize
            h = host_of[snd]
            q[h] = q.get(h, 0.0) - nbytes
            dsts = [r for r in sl.remote if host_of[r] == h] + foreign
            others = [r for r in sl.remote if host_of[r] != h and r not in foreign]
            # point-to-point when cheaper: tiny slices to few receivers
            if p2p and len(dsts) > 1:
                bw = nets.out_bw[nic[snd]]
                bcast = nets.lat + nbytes / bw
                sends = nets.lat * len(dsts) + len(dsts) * nbytes / bw
                if sends < bcast:
                    used_p2p = True
                    for r in dsts:
                        items.append(_bcast_item(nets, snd, [r], box, nbytes, seq))
                        seq += 1
                    dsts = []
            pieces = [box]
            if chunk and dsts and nbytes > 2 * chunk_bytes:
                k = min(16, math.ceil(nbytes / chunk_bytes))
                pieces = list(split_box(box, k) or [box])
            for piece in pieces:
                if dsts:
                    pb = box_size(piece) * itemsize
                    items.append(_bcast_item(nets, snd, dsts, piece, pb, seq))
                    seq += 1
            if others:  # receivers on other holder hosts: from a holder on their own host
                by_host = {}
                for r in others:
                    by_host.setdefault(host_of[r], []).append(r)
                for hh, group in by_host.items():
                    items.append(
                        _bcast_item(nets, _least(sl.holders, hh, nets), group, box, nbytes, seq)
                    )
                    seq += 1
    return items, used_p2p


def _host_out(nets: _Nets, h: int, topology: Topology) -> float:
    first = sum(topology.nics_per_host[:h])
    return sum(nets.out_load[first : first + topology.nics_per_host[h]])


def _least(holders: tuple[int, ...], host: int, nets: _Nets) -> int:
    """The holder on ``host`` whose NIC and rank have sent the least."""
    on = [r for r in holders if nets.host_of[r] == host]
    return min(
        on, key=lambda r: (nets.out_load[nets.nic[r]], nets.rank_load.get(r, 0.0), on.index(r))
    )


def _list_schedule(items: list[_Item], priority: str, lat: float = 0.0) -> list[Op]:
    """Place items greedily (each at the time all its ranks and NICs are free) in priority
    order; the plan lists them by that start time.

    ``priority="slots"``: colour the items instead: largest first, each into the first round in
    which none of its ranks is busy (rounds are bit masks per rank), so every round keeps as many
    ranks busy at once as possible; the plan lists the rounds in turn.
    """
    if priority == "dispatch":
        return _dispatch(items, lat)
    if priority == "nondelay":
        return _dispatch_nd(items, lat)
    if priority == "nicslots":
        return _nic_slots(items)
    if priority == "slots":
        used: dict[int, int] = {}
        slot = [0] * len(items)
        for i in sorted(range(len(items)), key=lambda i: (-items[i].dur, items[i].order)):
            u = 0
            for r in items[i].ranks:
                u |= used.get(r, 0)
            k = (~u & (u + 1)).bit_length() - 1
            bit = 1 << k
            for r in items[i].ranks:
                used[r] = used.get(r, 0) | bit
            slot[i] = k
        return [
            items[i].op
            for i in sorted(
                range(len(items)), key=lambda i: (slot[i], -items[i].dur, items[i].order)
            )
        ]
    if priority == "lpt":
        keys = sorted(range(len(items)), key=lambda i: (-items[i].dur, items[i].order))
    else:  # "load": items on the most loaded NIC first
        load: dict[int, float] = {}
        for it in items:
            for k in it.nics:
                load[k] = load.get(k, 0.0) + it.dur
        keys = sorted(
            range(len(items)),
            key=lambda i: (-max((load[k] for k in items[i].nics), default=0.0), -items[i].dur,
                           items[i].order),
        )
    free_rank: dict[int, float] = {}
    free_nic: dict[int, float] = {}
    start = [0.0] * len(items)
    for i in keys:
        it = items[i]
        s = 0.0
        for r in it.ranks:
            v = free_rank.get(r, 0.0)
            if v > s:
                s = v
        for k in it.nics:
            v = free_nic.get(k, 0.0)
            if v > s:
                s = v
        e = s + it.dur
        for r in it.ranks:
            free_rank[r] = e
        for k in it.nics:
            free_nic[k] = e
        start[i] = s
    rank_of = {i: pos for pos, i in enumerate(keys)}
    return [items[i].op for i in sorted(range(len(items)), key=lambda i: (start[i], rank_of[i]))]


def _nic_slots(items: list[_Item]) -> list[Op]:
    """Rounds in which every rank *and every NIC direction* appears at most once.

    Items, largest first, go into the first round in which none of their ranks and none of
    their NIC resources is taken (bit masks per rank and per NIC direction); the plan lists the
    rounds in turn. Within a round no two transfers share a NIC, so each moves at its NIC's full
    rate (the open-shop view: sender NIC x receiver NIC is a bipartite multigraph, each round a
    matching of it).
    """
    used_rank: dict[int, int] = {}
    used_nic: dict[int, int] = {}
    slot = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-items[i].dur, items[i].order)):
        it = items[i]
        u = 0
        for r in it.ranks:
            u |= used_rank.get(r, 0)
        for k in it.nics:
            u |= used_nic.get(k, 0)
        bit = ~u & (u + 1)
        for r in it.ranks:
            used_rank[r] = used_rank.get(r, 0) | bit
        for k in it.nics:
            used_nic[k] = used_nic.get(k, 0) | bit
        slot[i] = bit.bit_length()
    return [
        items[i].op
        for i in sorted(range(len(items)), key=lambda i: (slot[i], -items[i].dur, items[i].order))
    ]


def _dispatch(items: list[_Item], lat: float) -> list[Op]:
    """Earliest-start dispatch: repeatedly start the item that can start first.

    Model: an item holds its ranks for its whole duration (latency + transfer) and its NIC
    directions only while it moves bytes (from ``latency`` after its start), so one rank's
    start-up overlaps another rank's transfer on the same NIC. Among items that can start at
    the same time, the one whose busiest resource (rank or NIC direction) has the most work in
    total goes first. The plan lists items by start time. A lazy heap keeps this
    O(n log n) (an item's earliest start only grows).
    """
    crit = _crit(items, lat)
    free_rank: dict[int, float] = {}
    free_nic: dict[int, float] = {}

    def earliest(it: _Item) -> float:
        s = 0.0
        for r in it.ranks:
            v = free_rank.get(r, 0.0)
            if v > s:
                s = v
        for k in it.nics:  # bytes move from s + lat on
            v = free_nic.get(k, 0.0) - lat
            if v > s:
                s = v
        return s

    heap = [(0.0, -crit[i], items[i].order, i) for i in range(len(items))]
    heapq.heapify(heap)
    out: list[Op] = []
    while heap:
        s0, c, o, i = heapq.heappop(heap)
        it = items[i]
        s = earliest(it)
        if s > s0 + 1e-15:
            heapq.heappush(heap, (s, c, o, i))
            continue
        e = s + it.dur
        for r in it.ranks:
            free_rank[r] = e
        for k in it.nics:
            free_nic[k] = e
        out.append(it.op)
    return out


def _dispatch_nd(
    items: list[_Item], lat: float, rng: np.random.Generator | None = None
) -> list[Op]:
    """Non-delay dispatch, as the runtime runs: an item starts as soon as all its ranks are
    free. Repeatedly take the item that can start first; among those, the one whose NICs are
    free soonest (transfers queue on a NIC in this estimate), then the one whose busiest
    resource has the most work (with ``rng``: that work scaled by a random factor in [1, 2), for
    seeded trials). Lazy heap: an item's key only grows."""
    crit = _crit(items, lat)
    if rng is not None:
        crit = [c * (1.0 + u) for c, u in zip(crit, rng.random(len(crit)).tolist())]
    free_rank: dict[int, float] = {}
    free_nic: dict[int, float] = {}

    def key(it: _Item) -> tuple[float, float]:
        s = 0.0
        for r in it.ranks:
            v = free_rank.get(r, 0.0)
            if v > s:
                s = v
        wait = 0.0
        for k in it.nics:
            v = free_nic.get(k, 0.0) - s - lat
            if v > wait:
                wait = v
        return s, wait

    heap = [(0.0, 0.0, -crit[i], items[i].order, i) for i in range(len(items))]
    heapq.heapify(heap)
    out: list[Op] = []
    while heap:
        s0, w0, c, o, i = heapq.heappop(heap)
        it = items[i]
        s, w = key(it)
        if s > s0 or w > w0:
            heapq.heappush(heap, (s, w, c, o, i))
            continue
        e = s + w + it.dur
        for r in it.ranks:
            free_rank[r] = e
        for k in it.nics:
            free_nic[k] = e
        out.append(it.op)
    return out


def _crit(items: list[_Item], lat: float) -> list[float]:
    """Per item: the total work of its busiest resource (rank, or NIC direction)."""
    load: dict[tuple[int, int], float] = {}
    for it in items:
        for r in it.ranks:
            load[(0, r)] = load.get((0, r), 0.0) + it.dur
        for k in it.nics:
            load[(1, k)] = load.get((1, k), 0.0) + it.dur - lat
    return [
        max(
            max((load[(0, r)] for r in it.ranks), default=0.0),
            max((load[(1, k)] for k in it.nics), default=0.0),
        )
        for it in items
    ]


_OWN_VARIANTS: tuple[tuple[bool, bool, str], ...] = (
    (True, False, "slots"),
    (True, True, "slots"),
    (False, False, "slots"),
    (True, False, "load"),
    (True, True, "load"),
    (False, False, "load"),
    (True, False, "lpt"),
    (True, True, "lpt"),
    (False, False, "lpt"),
    (True, False, "dispatch"),
    (True, True, "dispatch"),
    (False, False, "dispatch"),
    (True, False, "nondelay"),
    (True, True, "nondelay"),
    (False, False, "nondelay"),
    (True, False, "nicslots"),
    (True, True, "nicslots"),
    (False, False, "nicslots"),
)
"""(stripe, chunk, priority) of the plans of our own method that ``"auto"`` tries."""


def _ops_key(ops: tuple[Op, ...]) -> tuple:
    """A hashable form of an op list (slices are not hashable before Python 3.12)."""
    return tuple(
        (op.kind, op.ranks(), tuple((b.start, b.stop) for b in op.box)) for op in ops
    )


def _unshared_nics(topology: Topology) -> bool:
    """Whether every NIC serves one rank at most (then no two transfers ever share a NIC: a NIC
    is loaded only by operations of its one rank, which that rank runs one after another)."""
    return all(
        -(-len(ranks) // k) <= 1 for ranks, k in zip(topology.hosts, topology.nics_per_host)
    )


def _op_rate(op: Op, topology: Topology, nets: _Nets) -> float:
    """Bytes/s of ``op`` when it shares no NIC: the slowest NIC on its route, and ``intra_gbps``
    when it fans out inside a host (:func:`meshcast.simulate`'s rules for a lone transfer)."""
    host_of, nic = nets.host_of, nets.nic
    rates: list[float] = []
    fan = False
    if isinstance(op, Send):
        if host_of[op.src] == host_of[op.dst]:
            return nets.intra
        return min(nets.out_bw[nic[op.src]], nets.in_bw[nic[op.dst]])
    assert isinstance(op, Broadcast)
    prev = None
    for leader, members in broadcast_chain(op, host_of):
        if prev is not None:
            rates += [nets.out_bw[nic[prev]], nets.in_bw[nic[leader]]]
        fan = fan or bool(members)
        prev = leader
    if fan:
        rates.append(nets.intra)
    return min(rates) if rates else nets.intra


def _rounds_time(
    topology: Topology,
    copy_end: dict[int, float],
    flat: np.ndarray,
    counts: np.ndarray,
    nbytes: np.ndarray,
    rate: np.ndarray,
    slot: np.ndarray,
) -> float:
    """Exact :func:`meshcast.simulate` time of a plan made of per-rank copies followed by network
    operations listed in rounds (``slot`` non-decreasing; the operations of one round share no
    rank), on a topology where no NIC serves two ranks (:func:`_unshared_nics`). Operation ``i``
    has the ranks ``flat[sum(counts[:i]) : sum(counts[:i + 1])]``.

    Why exact: no transfer ever shares a NIC, so every operation takes ``latency`` plus its
    bytes at :func:`_op_rate`, and starts when its ranks are free (their previous operation in
    plan order has ended). Within a round the ranks are disjoint, so the round is evaluated at
    once with numpy; the float operations are the simulator's (``(start + lat) + bytes / rate``,
    copies ``start + bytes / intra`` one after another), so the result is the same number.
    """
    lat = topology.latency_us * 1e-6
    everyone, dense = np.unique(flat, return_inverse=True)
    free = np.array([copy_end.get(r, 0.0) for r in everyone.tolist()], dtype=np.float64)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    cuts = np.flatnonzero(np.diff(slot)) + 1
    bounds = np.concatenate(([0], cuts, [len(counts)])).tolist()
    dur = nbytes.astype(np.float64) / rate
    end_all = max(copy_end.values(), default=0.0)
    for a, b in itertools.pairwise(bounds):
        if a == b:
            continue
        lo, hi = offsets[a], offsets[b]
        who = dense[lo:hi]
        start = np.maximum.reduceat(free[who], offsets[a:b] - lo)
        end = (start + lat) + dur[a:b]
        free[who] = np.repeat(end, counts[a:b])
        end_all = max(end_all, float(end.max()))
    return end_all


def _rounds(senders: list[int], remotes: list[tuple[int, ...]]) -> np.ndarray:
    """A round per operation such that the operations of one round share no rank.

    Every sender sends once to every receiver (a complete bipartite graph, no rank on both
    sides): the Latin square ``(i + j) mod K`` (sender ``i``, receiver ``j`` in order of rank,
    ``K`` = the larger count), ``K`` rounds: as few as the busiest rank needs. Otherwise a
    greedy colouring: each operation into the first round in which none of its ranks is busy
    (bit masks per rank).
    """
    n = len(senders)
    graph = _complete_bipartite(senders, remotes)
    if graph is not None:
        s_ranks, r_ranks, i, j = graph
        return (i + j) % max(len(s_ranks), len(r_ranks))
    used: dict[int, int] = {}
    out = np.empty(n, dtype=np.int64)
    for pos, (sender, remote) in enumerate(zip(senders, remotes)):
        u = used.get(sender, 0)
        for r in remote:
            u |= used.get(r, 0)
        b = ~u & (u + 1)
        used[sender] = used.get(sender, 0) | b
        for r in remote:
            used[r] = used.get(r, 0) | b
        out[pos] = b.bit_length()
    return out


def _complete_bipartite(
    senders: list[int], remotes: list[tuple[int, ...]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """For sends in which every sender sends once to every receiver and no rank is on both sides:
    the sender ranks, the receiver ranks (sorted), and each send's index into both; else None."""
    n = len(senders)
    if not n or any(len(r) != 1 for r in remotes):
        return None
    s_ranks, i = np.unique(np.array(senders, dtype=np.int64), return_inverse=True)
    r_ranks, j = np.unique(np.array([r[0] for r in remotes], dtype=np.int64), return_inverse=True)
    if n != len(s_ranks) * len(r_ranks) or len(np.unique(i * len(r_ranks) + j)) != n:
        return None
    if np.intersect1d(s_ranks, r_ranks).size:
        return None
    return s_ranks, r_ranks, i, j


def _phased_sends(
    senders: list[int], remotes: list[tuple[int, ...]], boxes: list[Box], topology: Topology
) -> list[Op] | None:
    """Sends of a complete bipartite graph (every sender once to every receiver) ordered in two
    phases, for NICs that serve an even number of senders (receivers); None otherwise.

    Latin-square rounds over all ranks start every operation of a round together: all the ranks
    of a NIC pay their start-up at once and the NIC idles meanwhile. Here the ranks of each NIC
    are cut into two halves (in rank order) and the pairs into two epochs: first half to first
    half and second to second, then crosswise; each block (a sender half x a receiver half) is a
    Latin square of its own, and the blocks of an epoch share no rank. The first operation of
    each second-half sender in each epoch is cut into a one-row piece and the rest, so its block
    runs one start-up behind the other: one half's transfers fill the NIC while the other half
    pays its start-ups.
    """
    graph = _complete_bipartite(senders, remotes)
    if graph is None:
        return None
    s_ranks, r_ranks, i, j = graph
    nic, _ = topology.global_nics()

    def halves(ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Per rank: its half (0, 1) among its NIC's ranks, and its index within that half;
        None unless every NIC serves an even number of them."""
        nics = np.array([nic[r] for r in ranks.tolist()], dtype=np.int64)
        size = np.bincount(nics)[nics]
        if (size % 2).any():
            return None
        order = np.lexsort((ranks, nics))
        pos = np.empty(len(ranks), dtype=np.int64)
        starts = np.searchsorted(nics[order], nics[order], side="left")
        pos[order] = np.arange(len(ranks)) - starts
        half = (pos >= size // 2).astype(np.int64)
        index = np.empty(len(ranks), dtype=np.int64)
        for h in (0, 1):
            members = np.flatnonzero(half == h)
            index[members] = np.arange(len(members))
        return half, index

    sides = halves(s_ranks), halves(r_ranks)
    if sides[0] is None or sides[1] is None:
        return None  # halves of unequal size load the NICs unevenly (measured slower)
    (s_half, s_index), (r_half, r_index) = sides
    n_s = np.bincount(s_half, minlength=2)
    n_r = np.bincount(r_half, minlength=2)
    gs, gr = s_half[i], r_half[j]
    k = np.maximum(n_s[gs], n_r[gr])
    epoch = gs ^ gr
    rounds = (r_index[j] - s_index[i]) % k
    order = np.lexsort((np.arange(len(senders)), gs, rounds, epoch)).tolist()
    ops: list[Op] = []
    lead: set[tuple[int, int]] = set()  # (epoch, sender) whose first operation is placed
    for p in order:
        a, b, box = senders[p], remotes[p][0], boxes[p]
        key = (int(epoch[p]), a)
        if gs[p] and key not in lead:
            lead.add(key)
            d = max(range(len(box)), key=lambda x: box[x].stop - box[x].start)
            lo, hi = box[d].start, box[d].stop
            if hi - lo >= 2:
                ops.append(Send(a, b, (*box[:d], slice(lo, lo + 1), *box[d + 1 :])))
                box = (*box[:d], slice(lo + 1, hi), *box[d + 1 :])
        ops.append(Send(a, b, box))
    return ops


def _large_plan(task: ReshardTask, topology: Topology) -> tuple[Plan, float | None, Plan | None]:
    """``"auto"`` above :data:`AUTO_SIM_LIMIT` transfers: one broadcast per slice, senders in
    turn among the holders of each source tile (vectorised), ordered in rank-disjoint rounds.

    Returns the plan; its exact simulated time (:func:`_rounds_time`) when no NIC serves two
    ranks, else None; and where NICs are shared, the same sends in the order of
    :func:`_phased_sends` when that applies, else None."""
    dec = task.decomposition
    n = len(dec)
    src_t = dec.src_tile
    by_tile = np.argsort(src_t, kind="stable")
    first = np.searchsorted(src_t[by_tile], src_t[by_tile], side="left")
    pos = np.empty(n, dtype=np.int64)
    pos[by_tile] = np.arange(n) - first
    n_holders = np.array([len(h) for h in dec.holders_of_tile], dtype=np.int64)
    pick = pos % n_holders[src_t]
    sizes = dec.sizes()
    holders_of, receivers_of = dec.holders_of_tile, dec.receivers_of_tile
    # per (source tile, destination tile) pair: receivers holding the slice, and the others
    n_dst = max(len(receivers_of), 1)
    pairs, inverse = np.unique(src_t * n_dst + dec.dst_tile, return_inverse=True)
    local_of: list[tuple[int, ...]] = []
    remote_of: list[tuple[int, ...]] = []
    if set(task.src.mesh.devices).isdisjoint(task.dst.mesh.devices):  # nobody holds its own
        remote_of = [receivers_of[pr] for pr in (pairs % n_dst).tolist()]
        local_of = [()] * len(remote_of)
    else:
        for pr in pairs.tolist():
            held = set(holders_of[pr // n_dst])
            want = receivers_of[pr % n_dst]
            local_of.append(tuple(r for r in want if r in held))
            remote_of.append(tuple(r for r in want if r not in held))
    flat_holders = np.fromiter(itertools.chain.from_iterable(holders_of), dtype=np.int64)
    first_holder = np.concatenate(([0], np.cumsum(n_holders)[:-1]))
    sender_of = flat_holders[first_holder[src_t] + pick].tolist()
    boxes = dec.boxes()
    inv = inverse.ravel().tolist()
    copies: list[Op] = [
        Copy(r, boxes[i]) for i, q in enumerate(inv) if local_of[q] for r in local_of[q]
    ]
    keep = [i for i, q in enumerate(inv) if remote_of[q]]
    senders = [sender_of[i] for i in keep]
    remotes = [remote_of[inv[i]] for i in keep]
    ops: list[Op] = [
        Send(a, rem[0], boxes[i]) if len(rem) == 1 else Broadcast(a, rem, boxes[i])
        for i, a, rem in zip(keep, senders, remotes)
    ]
    slot = _rounds(senders, remotes)
    order_a = np.lexsort((np.arange(len(ops)), -sizes[keep] if keep else [], slot))
    order = order_a.tolist()
    out = Plan(task, (*copies, *(ops[j] for j in order)), "broadcast", "auto", topology)
    if not _unshared_nics(topology):
        phased = _phased_sends(senders, remotes, [boxes[i] for i in keep], topology)
        if phased is None:
            return out, None, None
        return out, None, Plan(task, (*copies, *phased), "broadcast", "auto", topology)
    nets = _Nets(topology)
    itemsize = task.itemsize
    copy_end: dict[int, float] = {}
    for c in copies:  # one rank each, zero latency, one after another
        assert isinstance(c, Copy)
        copy_end[c.rank] = copy_end.get(c.rank, 0.0) + box_size(c.box) * itemsize / nets.intra
    counts = 1 + np.fromiter((len(r) for r in remotes), dtype=np.int64, count=len(remotes))
    if len(ops) and int(counts.max()) == 2:  # sends only: vectorised
        snd = np.array(senders, dtype=np.int64)[order_a]
        rcv = np.array([r[0] for r in remotes], dtype=np.int64)[order_a]
        top = int(max(snd.max(), rcv.max())) + 1
        nic_of = np.zeros(top, dtype=np.int64)
        host_of = np.zeros(top, dtype=np.int64)
        for r in np.unique(np.concatenate((snd, rcv))).tolist():
            nic_of[r], host_of[r] = nets.nic[r], nets.host_of[r]
        out_bw, in_bw = np.array(nets.out_bw), np.array(nets.in_bw)
        rate = np.where(
            host_of[snd] == host_of[rcv],
            nets.intra,
            np.minimum(out_bw[nic_of[snd]], in_bw[nic_of[rcv]]),
        )
        flat = np.stack((snd, rcv), axis=1).ravel()
    else:
        rate = np.array([_op_rate(ops[j], topology, nets) for j in order])
        flat = np.fromiter(
            itertools.chain.from_iterable((senders[j], *remotes[j]) for j in order),
            dtype=np.int64,
        )
    counts = counts[order_a] if len(ops) else counts
    nbytes = sizes[np.asarray(keep, dtype=np.int64)[order_a]] * itemsize if keep else sizes[:0]
    slots = slot[order_a] if keep else np.zeros(0, dtype=np.int64)
    return out, _rounds_time(topology, copy_end, flat, counts, nbytes, rate, slots), None


def auto_plan(task: ReshardTask, topology: Topology, strategy: str | None) -> Plan:
    """Our method (see module doc). ``strategy=None``: choose per slice among the strategies;
    a given strategy restricts the candidates to it."""
    from .planner import STRATEGIES, plan

    dec = task.decomposition
    if strategy in (None, "broadcast") and len(dec) > AUTO_SIM_LIMIT:
        return _checked_large_plan(task, topology, strategy)
    slices = list(iter_slices(task))
    transfers = sum(len(s.remote) for s in slices)
    lbd = lower_bound_details(task, topology)
    lat = topology.latency_us * 1e-6
    candidates: list[tuple[str, str, tuple[Op, ...], tuple]] = []
    if strategy in (None, "broadcast"):
        variants = _OWN_VARIANTS if transfers <= AUTO_SIM_LIMIT else _OWN_VARIANTS[:1]
        built: dict[tuple[bool, bool], tuple[list[_Item], str]] = {}
        for stripe, chunk, priority in variants:
            if (stripe, chunk) not in built:
                items, used_p2p = _own_items(
                    task, topology, slices, lbd, stripe=stripe, chunk=chunk, p2p=strategy is None
                )
                built[(stripe, chunk)] = (items, "auto" if used_p2p else "broadcast")
            items, label = built[(stripe, chunk)]
            candidates.append(
                (label, "own", tuple(_list_schedule(items, priority, lat)), ())
            )
        if transfers <= AUTO_SIM_LIMIT:
            # seeded non-delay trials with perturbed priorities, within a budget of items
            for c, (items, label) in enumerate(built.values()):
                trials = min(AUTO_TRIALS, AUTO_TRIAL_BUDGET // (len(built) * max(len(items), 1)))
                for k in range(trials):
                    rng = np.random.default_rng([SEED, c, k])
                    candidates.append((label, "own", tuple(_dispatch_nd(items, lat, rng)), ()))
        # the vectorised plans of larger tasks (rank-disjoint rounds; phased on shared NICs)
        rounds_plan, _, phased_plan = _large_plan(task, topology)
        for large in (rounds_plan, phased_plan):
            if large is not None:
                candidates.append(("broadcast", "own", large.ops, ()))
    # the nine fixed combinations are always candidates: auto is never slower than any of them
    for s in STRATEGIES if strategy is None else (strategy,):
        for b in ("none", "size", "order"):
            p = plan(task, topology, strategy=s, balance=b)
            candidates.append((s, b, p.ops, p.fallbacks))
    times = _simulate_all(task, topology, candidates)
    best = min(range(len(candidates)), key=lambda i: (times[i], i))
    if times[best] > AUTO_SEARCH_GAP * _raw_bound(lbd):
        # local search from the fastest candidate without all-gathers (any order of copies,
        # sends and broadcasts moves the same data; an all-gather must follow its parts)
        free = [i for i in range(len(candidates))
                if not any(isinstance(op, AllGather) for op in candidates[i][2])]
        if free:
            start = min(free, key=lambda i: (times[i], i))
            label, _, ops, fallbacks = candidates[start]
            ops, t = _local_search(task, topology, ops, label)
            if t < times[best]:
                return Plan(task, ops, label, "auto", topology, fallbacks)
    label, _, ops, fallbacks = candidates[best]
    return Plan(task, ops, label, "auto", topology, fallbacks)


def _checked_large_plan(task: ReshardTask, topology: Topology, strategy: str | None) -> Plan:
    """Above :data:`AUTO_SIM_LIMIT` slices: the vectorised plan (or its phased order, if that
    simulates faster), kept if it meets the lower bound; otherwise the fastest of it and the
    fixed combinations (ties: the vectorised plan).

    A fixed plan is simulated only when its :func:`meshcast.time_floor` is below the
    best time so far and its operations differ from every plan simulated before; when every
    slice has at most one receiver to reach, the three strategies build the same operations
    (one ``Send`` per transfer, the same senders, the same order), so one strategy stands for all.
    """
    from ..estimate.simulate import simulate, time_floor
    from .planner import STRATEGIES, plan

    large, exact, phased = _large_plan(task, topology)
    best, best_t = large, exact if exact is not None else simulate(large, topology).time_s
    if phased is not None:
        t = simulate(phased, topology).time_s
        if t < best_t:
            best, best_t = phased, t
    if best_t <= _raw_bound(lower_bound_details(task, topology)) * (1 + CERTIFY_TOL):
        return best  # within CERTIFY_TOL of the bound: no plan is faster
    seen = {_ops_key(p.ops) for p in (large, phased) if p is not None}
    strategies = STRATEGIES if strategy is None else (strategy,)
    if len(strategies) > 1 and _one_remote_receiver(task):
        strategies = strategies[:1]
    for s in strategies:
        for b in ("none", "size", "order"):
            p = plan(task, topology, strategy=s, balance=b)
            key = _ops_key(p.ops)
            if key in seen or time_floor(p, topology) * (1 - FLOOR_TOL) >= best_t:
                continue
            seen.add(key)
            t = simulate(p, topology).time_s
            if t < best_t:
                best, best_t = Plan(task, p.ops, s, "auto", topology, p.fallbacks), t
    return best


def _one_remote_receiver(task: ReshardTask) -> bool:
    """Whether every unit slice has at most one receiver that does not hold it."""
    dec = task.decomposition
    holders = [set(h) for h in dec.holders_of_tile]
    n_dst = len(dec.receivers_of_tile)
    pairs = np.unique(dec.src_tile * n_dst + dec.dst_tile)
    return all(
        sum(r not in holders[s] for r in dec.receivers_of_tile[t]) <= 1
        for s, t in zip((pairs // n_dst).tolist(), (pairs % n_dst).tolist())
    )


def _local_search(
    task: ReshardTask, topology: Topology, ops: tuple[Op, ...], label: str
) -> tuple[tuple[Op, ...], float]:
    """Improve the order of ``ops`` (copies, sends, broadcasts) by moving one operation earlier
    at a time, keeping a move when the simulated time drops.

    A move takes an operation that ends late in the current simulation (the k-th latest with k
    drawn from an exponential of mean n/8) and puts it before a uniformly drawn earlier one.
    Seeded; at most :data:`AUTO_SEARCH_STEPS` moves and :data:`AUTO_SEARCH_BUDGET` simulated
    operations in all. Returns the best order and its simulated time.
    """
    from ..estimate.simulate import simulate

    n = len(ops)
    cur = list(ops)
    rep = simulate(Plan(task, ops, label, "auto", topology), topology)
    if n < 2:
        return ops, rep.time_s
    rng = np.random.default_rng([SEED, 7])
    for _ in range(min(AUTO_SEARCH_STEPS, AUTO_SEARCH_BUDGET // n)):
        late = np.argsort(rep.end_s, kind="stable")
        j = int(late[n - 1 - min(int(rng.exponential(n / 8)), n - 1)])
        if j == 0:
            continue
        i = int(rng.integers(0, j))
        cand = [*cur[:i], cur[j], *cur[i:j], *cur[j + 1 :]]
        new = simulate(Plan(task, tuple(cand), label, "auto", topology), topology)
        if new.time_s < rep.time_s:
            cur, rep = cand, new
    return tuple(cur), rep.time_s


def _raw_bound(lbd) -> float:
    """The lower bound without its downward float margin of a relative 1e-9."""
    return max(max(lbd.inbound_s, lbd.outbound_s) + lbd.latency_s, lbd.rank_s, lbd.host_s)


def _simulate_all(
    task: ReshardTask, topology: Topology, candidates: list[tuple[str, str, tuple[Op, ...], tuple]]
) -> list[float]:
    """Simulated time of every candidate (each distinct op list simulated once)."""
    from ..estimate.simulate import simulate

    seen: dict[tuple, float] = {}
    out: list[float] = []
    for label, _, ops, fallbacks in candidates:
        key = _ops_key(ops)
        t = seen.get(key)
        if t is None:
            t = simulate(Plan(task, ops, label, "auto", topology, fallbacks), topology).time_s
            seen[key] = t
        out.append(t)
    return out
