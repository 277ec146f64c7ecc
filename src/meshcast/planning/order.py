"""``balance="order"``: the paper's joint choice of senders and order (PAPER.md section 3).

Randomised greedy rounds of host-disjoint transfers, senders drawn favouring lightly loaded
hosts, best of :data:`~meshcast.planning.budgets.ORDER_TRIALS` seeded trials (fewer when every
job has one candidate sender host and a trial already reaches the busiest host's work: no later
trial could be kept); for small instances a depth-first branch-and-bound search improves on the
best trial. Cost model (:class:`~meshcast.planning.host_model.HostModel`): a transfer starts
when its sender host and all its receiver hosts are free and occupies them for size /
bandwidth. Pure: seeded, bounded by counts.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..core.boxes import box_size
from ..core.ops import AllGather, Broadcast, Copy, Op, Send
from ..core.plan import Plan
from ..core.task import ReshardTask, iter_slices
from ..core.topology import Topology
from ..estimate.simulate import copy_send_floor
from .budgets import (
    ORDER_NODE_BUDGET,
    ORDER_TRIALS,
    SEARCH_MAX_JOBS,
    SEARCH_NODE_BUDGET,
    SEED,
    seeded_rng,
)
from .fixed import allgather_groups
from .host_model import HostModel, Job, branch_and_bound

__all__ = ["order_floor", "order_plan"]

LOAD_NOISE = 0.5
"""The greedy rounds draw a sender host by its load times a random factor in [1, 1.5): enough
randomness that the seeded trials differ, while light hosts stay favoured. Set once; not
derived."""


def _skeleton(task: ReshardTask, topology: Topology, strategy: str):
    """Copies, network jobs (sender still open), all-gathers fed by jobs, fallbacks."""
    host_of = topology.hosts_by_rank
    copies: list[Op] = []
    jobs: list[Job] = []
    gathers: list[AllGather] = []
    fallbacks: list[tuple[int, str]] = []
    itemsize = task.itemsize
    for sl in iter_slices(task):
        if sl.local:
            copies.extend(Copy(r, sl.box) for r in sl.local)
        remote = sl.remote
        if not remote:
            continue
        if strategy == "broadcast" or (strategy == "send_recv" and len(remote) == 1):
            jobs.append(Job(sl.box, sl.nbytes, sl.holders, remote, -1))
        elif strategy == "send_recv":
            jobs.extend(Job(sl.box, sl.nbytes, sl.holders, (r,), -1) for r in remote)
        else:
            for group, parts in allgather_groups(sl.index, sl.box, sl.remote, host_of, fallbacks):
                if parts is None:
                    jobs.extend(Job(sl.box, sl.nbytes, sl.holders, (r,), -1) for r in group)
                    continue
                g = len(gathers)
                gathers.append(AllGather(tuple(group), sl.box, parts))
                jobs.extend(
                    Job(p, box_size(p) * itemsize, sl.holders, (r,), g)
                    for r, p in zip(group, parts)
                )
    return copies, jobs, gathers, fallbacks


def _job_op(job: Job, sender: int) -> Op:
    if len(job.receivers) == 1:
        return Send(sender, job.receivers[0], job.box)
    return Broadcast(sender, job.receivers, job.box)


def _mean_duration(model: HostModel, net: list[int]) -> float:
    """The mean of the jobs' shortest durations (1.0 for none or zero): the load unit of the
    greedy rounds."""
    mean = (sum(min(model.dur[j].values()) for j in net) / len(net)) if net else 1.0
    return mean or 1.0


def _greedy_rounds(
    model: HostModel, net: list[int], num_hosts: int, rng: np.random.Generator, budget: int,
    mean: float,
) -> tuple[list[tuple[int, int]], int]:
    """One randomised trial: rounds of host-disjoint transfers (``mean``: :func:`_mean_duration`).
    Returns (order, nodes spent). Busy hosts are a bit mask; the noise is drawn in one block
    (the same numbers as one draw per free sender: doubles come one after another)."""
    remaining = [net[i] for i in rng.permutation(len(net)).tolist()]
    # a job draws once per free candidate when it is placed: at most this many draws in all
    buf = rng.random(sum(len(model.cands[j]) for j in net)).tolist()
    pos = 0
    load = [0.0] * num_hosts
    order: list[tuple[int, int]] = []
    nodes = 0
    rmask, cands, dur, cmask = model.rmask, model.cands, model.dur, model.cmask
    while remaining:
        # the hosts a waiting job must reach, and those one may come from: once all of either
        # are busy, the round is full
        receiving = sending = busy = 0
        for j in remaining:
            receiving |= rmask[j]
            sending |= cmask[j]
        rest: list[int] = []
        for at, j in enumerate(remaining):
            nodes += 1
            if nodes > budget:  # out of budget: the rest in one pass, least-loaded sender
                rest.extend(remaining[at:])
                _least_loaded_pass(model, rest, load, order)
                return order, nodes
            if busy & rmask[j]:
                rest.append(j)
                continue
            cj = cands[j]
            if len(cj) == 1:
                if busy & cmask[j]:
                    rest.append(j)
                    continue
                h = cj[0]
                pos += 1
            else:
                free = [h for h in cj if not busy >> h & 1]
                if not free:
                    rest.append(j)
                    continue
                k = len(free)
                h = free[0] if k == 1 else _lightest(free, load, mean, buf[pos : pos + k])
                pos += k
            busy |= rmask[j] | (1 << h)
            load[h] += dur[j][h]
            order.append((j, h))
            if busy & receiving == receiving or busy & sending == sending:
                # the round is full: every later job waits, each a node as if visited
                rest.extend(remaining[at + 1 :])
                nodes += len(remaining) - at - 1
                if nodes > budget:  # as if out of budget at the first job past it
                    _least_loaded_pass(model, rest, load, order)
                    return order, budget + 1
                break
        remaining = rest
    return order, nodes


def _lightest(free: list[int], load: list[float], mean: float, draws: list[float]) -> int:
    """The host of ``free`` whose load (in units of ``mean``) scaled by a random factor in
    [1, 1 + LOAD_NOISE) is least (``draws``: one uniform draw per host): light load favoured."""
    scaled = [load[x] / mean * (1 + LOAD_NOISE * v) for x, v in zip(free, draws)]
    return free[min(range(len(free)), key=scaled.__getitem__)]


def _least_loaded_pass(
    model: HostModel, jobs: list[int], load: list[float], order: list[tuple[int, int]]
) -> None:
    """Append ``jobs`` to ``order``, each from its least loaded candidate host (``load`` kept up
    to date): the end of a trial out of budget."""
    cands, dur = model.cands, model.dur
    for j in jobs:
        cj = cands[j]
        h = cj[0] if len(cj) == 1 else min(cj, key=lambda x: (load[x], x))
        load[h] += dur[j][h]
        order.append((j, h))


def _least_loaded_holder_on_host(
    holders: tuple[int, ...], host: int, host_of: dict[int, int], load: dict
) -> int:
    """The holder on ``host`` that has sent the fewest bytes so far (first listed on ties)."""
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
    memo: list[tuple[tuple, tuple[Op, ...]]] | None = None,
) -> Plan:
    """The paper's ``loadbalance_order``: senders and order chosen jointly (module doc).

    ``seed``, ``trials``, ``node_budget`` and ``search_budget`` default to
    :data:`~meshcast.planning.budgets.SEED`, :data:`~meshcast.planning.budgets.ORDER_TRIALS`,
    :data:`~meshcast.planning.budgets.ORDER_NODE_BUDGET` and
    :data:`~meshcast.planning.budgets.SEARCH_NODE_BUDGET`. ``memo`` (a list kept by the caller
    for one task and topology, with the same budgets): the operations are those of an earlier
    strategy whose copies, network jobs and all-gathers were the same (e.g. ``send_recv`` and
    ``broadcast`` where every slice has one receiver to reach), without planning again."""
    copies, jobs, gathers, fallbacks = _skeleton(task, topology, strategy)
    key = (copies, jobs, gathers)
    for seen, ops in memo or ():
        if seen == key:
            return Plan(task, ops, strategy, "order", topology, tuple(fallbacks))
    sequence = _sequence(topology, jobs, seed, trials, node_budget, search_budget)
    ops = tuple(_ops_in_order(jobs, gathers, sequence, copies))
    if memo is not None:
        memo.append((key, ops))
    return Plan(task, ops, strategy, "order", topology, tuple(fallbacks))


def order_floor(task: ReshardTask, topology: Topology, strategy: str) -> float | None:
    """:func:`meshcast.time_floor` of ``order_plan(task, topology, strategy)`` (default budgets)
    computed from its senders, receivers and bytes without building its operations (the same
    number: :func:`~meshcast.estimate.simulate.copy_send_floor`), where every network job has
    one receiver and none feeds an all-gather; None otherwise."""
    copies, jobs, gathers, _ = _skeleton(task, topology, strategy)
    if gathers or any(len(job.receivers) != 1 for job in jobs):
        return None
    sequence = _sequence(topology, jobs, SEED, ORDER_TRIALS, ORDER_NODE_BUDGET,
                         SEARCH_NODE_BUDGET)
    itemsize = task.itemsize
    srcs = [-1] * len(copies) + [r for _, r in sequence]
    dsts = [c.rank for c in copies] + [jobs[j].receivers[0] for j, _ in sequence]
    nbytes = [box_size(c.box) * itemsize for c in copies] + [jobs[j].nbytes for j, _ in sequence]
    return copy_send_floor(srcs, dsts, nbytes, topology)


def _sequence(topology: Topology, jobs: list[Job], seed: int, trials: int, node_budget: int,
              search_budget: int) -> list[tuple[int, int]]:
    """The jobs in the plan's order with their senders: ``(job, sender rank)``, the best of the
    seeded trials (improved by the branch-and-bound search on small instances)."""
    model = HostModel(topology, jobs)
    net = [j for j in range(len(jobs)) if model.local[j] is None]
    n_hosts = topology.num_hosts
    best, makespan, starts = _best_of_trials(model, net, n_hosts, seed, trials, node_budget)
    if 0 < len(net) <= SEARCH_MAX_JOBS:
        found = branch_and_bound(model, net, n_hosts, makespan, search_budget)
        if found is not None:
            best, (starts, _) = found, model.schedule(found, n_hosts)
    return _senders_in_order(model, jobs, best, starts)


def _best_of_trials(
    model: HostModel, net: list[int], n_hosts: int, seed: int, trials: int, node_budget: int
) -> tuple[list[tuple[int, int]], float, list[float]]:
    """The best of the seeded greedy-round trials (by makespan, then host-load spread) within
    ``node_budget`` job examinations over all trials, its makespan and its jobs' starts in the
    host model."""
    best: list[tuple[int, int]] | None = None
    best_starts: list[float] = []
    best_key = (math.inf, math.inf)
    spent = 0
    floor = _fixed_host_work(model, net, n_hosts)
    mean = _mean_duration(model, net)
    for trial in range(max(1, trials)):
        if trial and (spent >= node_budget or best_key[0] <= floor):
            break  # out of budget, or no later trial can have a smaller key
        rng = seeded_rng(seed, trial)
        order, nodes = _greedy_rounds(model, net, n_hosts, rng, max(1, node_budget - spent), mean)
        spent += nodes
        load = [0.0] * n_hosts
        for j, h in order:
            load[h] += model.dur[j][h]
        starts, makespan = model.schedule(order, n_hosts)
        key = (makespan, max(load) - min(load))
        if key < best_key:
            best, best_key, best_starts = order, key, starts
    assert best is not None
    return best, best_key[0], best_starts


def _fixed_host_work(model: HostModel, net: list[int], n_hosts: int) -> float:
    """When every job has one candidate sender host, every trial gives the hosts the same work
    (so the same load spread) and none has a makespan below the busiest host's work: that work.
    Else minus infinity (the trials differ in their senders: no trial ends the search)."""
    if any(len(model.cands[j]) != 1 for j in net):
        return -math.inf
    work = [0.0] * n_hosts
    for j in net:
        h = model.cands[j][0]
        for x in model.span[j][h]:
            work[x] += model.dur[j][h]
    return max(work, default=0.0)


def _senders_in_order(
    model: HostModel, jobs: list[Job], best: list[tuple[int, int]], starts: list[float]
) -> list[tuple[int, int]]:
    """The final order: local jobs, then the network jobs of ``best`` by their ``starts`` in the
    host model (ties in the order of ``best``); each with its sender, the least loaded holder on
    its sender host: ``(job, sender rank)``."""
    timed = [best[k] for k in sorted(range(len(best)), key=starts.__getitem__)]  # stable
    local = [(j, model.local[j]) for j in range(len(jobs)) if model.local[j] is not None]
    if all(len(job.holders) == 1 for job in jobs):  # one sender each: no choice to make
        return [(j, jobs[j].holders[0]) for j, _ in itertools.chain(local, timed)]
    host_of = model.host_of
    rank_load: dict[int, int] = {}
    out: list[tuple[int, int]] = []
    for j, h in itertools.chain(local, timed):
        job = jobs[j]
        r = _least_loaded_holder_on_host(job.holders, h, host_of, rank_load)
        rank_load[r] = rank_load.get(r, 0) + job.nbytes
        out.append((j, r))
    return out


def _ops_in_order(
    jobs: list[Job], gathers: list[AllGather], sequence: list[tuple[int, int]],
    copies: list[Op],
) -> list[Op]:
    """The operations: copies, then the jobs of ``sequence`` from their senders, each
    all-gather right after the last part it is fed by."""
    ops: list[Op] = list(copies)
    left = [len(g.group) for g in gathers]
    for j, r in sequence:
        job = jobs[j]
        ops.append(_job_op(job, r))
        if job.gather >= 0:
            left[job.gather] -= 1
            if not left[job.gather]:
                ops.append(gathers[job.gather])
    return ops
