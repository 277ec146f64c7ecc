"""The records a weight sync keeps in its joint group's store: the exchange of what each rank
holds (once), and each sync's commit, which makes a version visible on the engine only once every
rank of both jobs succeeded (weight_sync.py)."""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from typing import Any

from ..runtime.errors import ReshardError
from ..runtime.joint import JointGroup

__all__ = ["WeightSyncError", "commit", "exchange", "forget"]

POLL_S = (1e-3, 0.02)
"""First and longest pause between two looks at a sync's commit records."""


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
        store.wait(keys, datetime.timedelta(seconds=timeout))
    except Exception as exc:
        try:
            missing = [j for j, k in enumerate(keys) if not store.check([k])]
        except Exception:
            raise _unreachable(group, caller, exc) from exc
        raise WeightSyncError(
            f"{caller} on {group.role} rank {group.rank}: {group.describe(missing)} did not "
            f"describe their parameters within {timeout:g} s (every rank of both jobs builds "
            f"the WeightSync)", tuple(missing), tuple(missing)) from exc
    return {j: json.loads(v) for j, v in enumerate(store.multi_get(keys))}


def commit(group: JointGroup, key: str, version: int | None, failure: ReshardError | None,
           timeout: float, kept: str, caller: str) -> int:
    """Say under ``key`` whether this rank's part of a sync succeeded and wait until every rank
    has: the version sent (the trainer ranks' ``version``, equal on all), or
    :class:`WeightSyncError` on every rank, naming the ranks that failed, with ``kept`` (what the
    engine's parameters hold now)."""
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
        records = _wait_commits(group, key, timeout, kept, caller)
    except WeightSyncError:
        raise
    except Exception as exc:
        raise _unreachable(group, caller, exc) from exc
    versions = sorted({r["version"] for r in records if r["rank"] in group.ranks("trainer")})
    if len(versions) != 1:
        raise WeightSyncError(f"{caller} on {group.role} rank {group.rank}: the trainer ranks "
                              f"pushed different versions {versions}; {kept}")
    return versions[0]


def _wait_commits(group: JointGroup, key: str, timeout: float, kept: str,
                  caller: str) -> list[dict]:
    """Every rank's commit record once the sync's verdict is ``"ok"``; else
    :class:`WeightSyncError`. The verdict is set once (``compare_set``): ``"ok"`` by a rank that
    sees every rank's success, a failure by the first rank that failed or that timed out
    waiting, so a rank that comes late to a sync others gave up never commits it."""
    store, verdict = group.store, f"{key}/verdict"
    start, pause = time.monotonic(), POLL_S[0]
    while True:
        if store.add(f"{key}/done", 0) >= group.size:
            decided = store.compare_set(verdict, "", "ok").decode()
        elif time.monotonic() - start > timeout:
            missing = [j for j in range(group.size) if not store.check([f"{key}/{j}"])]
            late = {"rank": group.me, "failed": missing,
                    "error": f"{group.describe(missing)} did not finish the sync within "
                             f"{timeout:g} s"}
            decided = store.compare_set(verdict, "", json.dumps(late)).decode()
        else:
            decided = store.get(verdict).decode() if store.check([verdict]) else ""
        if decided == "ok":
            return [json.loads(v)
                    for v in store.multi_get([f"{key}/{j}" for j in range(group.size)])]
        if decided:
            first = json.loads(decided)
            failed = tuple(first["failed"] or [first["rank"]])
            raise WeightSyncError(
                f"{caller} on {group.role} rank {group.rank}: the sync failed on "
                f"{group.describe([first['rank']])} ({group.describe(list(failed))} failed "
                f"first: {first['error']}); {kept}", failed, failed)
        time.sleep(pause)
        pause = min(2 * pause, POLL_S[1])


def forget(group: JointGroup, key: str) -> None:
    """Delete this rank's commit record under ``key`` (an earlier sync's, which every rank has
    read once any rank has committed a later one), and on joint rank 0 the sync's counters, so
    the store does not grow with the number of syncs."""
    store = group.store
    keys = [f"{key}/{group.me}"] + ([f"{key}/done", f"{key}/verdict"] if group.me == 0 else [])
    for k in keys:
        with contextlib.suppress(Exception):  # the store gone: nothing to keep tidy
            store.delete_key(k)
