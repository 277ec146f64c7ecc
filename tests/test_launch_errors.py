"""``meshcast.launch`` shows a failing rank's own error, on loopback and on an emulated cluster:
its traceback when it could report, else its exit code and the end of its stderr; a script
without an ``if __name__ == "__main__":`` guard gets an error that says exactly that. Real
processes, real scripts run as ``__main__``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import meshcast
from meshcast.cluster import Cluster, available
from meshcast.runtime import LaunchError

OK, REASON = available()
GUARD = 'the script has no `if __name__ == "__main__":` guard'


def _dies_saying_why(rank: int) -> int:
    import torch.distributed as dist

    if rank == 1:
        print("rank 1: the disk is on fire", file=sys.stderr, flush=True)
        os._exit(7)  # no Python error, no report: only the exit code and stderr tell
    dist.barrier()
    return rank


def _killed(rank: int) -> int:
    import signal

    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return rank


def _script(tmp_path, body: str, cluster: str | None = None) -> subprocess.CompletedProcess:
    """Run ``body`` as a script of its own (``__main__``), in ``tmp_path``."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body).replace("CLUSTER", repr(cluster)))
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)


NO_GUARD = """
    import meshcast
    from meshcast.cluster import Cluster

    def double(rank):
        return 2 * rank

    cluster = Cluster.detect(CLUSTER) if CLUSTER else None
    print(meshcast.launch(double, 2, cluster=cluster, timeout=60))
"""

DIES_AT_IMPORT = """
    import os, sys
    import meshcast
    from meshcast.cluster import Cluster

    def double(rank):
        return 2 * rank

    if __name__ == "__mp_main__" and os.environ["RANK"] == "1":  # only when a rank imports it
        sys.stderr.write("rank 1 cannot start: the licence server is down\\n")
        sys.stderr.flush()
        os._exit(5)

    if __name__ == "__main__":
        cluster = Cluster.detect(CLUSTER) if CLUSTER else None
        meshcast.launch(double, 2, cluster=cluster, timeout=60)
"""

IMPORT_ERROR = """
    import meshcast
    from meshcast.cluster import Cluster

    def double(rank):
        return 2 * rank

    if __name__ == "__mp_main__":  # a module only the parent has
        import no_such_module_for_meshcast_tests

    if __name__ == "__main__":
        cluster = Cluster.detect(CLUSTER) if CLUSTER else None
        meshcast.launch(double, 2, cluster=cluster, timeout=60)
"""


def _check_no_guard(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "LaunchError" in done.stderr and GUARD in done.stderr
    assert done.stderr.count(GUARD) >= 2  # every rank says it (ranks 0 and 1)
    assert "put the code that starts the job under that guard" in done.stderr


def _check_dies_at_import(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 1, done.stderr[-3000:]
    message = done.stderr[done.stderr.index("LaunchError: "):]
    assert "rank 1: exited with code 5 before reporting a result; the end of its stderr:\n" \
           "    rank 1 cannot start: the licence server is down" in message


def _check_import_error(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 1, done.stderr[-3000:]
    message = done.stderr[done.stderr.index("LaunchError: "):]
    assert "failed while importing the main script" in message
    assert "ModuleNotFoundError: No module named 'no_such_module_for_meshcast_tests'" in message


# -- loopback -------------------------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_a_rank_that_dies_is_shown_with_its_stderr() -> None:
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        meshcast.launch(_dies_saying_why, 3, timeout=60)
    failures = info.value.failures
    assert failures[1] == ("exited with code 7 before reporting a result; the end of its "
                           "stderr:\n    rank 1: the disk is on fire")
    # the rank that died is the one shown in full, not a peer that lost its connection to it
    assert str(info.value).splitlines()[1] == f"rank 1: {failures[1].splitlines()[0]}"
    assert "rank 1: the disk is on fire" in str(info.value)
    assert time.monotonic() - start < 120


@pytest.mark.timeout(240)
def test_a_rank_killed_by_a_signal_is_named_so() -> None:
    with pytest.raises(LaunchError) as info:
        meshcast.launch(_killed, 2, timeout=60)
    assert info.value.failures[1] == ("killed by signal 9 (SIGKILL) before reporting a result "
                                      "(nothing on its stderr)")


@pytest.mark.timeout(300)
def test_a_script_without_main_guard_is_told_so(tmp_path) -> None:
    _check_no_guard(_script(tmp_path, NO_GUARD))


@pytest.mark.timeout(300)
def test_a_rank_dying_while_it_imports_the_script_shows_its_stderr(tmp_path) -> None:
    _check_dies_at_import(_script(tmp_path, DIES_AT_IMPORT))


@pytest.mark.timeout(300)
def test_an_import_error_in_a_rank_is_shown(tmp_path) -> None:
    _check_import_error(_script(tmp_path, IMPORT_ERROR))


# -- emulated cluster -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    if not OK:
        pytest.skip(f"emulated cluster unavailable: {REASON}")
    c = Cluster.up(2, nic_gbit=1.0, latency_ms=0.0, name=f"mc-t{os.getpid()}-d")
    try:
        yield c
    finally:
        c.down()


@pytest.mark.timeout(240)
def test_cluster_rank_that_dies_is_shown_with_its_stderr(cluster: Cluster) -> None:
    with pytest.raises(LaunchError) as info:
        meshcast.launch(_dies_saying_why, 4, cluster=cluster, timeout=60)
    assert info.value.failures[1] == ("exited with code 7 before reporting a result; the end of "
                                      "its stderr:\n    rank 1: the disk is on fire")
    assert str(info.value).splitlines()[1].startswith("rank 1: exited with code 7")
    assert not any(cluster.pids().values()), "ranks left running inside the namespaces"


@pytest.mark.timeout(300)
def test_cluster_script_without_main_guard_is_told_so(cluster: Cluster, tmp_path) -> None:
    _check_no_guard(_script(tmp_path, NO_GUARD, cluster.name))


@pytest.mark.timeout(300)
def test_cluster_rank_dying_while_it_imports_the_script(cluster: Cluster, tmp_path) -> None:
    _check_dies_at_import(_script(tmp_path, DIES_AT_IMPORT, cluster.name))
    _check_import_error(_script(tmp_path, IMPORT_ERROR, cluster.name))
    assert not any(cluster.pids().values())
