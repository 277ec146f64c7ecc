"""Refused calls keep the ranks' calls apart, and Ctrl-C on one rank ends the call everywhere.

One launched job of 4 ranks (2 emulated hosts of 2), gloo on real processes:

* **Refusals in a row.** A call that one rank makes with other plans than its peers (its count of
  the peers' plan then lags theirs), then a call that every rank refuses before joining it (here
  ``reshard_many`` with fewer tensors than plans), used to leave that rank one call number
  behind its peers for good: its next call of the same plans waited ``timeout`` in a call its
  peers never joined while they waited in another (found by probing; the refused call's name is
  now settled in the store, so a rank that lags renumbers past it). Every later call must go
  ahead, exactly, at once.
* **Ctrl-C on one rank** (SIGINT, ``KeyboardInterrupt``), in the middle of a transfer, in a
  program that catches it and lives on: its peers waited the whole ``timeout``, were told the
  rank "stopped responding" and had their process group closed by gloo's time-out. Now the
  interrupt is this rank's failure on the call's board: every peer raises at once naming it,
  the interrupted rank raises ``KeyboardInterrupt``, and the group still works. The same in the
  input agreement: peers that come later refuse at once. And in the argument checks before it
  (found by a timing fuzz): the rank left before joining, with nothing in the store, so its next
  call met its peers' current one, and every call after was refused or waited ``timeout``.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import meshcast
from meshcast import Layout, Mesh, ReshardTask, Topology

WORLD = 4
TOPOLOGY = Topology.uniform(2, 2)
TIMEOUT = 60.0  # every outcome must come long before it


def _plans() -> tuple:
    src = Layout(Mesh.from_range(0, (2,)), "S0R")
    rows = ReshardTask((4096, 8), "float32", src, Layout(Mesh.from_range(2, (2,)), "RS0"))
    cols = ReshardTask((4096, 8), "float32", src, Layout(Mesh.from_range(2, (2,)), "S0R"))
    return meshcast.plan(rows, TOPOLOGY), meshcast.plan(cols, TOPOLOGY)


def _attempt(fn) -> tuple[str, float]:
    """What ``fn()`` gave ("exact", "wrong") or raised (its type and text), and its seconds."""
    start = time.monotonic()
    try:
        text = "exact" if fn() else "wrong"
    except (ValueError, meshcast.ReshardError, KeyboardInterrupt) as exc:
        text = f"{type(exc).__name__}: {exc}"
    return text, time.monotonic() - start


def _exact_many(rank: int, plans: list, full) -> bool:
    import torch

    local = [None if p.task.src_box(rank) is None else full[p.task.src_box(rank)].clone()
             for p in plans]
    got = meshcast.reshard_many(local, plans, timeout=TIMEOUT)
    return all((g is None and p.task.dst_box(rank) is None)
               or torch.equal(g, full[p.task.dst_box(rank)]) for g, p in zip(got, plans))


def _refusals(rank: int, full) -> dict:
    rows, cols = _plans()
    local = full[rows.task.src_box(rank)].clone() if rank < 2 else None
    out = {"mismatch": _attempt(lambda: meshcast.reshard_many(
        [local] if rank == 0 else [local, local], [rows] if rank == 0 else [rows, cols],
        timeout=TIMEOUT))}
    out["too few"] = _attempt(lambda: meshcast.reshard_many([local], [rows, cols],
                                                            timeout=TIMEOUT))
    out["other plans"] = _attempt(lambda: _exact_many(rank, [rows, rows], full))
    out["again"] = _attempt(lambda: _exact_many(rank, [rows, cols], full))
    out["once more"] = _attempt(lambda: _exact_many(rank, [rows, cols], full))
    return out


def _interrupt_at(count: int) -> None:
    """Send this process SIGINT when it is about to post its ``count``-th message."""
    from meshcast.runtime import p2p

    original, posted = p2p.Links.isend, [0]

    def isend(self, *args, **kwargs):
        posted[0] += 1
        if posted[0] == count:
            p2p.Links.isend = original
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, *args, **kwargs)

    p2p.Links.isend = isend


def _interrupts(rank: int, full) -> dict:
    import torch

    rows, _ = _plans()
    local = full[rows.task.src_box(rank)].clone() if rank < 2 else None
    want = full[rows.task.dst_box(rank)] if rank >= 2 else None

    def exact(got) -> bool:
        return (got is None and want is None) or torch.equal(got, want)

    if rank == 0:
        _interrupt_at(2)  # rows: rank 0 sends its half to ranks 2 and 3
    out = {"transfer": _attempt(lambda: exact(meshcast.reshard(
        local, rows, timeout=TIMEOUT, chunk_bytes=4096)))}
    out["after transfer"] = _attempt(lambda: exact(meshcast.reshard(local, rows,
                                                                    timeout=TIMEOUT)))
    if rank == 0:  # the others come a second later: rank 0 waits for them in the agreement
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    else:
        time.sleep(1.5)
    out["agreement"] = _attempt(lambda: exact(meshcast.reshard(local, rows, timeout=TIMEOUT)))
    out["after agreement"] = _attempt(lambda: exact(meshcast.reshard(local, rows,
                                                                     timeout=TIMEOUT)))
    from meshcast.runtime import execute, many

    for key, module, name, call in (
            ("agreed", execute, "_transfer", lambda: exact(meshcast.reshard(
                local, rows, timeout=TIMEOUT))),
            ("agreed many", many, "Links", lambda: _exact_many(rank, [rows], full))):
        if rank == 0:  # Ctrl-C once the agreement is over, before the transfers begin
            _interrupt_on(module, name)
        out[key] = _attempt(call)
        out[f"after {key}"] = _attempt(call)
    for key, module, name, call in (
            ("checks", execute, "_validate", lambda: exact(meshcast.reshard(
                local, rows, timeout=TIMEOUT))),
            ("checks many", many, "_check_arguments", lambda: _exact_many(rank, [rows], full))):
        if rank == 0:  # Ctrl-C in the argument checks, before this rank joins; the others come
            _interrupt_on(module, name)  # a second later, so it calls the call off
        else:
            time.sleep(1.0)
        out[key] = _attempt(call)
        out[f"after {key}"] = _attempt(call)
    return out


def _interrupt_on(module, name: str) -> None:
    """Send this process SIGINT when ``module.name`` is next called (then call it)."""
    original = getattr(module, name)

    def first(*args, **kwargs):
        setattr(module, name, original)
        os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    setattr(module, name, first)


def _job(rank: int) -> dict:
    import torch

    # the program under test has Python's own handler (a process a non-interactive shell starts
    # in the background inherits SIGINT ignored, and Python then leaves it ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    full = torch.arange(4096 * 8, dtype=torch.float32).reshape(4096, 8)
    return {**_refusals(rank, full), **_interrupts(rank, full)}


@pytest.fixture(scope="module")
def job() -> list[dict]:
    return meshcast.launch(_job, WORLD, hosts=TOPOLOGY, timeout=300)


@pytest.mark.timeout(400)
def test_calls_after_refusals_in_a_row_go_ahead_at_once(job: list[dict]) -> None:
    for rank in range(WORLD):
        mismatch, seconds = job[rank]["mismatch"]
        assert mismatch.startswith(f"ValueError: meshcast.reshard_many on rank {rank}: "), mismatch
        assert mismatch.endswith("; nothing was sent"), mismatch
        assert seconds < TIMEOUT / 4, (rank, mismatch, seconds)
        assert job[rank]["too few"][0] == ("ValueError: tensors has 1 entries but plans has 2: "
                                           "give one plan per tensor")
        for key in ("other plans", "again", "once more"):
            assert job[rank][key][0] == "exact", (rank, key, job[rank][key])
            assert job[rank][key][1] < TIMEOUT / 4, (rank, key, job[rank][key])


@pytest.mark.timeout(400)
def test_ctrl_c_on_one_rank_ends_the_call_on_every_rank_at_once(job: list[dict]) -> None:
    text, seconds = job[0]["transfer"]
    assert text.startswith("KeyboardInterrupt: meshcast.reshard on rank 0 failed after "), text
    assert ("rank 0 failed first: it raised KeyboardInterrupt: SIGINT (Ctrl-C) in the middle of "
            "its transfers") in text, text
    assert seconds < TIMEOUT / 4, (text, seconds)
    for rank in range(1, WORLD):
        text, seconds = job[rank]["transfer"]
        assert text.startswith(f"ReshardError: meshcast.reshard on rank {rank} failed after "), \
            text
        assert ("rank 0 failed first: it raised KeyboardInterrupt: SIGINT (Ctrl-C) in the "
                "middle of its transfers") in text, text
        assert "stopped responding" not in text and "timed out" not in text, text
        assert seconds < TIMEOUT / 4, (rank, text, seconds)
    for rank in range(WORLD):  # the process group still works
        assert job[rank]["after transfer"][0] == "exact", (rank, job[rank]["after transfer"])
        assert job[rank]["after agreement"][0] == "exact", (rank, job[rank]["after agreement"])


@pytest.mark.timeout(400)
def test_ctrl_c_in_the_agreement_is_refused_on_every_rank(job: list[dict]) -> None:
    text, seconds = job[0]["agreement"]
    assert text == "KeyboardInterrupt: ", text
    for rank in range(1, WORLD):
        text, seconds = job[rank]["agreement"]
        assert text == (f"ValueError: meshcast.reshard on rank {rank}: rank 0 called the call "
                        f"off: rank 0 was interrupted (KeyboardInterrupt) in the input "
                        f"agreement; nothing was sent"), text
        assert seconds < TIMEOUT / 4, (rank, text, seconds)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("key, caller", [("agreed", "meshcast.reshard"),
                                         ("agreed many", "meshcast.reshard_many")])
def test_ctrl_c_right_after_the_agreement_ends_the_call_on_every_rank(
        job: list[dict], key: str, caller: str) -> None:
    """Ctrl-C after the ranks agreed, before the interrupted rank's transfers began: its peers go
    ahead, so it must not leave (they would wait ``timeout`` for its messages); the interrupt is
    its failure of the transfers, as in the middle of them: every peer raises naming it, or
    returns its exact result where everything it needed had arrived before the report reached
    the board (the report is made by a thread, so the interrupted rank's first messages may still
    carry data: docs/runtime.md, "Failures")."""
    said = ("rank 0 failed first: it raised KeyboardInterrupt: SIGINT (Ctrl-C) in the middle of "
            "its transfers")
    text, seconds = job[0][key]
    assert text.startswith(f"KeyboardInterrupt: {caller} on rank 0 failed after "), text
    for rank in range(WORLD):
        text, seconds = job[rank][key]
        assert said in text or (rank > 0 and text == "exact"), (rank, text)
        assert "stopped responding" not in text and "timed out" not in text, text
        assert seconds < TIMEOUT / 4, (rank, text, seconds)
        assert job[rank][f"after {key}"][0] == "exact", (rank, job[rank][f"after {key}"])


@pytest.mark.timeout(400)
@pytest.mark.parametrize("key, caller", [("checks", "meshcast.reshard"),
                                         ("checks many", "meshcast.reshard_many")])
def test_ctrl_c_in_the_argument_checks_calls_the_call_off_on_every_rank(
        job: list[dict], key: str, caller: str) -> None:
    """Ctrl-C before the interrupted rank joined the agreement (its arguments being checked):
    the call is called off on every rank, as in the agreement, and the next call goes ahead."""
    assert job[0][key][0] == "KeyboardInterrupt: ", job[0][key]
    for rank in range(1, WORLD):
        text, seconds = job[rank][key]
        assert text == (f"ValueError: {caller} on rank {rank}: rank 0 called the call off: rank 0 "
                        f"was interrupted (KeyboardInterrupt) in the input agreement; nothing "
                        f"was sent"), text
        assert seconds < TIMEOUT / 4, (rank, text, seconds)
    for rank in range(WORLD):
        assert job[rank][f"after {key}"][0] == "exact", (rank, job[rank][f"after {key}"])
        assert job[rank][f"after {key}"][1] < TIMEOUT / 4, (rank, job[rank][f"after {key}"])
