"""The two jobs of tests/test_weight_sync_interrupts.py: a trainer and an engine of 2 ranks each,
launched separately, meeting through ``meshcast.connect``; two float32 tensors ``a`` and ``b``
(4 x 6, rows cut over the 2 ranks on both sides), version ``v`` being ``base + v``.

Every sync in turn (the same list on every rank of both jobs), each a real push/receive pair:

* ``ok``: a plain sync.
* Ctrl-C (SIGINT, sent by the process to itself at a point set up here) on one rank: in the
  middle of the transfer (trainer rank 1, from its ``convert``), in the transfer's input
  agreement (trainer rank 0, as it calls the transfer), after the start but before the transfer
  (trainer rank 1, as it checks the versions), while waiting for the other job to come (engine
  rank 0, its peers coming later), while waiting for the commit (engine rank 0, trainer rank 1
  late to commit), and once every rank committed (engine rank 0);
* versions against the rule: the last one again, a lower one, different versions on the two
  trainer ranks, a version that is not an int.

Before those, a WeightSync that engine rank 0 is interrupted in building (reported last).

Each rank reports ``[case, what happened, the version its sync holds, and (engine) whether its
parameters hold exactly that version]``.
"""

from __future__ import annotations

import os
import signal
import time

import meshcast as mc

SHAPE = (4, 6)
TIMEOUT = 30.0  # a test that waited it out would say so ("within 30 s")
CASES = [
    ("ok", 1), ("transfer", 2), ("ok", 2), ("agreement", 3), ("ok", 3), ("before", 4),
    ("ok", 4), ("come", 5), ("ok", 5), ("commit", 6), ("ok", 6), ("committed", 7),
    ("same", 7), ("lower", 3), ("differ", 8), ("not an int", 8), ("ok", 8),
]
"""(case, version pushed), in order."""


def full(name: str, version: int):
    """Tensor ``name`` at ``version``."""
    import torch

    return torch.arange(24, dtype=torch.float32).view(SHAPE) + 100 * "ab".index(name) + version


def _ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def _patch(module, name: str, before) -> None:
    """Make ``module.name`` run ``before(*args)`` first, once, then be itself again."""
    original = getattr(module, name)

    def once(*args, **kwargs):
        setattr(module, name, original)
        before(*args)
        return original(*args, **kwargs)

    setattr(module, name, once)


def _arm(case: str, role: str, rank: int, state: dict) -> None:
    """Set up this rank's part of ``case`` (module docstring)."""
    from meshcast.interop import sync_store, weight_sync

    if case == "transfer" and (role, rank) == ("trainer", 1):
        state["ctrl_c_at_convert"] = True
    elif case == "agreement" and (role, rank) == ("trainer", 0):
        _patch(weight_sync, "run_many", lambda *a: _ctrl_c())
    elif case == "before" and (role, rank) == ("trainer", 1):
        _patch(weight_sync, "version_problem", lambda *a: _ctrl_c())
    elif case == "come":  # engine rank 0 is interrupted as it waits for the trainer to come
        if (role, rank) == ("engine", 0):
            signal.signal(signal.SIGALRM, lambda *_: _ctrl_c())
            signal.setitimer(signal.ITIMER_REAL, 0.5)
        elif role == "trainer":
            time.sleep(2.0)
    elif case == "commit" and (role, rank) == ("trainer", 1):  # late to commit
        _patch(weight_sync, "commit", lambda *a: time.sleep(1.0))
    elif case == "commit" and (role, rank) == ("engine", 0):
        _patch(sync_store, "_wait_commits", lambda *a: _ctrl_c())
    elif case == "committed" and (role, rank) == ("engine", 0):
        def all_done(group, key, *rest) -> None:  # every rank committed, then Ctrl-C
            while group.store.add(f"{key}/done", 0) < group.size:
                time.sleep(0.01)
            _ctrl_c()

        _patch(sync_store, "_wait_commits", all_done)


def _version(case: str, version: int, rank: int) -> object:
    if case == "differ":
        return version + rank
    if case == "not an int":
        return str(version) if rank == 1 else version
    return version


def run(rank: int, address: str, role: str) -> list:
    """One rank of ``role``'s job: every case of :data:`CASES`; the report."""
    import torch

    # the program under test has Python's own handler (a process a non-interactive shell starts
    # in the background inherits SIGINT ignored, and Python then leaves it ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    group = mc.connect(address, role, model="interrupts", timeout=60)
    two = mc.Layout(mc.Mesh([0, 1]), "S0R")
    desc = {n: mc.ParamSpec(SHAPE, torch.float32, two) for n in "ab"}
    state = {"ctrl_c_at_convert": False}

    def convert(name, shard, dtype):
        if state["ctrl_c_at_convert"]:
            state["ctrl_c_at_convert"] = False
            _ctrl_c()
        return shard.to(dtype)

    built = _interrupted_build(group, desc, role, rank)
    sync = mc.WeightSync(group, desc, convert=convert, timeout=TIMEOUT)
    params = {n: torch.zeros(2, 6) for n in "ab"}
    report = []
    for case, version in CASES:
        _arm(case, role, rank, state)
        try:
            if role == "trainer":
                mine = {n: full(n, version)[2 * rank: 2 * rank + 2] for n in "ab"}
                got = f"ok {sync.push(mine, version=_version(case, version, rank)).version}"
            else:
                got = f"ok {sync.receive(params).version}"
        except (KeyboardInterrupt, ValueError, mc.ReshardError) as exc:
            got = f"{type(exc).__name__}: {exc}"
        exact = role == "engine" and all(
            torch.equal(params[n], full(n, sync.version)[2 * rank: 2 * rank + 2]) for n in "ab")
        report.append([case, got, sync.version, exact])
    mc.disconnect(group)
    return [*report, ["build", *built]]


def _interrupted_build(group, desc: dict, role: str, rank: int) -> list:
    """A WeightSync that engine rank 0 is interrupted in building, as it waits for the trainer
    (which comes 2 s later): ``[what happened, seconds]`` on this rank."""
    if (role, rank) == ("engine", 0):
        signal.signal(signal.SIGALRM, lambda *_: _ctrl_c())
        signal.setitimer(signal.ITIMER_REAL, 1.0)
    elif role == "trainer":
        time.sleep(3.0)
    start = time.monotonic()
    try:
        mc.WeightSync(group, desc, timeout=TIMEOUT)
        got = "built"
    except (KeyboardInterrupt, ValueError, mc.ReshardError) as exc:
        got = f"{type(exc).__name__}: {exc}"
    return [got, time.monotonic() - start]
