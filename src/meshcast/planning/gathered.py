"""Gathered tiles: the receivers of one host that need the same destination tile take a part of
it each, then re-join it in one all-gather, for any plan.

A destination tile made of several unit slices, needed by ``m`` ranks of one host, costs each of
them one operation per slice when every slice is broadcast to all ``m`` (each broadcast holds
all of them): ``k`` slices, ``k`` start-ups on every one of those ranks, the host's NIC idle in
each. Cut the tile into ``m`` parts instead (a grid of whole slices where their boundaries
allow), send each receiver its part (one send per slice the part meets, from a holder), then
one ``AllGather`` over the host's fast links: each rank pays about ``k / m + 1`` start-ups, and
the parts cross the NIC (or the receivers' own NICs) side by side. The ``"allgather"``
strategy does this per slice, which pays the re-join per slice; :func:`gathered` does it per
tile, on the operations of any plan without all-gathers, as candidates of ``"auto"``, kept only
where they simulate faster. Where ``k < m`` parts would cut slices into pieces, the cells of a
grid of whole slices may instead be replicated: the ranks form sets, each set a rank per cell
and its own all-gather, and a cell goes to one rank of every set in one broadcast.
``docs/scheduling.md`` (``auto``, step 8) has the measurements; the lower bound allows
all-gathers of several slices (its section there).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

from ..core.boxes import Box, box_inside, box_intersection, box_size, split_box
from ..core.ops import AllGather, Broadcast, Op, Send
from ..core.task import ReshardTask, iter_slices
from ..core.topology import Topology

__all__ = ["Group", "gathered", "tile_groups"]


class Group(NamedTuple):
    """A destination tile's box, the ranks of one host that need all of it from elsewhere, and
    the unit slices that make it up (boxes and holders)."""

    box: Box
    receivers: tuple[int, ...]
    slices: tuple[tuple[Box, tuple[int, ...]], ...]


def tile_groups(task: ReshardTask, topology: Topology) -> list[Group]:
    """The (destination tile, host) pairs worth gathering: two or more ranks of the host need
    the tile, none of them holds any of it (each slice reaches all of them from elsewhere), it is
    one box (not the several boxes of a strided or fused layout's tile), and it has two or more
    unit slices or one with two or more holders (else its parts would leave one sender one after
    another); in tile order, then host order."""
    dec = task.decomposition
    host_of = topology.hosts_by_rank
    by_tile: dict[int, list[int]] = {}
    for i, t in enumerate(dec.dst_tile.tolist()):
        by_tile.setdefault(t, []).append(i)
    slices = list(iter_slices(task))
    groups: list[Group] = []
    for t, members in sorted(by_tile.items()):
        by_host: dict[int, list[int]] = {}
        for r in dec.receivers_of_tile[t]:
            by_host.setdefault(host_of[r], []).append(r)
        for _, ranks in sorted(by_host.items()):
            if len(ranks) < 2 or any(not set(ranks) <= set(slices[i].remote) for i in members):
                continue
            if len(members) == 1 and len(slices[members[0]].holders) == 1:
                continue  # its parts would leave one sender one after another
            boxes = [slices[i].box for i in members]
            box = tuple(slice(min(b[d].start for b in boxes), max(b[d].stop for b in boxes))
                        for d in range(len(boxes[0])))
            if box_size(box) != sum(map(box_size, boxes)):
                continue  # a tile of several boxes (a strided or fused layout): not one box
            groups.append(Group(box, tuple(ranks),
                                tuple((slices[i].box, slices[i].holders) for i in members)))
    return groups


def gathered(ops: Sequence[Op], groups: list[Group], *, replicate: bool = False
             ) -> tuple[Op, ...] | None:
    """``ops`` (no ``AllGather`` among them) with every group of ``groups`` (:func:`tile_groups`)
    that can be cut into a part per receiver (:func:`_parts`) gathered: where an operation brings
    a box of the group's tile to some of its receivers, each of them gets, in its place, only the
    piece of that box that falls in its own part (the operation keeps its other receivers): one
    ``Send``, or one ``Broadcast`` to the receivers whose parts hold the same piece; the distinct
    pieces of one operation each from the holder of its slice that sends the fewest operations
    so far (its sender first among equals, then the others in turn: parts of one slice leave over
    several NICs); each group's ``AllGather`` follows its last piece. With ``replicate``, a
    group whose tile has a grid of whole slices of ``c`` cells, ``c`` a divisor of its ``m``
    receivers below ``m``, is gathered by ``m / c`` sets of ``c`` receivers, each a cell per
    receiver and its own all-gather (a cell then goes to ``m / c`` receivers in one broadcast);
    a group without such a grid is left as it is. The order of the plan stays. None where no
    group is gathered."""
    if any(isinstance(op, AllGather) for op in ops):
        return None
    part_of: dict[int, list[tuple[Box, Box, int]]] = {}  # receiver -> (tile, its part, gather)
    used: list[tuple[Group, AllGather]] = []
    for g in groups:
        for ranks, parts in _sets(g, replicate):
            for r, part in zip(ranks, parts):
                part_of.setdefault(r, []).append((g.box, part, len(used)))
            used.append((g, AllGather(ranks, g.box, parts)))
    if not used:
        return None
    out: list[Op] = []
    last = [0] * len(used)  # per all-gather: how many operations precede it
    sent: dict[int, int] = {}  # rank -> operations it sends so far
    for op in ops:
        if not isinstance(op, (Send, Broadcast)):
            out.append(op)
            continue
        for piece, fed in _rewritten(op, part_of, used, sent):
            out.append(piece)
            for k in fed:
                last[k] = len(out)
    after: dict[int, list[AllGather]] = {}
    for (_, gather), at in zip(used, last):
        after.setdefault(at, []).append(gather)
    return tuple(x for i in range(len(out) + 1)
                 for x in (*after.get(i, ()), *((out[i],) if i < len(out) else ())))


def _sets(g: Group, replicate: bool) -> list[tuple[tuple[int, ...], tuple[Box, ...]]]:
    """The sets of receivers that gather ``g`` and their parts (:func:`gathered`): one set of
    all its receivers with :func:`_parts`, or with ``replicate`` the sets of :func:`_cells`;
    none where there are no such parts."""
    if not replicate:
        parts = _parts(g)
        return [] if parts is None else [(g.receivers, parts)]
    cells = _cells(g)
    if cells is None:
        return []
    c = len(cells)
    return [(g.receivers[j:j + c], cells) for j in range(0, len(g.receivers), c)]


def _rewritten(op: Send | Broadcast, part_of: dict[int, list[tuple[Box, Box, int]]],
               used: list[tuple[Group, AllGather]], sent: dict[int, int]
               ) -> list[tuple[Op, list[int]]]:
    """``op`` as :func:`gathered` rewrites it, each operation with the all-gathers it feeds:
    ``op`` itself where none of its receivers gathers its box, else ``op`` without them (if any
    are left) and their pieces, each from the least busy holder by ``sent`` (module doc)."""
    dsts = (op.dst,) if isinstance(op, Send) else op.dsts
    keep: list[int] = []
    same: dict[tuple, tuple[Box, list[tuple[int, int]]]] = {}  # one piece, its owners
    for r in dsts:
        mine = next(((part, k) for tile, part, k in part_of.get(r, ())
                     if box_inside(op.box, tile)), None)
        if mine is None:
            keep.append(r)
        elif (piece := box_intersection(op.box, mine[0])) is not None:
            key = tuple((x.start, x.stop) for x in piece)
            same.setdefault(key, (piece, []))[1].append((mine[1], r))
    out: list[tuple[Op, list[int]]] = []
    if keep:
        sent[op.src] = sent.get(op.src, 0) + 1
        if len(keep) == len(dsts):
            return [(op, [])]
        out.append((Send(op.src, keep[0], op.box) if len(keep) == 1
                    else Broadcast(op.src, tuple(keep), op.box), []))
    if same:
        k0 = next(iter(same.values()))[1][0][0]
        holders = next(h for box, h in used[k0][0].slices if box_inside(op.box, box))
        first = holders.index(op.src) if op.src in holders else 0
        turn = holders[first:] + holders[:first]
        for piece, owners in same.values():
            src = min(turn, key=lambda h: sent.get(h, 0))
            turn = turn[1:] + turn[:1]
            sent[src] = sent.get(src, 0) + 1
            to = tuple(r for _, r in owners)
            out.append((Send(src, to[0], piece) if len(to) == 1 else Broadcast(src, to, piece),
                        [k for k, _ in owners]))
    return out


def _cells(g: Group) -> tuple[Box, ...] | None:
    """The grid of whole unit slices of ``g``'s tile with the most cells ``c`` below the
    number ``m`` of its receivers, ``c >= 2`` dividing ``m`` (the grid whose largest cell is
    smallest among those of ``c`` cells); None where there is none."""
    m, inner = len(g.receivers), _boundaries(g)
    for c in range(m // 2, 1, -1):
        grid = None if m % c else _best_grid(g.box, inner, c)
        if grid is not None:
            return grid
    return None


def _boundaries(g: Group) -> list[list[int]]:
    """Per dimension, the starts of ``g``'s unit slices inside its tile (sorted)."""
    return [sorted({b[d].start for b, _ in g.slices} - {g.box[d].start})
            for d in range(len(g.box))]


def _best_grid(box: Box, inner: list[list[int]], c: int) -> tuple[Box, ...] | None:
    """Of the grids of ``c`` cells at the boundaries ``inner`` (:func:`_grid`), the one whose
    largest cell is smallest; None where the boundaries allow none."""
    grids = [_grid(box, inner, counts) for counts in _factorings(c, [len(x) + 1 for x in inner])]
    return min(grids, key=lambda parts: max(box_size(p) for p in parts)) if grids else None


def _parts(g: Group) -> tuple[Box, ...] | None:
    """``g``'s tile cut into one part per receiver: a grid of whole unit slices where the slices'
    boundaries allow one of exactly that many cells (each part then meets its slices whole: one
    send per slice), the grid whose largest cell is smallest; else, along the dimension with the
    most slice boundaries, each run between two boundaries cut into equal parts, as many per run
    as its share of the length (each part inside one run: one send); else equal parts along the
    longest dimension (:func:`~meshcast.core.boxes.split_box`); None where it is too short."""
    box, m = g.box, len(g.receivers)
    if not box:
        return None
    inner = _boundaries(g)
    grid = _best_grid(box, inner, m)
    if grid is not None:
        return grid
    d = max(range(len(box)), key=lambda x: (len(inner[x]), -x))
    return _runs_cut(box, d, inner[d], m) or split_box(box, m)


def _runs_cut(box: Box, d: int, inner: list[int], m: int) -> tuple[Box, ...] | None:
    """``box`` cut along ``d`` into ``m`` parts, none across a boundary of ``inner`` (fewer than
    ``m - 1``): each run between boundaries gets one part, and the others go to the runs by
    length (largest remainder); None where a run is shorter than its count."""
    edges = [box[d].start, *inner, box[d].stop]
    runs = list(itertools.pairwise(edges))
    total = edges[-1] - edges[0]
    share = [(b - a) * (m - len(runs)) / total for a, b in runs]
    counts = [1 + int(x) for x in share]
    for k in sorted(range(len(runs)), key=lambda k: (int(share[k]) - share[k], k))[
            : m - sum(counts)]:
        counts[k] += 1
    if any(c > b - a for (a, b), c in zip(runs, counts)):
        return None
    cells = []
    for (a, b), c in zip(runs, counts):
        small, extra = divmod(b - a, c)
        for k in range(c):
            lo = a + k * small + min(k, extra)
            cells.append((*box[:d], slice(lo, lo + small + (k < extra)), *box[d + 1:]))
    return tuple(cells)


def _factorings(m: int, caps: list[int]) -> list[tuple[int, ...]]:
    """Every way to write ``m`` as a product of one factor per dimension, factor ``d`` at most
    ``caps[d]`` (in lexicographic order)."""
    if not caps:
        return [()] if m == 1 else []
    return [(c, *rest) for c in range(1, min(m, caps[0]) + 1) if m % c == 0
            for rest in _factorings(m // c, caps[1:])]


def _grid(box: Box, inner: list[list[int]], counts: tuple[int, ...]) -> tuple[Box, ...]:
    """``box`` cut into ``counts[d]`` pieces along each dimension ``d`` at the boundaries of
    ``inner[d]`` nearest to equal pieces; the cells in row-major order."""
    edges = []
    for (lo, hi), cuts, c in zip(((b.start, b.stop) for b in box), inner, counts):
        chosen: list[int] = []
        first = 0  # the first boundary still free
        for k in range(1, c):
            target = lo + (hi - lo) * k / c
            last = len(cuts) - (c - 1 - k)  # a boundary left for each later cut
            j = min(range(first, last), key=lambda j: (abs(cuts[j] - target), j))
            chosen.append(cuts[j])
            first = j + 1
        edges.append([slice(a, b) for a, b in itertools.pairwise([lo, *chosen, hi])])
    return tuple(itertools.product(*edges))
