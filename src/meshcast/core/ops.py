"""The operations of a plan: plain immutable values (``Copy``, ``Send``, ``Broadcast``,
``AllGather``), their JSON form, and their host-aware realisation as rank-to-rank transfers
(:func:`broadcast_chain`, :func:`transfers`).

Operations read from the source shard of the rank that sends (a *holder*) and write into the
destination shard of the ranks that receive. ``AllGather`` is the one exception: each of its ranks
contributes a part it already received into its destination shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from .boxes import Box, box_size

__all__ = [
    "OP_KINDS",
    "AllGather",
    "Broadcast",
    "Copy",
    "Op",
    "Send",
    "Transfer",
    "broadcast_chain",
    "op_to_json",
    "ops_from_json",
    "transfers",
]


class Copy(NamedTuple):
    """``rank`` holds ``box`` in its source shard and needs it in its destination shard."""

    rank: int
    box: Box
    kind = "copy"

    def ranks(self) -> tuple[int, ...]:
        """Every rank taking part."""
        return (self.rank,)


class Send(NamedTuple):
    """Point-to-point: ``src`` sends ``box`` from its source shard to ``dst``."""

    src: int
    dst: int
    box: Box
    kind = "send"

    def ranks(self) -> tuple[int, ...]:
        """Every rank taking part."""
        return (self.src, self.dst)


class Broadcast(NamedTuple):
    """``src`` multicasts ``box`` to every rank of ``dsts`` (``src`` is not one of them).

    Runtimes deliver it into each receiving host once and fan it out inside the host.
    """

    src: int
    dsts: tuple[int, ...]
    box: Box
    kind = "broadcast"

    def ranks(self) -> tuple[int, ...]:
        """Every rank taking part."""
        return (self.src, *self.dsts)


class AllGather(NamedTuple):
    """Rank ``group[i]`` holds ``parts[i]`` (a piece of ``box``) in its destination shard; after
    the all-gather every rank of ``group`` holds all of ``box``."""

    group: tuple[int, ...]
    box: Box
    parts: tuple[Box, ...]
    kind = "allgather"

    def ranks(self) -> tuple[int, ...]:
        """Every rank taking part."""
        return self.group


Op = Copy | Send | Broadcast | AllGather
OP_KINDS: dict[str, type] = {c.kind: c for c in (Copy, Send, Broadcast, AllGather)}


class Transfer(NamedTuple):
    """One rank-to-rank movement of bytes in the host-aware realisation of an operation."""

    src: int
    dst: int
    nbytes: int


def broadcast_chain(op: Broadcast, host_of: dict[int, int]) -> list[tuple[int, list[int]]]:
    """Host-aware route of a broadcast: ``[(leader, ranks it fans out to locally), ...]``.

    The first entry is the sender's own host (the sender leads it, possibly with nobody to feed);
    then one entry per other receiving host, in order of first appearance in ``op.dsts``. Each
    leader receives from the previous leader, so the data enters each receiving host once.
    """
    src_host = host_of[op.src]
    groups: dict[int, list[int]] = {src_host: []}
    for r in op.dsts:
        groups.setdefault(host_of[r], []).append(r)
    chain = [(op.src, groups.pop(src_host))]
    for members in groups.values():
        chain.append((members[0], members[1:]))
    return chain


def transfers(op: Op, itemsize: int, host_of: dict[int, int]) -> Iterator[Transfer]:
    """The point-to-point movements an operation makes when run host-aware (local copies: none)."""
    if isinstance(op, Send):
        yield Transfer(op.src, op.dst, box_size(op.box) * itemsize)
    elif isinstance(op, Broadcast):
        nbytes = box_size(op.box) * itemsize
        prev = None
        for leader, members in broadcast_chain(op, host_of):
            if prev is not None:
                yield Transfer(prev, leader, nbytes)
            for r in members:
                yield Transfer(leader, r, nbytes)
            prev = leader
    elif isinstance(op, AllGather):
        for i, part in zip(op.group, op.parts):
            nbytes = box_size(part) * itemsize
            for j in op.group:
                if j != i:
                    yield Transfer(i, j, nbytes)


def _box_to_json(box: Box) -> list[list[int]]:
    return [[s.start, s.stop] for s in box]


def _box_from_json(data: list[list[int]]) -> Box:
    return tuple(slice(*_pair(s)) for s in data)


def _pair(data: Any) -> tuple[Any, Any]:
    if not isinstance(data, list) or len(data) != 2:
        raise ValueError(f"a box dimension must be [start, stop], got {data!r}")
    return data[0], data[1]


def op_to_json(op: Op) -> list[Any]:
    """``op`` as a JSON list: its kind, then its fields (boxes as ``[start, stop]`` pairs)."""
    if isinstance(op, Copy):
        return ["copy", op.rank, _box_to_json(op.box)]
    if isinstance(op, Send):
        return ["send", op.src, op.dst, _box_to_json(op.box)]
    if isinstance(op, Broadcast):
        return ["broadcast", op.src, list(op.dsts), _box_to_json(op.box)]
    return ["allgather", list(op.group), _box_to_json(op.box), [_box_to_json(p) for p in op.parts]]


_ARITY = {"copy": 3, "send": 4, "broadcast": 4, "allgather": 4}


def _op_from_json(data: list[Any]) -> Op:
    kind = data[0] if isinstance(data, list) and data else None
    if kind not in _ARITY:
        raise ValueError(f"unknown kind {kind!r}; known: {list(OP_KINDS)}")
    if len(data) != _ARITY[kind]:
        raise ValueError(f"a {kind} has {_ARITY[kind] - 1} fields, got {len(data) - 1}")
    if kind == "copy":
        return Copy(data[1], _box_from_json(data[2]))
    if kind == "send":
        return Send(data[1], data[2], _box_from_json(data[3]))
    if kind == "broadcast":
        return Broadcast(data[1], tuple(data[2]), _box_from_json(data[3]))
    return AllGather(
        tuple(data[1]), _box_from_json(data[2]), tuple(_box_from_json(p) for p in data[3])
    )


def ops_from_json(data: Any) -> tuple[Op, ...]:
    """The operations of a plan from their JSON list; ``ValueError`` names the first bad one."""
    if not isinstance(data, list):
        raise ValueError(f"plan JSON: ops must be a list, got {type(data).__name__}")
    ops = []
    for i, op in enumerate(data):
        try:
            ops.append(_op_from_json(op))
        except (TypeError, ValueError) as e:
            raise ValueError(f"plan JSON: ops[{i}] = {op!r} is not an operation: {e}") from None
    return tuple(ops)
