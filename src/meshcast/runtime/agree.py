"""The input agreement: before any data moves, the ranks of a call learn each other's plan digest,
options and input errors through the store, and refuse together if anything differs.

Each rank appends its record to the call's key and reads the key until every plan rank's record
is there (a few store round trips when the ranks arrive together). Nothing here waits on a
message, so nothing can hang on a rank that holds a different plan: while waiting, a rank looks at
where each missing peer is (``meshcast/at/<rank>``) and refuses at once when the peer

* is in a call with other plan ranks that include this rank, which this rank has not made: each
  waits for the other (plans or meshes that differ per rank), or
* has refused its own call with other plan ranks (its plan differs from its peers').

A peer that is merely busy elsewhere (an earlier call, compute) is waited for, up to ``timeout``.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from .board import Call, calls_made
from .errors import ReshardError

__all__ = ["agree", "refuse_early"]

POLL_S = (1e-4, 5e-3)
"""First and longest pause between two looks at the records."""
SCAN_S = (0.02, 0.1)
"""When a rank first looks where its missing peers are, and how often after that."""
RECENT_S = 5.0
"""A peer's refusal counts against this call if it happened at most this long before the call
started (an older one belongs to an earlier, unrelated mistake)."""


def agree(call: Call, record: dict[str, Any]) -> None:
    """Exchange ``record`` (``plan``, ``options``, ``error``, ``what``) with every
    rank of ``call``; raise ``ValueError`` on every rank if any differ or any has an error,
    :class:`ReshardError` if a rank does not come within the call's timeout."""
    here = {
        "call": call.key, "digest": call.digest, "number": call.number,
        "ranks": list(call.ranks), "what": record["what"], "state": "agreeing",
        "wall": time.time(),
    }
    try:
        records = _gather(call, {**record, "rank": call.me}, here)
        problem = _compare(call, records)
    except ValueError:
        _refused(call, here)
        raise
    except ReshardError:
        _refused(call, here)
        raise
    except Exception as exc:  # the store itself failed
        raise ReshardError(
            f"{call.caller} on rank {call.me}: the process group's store failed during the "
            f"input agreement after {call.elapsed():.2f} s: {exc}", call.ranks) from exc
    if problem is not None:
        _refused(call, here)
        raise ValueError(f"{call.caller} on rank {call.me}: {problem}; nothing was sent")


def _gather(call: Call, record: dict[str, Any], here: dict[str, Any]) -> dict[int, dict]:
    store, key = call.store, f"{call.key}/records"
    store.set(call.at_key(call.me), json.dumps(here))
    store.append(key, json.dumps(record) + "\n")
    got: dict[int, dict] = {}
    pause, next_scan = POLL_S[0], SCAN_S[0]
    while True:
        for line in store.get(key).decode().splitlines():
            rec = json.loads(line)
            got[rec["rank"]] = rec
        missing = [q for q in call.ranks if q not in got]
        if not missing:
            break
        if call.elapsed() >= next_scan:
            conflict = _conflict(call, missing, record["what"])
            if conflict is not None:
                raise ValueError(f"{call.caller} on rank {call.me}: {conflict}; nothing was sent")
            next_scan = call.elapsed() + SCAN_S[1]
        if call.elapsed() > call.timeout:
            raise ReshardError(_absent(call, missing), tuple(missing), failed=tuple(missing))
        time.sleep(pause)
        pause = min(2 * pause, POLL_S[1])
    if store.add(f"{call.key}/read", 1) == len(call.ranks):  # the last reader cleans up
        store.delete_key(key)
        store.delete_key(f"{call.key}/read")
    return got


def _where(call: Call, rank: int) -> dict[str, Any] | None:
    key = call.at_key(rank)
    if not call.store.check([key]):
        return None
    return json.loads(call.store.get(key).decode())


def _conflict(call: Call, missing: list[int], what: str) -> str | None:
    for q in missing:
        at = _where(call, q)
        if at is None or at["digest"] == call.digest:
            continue  # never called, or in an earlier, the same or a later call of these ranks
        theirs = f"{at['what']} over ranks {_ranks(at['ranks'])}"
        mine = f"{what} over ranks {_ranks(call.ranks)}"
        advice = ("every rank of a plan must call with the same plan (are meshes or plans built "
                  "differently on different ranks, e.g. a sub-mesh that differs per rank?)")
        if call.me in at["ranks"] and at["number"] >= calls_made(call.group, at["digest"]):
            return (f"rank {q} waits for this rank in a call with another plan ({theirs}), while "
                    f"this rank's plan ({mine}) waits for rank {q}: {advice}")
        if at["state"] == "refused" and at.get("wall", 0.0) > call.wall - RECENT_S:
            return (f"rank {q} refused its call with another plan ({theirs}), while this rank's "
                    f"plan ({mine}) waits for it: {advice}")
    return None


def _absent(call: Call, missing: list[int]) -> str:
    where = []
    for q in missing[:4]:
        at = _where(call, q)
        if at is None:
            where.append(f"rank {q} has not called meshcast on this process group")
        elif at["call"] == call.key:
            where.append(f"rank {q} joined but its record did not arrive")
        else:
            where.append(f"rank {q} is in another call ({at['what']} over ranks "
                         f"{_ranks(at['ranks'])}, {at['state']})")
    return (
        f"{call.caller} on rank {call.me}: ranks {missing} did not join the input agreement "
        f"within {call.timeout:g} s ({'; '.join(where)}) (ranks involved: {list(call.ranks)}); "
        f"nothing was sent"
    )


def _compare(call: Call, records: dict[int, dict]) -> str | None:
    """Why the ranks cannot go ahead (None: they can); the same text on every rank but the one
    whose own input is wrong, which gets its own error first."""
    mine = records[call.me]
    if mine["error"] is not None:
        return mine["error"]
    plans = [q for q in call.ranks if records[q]["plan"] != mine["plan"]]
    if plans:
        q = plans[0]
        return (f"ranks {plans} called with different plans than rank {call.me} (rank {q}: "
                f"{records[q]['what']}; rank {call.me}: {mine['what']}); every rank must pass "
                f"the same plans in the same order")
    for name, value in mine["options"].items():
        differ = [q for q in call.ranks if records[q]["options"].get(name) != value]
        if differ:
            theirs = records[differ[0]]["options"].get(name)
            return (f"ranks {differ} passed {name}={theirs!r} where rank {call.me} passed "
                    f"{value!r}: it must be the same on every rank")
    bad = [q for q in call.ranks if records[q]["error"] is not None]
    if bad:
        first = records[bad[0]]
        return (f"ranks {bad} passed inputs that do not fit the plans (rank {bad[0]}: "
                f"{first['error']})")
    return None


def _refused(call: Call, here: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        call.store.set(call.at_key(call.me), json.dumps({**here, "state": "refused",
                                                         "wall": time.time()}))


def refuse_early(group: object, me: int, what: str) -> None:
    """Say in the store that this rank refused a call before it could join an agreement (its
    arguments were unusable), so that peers waiting for it refuse at once instead of timing out.
    Best effort: nothing happens without an initialised process group."""
    from .board import store_of

    here = {"call": "", "digest": "", "number": -1, "ranks": [], "what": what,
            "state": "refused", "wall": time.time()}
    with contextlib.suppress(Exception):
        store_of(group).set(Call.at_key(me), json.dumps(here))


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    return str(ranks)
