"""The records a weight sync keeps in its joint group's store: the exchange of what each rank
holds (once), each sync's start (:func:`begin`: every rank has come, and the version pushed
follows the rules, before anything moves), and each sync's commit, which makes a version visible
on the engine only once every rank of both jobs succeeded (weight_sync.py)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from ..runtime.errors import ReshardError
from ..runtime.joint import JointGroup
from ..runtime.store_keys import wait_for_keys

__all__ = ["WeightSyncError", "begin", "commit", "exchange", "forget", "version_problem"]

POLL_S = (1e-3, 0.02)
"""First and longest pause between two looks at a sync's commit records."""
BEGIN_POLL_S = (1e-4, 5e-3)
"""First and longest pause between two looks at a sync's start records."""
VERSION_RULE = ("a push's version must be an int, the same on every trainer rank, and greater "
                "than the last version synced")
"""The rule of ``push(params, version)`` (docs/weight-sync.md, "Versions and atomicity")."""


class WeightSyncError(ReshardError):
    """A sync failed; the message names the ranks (as ``(job, rank)``) that failed first and the
    version the engine's parameters hold now. ``failed``: their joint ranks."""


def _who(group: JointGroup, exc: ReshardError) -> list[int]:
    return list(exc.failed or exc.ranks)


def _unreachable(group: JointGroup, caller: str, exc: BaseException) -> WeightSyncError:
    return WeightSyncError(
        f"{caller} on {group.role} rank {group.rank}: the rendezvous store at {group.address} "
        f"(held by trainer rank 0) cannot be reached, so trainer rank 0 has probably died: "
        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", (0,), (0,))


def exchange(group: JointGroup, key: str, record: dict[str, Any],
             timeout: float) -> dict[int, dict]:
    """Every joint rank's ``record`` under ``key``: ``{joint rank: record}``; raises
    :class:`WeightSyncError` naming the ranks that did not come within ``timeout``."""
    store, caller = group.store, "meshcast.WeightSync"
    keys = [f"{key}/{j}" for j in range(group.size)]
    try:
        store.set(keys[group.me], json.dumps(record))
        came = wait_for_keys(store, keys, timeout)
        missing = [] if came else [j for j, k in enumerate(keys) if not store.check([k])]
    except KeyboardInterrupt:  # Ctrl-C: the peers stop at once, naming this rank
        with contextlib.suppress(Exception):
            store.set(keys[group.me], json.dumps({"error": (
                "was interrupted (KeyboardInterrupt: SIGINT, Ctrl-C) while the WeightSync was "
                "being built")}))
        raise
    except Exception as exc:
        raise _unreachable(group, caller, exc) from exc
    if missing:
        raise WeightSyncError(
            f"{caller} on {group.role} rank {group.rank}: {group.describe(missing)} did not "
            f"describe their parameters within {timeout:g} s (every rank of both jobs builds "
            f"the WeightSync)", tuple(missing), tuple(missing))
    return {j: json.loads(v) for j, v in enumerate(store.multi_get(keys))}


def begin(group: JointGroup, key: str, record: dict[str, Any], timeout: float, kept: str,
          caller: str, interrupted: Callable[[], bool]) -> dict[int, dict]:
    """Write this rank's ``record`` of a sync under ``key`` and wait until every rank of both
    jobs has: ``{joint rank: record}``. The outcome is decided once (``compare_set``): ``"go"``
    by a rank that sees every record, or called off by a rank ``interrupted()`` (Ctrl-C) or
    timed out first; then :class:`WeightSyncError` on every rank, naming the rank, with
    ``kept`` (nothing has moved). Polled, so an interrupt is seen at once."""
    store, me = group.store, group.me
    keys, decision = [f"{key}/{j}" for j in range(group.size)], f"{key}/decision"
    start, pause = time.monotonic(), BEGIN_POLL_S[0]
    try:
        store.set(keys[me], json.dumps(record))
        while True:
            stop = interrupted()
            if store.check(keys):
                decided = store.compare_set(decision, "", "go").decode()
            elif stop or time.monotonic() - start > timeout:
                late = [j for j, k in enumerate(keys) if not store.check([k])]
                why = ({"failed": [me], "error": f"{group.describe([me])} was interrupted "
                        f"(KeyboardInterrupt: SIGINT, Ctrl-C) before the transfer"}
                       if stop else
                       {"failed": late, "error": f"{group.describe(late)} did not come to the "
                                                 f"sync within {timeout:g} s"})
                decided = store.compare_set(decision, "", json.dumps({"rank": me, **why}))
                decided = decided.decode()
            else:
                decided = store.get(decision).decode() if store.check([decision]) else ""
            if decided == "go":
                return {j: json.loads(v) for j, v in enumerate(store.multi_get(keys))}
            if decided:
                failed = tuple(json.loads(decided)["failed"])
                raise WeightSyncError(f"{caller} on {group.role} rank {group.rank}: "
                                      f"{json.loads(decided)['error']}; nothing was sent: {kept}",
                                      failed, failed)
            time.sleep(pause)
            pause = min(2 * pause, BEGIN_POLL_S[1])
    except WeightSyncError:
        raise
    except Exception as exc:
        raise _unreachable(group, caller, exc) from exc


def version_problem(group: JointGroup, records: dict[int, dict]) -> str | None:
    """Why the version of a push breaks :data:`VERSION_RULE`, naming the trainer ranks at fault
    (as ``(job, rank)``), from every rank's :func:`begin` record (``version``: the trainer's
    push, ``last``: the version this rank last synced or was told, ``error``); None: it
    follows it. The same on every rank, from the same records."""
    trainer = {j: records[j] for j in group.ranks("trainer")}
    bad = [j for j, r in trainer.items() if r.get("error")]
    if bad:
        return f"{group.describe(bad)}: {trainer[bad[0]]['error']}: {VERSION_RULE}"
    by: dict[int, list[int]] = {}
    for j, r in trainer.items():
        by.setdefault(r["version"], []).append(j)
    if len(by) > 1:
        said = "; ".join(f"{group.describe(js)} version {v}" for v, js in sorted(by.items()))
        return f"the trainer ranks pushed different versions ({said}): {VERSION_RULE}"
    (version, pushers), = by.items()
    lasts = {j: r["last"] for j, r in records.items() if r.get("last") is not None}
    last = max(lasts.values(), default=None)
    if last is None or version > last:
        return None
    holders = [j for j, v in lasts.items() if v == last]
    return (f"{group.describe(pushers)} pushed version {version}, not greater than the last "
            f"version synced, {last} (recorded by {group.describe(holders)}): {VERSION_RULE}")


def commit(group: JointGroup, key: str, version: int | None, failure: ReshardError | None,
           timeout: float, kept: str, caller: str,
           interrupted: Callable[[], bool] = lambda: False) -> int:
    """Say under ``key`` whether this rank's part of a sync succeeded and wait until every rank
    has: the version sent (the trainer ranks' ``version``, equal on all), or
    :class:`WeightSyncError` on every rank, naming the ranks that failed, with ``kept`` (what the
    engine's parameters hold now). A rank ``interrupted()`` while it waits fails the sync
    unless every rank had succeeded (then it commits too)."""
    store = group.store
    mine = {"ok": failure is None, "version": version, "rank": group.me,
            "failed": [] if failure is None else _who(group, failure),
            "error": None if failure is None else str(failure).splitlines()[0][:400]}
    try:
        store.set(f"{key}/{group.me}", json.dumps(mine))
        if failure is not None:
            store.compare_set(f"{key}/verdict", "", json.dumps(mine))
        store.add(f"{key}/done", 1)
    except Exception as exc:  # the store is gone, whatever else failed
        raise _unreachable(group, caller, exc) from exc
    if failure is not None:  # said in the store where it could be: the others raise too
        who = group.describe(mine["failed"]) if mine["failed"] else "an unknown rank"
        raise WeightSyncError(f"{caller} on {group.role} rank {group.rank} failed ({who} failed "
                              f"first); {kept}: {failure}", tuple(mine["failed"]),
                              tuple(mine["failed"])) from failure
    try:
        records = _wait_commits(group, key, timeout, kept, caller, interrupted)
    except WeightSyncError:
        raise
    except Exception as exc:
        raise _unreachable(group, caller, exc) from exc
    trainer = [r for r in records if r["rank"] in group.ranks("trainer")]
    if len({r["version"] for r in trainer}) != 1:  # (begin refused it before anything moved)
        said = "; ".join(f"{group.describe([r['rank']])} version {r['version']}" for r in trainer)
        raise WeightSyncError(f"{caller} on {group.role} rank {group.rank}: the trainer ranks "
                              f"pushed different versions ({said}); {kept}")
    return trainer[0]["version"]


def _wait_commits(group: JointGroup, key: str, timeout: float, kept: str, caller: str,
                  interrupted: Callable[[], bool]) -> list[dict]:
    """Every rank's commit record once the sync's verdict is ``"ok"``; else
    :class:`WeightSyncError`. The verdict is set once (``compare_set``): ``"ok"`` by a rank that
    sees every rank's success, a failure by the first rank that failed, that timed out waiting
    or that was interrupted, so a rank that comes late to a sync others gave up never commits
    it."""
    store, verdict = group.store, f"{key}/verdict"
    start, pause = time.monotonic(), POLL_S[0]
    while True:
        if store.add(f"{key}/done", 0) >= group.size:
            decided = store.compare_set(verdict, "", "ok").decode()
        elif interrupted():
            stop = {"rank": group.me, "failed": [group.me],
                    "error": f"{group.describe([group.me])} was interrupted (KeyboardInterrupt: "
                             f"SIGINT, Ctrl-C) while it waited for the sync's commit"}
            decided = store.compare_set(verdict, "", json.dumps(stop)).decode()
        elif time.monotonic() - start > timeout:
            missing = [j for j in range(group.size) if not store.check([f"{key}/{j}"])]
            late = {"rank": group.me, "failed": missing,
                    "error": f"{group.describe(missing)} did not finish the sync within "
                             f"{timeout:g} s"}
            decided = store.compare_set(verdict, "", json.dumps(late)).decode()
        else:
            decided = store.get(verdict).decode() if store.check([verdict]) else ""
        if decided == "ok":
            records = [json.loads(v)
                       for v in store.multi_get([f"{key}/{j}" for j in range(group.size)])]
            _all_read(group, key, start + timeout)
            return records
        if decided:
            first = json.loads(decided)
            failed = tuple(first["failed"] or [first["rank"]])
            raise WeightSyncError(
                f"{caller} on {group.role} rank {group.rank}: the sync failed on "
                f"{group.describe([first['rank']])} ({group.describe(list(failed))} failed "
                f"first: {first['error']}); {kept}", failed, failed)
        time.sleep(pause)
        pause = min(2 * pause, POLL_S[1])


def _all_read(group: JointGroup, key: str, deadline: float) -> None:
    """Count this rank's read of the sync's success; on the rank that holds the store (joint
    rank 0, the trainer's rank 0), wait until every rank has read it (or ``deadline``): were it
    to exit at once, a rank still reading would find no store and fail a sync its peers
    committed."""
    store = group.store
    store.add(f"{key}/read", 1)
    pause = POLL_S[0]
    while group.me == 0 and store.add(f"{key}/read", 0) < group.size \
            and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(2 * pause, POLL_S[1])


def forget(group: JointGroup, key: str,
           shared: tuple[str, ...] = ("done", "verdict", "read")) -> None:
    """Delete this rank's record of an earlier sync under ``key`` (which every rank has read
    once every rank has begun a later one), and on joint rank 0 the ``shared`` keys under it
    (the sync's decision or counters), so the store does not grow with the number of syncs."""
    store = group.store
    keys = [f"{key}/{group.me}"] + ([f"{key}/{s}" for s in shared] if group.me == 0 else [])
    for k in keys:
        with contextlib.suppress(Exception):  # the store gone: nothing to keep tidy
            store.delete_key(k)
