"""Ctrl-C on one rank during a weight sync, and versions against the rule, on two separately
launched jobs of 2 ranks each (gloo, real processes, loopback; weight_sync_interrupt_job.py).

Found by probing as an outside user:

* **Ctrl-C** (SIGINT, ``KeyboardInterrupt``) on one rank of a sync. As it called the transfer,
  the interrupted rank raised a bare ``KeyboardInterrupt`` and its count of the syncs parted
  from its peers': every later sync was refused on every rank (``passed sync='... sync #3'
  where rank 0 passed '... sync #4'``) and the last timed out. As it waited for the other job to
  come, its peers were told only that joint rank 2 "was interrupted in the input agreement", and
  the group was left as broken. While it waited for the commit, it left its peers waiting the
  whole ``timeout``. Now a sync defers SIGINT from its start to its commit: the interrupted rank
  fails the sync on every rank of both jobs at once, its peers raise naming it as ``(job, rank)``
  and the point it was at, it raises ``KeyboardInterrupt``, the engine's parameters keep the
  previous version (exactly), and the next sync goes ahead on every rank. Interrupted once every
  rank had committed, the rank finishes the commit (its parameters hold the new version) and then
  raises ``KeyboardInterrupt``.
* **Versions**: a push of the last version again, of a lower one, or of different versions on
  the trainer ranks was taken (the engine reported whatever came; different versions were found
  only after the bytes had moved, in an error naming no rank), and a version that is not an int
  raised ``TypeError`` on that trainer rank alone, leaving its peers waiting. Now each is refused
  on every rank of both jobs before anything moves, naming the trainer ranks, the versions and
  the rule.
"""

from __future__ import annotations

import socket
import threading

import pytest
import weight_sync_interrupt_job as job

import meshcast as mc

ROLES = ("trainer", "engine")
LEGEND = "joint ranks 0-1 are trainer ranks 0-1, 2-3 are engine ranks 0-1"
RULE = ("a push's version must be an int, the same on every trainer rank, and greater than the "
        "last version synced")
ALL = "trainer rank 0, trainer rank 1, engine rank 0, engine rank 1"


def _address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def seen() -> dict:
    """``{(role, rank): {case index: [case, text, version, exact]}}`` of both jobs."""
    address, results = _address(), {}

    def run(role: str) -> None:
        try:
            results[role] = mc.launch(job.run, 2, args=(address, role), timeout=120)
        except Exception as exc:  # reported by the test
            results[role] = exc

    threads = [threading.Thread(target=run, args=(role,), daemon=True) for role in ROLES]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    for role in ROLES:
        assert isinstance(results.get(role), list), results
    return {(role, rank): dict(enumerate(report))
            for role in ROLES for rank, report in enumerate(results[role])}


def _caller(role: str) -> str:
    return f"meshcast.WeightSync.{'push' if role == 'trainer' else 'receive'}"


def _kept(role: str, version: int) -> str:
    return ("the engine keeps its previous version" if role == "trainer" else
            f"this engine rank's parameters keep version {version} (nothing changed)")


def _case(seen: dict, k: int, case: str, version: int) -> dict:
    """``{(role, rank): text}`` of case ``k``; checks every engine rank holds ``version``
    exactly after it."""
    out = {}
    for who, report in seen.items():
        name, text, held, exact = report[k]
        assert name == case == job.CASES[k][0], (who, report[k])
        assert held == version, (who, report[k])
        assert exact or who[0] == "trainer", (who, report[k])  # byte for byte
        out[who] = text
    return out


def _everyone_else(texts: dict, interrupted: tuple[str, int]) -> dict:
    return {who: text for who, text in texts.items() if who != interrupted}


@pytest.mark.timeout(300)
def test_plain_syncs_between_the_failures_are_exact(seen: dict) -> None:
    for k, (case, version) in enumerate(job.CASES):
        if case == "ok":
            assert set(_case(seen, k, case, version).values()) == {f"ok {version}"}


@pytest.mark.timeout(300)
def test_ctrl_c_in_the_transfer_fails_the_sync_on_every_rank_naming_it(seen: dict) -> None:
    for k, who in ((1, ("trainer", 1)), (3, ("trainer", 0))):  # "transfer", "agreement"
        case, version = job.CASES[k]
        texts = _case(seen, k, case, version - 1)  # the engine keeps the previous version
        rank = who[1]
        assert texts[who].startswith(
            f"KeyboardInterrupt: meshcast.WeightSync.push on trainer rank {rank} failed "
            f"(trainer rank {rank} failed first); the engine keeps its previous version: "), texts
        said = (f"rank {rank} failed first: it raised KeyboardInterrupt: SIGINT (Ctrl-C) in the "
                f"middle of its transfers")
        assert said in texts[who], texts[who]
        for (role, r), text in _everyone_else(texts, who).items():
            assert text.startswith(f"WeightSyncError: {_caller(role)} on {role} rank {r}"), text
            assert f"trainer rank {rank} failed first" in text and said in text, text
            assert _kept(role, version - 1) in text, text
            assert "within" not in text, text  # nobody waited out the timeout


@pytest.mark.timeout(300)
def test_ctrl_c_before_the_transfer_is_refused_on_every_rank(seen: dict) -> None:
    texts = _case(seen, 5, "before", 3)
    why = "trainer rank 1 was interrupted (KeyboardInterrupt: SIGINT, Ctrl-C) before the transfer"
    kept = f"nothing was sent (the engine's parameters keep version 3; {LEGEND})"
    assert texts[("trainer", 1)] == (f"KeyboardInterrupt: meshcast.WeightSync.push on rank 1: "
                                     f"{why}; {kept}")
    for (role, r), text in _everyone_else(texts, ("trainer", 1)).items():
        joint = r if role == "trainer" else 2 + r
        assert text == (f"ValueError: {_caller(role)} on rank {joint}: ranks [1] passed inputs "
                        f"that do not fit the plans (rank 1: {why}); {kept}")


@pytest.mark.timeout(300)
def test_ctrl_c_while_waiting_for_the_other_job_is_named_on_both(seen: dict) -> None:
    texts = _case(seen, 7, "come", 4)
    why = "engine rank 0 was interrupted (KeyboardInterrupt: SIGINT, Ctrl-C) before the transfer"
    for (role, r), text in texts.items():
        kind = "KeyboardInterrupt" if (role, r) == ("engine", 0) else "WeightSyncError"
        assert text == (f"{kind}: {_caller(role)} on {role} rank {r}: {why}; nothing was sent: "
                        f"{_kept(role, 4)}")


@pytest.mark.timeout(300)
def test_ctrl_c_while_waiting_for_the_commit_fails_it_everywhere(seen: dict) -> None:
    texts = _case(seen, 9, "commit", 5)
    why = ("the sync failed on engine rank 0 (engine rank 0 failed first: engine rank 0 was "
           "interrupted (KeyboardInterrupt: SIGINT, Ctrl-C) while it waited for the sync's "
           "commit)")
    for (role, r), text in texts.items():
        kind = "KeyboardInterrupt" if (role, r) == ("engine", 0) else "WeightSyncError"
        assert text == f"{kind}: {_caller(role)} on {role} rank {r}: {why}; {_kept(role, 5)}"


@pytest.mark.timeout(300)
def test_ctrl_c_once_every_rank_committed_keeps_the_new_version(seen: dict) -> None:
    texts = _case(seen, 11, "committed", 7)
    assert texts.pop(("engine", 0)) == (
        "KeyboardInterrupt: meshcast.WeightSync.receive on engine rank 0 was interrupted "
        "(SIGINT, Ctrl-C) once the sync of version 7 had succeeded on every rank of both jobs: "
        "the engine's parameters hold version 7")
    assert set(texts.values()) == {"ok 7"}


@pytest.mark.timeout(300)
def test_versions_against_the_rule_are_refused_on_every_rank_naming_the_trainer_ranks(
        seen: dict) -> None:
    problems = {
        "same": f"trainer rank 0, trainer rank 1 pushed version 7, not greater than the last "
                f"version synced, 7 (recorded by {ALL}): {RULE}",
        "lower": f"trainer rank 0, trainer rank 1 pushed version 3, not greater than the last "
                 f"version synced, 7 (recorded by {ALL}): {RULE}",
        "differ": f"the trainer ranks pushed different versions (trainer rank 0 version 8; "
                  f"trainer rank 1 version 9): {RULE}",
        "not an int": f"trainer rank 1: version must be an int, got str: {RULE}",
    }
    for k, (case, _) in enumerate(job.CASES):
        if case not in problems:
            continue
        for (role, r), text in _case(seen, k, case, 7).items():  # the engine keeps version 7
            assert text == (f"ValueError: {_caller(role)} on {role} rank {r}: {problems[case]}; "
                            f"nothing was sent: {_kept(role, 7)}")


@pytest.mark.timeout(300)
def test_ctrl_c_while_building_a_weight_sync_stops_every_rank_at_once(seen: dict) -> None:
    """Ctrl-C on engine rank 0 as it waits for the trainer to describe its parameters: the wait
    blocked in the store client (``Store.wait``) until the timeout; now it is polled, and the
    peers are told at once."""
    built = {who: report[len(job.CASES)] for who, report in seen.items()}
    name, text, seconds = built[("engine", 0)]
    assert (name, text) == ("build", "KeyboardInterrupt: "), built
    assert seconds < job.TIMEOUT / 4, built
    for (role, r), (_, text, seconds) in built.items():
        if (role, r) != ("engine", 0):
            assert text == (f"ValueError: meshcast.WeightSync on {role} rank {r}: engine rank 0: "
                            f"was interrupted (KeyboardInterrupt: SIGINT, Ctrl-C) while the "
                            f"WeightSync was being built"), built
            assert seconds < job.TIMEOUT / 4, built
