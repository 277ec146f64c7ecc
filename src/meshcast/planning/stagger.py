"""Staggered starts: lead pieces that offset the ranks sharing a NIC, for any plan.

The runtime (and the simulator) starts an operation as soon as its ranks are free, so every rank
starts its first transfer at time 0: the ranks of a shared NIC pay their start-ups together, the
NIC idles meanwhile, then they share it, round after round. No order of the operations changes
that. Cutting a rank's first operation into ``k`` one-row *lead pieces* and the rest delays
everything it does next by about ``k`` start-ups; ranks of one NIC delayed by different numbers
of start-ups take turns on it, each transferring while the others pay their start-ups. The
phased order of :mod:`.phased` does this for complete bipartite sends; :func:`staggered` does it
for the operations of any plan, as candidates of ``"auto"`` (:data:`STAGGERS`), kept only where
they simulate faster. ``docs/scheduling.md`` (``auto``, step 8) has the measurements.
"""

from __future__ import annotations

from ..core.ops import Broadcast, Op, Send
from ..core.topology import Topology

__all__ = ["STAGGERS", "lead_pieces", "staggered"]

STAGGERS: tuple[tuple[str, int], ...] = (("src", 2), ("src", 3), ("dst", 2), ("dst", 3))
"""The staggers ``"auto"`` tries on its best plan (side, groups) (:func:`staggered`), in this
order. Two and three groups, on the senders' or the receivers' NICs, were each the best on some
tasks of the planner suite; more groups or one delay per rank gained nothing more there. Set
once; not derived."""


def staggered(ops: tuple[Op, ...], topology: Topology, side: str, groups: int
              ) -> tuple[Op, ...] | None:
    """``ops`` with the ranks of each NIC staggered: the ranks on one side (``"src"``: senders,
    ``"dst"``: receivers) of the network operations (sends and broadcasts that leave the
    sender's host) are taken per NIC in the order of their first such operation, and the
    ``k``-th rank of a NIC that serves two or more is delayed ``k mod groups`` start-ups: its
    first network operation is cut into that many lead pieces and the rest (:func:`lead_pieces`;
    an operation that delays several ranks is cut for the largest delay). None where nothing
    would be cut."""
    nic, _ = topology.global_nics()
    host = topology.hosts_by_rank
    first: dict[int, int] = {}  # rank -> index of its first network operation on this side
    members: dict[int, list[int]] = {}  # NIC -> its ranks, in the order they first appear
    for i, op in enumerate(ops):
        if not isinstance(op, (Send, Broadcast)):
            continue
        dsts = (op.dst,) if isinstance(op, Send) else op.dsts
        if all(host[d] == host[op.src] for d in dsts):
            continue  # inside a host: no NIC
        for r in (op.src,) if side == "src" else dsts:
            if r not in first:
                first[r] = i
                members.setdefault(nic[r], []).append(r)
    cuts: dict[int, int] = {}
    for ranks in members.values():
        for k, r in enumerate(ranks):
            delay = k % groups
            if delay and len(ranks) > 1:
                cuts[first[r]] = max(cuts.get(first[r], 0), delay)
    out: list[Op] = []
    changed = False
    for i, op in enumerate(ops):
        if i in cuts:
            cut = lead_pieces(op, cuts[i])
            changed = changed or len(cut) > 1
            out += cut
        else:
            out.append(op)
    return tuple(out) if changed else None


def lead_pieces(op: Send | Broadcast, cut: int) -> list[Op]:
    """``op`` as ``cut`` one-row pieces along its box's longest dimension and the rest (fewer
    where its rows do not allow; ``op`` itself for a 0-d box): the pieces move the same elements
    between the same ranks, one start-up each."""
    box = op.box
    if not box:
        return [op]
    d = max(range(len(box)), key=lambda x: box[x].stop - box[x].start)
    lo, hi = box[d].start, box[d].stop
    cut = max(min(cut, hi - lo - 1), 0)
    pieces: list[Op] = [op._replace(box=(*box[:d], slice(x, x + 1), *box[d + 1:]))
                        for x in range(lo, lo + cut)]
    return [*pieces, op._replace(box=(*box[:d], slice(lo + cut, hi), *box[d + 1:]))]
