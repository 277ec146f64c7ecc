"""The cost model of ``balance="order"`` (:mod:`meshcast.planning.order`) and its
branch-and-bound search: a transfer starts when its sender host and all its receiver hosts are
free and occupies them for size / bandwidth; a list of (job, sender host) is list-scheduled in
that order. Pure.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

from ..core.boxes import Box
from ..core.topology import Topology
from ..core.units import GBIT

__all__ = ["BOUND_SLACK", "IMPROVEMENT", "HostModel", "Job", "branch_and_bound"]

BOUND_SLACK = 1e-12
"""The branch and bound's spread bound (a sum of many durations) is scaled down by this relative
margin, so float rounding can never prune a better order."""
IMPROVEMENT = 1e-9
"""The search keeps an order only if it is faster than the best trial by this relative margin
(a float tie is no improvement)."""


class Job(NamedTuple):
    """A network transfer whose sender is still open: the holders it may come from."""

    box: Box
    nbytes: int
    holders: tuple[int, ...]
    receivers: tuple[int, ...]
    gather: int  # index of the AllGather this part feeds, or -1


class HostModel:
    """The paper's cost model at host granularity (one NIC's bandwidth per host), per job: its
    receiver hosts, candidate sender hosts (``cands``), duration per sender host, the host that
    serves it without its NIC (``local``), bit masks of its receiver and candidate hosts and,
    per sender host, the hosts it occupies (``span``); ``host_of``: the topology's host of each
    rank."""

    def __init__(self, topology: Topology, jobs: list[Job]) -> None:
        self.host_of = host_of = topology.hosts_by_rank
        out_bw = [g * GBIT for g in topology.nic_out_gbps]
        in_bw = [g * GBIT for g in topology.nic_in_gbps]
        intra = topology.intra_gbps * GBIT
        hosts: dict[tuple[int, ...], tuple[int, ...]] = {}  # ranks -> their hosts, in order
        rows: dict[tuple, tuple] = {}  # jobs with the same hosts and bytes share their row
        per_job: list[tuple] = []
        for _, nbytes, holders, receivers, _ in jobs:
            rh = hosts.get(receivers)
            if rh is None:
                rh = hosts[receivers] = tuple(dict.fromkeys(host_of[r] for r in receivers))
            cands = hosts.get(holders)
            if cands is None:
                cands = hosts[holders] = tuple(dict.fromkeys(host_of[r] for r in holders))
            key = (rh, cands, nbytes)
            row = rows.get(key)
            if row is None:
                row = rows[key] = _row(rh, cands, nbytes, out_bw, in_bw, intra)
            per_job.append(row)
        columns = [list(c) for c in zip(*per_job)] if per_job else [[] for _ in range(7)]
        self.recv_hosts: list[tuple[int, ...]] = columns[0]
        self.cands: list[tuple[int, ...]] = columns[1]
        self.dur: list[dict[int, float]] = columns[2]  # read only: jobs may share one
        self.local: list[int | None] = columns[3]  # the host that serves it without its NIC
        self.rmask: list[int] = columns[4]
        self.cmask: list[int] = columns[5]
        self.span: list[dict[int, tuple[int, ...]]] = columns[6]

    def schedule(self, order: list[tuple[int, int]], num_hosts: int) -> tuple[list[float], float]:
        """List-schedule ``[(job, sender host), ...]`` in this order; return each job's start
        (in the order given) and the makespan."""
        free = [0.0] * num_hosts
        end = 0.0
        span, dur = self.span, self.dur
        starts: list[float] = []
        for j, h in order:
            hs = span[j][h]
            s = 0.0  # the latest free time of its hosts (all are at least 0)
            for x in hs:
                if free[x] > s:
                    s = free[x]
            e = s + dur[j][h]
            for x in hs:
                free[x] = e
            if e > end:
                end = e
            starts.append(s)
        return starts, end


def _row(rh: tuple[int, ...], cands: tuple[int, ...], nbytes: int, out_bw: list[float],
         in_bw: list[float], intra: float) -> tuple:
    """:class:`HostModel`'s columns for one job of ``nbytes`` from hosts ``cands`` to ``rh``."""
    d: dict[int, float] = {}
    local = None
    for h in cands:
        others = [x for x in rh if x != h]
        if not others:
            local = h
            d[h] = nbytes / intra
        else:
            d[h] = nbytes / min(out_bw[h], *(in_bw[x] for x in others))
    span = {h: rh if h in rh else (h, *rh) for h in cands}
    return (rh, cands, d, local, sum(1 << x for x in rh), sum(1 << x for x in cands), span)


def branch_and_bound(
    model: HostModel, net: list[int], num_hosts: int, incumbent: float, budget: int
) -> list[tuple[int, int]] | None:
    """Depth-first branch and bound over (next transfer, sender) of the jobs ``net`` (not
    empty); the order found if faster than ``incumbent`` by more than :data:`IMPROVEMENT`
    within ``budget`` nodes, else None.

    A node's bound is the largest of: its makespan; over hosts, free time + the work every
    remaining job must put on it (on its receiver hosts; on its sender host too when it has one
    candidate); over the candidate sender hosts together, their mean free time + the remaining
    jobs' shortest work spread over them (every job occupies one of them); with more jobs than
    those hosts, their least free time + the ``ceil(jobs / hosts)`` shortest jobs (one of them
    takes that many)."""
    search = _Search(model, net, num_hosts, incumbent, budget)
    if budget > 0:
        search.nodes = 1  # the root
        lpt = sorted(net, key=lambda j: (-max(model.dur[j].values()), j))
        left = sum(search.shortest[j] for j in net)
        if search.bound(0.0, lpt, left) < search.best:
            search.expand(lpt, 0.0, left)
    return search.found


class _Search:
    """The state of :func:`branch_and_bound`: hosts' free times, the work that must still
    enter each, the best makespan and order found, the order being built, the nodes spent."""

    def __init__(self, model: HostModel, net: list[int], num_hosts: int, incumbent: float,
                 budget: int) -> None:
        self.model, self.budget = model, budget
        self.free = [0.0] * num_hosts
        self.must = must = [0.0] * num_hosts  # work the remaining jobs must put on each host
        self.shortest = {j: min(model.dur[j].values()) for j in net}
        self.on = {j: model.recv_hosts[j] if len(model.cands[j]) > 1
                   else tuple(dict.fromkeys((*model.recv_hosts[j], *model.cands[j])))
                   for j in net}
        for j in net:
            for x in self.on[j]:
                must[x] += self.shortest[j]
        self.senders = sorted({h for j in net for h in model.cands[j]})
        self.spread = (1 - BOUND_SLACK) / len(self.senders)
        self.best = incumbent * (1 - IMPROVEMENT)
        self.found: list[tuple[int, int]] | None = None
        self.chosen: list[tuple[int, int]] = []
        self.nodes = 0

    def bound(self, makespan: float, todo: list[int], left: float) -> float:
        """No order of the jobs ``todo`` (shortest work ``left``) after this node ends sooner."""
        free, senders = self.free, self.senders
        b = max(makespan, max(map(operator.add, free, self.must)),
                (sum([free[x] for x in senders]) + left) * self.spread)
        if len(todo) > len(senders):  # some sender takes at least k of them, after its free time
            k = -(-len(todo) // len(senders))
            least = sum(sorted([self.shortest[j] for j in todo])[:k])
            b = max(b, (min([free[x] for x in senders]) + least) * (1 - BOUND_SLACK))
        return b

    def expand(self, todo: list[int], makespan: float, left: float) -> None:
        """Visit the children of a node that was counted and not pruned (``todo`` not empty,
        ``left`` its jobs' shortest work): each (next job, sender) in turn, a node while the
        budget allows, pruned by the bound before it recurses."""
        free, must, on, chosen = self.free, self.must, self.on, self.chosen
        cands, dur, span = self.model.cands, self.model.dur, self.model.span
        for k, j in enumerate(todo):
            mind = self.shortest[j]
            rest = todo[:k] + todo[k + 1 :]
            cj = cands[j]
            for h in cj if len(cj) == 1 else sorted(cj, key=lambda x: (free[x], x)):
                hs = span[j][h]
                start = 0.0  # the latest free time of its hosts (all are at least 0)
                for x in hs:
                    if free[x] > start:
                        start = free[x]
                end = start + dur[j][h]
                saved = [free[x] for x in hs]
                for x in hs:
                    free[x] = end
                for x in on[j]:
                    must[x] -= mind
                chosen.append((j, h))
                if self.nodes < self.budget:
                    self.nodes += 1
                    m = end if end > makespan else makespan
                    if not rest:
                        if m < self.best:
                            self.best, self.found = m, list(chosen)
                    elif self.bound(m, rest, left - mind) < self.best:
                        self.expand(rest, m, left - mind)
                chosen.pop()
                for x in on[j]:
                    must[x] += mind
                for x, v in zip(hs, saved):
                    free[x] = v
                if self.nodes >= self.budget:
                    return
