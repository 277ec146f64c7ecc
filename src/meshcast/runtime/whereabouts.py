"""Where a rank that waits long in an input agreement is, seen from every process group.

A call's agreement keys live in its process group's store (board.py), so a rank waiting on one
group cannot see that the peer it waits for is itself stuck in a call on another group (the
pipeline runtime's activations and gradients, a sub-group): its timeout would blame that peer,
healthy but waiting, rather than the rank the peer waits for. A rank that has waited a while
(agree.py's first look around) therefore also leaves a note in the default group's store,
``meshcast/where/<global rank>``: its call, on which group, and the global ranks it still
misses; the note goes when the agreement ends. Other long waits leave notes the same way
(:func:`note_wait`: the pipeline runtime's waits for a tensor, or for the rank's own
computation). A timeout then follows the notes from the ranks it misses to the ranks at the end
of the chain (:func:`chain`, :func:`chain_of`): ranks in no wait at all, or computing. Only
slow waits write notes: a call whose ranks come together costs nothing more. Joint groups (two
jobs) have no default store in common and keep no notes.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .board import Call
from .joint import JointGroup

__all__ = ["chain", "chain_of", "drop_wait", "forget", "leave_note", "note_wait"]

_KEY = "meshcast/where/{}"
_HOPS = 4  # notes followed at most (a chain of waits longer than this is cut)


def _to_global(call: Call) -> Callable[[int], int] | None:
    """``call``'s group rank -> global rank, or None where there are no notes (a joint group,
    or no default group)."""
    if isinstance(call.group, JointGroup) or not dist.is_initialized():
        return None
    group = call.group
    if group is dist.group.WORLD or group is None:
        return lambda r: r
    return lambda r: dist.get_global_rank(group, r)


_notes: dict[int, dict[str, Any]] = {}  # this process's notes by owner: one per waiting thread
_lock = threading.Lock()


def note_wait(owner: object, me: int, text: str, missing: Sequence[int], since: float,
              compute: bool = False) -> None:
    """Say in the default store that global rank ``me`` (this process) ``text`` ("waits in ...")
    for global ranks ``missing`` (none: for its own computation) since ``since``
    (``time.time()``), until :func:`drop_wait` of the same ``owner``; ``compute``: the wait is
    its computation's own (so that computation is not running). Best effort: nothing without a
    default store."""
    if not dist.is_initialized():
        return
    with contextlib.suppress(Exception), _lock:
        _notes[id(owner)] = {"text": text, "missing": list(missing), "since": since,
                             "compute": compute}
        _write(c10d._get_default_store(), _KEY.format(me))


def drop_wait(owner: object, me: int) -> None:
    """Take the note of ``owner`` away (its wait ended)."""
    if id(owner) not in _notes:  # (most waits: they were short)
        return
    with contextlib.suppress(Exception), _lock:
        if _notes.pop(id(owner), None) is not None:
            _write(c10d._get_default_store(), _KEY.format(me))


def _write(store: Any, key: str) -> None:
    """This process's notes, all under its one key (two threads may wait at once)."""
    if _notes:
        store.set(key, json.dumps(list(_notes.values())))
    else:
        store.delete_key(key)


def leave_note(call: Call, missing: list[int]) -> None:
    """:func:`note_wait` for an agreement of ``call`` that misses ``missing`` (group ranks)."""
    to_global = _to_global(call)
    if to_global is not None:
        note_wait(call, to_global(call.me), f"waits in a {call.caller} on process group "
                  f"{getattr(call.group, 'group_name', 'default')!r} (global ranks "
                  f"{_span([to_global(r) for r in call.ranks])})",
                  [to_global(r) for r in missing], call.wall)


def forget(call: Call) -> None:
    """Take the note of ``call``'s agreement away (it ended)."""
    to_global = _to_global(call) if id(call) in _notes else None
    if to_global is not None:
        drop_wait(call, to_global(call.me))


def chain(call: Call, missing: list[int]) -> str:
    """What the notes say of ``missing`` (group ranks of ``call``) that are in no call on this
    group: each that waits in a call on another group, for which ranks, down to ranks in no
    call ("" when no note says anything)."""
    to_global = _to_global(call)
    if to_global is None:
        return ""
    gone = [to_global(q) for q in missing]
    return chain_of(gone, skip=gone)


def chain_of(ranks: Sequence[int], skip: Sequence[int] = ()) -> str:
    """What the notes say of global ``ranks`` (each note of the first of them; then, followed
    down the ranks they wait for, the ranks at the end: in no wait at all, named unless in
    ``skip``, or whose only own waits are for their own computation); "" when no note says
    anything (or without a default store)."""
    if not dist.is_initialized():
        return ""
    store = None
    with contextlib.suppress(Exception):
        store = c10d._get_default_store()
    told, seen, ends, busy, todo = [], set(), [], [], list(ranks)
    with contextlib.suppress(Exception):
        for hop in range(_HOPS):
            nxt = []
            for g in todo:
                if g in seen:
                    continue
                seen.add(g)
                key = _KEY.format(g)
                notes = json.loads(store.get(key).decode()) if store.check([key]) else []
                if not notes:
                    ends.append(g)
                if any(n["missing"] == [] for n in notes) and not any(
                        n.get("compute") for n in notes):  # its computation: never waits
                    busy.append(g)
                for note in notes if hop == 0 else ():
                    told.append(f"global rank {g} {note['text']}" + (
                        f" for global ranks {note['missing']}" if note["missing"] else "")
                        + f", for {time.time() - note['since']:.0f} s")
                nxt += [q for n in notes for q in n["missing"]]
            todo = nxt
            if not todo:
                break
    last = [g for g in ends if g not in set(skip)]
    told += [f"global ranks {last} wait in no meshcast agreement: busy elsewhere, or dead"] * bool(
        last and told) + [f"global ranks {busy} are computing (waited for, not waiting)"] * bool(
        busy)
    return "; ".join(told)


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}..{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) \
        else str(ranks)
