"""The keys of one call's input agreement in the store (agree.py): the records the ranks append,
the count of those that came, the verdict set once, and where each rank is."""

from __future__ import annotations

import json
from typing import Any

from .board import Call

__all__ = [
    "call_off", "follow", "join", "joined", "missing_ranks", "read_records", "settle",
    "settled", "verdict_of", "where_is",
]


def read_records(call: Call, key: str) -> tuple[dict[int, dict], bool]:
    """The records under ``key`` by rank, and whether a rank called the call off there."""
    text = call.store.get(key).decode() if call.store.check([key]) else ""
    got: dict[int, dict] = {}
    called_off = False
    for line in text.splitlines():
        rec = json.loads(line)
        if "rank" in rec:
            got[rec["rank"]] = rec
        else:
            called_off = True
    return got, called_off


def join(call: Call) -> int:
    """Count this rank in (after its record is there): how many have come, with it."""
    return call.store.add(f"{call.key}/joined", 1)


def joined(call: Call) -> int:
    """How many ranks have counted themselves in (a stray's record counts too, agree._strays)."""
    return call.store.add(f"{call.key}/joined", 0)


def missing_ranks(call: Call, key: str) -> list[int]:
    """The plan ranks whose record is not under ``key`` yet."""
    got = read_records(call, key)[0]
    return [q for q in call.ranks if q not in got]


def settle(call: Call, verdict: dict[str, Any]) -> dict[str, Any]:
    """Set the call's verdict unless one is set; the verdict that holds (:func:`follow`)."""
    ours = json.dumps({**verdict, "step": call.step})
    held = json.loads(call.store.compare_set(f"{call.key}/verdict", "", ours).decode())
    return _acknowledged(call, held)


def follow(call: Call) -> dict[str, Any]:
    """The verdict of this call, set by a peer."""
    return _acknowledged(call, verdict_of(call, call.key))


def _acknowledged(call: Call, held: dict[str, Any]) -> dict[str, Any]:
    """``held``, once this rank has read it: the last rank of the call to read a verdict to go
    ahead deletes the call's keys (each rank reads it once)."""
    store = call.store
    if held.get("ok") and store.add(f"{call.key}/read", 1) == len(call.ranks):
        for suffix in ("records", "joined", "verdict", "read"):
            store.delete_key(f"{call.key}/{suffix}")
    return held


def call_off(call: Call, key: str, verdict: dict[str, Any]) -> None:
    """Call off a peer's call ``key`` that this rank will not make at this step (the peer's ranks
    then refuse at this step too, and none of them keeps waiting in it)."""
    ours = json.dumps({**verdict, "step": call.step})
    call.store.compare_set(f"{key}/verdict", "", ours)
    call.store.append(f"{key}/records", json.dumps({"called_off": True}) + "\n")


def settled(call: Call, key: str) -> bool:
    """Whether call ``key`` has its verdict (a peer that shows itself agreeing there is about to
    leave it)."""
    return bool(key) and call.store.check([f"{key}/verdict"])


def verdict_of(call: Call, key: str) -> dict[str, Any]:
    """The verdict of call ``key`` (it must be set)."""
    return json.loads(call.store.get(f"{key}/verdict").decode())


def where_is(call: Call, rank: int) -> dict[str, Any] | None:
    """Where ``rank`` says it is (its last call and state), None if it never called."""
    key = call.at_key(rank)
    if not call.store.check([key]):
        return None
    return json.loads(call.store.get(key).decode())
