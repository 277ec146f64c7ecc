"""Where a rank that waits long in an input agreement is, seen from every process group.

A call's agreement keys live in its process group's store (board.py), so a rank waiting on one
group cannot see that the peer it waits for is itself stuck in a call on another group (the
pipeline runtime's activations and gradients, a sub-group): its timeout would blame that peer,
healthy but waiting, rather than the rank the peer waits for. A rank that has waited a while
(agree.py's first look around) therefore also leaves a note in the default group's store,
``meshcast/where/<global rank>``: its call, on which group, and the global ranks it still
misses; the note goes when the agreement ends. A timeout then follows the notes from the ranks it
misses to the ranks at the end of the chain (:func:`chain`). Only slow agreements write notes:
a call whose ranks come together costs nothing more. Joint groups (two jobs) have no default
store in common and keep no notes.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .board import Call
from .joint import JointGroup

__all__ = ["chain", "forget", "leave_note"]

_KEY = "meshcast/where/{}"
_HOPS = 4  # notes followed at most (a chain of waits longer than this is cut)


def _store_and_ranks(call: Call) -> tuple[Any, Any] | None:
    """The default store and a group rank -> global rank function, or None (no notes)."""
    if isinstance(call.group, JointGroup) or not dist.is_initialized():
        return None
    try:
        store = c10d._get_default_store()
    except Exception:
        return None
    group = call.group
    if group is dist.group.WORLD or group is None:
        return store, lambda r: r
    return store, lambda r: dist.get_global_rank(group, r)


_notes: dict[int, dict[str, Any]] = {}  # this process's notes by id(call): one per thread's call
_lock = threading.Lock()


def _write(store: Any, key: str) -> None:
    """This process's notes, all under its one key (two threads may wait at once)."""
    if _notes:
        store.set(key, json.dumps(list(_notes.values())))
    else:
        store.delete_key(key)


def leave_note(call: Call, missing: list[int]) -> bool:
    """Say in the default store that this rank waits in ``call`` for ``missing`` (group ranks);
    True if a note was left (best effort)."""
    where = _store_and_ranks(call)
    if where is None:
        return False
    store, to_global = where
    with contextlib.suppress(Exception), _lock:
        _notes[id(call)] = {
            "what": call.caller, "group": getattr(call.group, "group_name", "default"),
            "ranks": [to_global(r) for r in call.ranks],
            "missing": [to_global(r) for r in missing], "since": call.wall}
        _write(store, _KEY.format(to_global(call.me)))
        return True
    return False


def forget(call: Call) -> None:
    """Take this rank's note of ``call`` away (its agreement ended)."""
    if id(call) not in _notes:  # (most calls: they never waited long)
        return
    where = _store_and_ranks(call)
    if where is not None:
        with contextlib.suppress(Exception), _lock:
            if _notes.pop(id(call), None) is not None:
                _write(where[0], _KEY.format(where[1](call.me)))


def chain(call: Call, missing: list[int]) -> str:
    """What the notes say of ``missing`` (group ranks) that are in no call on this group: each
    that waits in a call on another group, for which ranks, down to ranks in no call ("" when
    no note says anything)."""
    where = _store_and_ranks(call)
    if where is None:
        return ""
    store, to_global = where
    told, seen, ends = [], set(), []
    todo = [to_global(q) for q in missing]
    with contextlib.suppress(Exception):
        for _ in range(_HOPS):
            nxt = []
            for g in todo:
                if g in seen:
                    continue
                seen.add(g)
                key = _KEY.format(g)
                notes = json.loads(store.get(key).decode()) if store.check([key]) else []
                if not notes:
                    ends.append(g)
                for note in notes:
                    told.append(f"global rank {g} waits for global ranks {note['missing']} in "
                                f"a {note['what']} on process group {note['group']!r} (global "
                                f"ranks {_span(note['ranks'])}, for "
                                f"{time.time() - note['since']:.0f} s)")
                    nxt += note["missing"]
            todo = nxt
            if not todo:
                break
    if not told:
        return ""
    last = [g for g in ends if g not in {to_global(q) for q in missing}]
    return "; ".join(told) + (f"; global ranks {last} wait in no meshcast agreement: busy "
                              f"elsewhere, or dead" if last else "")


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}..{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) \
        else str(ranks)
