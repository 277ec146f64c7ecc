"""The input agreement: before any data moves, the ranks of a call learn each other's options and
input errors through the store, and refuse together if anything differs or is wrong.

Each rank appends its record to the call's key and counts itself in; the rank whose count
completes the call reads every record and sets the verdict, the others look for the verdict
(one small key) until it is there: a few store round trips when the ranks arrive together, and
the records read once per call, not by every rank on every look (the store's work grows with the
ranks, not with their square). Calls are keyed by their plan
(board.py), so ranks holding different plans never meet under one key; nothing here waits on a
message, so nothing can hang on them either: while waiting, a rank looks at where each missing
peer is (``meshcast/at/<rank>``) and refuses at once when the peer

* waits in the agreement of another call whose ranks include this rank and which this rank has
  not made: each waits for the other (a plan or a mesh that differs per rank), or
* refused, at the same step of the program (the same number of meshcast calls on this group,
  board.next_step), a call that this rank has not made: its plan differs from its peers', or its
  plan was unusable (a rank shows its last few refusals, so a slow peer still finds them).
  Steps agree where every rank makes every call (SPMD, as with DTensor); where
  they do not, such a peer is waited for (a group whose calls are made by their plans' ranks
  only, board.calls_by_plan_ranks, compares no steps at all).

A peer that is merely busy elsewhere (an earlier call, compute) is waited for, up to ``timeout``;
so is a peer that still waits in the agreement of a call of an earlier step, which this rank has
passed (it came there after its peers had refused that step without it): that call is called off
for it, and it then comes.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from .agree_keys import (
    call_off,
    follow,
    join,
    joined,
    missing_ranks,
    read_records,
    settle,
    settled,
    verdict_of,
    where_is,
)
from .board import Call, calls_made, recent_refusals, steps_agree
from .errors import ReshardError
from .whereabouts import chain, forget, leave_note

__all__ = ["agree", "refuse_early"]

POLL_S = (1e-4, 5e-3)
"""First and longest pause between two looks at the records."""
SCAN_S = (0.02, 0.1)
"""When a rank first looks where its missing peers are, and how often after that."""
RECENT_REFUSALS = 8
"""Refusals a rank keeps showing to its peers (kept per process group, board.recent_refusals,
and dropped with the group)."""


def agree(
    call: Call, record: dict[str, Any], abort: Callable[[], str | None] | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> None:
    """Exchange ``record`` (``plan``, ``options``, ``error``, ``what``, optionally ``names``: a
    digest of the tensors' names, compared where two ranks give one) with every rank of
    ``call``; raise ``ValueError`` on every rank if any differ or any has an error,
    :class:`ReshardError` if a rank does not come within the call's timeout.

    The outcome is one verdict per call, set once in the store (``compare_set``): by the first
    rank that holds every record (the verdict follows from the records alone, so every such rank
    would set the same), or by a rank that calls the call off while a record is missing (a
    conflict, a time-out, ``abort()`` returning a reason). Every rank follows the verdict, so no
    rank goes ahead while another refuses.

    ``interrupted()`` says whether this rank had a Ctrl-C that its caller deferred
    (interrupt.py, :func:`~meshcast.runtime.interrupt.call_interrupts`): the call is then called
    off and this rank raises ``KeyboardInterrupt``, unless a peer already found every record
    there (the verdict is to go ahead: the caller then reports the interrupt as this rank's
    failure of the transfer, and every rank raises at once)."""
    here = {
        "call": call.key, "family": call.family, "number": call.number, "step": call.step,
        "ranks": list(call.ranks), "what": record["what"], "state": "agreeing",
        "refusals": _recent_refusals(call.group),
    }
    refusals = here["refusals"]
    record = {**record, "rank": call.me, "step": call.step,
              "refused_at": refusals[-1]["step"] if refusals else None}
    try:
        records, verdict = _gather(call, record, here, abort, interrupted)
        if not verdict["ok"] and verdict.get("by") is None and call.me in _strays(records):
            call.renumber()  # this rank's call met the one it refused: join its own partners
            here["call"], here["number"] = call.key, call.number
            records, verdict = _gather(call, record, here, abort, interrupted)
    except KeyboardInterrupt:  # Ctrl-C: the peers refuse at once instead of waiting for it
        with contextlib.suppress(Exception):
            call_off(call, call.key, {"ok": False, "by": call.me,
                                      "reason": _interrupted_reason(call)})
            _refused(call, here)
        raise
    except Exception as exc:  # the store itself failed
        _refused(call, here)
        raise ReshardError(
            f"{call.caller} on rank {call.me}: the process group's store failed during the "
            f"input agreement after {call.elapsed():.2f} s: {exc}", call.ranks) from exc
    finally:
        forget(call)
    if not verdict["ok"]:
        _refused(call, here)
        _raise_refusal(call, records, verdict, record["what"])


def _raise_refusal(call: Call, records: dict[int, dict], verdict: dict[str, Any], what: str
                   ) -> None:
    """Raise the refusal ``verdict`` on this rank (``what``: its call, as its record says)."""
    if verdict.get("by") == call.me and verdict["reason"] == _interrupted_reason(call):
        raise KeyboardInterrupt
    if verdict.get("by") is None:  # decided from the records: each rank says it its own way
        problem = _compare(call, records)
        raise ValueError(f"{call.caller} on rank {call.me}: {problem}; nothing was sent")
    text = verdict["reason"]
    if verdict["by"] != call.me:  # say it from this rank's side where it can (not after a
        # refusal before joining: the refusing rank may be in its next call already)
        own = None if verdict.get("missing") or verdict.get("early") else _conflict(
            call, [q for q in call.ranks if q not in records], what)
        text = own[1] if own is not None else (
            f"rank {verdict['by']} called the call off: {verdict['reason']}")
    if verdict.get("missing"):
        missing = tuple(verdict["missing"])
        raise ReshardError(f"{call.caller} on rank {call.me}: {text}; nothing was sent", missing,
                           failed=missing)
    raise ValueError(f"{call.caller} on rank {call.me}: {text}; nothing was sent")


def _gather(
    call: Call, record: dict[str, Any], here: dict[str, Any],
    abort: Callable[[], str | None] | None, interrupted: Callable[[], bool] | None,
) -> tuple[dict[int, dict], dict[str, Any]]:
    """Every record this rank could read, and the verdict."""
    while settled(call, call.key) and verdict_of(call, call.key).get("step") != call.step:
        call.renumber()  # a name this rank's peers used at another step while it made another call
        here["call"], here["number"] = call.key, call.number
    store, key = call.store, f"{call.key}/records"
    store.set(call.at_key(call.me), json.dumps(here))
    store.append(key, json.dumps(record) + "\n")
    # the rank whose record completes the count reads them all; the others look for the verdict
    full, late, who = join(call) >= len(call.ranks), False, _Missing()
    got: dict[int, dict] = {}
    pause, next_scan = POLL_S[0], SCAN_S[0]
    while True:
        if full:
            got, called_off = read_records(call, key)
            missing = [q for q in call.ranks if q not in got]
            if called_off or not missing:
                verdict = {"ok": _compare(call, got) is None} if not missing else {"ok": False}
                return got, settle(call, verdict)
            full = False  # a record counted was a stray's (_strays): the last to come decides
        elif settled(call, call.key):
            verdict = follow(call)
            return ({} if verdict["ok"] else read_records(call, key)[0]), verdict
        off: dict[str, Any] | None = None
        theirs: str | None = None  # the call of a peer that waits for this one
        given_up = (_interrupted_reason(call) if interrupted is not None and interrupted()
                    else abort() if abort is not None else None)
        if given_up is not None:
            off = {"reason": given_up}
        elif call.elapsed() >= next_scan or call.elapsed() > call.timeout:
            next_scan = call.elapsed() + SCAN_S[1]
            count = joined(call)
            if not late and call.elapsed() <= call.timeout and count >= len(call.ranks):
                late = True  # every rank came: the verdict is on its way; read at the next look
            else:
                missing = who(call, key, count)
                if not missing:  # every record is there, still no verdict (its rank died?)
                    full = True
                    continue
                off, theirs = _scan(call, key, missing, record["what"])
                if off is None and call.elapsed() > call.timeout:
                    off = {"reason": _absent(call, missing), "missing": missing}
        if off is not None:
            verdict = settle(call, {"ok": False, "by": call.me, **off})
            if verdict.get("by") == call.me:  # tell the ranks still reading records
                store.append(key, json.dumps({"called_off": True}) + "\n")
            if theirs and theirs != call.key:  # the peer's call cannot go ahead without this rank
                call_off(call, theirs, {"ok": False, "by": call.me, **off})
            return (got if verdict["ok"] else read_records(call, key)[0]), verdict
        time.sleep(pause)
        pause = min(2 * pause, POLL_S[1])


class _Missing:
    """The plan ranks whose record is missing, read again only when the count of ranks come has
    changed since (each rank appends its record before it counts itself in): a long wait for a
    late peer costs a look around one small request, not a read of every record."""

    def __init__(self) -> None:
        self.count, self.ranks = -1, []

    def __call__(self, call: Call, key: str, count: int) -> list[int]:
        if count != self.count:
            self.count, ranks = count, missing_ranks(call, key)
            if ranks and ranks != self.ranks:  # seen from other groups too (whereabouts.py)
                leave_note(call, ranks)
            self.ranks = ranks
        return self.ranks


def _interrupted_reason(call: Call) -> str:
    return f"rank {call.me} was interrupted (KeyboardInterrupt) in the input agreement"


def _scan(
    call: Call, key: str, missing: list[int], what: str
) -> tuple[dict[str, Any] | None, str | None]:
    """One look at where the missing peers are: ``(off, theirs)``, why this call is off (None: it
    waits on) and the peer's call to call off with it.

    A peer may have added its record, finished this call and gone on since the records were read:
    it counts against this call only if its record is still missing. A peer still waiting in a
    call of an earlier step that this rank has passed (it arrived there after this rank's peers
    had refused that step without it) is behind, not in conflict: its call is called off, as it
    cannot go ahead without this rank, and this call waits for it to come."""
    reason = _conflict(call, missing, what)
    if reason is None or reason[0] in read_records(call, key)[0]:
        return None, None
    at = where_is(call, reason[0])
    # the peer's call, unless it is a later one (it refused this step and went on): that one
    # this rank will make too
    theirs = (at["call"] if at is not None and at["state"] == "agreeing"
              and at["step"] <= call.step else None)
    if theirs and theirs != call.key and at["step"] < call.step:
        call_off(call, theirs, {"ok": False, "by": call.me, "reason": reason[1]})
        return None, None
    return {"reason": reason[1]}, theirs


def _conflict(call: Call, missing: list[int], what: str) -> tuple[int, str] | None:
    """(peer, why) when a missing peer cannot come to this call (module docstring)."""
    advice = ("every rank of a plan must call with the same plan (are meshes or plans built "
              "differently on different ranks, e.g. a sub-mesh that differs per rank?)")
    mine = f"{what} over ranks {_ranks(call.ranks)}"
    where = {q: where_is(call, q) for q in missing}
    waiting = {q: at is not None and at["state"] == "agreeing"
               and not settled(call, at["call"]) for q, at in where.items()}
    spmd = steps_agree(call.group)  # else a peer's step says nothing of the call it makes
    differ = [q for q, at in where.items() if at is not None and at["family"] != call.family
              and at["ranks"] == list(call.ranks)
              and (waiting[q] or (spmd and at["step"] == call.step))
              and at["number"] >= calls_made(call.group, at["family"])]
    if differ:  # the same ranks, waiting for each other with different plans
        q = differ[0]
        return q, (f"ranks {differ} called with different plans than rank {call.me} (rank {q}: "
                   f"{where[q]['what']}; rank {call.me}: {what}); every rank must pass the same "
                   f"plans in the same order")
    for q, at in where.items():
        if at is None:
            continue  # never called
        theirs = f"{at['what']} over ranks {_ranks(at['ranks'])}"
        made = call.me in at["ranks"] and at["number"] < calls_made(call.group, at["family"])
        if (at["family"] != call.family and waiting[q] and call.me in at["ranks"]
                and not made):  # (a call of this plan is an earlier, this or a later one)
            return q, (f"rank {q} waits for rank {call.me} in a call with another plan "
                       f"({theirs}), while rank {call.me}'s plan ({mine}) waits for rank {q}: "
                       f"{advice}")
        for refusal in at.get("refusals", ()) if spmd else ():  # (also where it went on)
            if refusal["step"] != call.step or refusal["family"] == call.family:
                continue  # another step of the program (or this very call, on another rank)
            if call.me in refusal["ranks"] and refusal["number"] < calls_made(
                    call.group, refusal["family"]):
                continue  # a call this rank made too
            if not refusal["family"]:
                return q, (f"rank {q} refused its call before joining it ({refusal['what']}), "
                           f"while rank {call.me}'s plan ({mine}) waits for it")
            return q, (f"rank {q} refused its call with another plan ({refusal['what']} over "
                       f"ranks {_ranks(refusal['ranks'])}), while rank {call.me}'s plan ({mine}) "
                       f"waits for it: {advice}")
    return None


def _absent(call: Call, missing: list[int]) -> str:
    where = []
    for q in missing[:4]:
        at = where_is(call, q)
        if at is None:
            where.append(f"rank {q} has not called meshcast on this process group")
        elif at["call"] == call.key:
            where.append(f"rank {q} joined but its record did not arrive")
        else:  # its record is only rewritten by its next call: it may be long done
            refused = ", refused" if at["state"] == "refused" else ""
            where.append(f"rank {q}'s last call was another ({at['what']} over ranks "
                         f"{_ranks(at['ranks'])}{refused}) and it has not come to this one: "
                         f"busy elsewhere, or dead")
    further = chain(call, missing)  # where they wait, on other groups
    return (
        f"ranks {missing} did not join the input agreement within {call.timeout:g} s "
        f"({'; '.join(where)}{'; ' + further if further else ''}) (ranks involved: "
        f"{list(call.ranks)})"
    )


def _compare(call: Call, records: dict[int, dict]) -> str | None:
    """Why the ranks cannot go ahead (None: they can); the same text on every rank but the one
    whose own input is wrong, which gets its own error first."""
    mine = records[call.me]
    if mine["error"] is not None:
        return mine["error"]
    late = _strays(records)
    if late:
        return (f"ranks {late} refused this call before joining it and came on to their next "
                f"call, which met this one: this call is refused on every rank, and theirs "
                f"waits for its own partners")
    plans = [q for q in call.ranks if records[q]["plan"] != mine["plan"]]
    if plans:
        q = plans[0]
        return (f"ranks {plans} called with different plans than rank {call.me} (rank {q}: "
                f"{records[q]['what']}; rank {call.me}: {mine['what']}); every rank must pass "
                f"the same plans in the same order")
    mine_names = mine.get("names")
    names = [q for q in call.ranks if mine_names is not None
             and records[q].get("names") not in (None, mine_names)]
    if names:
        return (f"ranks {names} passed the same plans for tensors of other names or in another "
                f"order than rank {call.me} (names digest {records[names[0]]['names']} against "
                f"{mine_names}): every rank must pass the same tensors in the same order")
    # an input error first: it may be why that rank's options differ (a device it lacks)
    bad = [q for q in call.ranks if records[q]["error"] is not None]
    if bad:
        first = records[bad[0]]
        return (f"ranks {bad} passed inputs that do not fit the plans (rank {bad[0]}: "
                f"{first['error']})")
    for name, value in mine["options"].items():
        differ = [q for q in call.ranks if records[q]["options"].get(name) != value]
        if differ:
            theirs = records[differ[0]]["options"].get(name)
            return (f"ranks {differ} passed {name}={theirs!r} where rank {call.me} passed "
                    f"{value!r}: it must be the same on every rank")
    return None


def _strays(records: dict[int, dict]) -> list[int]:
    """The ranks whose record belongs to their next call: each refused a call early, at a step
    where a peer of this call is (its arguments were unusable, so it never joined that call),
    and came straight on to its next call of the same plans, under the name of the call it
    refused. Read from the records alone, so every rank finds the same."""
    steps = {rec.get("step") for rec in records.values()}
    return sorted(q for q, rec in records.items() if rec.get("refused_at") is not None
                  and rec["refused_at"] == rec.get("step", 0) - 1 and rec["refused_at"] in steps)


def _recent_refusals(group: object, add: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """This process's last refusals on ``group`` (step, family, number, ranks, what), newest
    last; ``add`` one first. They stay in ``meshcast/at/<rank>`` for a few calls, so a peer that
    is slow to look still finds the refusal of its step after this rank has moved on."""
    return recent_refusals(group, add, RECENT_REFUSALS)


def _refused(call: Call, here: dict[str, Any]) -> None:
    refusal = {"step": call.step, "family": call.family, "number": call.number,
               "ranks": list(call.ranks), "what": here["what"]}
    here = {**here, "state": "refused", "refusals": _recent_refusals(call.group, refusal)}
    with contextlib.suppress(Exception):
        call.store.set(call.at_key(call.me), json.dumps(here))


def refuse_early(group: object, me: int, what: str, family: str | None = None) -> None:
    """Say in the store that this rank refused a call before it could join an agreement (its
    plan was unusable), so that peers waiting for it at the same step refuse at once instead of
    timing out. ``family``: the plan family of the refused call where known (its call number is
    used up, as the peers' call used theirs). Best effort: nothing happens without an
    initialised process group."""
    from .board import next_step, skip_number, store_of

    number = skip_number(group, family) if family is not None else None
    refusal = {"step": next_step(group), "family": "", "number": -1, "ranks": [], "what": what}
    here = {"call": "", "family": "", "number": -1, "step": refusal["step"], "ranks": [],
            "what": what, "state": "refused", "refusals": _recent_refusals(group, refusal)}
    with contextlib.suppress(Exception):
        store = store_of(group)
        store.set(Call.at_key(me), json.dumps(here))
        if number is not None:  # the name used up is settled: a peer whose count of the family
            # lags (it refused another family at an earlier step) renumbers past it (_gather)
            key = f"meshcast/c/{family}/{number}"
            verdict = {"ok": False, "by": me, "step": refusal["step"], "early": True,
                       "reason": f"rank {me} refused its call before joining it ({what})"}
            store.compare_set(f"{key}/verdict", "", json.dumps(verdict))
            store.append(f"{key}/records", json.dumps({"called_off": True}) + "\n")


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    return str(ranks)
