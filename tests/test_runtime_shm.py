"""The intra-host shared-memory path of the ``"p2p"`` transport (runtime/shm.py) on real processes:
every strategy byte-exact through shared memory and through the loopback-socket fallback
(``MESHCAST_INTRA``), the segments really used and always released (also when a rank dies
mid-transfer), results written in place into the caller's ``out`` tensor.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch

import meshcast
from meshcast import Layout, Mesh, ReshardTask, Topology
from meshcast.runtime import LaunchError

TOPOLOGY = Topology.uniform(2, 4)  # hosts {0..3} {4..7}
SRC = Mesh([[0, 1], [2, 3]])
DST = Mesh([[4, 5], [6, 7]])
CASES = [  # (shape, src spec, dst spec, src mesh, dst mesh)
    ((24, 20), "RR", "RR", SRC, DST),  # a broadcast from host 0, fanned out on host 1
    ((24, 20), "S0R", "RR", SRC, DST),  # parts gathered across hosts
    ((24, 20), "RS0", "S1R", SRC, DST),  # strided boxes
    ((24, 20), "S0S1", "RR", Mesh([[4, 5], [6, 7]]), DST),  # all-gather inside host 1
    ((24, 20), "S0R", "S1R", Mesh([[4, 5], [6, 7]]), Mesh([[7, 6], [5, 4]])),  # sends in host 1
]
STRATEGIES = ("broadcast", "allgather", "send_recv")


def _segments_mapped() -> int:
    return Path("/proc/self/maps").read_text().count("meshcast-segment")


def _count_shm():
    """Count, in this process, the chunks written to and the receives done through segments."""
    from meshcast.runtime import shm

    counts = {"put": 0, "read": 0}
    put, run = shm.ShmWriter.put, shm.ShmReader.run

    def counted_put(self, *args):
        counts["put"] += 1
        return put(self, *args)

    def counted_run(self):
        counts["read"] += 1
        return run(self)

    shm.ShmWriter.put, shm.ShmReader.run = counted_put, counted_run
    return counts


def _full(shape) -> torch.Tensor:
    return torch.arange(shape[0] * shape[1], dtype=torch.int32).view(shape)


def _exact_runs(rank: int, counts: dict) -> list:
    out = []
    for mode in ("shm", "socket"):
        os.environ["MESHCAST_INTRA"] = mode
        before = dict(counts)
        for k, (shape, s, d, sm, dm) in enumerate(CASES):
            task = ReshardTask(shape, "int32", Layout(sm, s), Layout(dm, d))
            full = _full(shape)
            sbox, dbox = task.src_box(rank), task.dst_box(rank)
            local = None if sbox is None else full[sbox].clone()
            for strategy in STRATEGIES:
                p = meshcast.plan(task, TOPOLOGY, strategy=strategy)
                for ordered in (True, False):
                    got = meshcast.reshard(local, p, chunk_bytes=96, max_inflight_bytes=512,
                                           ordered=ordered, timeout=60)
                    ok = got is None if dbox is None else torch.equal(got, full[dbox])
                    out.append((mode, k, strategy, ordered, ok))
        used = counts["put"] + counts["read"] - before["put"] - before["read"]
        out.append((mode, "used shared memory", used > 0))
    os.environ.pop("MESHCAST_INTRA")
    return out


def _packed_fan_out(rank: int) -> list[bool]:
    """A packed (column-major) source broadcast to a host-mate through a segment and to another
    host over a socket, with a budget smaller than the segment and a chunk: the segment the
    sender fills is not waited for (it deadlocked until the timeout before)."""
    task = ReshardTask((24, 20), "int32", Layout(Mesh([[0]]), "RR"), Layout(Mesh([[1, 4]]), "RR"))
    full = _full(task.shape)
    local = full.t().contiguous().t() if rank == 0 else None
    p = meshcast.plan(task, TOPOLOGY, strategy="broadcast")
    out = []
    for mode in ("shm", "socket"):
        os.environ["MESHCAST_INTRA"] = mode
        got = meshcast.reshard(local, p, chunk_bytes=96, max_inflight_bytes=64, timeout=60)
        out.append(got is None if task.dst_box(rank) is None else torch.equal(got, full))
    os.environ.pop("MESHCAST_INTRA")
    return out


def _in_place(rank: int) -> dict:
    task = ReshardTask((24, 20), "int32", Layout(SRC, "RR"), Layout(DST, "S0R"))
    full = _full(task.shape)
    sbox, dbox = task.src_box(rank), task.dst_box(rank)
    local = None if sbox is None else full[sbox].clone()
    p = meshcast.plan(task, TOPOLOGY)
    report: dict = {}
    buf = None if dbox is None else torch.full((*full[dbox].shape, 3), -1,
                                               dtype=torch.int32)[..., 1]  # strided
    ptr = None if buf is None else buf.data_ptr()
    got = meshcast.reshard(local, p, out=buf, timeout=60)
    report["same"] = got is buf and (buf is None or (buf.data_ptr() == ptr
                                                     and torch.equal(buf, full[dbox])))
    for what in ("dtype", "device"):
        wrong = None if dbox is None else torch.zeros(full[dbox].shape, dtype=torch.int32)
        if rank == 5 and what == "dtype":
            wrong = wrong.float()
        if rank == 6 and what == "device":
            wrong = torch.empty(wrong.shape, dtype=torch.int32, device="meta")
        try:
            meshcast.reshard(local, p, out=wrong, timeout=60)
            report[what] = "no error"
        except ValueError as exc:
            report[what] = str(exc)
    return report


def _refusals(rank: int) -> dict:
    task = ReshardTask((8, 8), "int32", Layout(SRC, "RR"), Layout(DST, "RR"))
    local = torch.zeros(8, 8, dtype=torch.int32) if task.src_box(rank) is not None else None
    p = meshcast.plan(task, TOPOLOGY)
    report = {}
    for what, value in (("bad", "bogus" if rank == 2 else "shm"),
                        ("mixed", "socket" if rank == 6 else "shm")):
        os.environ["MESHCAST_INTRA"] = value
        try:
            meshcast.reshard(local, p, timeout=60)
            report[what] = "no error"
        except ValueError as exc:
            report[what] = str(exc)
    os.environ.pop("MESHCAST_INTRA")
    return report


MANY = [  # reshard_many: messages inside host 0, inside host 1 and across
    ((24, 20), "S0R", "RS0", SRC, Mesh([[3, 2], [1, 0]])),
    ((24, 20), "RS0", "S1R", Mesh([[4, 5], [6, 7]]), Mesh([[7, 6], [5, 4]])),
    ((30, 7), "S0S1", "RR", SRC, DST),
    ((9, 40), "RS0", "S0S1", Mesh([[0, 4], [2, 6]]), Mesh([[5, 1], [7, 3]])),
]


def _many_runs(rank: int) -> dict:
    """reshard_many through segments and sockets (strided ``out`` given for the last tensor), and
    a mixed setting refused."""
    from meshcast.runtime.many import last_many_stats

    tasks = [ReshardTask(shape, "int32", Layout(sm, s), Layout(dm, d))
             for shape, s, d, sm, dm in MANY]
    plans = [meshcast.plan(t, TOPOLOGY) for t in tasks]
    fulls = [_full(t.shape) + 1000 * k for k, t in enumerate(tasks)]
    ins = [None if t.src_box(rank) is None else f[t.src_box(rank)].clone()
           for t, f in zip(tasks, fulls)]
    report: dict = {}
    for mode in ("shm", "socket"):
        os.environ["MESHCAST_INTRA"] = mode
        box = tasks[-1].dst_box(rank)
        out = None if box is None else torch.zeros(
            (*fulls[-1][box].shape, 2), dtype=torch.int32)[..., 0]
        got = meshcast.reshard_many(ins, plans, bucket_bytes=256, out=[None] * 3 + [out],
                                    timeout=60)
        exact = all(g is None if t.dst_box(rank) is None else torch.equal(g, f[t.dst_box(rank)])
                    for g, t, f in zip(got, tasks, fulls))
        report[mode] = [exact, got[-1] is out, last_many_stats().shm_messages]
    schedule = meshcast.build_schedule(plans, 256)
    report["inside"] = sum(TOPOLOGY.host_of(peer) == TOPOLOGY.host_of(rank)
                           for bucket in schedule.buckets for phase in bucket
                           for peer, _ in phase.sends_of(rank))
    os.environ["MESHCAST_INTRA"] = "socket" if rank == 3 else "shm"
    try:
        meshcast.reshard_many(ins, plans, timeout=60)
        report["mixed"] = "no error"
    except ValueError as exc:
        report["mixed"] = str(exc)
    os.environ.pop("MESHCAST_INTRA")
    return report


def _cycles(rank: int) -> list:
    """Objects that only the cyclic garbage collector frees after a call, per (mode, case,
    strategy): a broadcast's relay and its readers kept themselves (and so the result tensor and
    their buffers) alive in reference cycles until a collection ran, so memory was reused late
    (and never, with the collector disabled)."""
    import collections
    import gc

    left = []
    for mode in ("shm", "socket"):
        os.environ["MESHCAST_INTRA"] = mode
        for k, (shape, s, d, sm, dm) in enumerate(CASES):
            task = ReshardTask(shape, "int32", Layout(sm, s), Layout(dm, d))
            sbox = task.src_box(rank)
            local = None if sbox is None else _full(shape)[sbox].clone()
            for strategy in STRATEGIES:
                p = meshcast.plan(task, TOPOLOGY, strategy=strategy)
                gc.collect()
                gc.set_debug(gc.DEBUG_SAVEALL)
                got = meshcast.reshard(local, p, chunk_bytes=96, timeout=60)
                del got
                n = gc.collect()
                gc.set_debug(0)
                if n:
                    kinds = collections.Counter(type(o).__name__ for o in gc.garbage)
                    left.append((mode, k, strategy, n, kinds.most_common(5)))
                gc.garbage.clear()
    os.environ.pop("MESHCAST_INTRA")
    return left


def _job(rank: int) -> dict:
    counts = _count_shm()
    report = {"runs": _exact_runs(rank, counts), "in_place": _in_place(rank),
              "refusals": _refusals(rank), "many": _many_runs(rank),
              "packed": _packed_fan_out(rank), "cycles": _cycles(rank)}
    report["kept"] = _segments_mapped() > 0 if rank in (4, 5, 6, 7) else None
    meshcast.clear_caches(["runtime.shm_segments", "runtime.shm_mappings"])
    report["mapped"] = _segments_mapped()
    report["threads"] = [t.name for t in threading.enumerate() if t.name.startswith("meshcast")]
    return report


@pytest.fixture(scope="module")
def job() -> list[dict]:
    return meshcast.launch(_job, 8, hosts=TOPOLOGY, timeout=600)


def test_every_strategy_is_exact_through_shared_memory_and_sockets(job: list[dict]) -> None:
    wrong = [(rank, run) for rank, r in enumerate(job) for run in r["runs"] if not run[-1]
             and run[1] != "used shared memory"]
    assert wrong == []
    assert len(job[0]["runs"]) == 2 * (len(CASES) * len(STRATEGIES) * 2 + 1)
    used = {mode: any(run[-1] for r in job for run in r["runs"]
                      if run[:2] == (mode, "used shared memory")) for mode in ("shm", "socket")}
    assert used == {"shm": True, "socket": False}


def test_a_call_leaves_nothing_for_the_cyclic_garbage_collector(job: list[dict]) -> None:
    assert [r["cycles"] for r in job] == [[]] * 8


def test_segments_are_kept_for_reuse_and_released_by_clear_caches(job: list[dict]) -> None:
    assert [r["kept"] for r in job[4:]] == [True] * 4
    assert [r["mapped"] for r in job] == [0] * 8
    assert [r["threads"] for r in job] == [[]] * 8


def test_out_receives_the_result_in_place(job: list[dict]) -> None:
    assert [r["in_place"]["same"] for r in job] == [True] * 8
    for r in job:
        assert "out has dtype torch.float32 on rank 5; the plan moves torch.int32" in \
            r["in_place"]["dtype"], r["in_place"]["dtype"]
        assert "out is a meta tensor (it has no data) on rank 6" in r["in_place"]["device"]


def test_a_bad_or_mixed_intra_setting_is_refused_on_every_rank(job: list[dict]) -> None:
    assert "$MESHCAST_INTRA must be 'shm' or 'socket' (or unset), got 'bogus'" in \
        job[2]["refusals"]["bad"], job[2]["refusals"]["bad"]
    for rank, r in enumerate(job):
        if rank != 2:
            assert ("ranks [2] passed inputs that do not fit the plans (rank 2: $MESHCAST_INTRA "
                    "must be 'shm' or 'socket' (or unset), got 'bogus')") in r["refusals"]["bad"], \
                r["refusals"]["bad"]
        assert "intra" in r["refusals"]["mixed"] and "6" in r["refusals"]["mixed"], \
            r["refusals"]["mixed"]


def test_a_packed_fan_out_with_a_small_budget_goes_through(job: list[dict]) -> None:
    assert [r["packed"] for r in job] == [[True, True]] * 8


def test_reshard_many_is_exact_through_segments_and_sockets(job: list[dict]) -> None:
    assert [r["many"]["shm"][:2] for r in job] == [[True, True]] * 8
    assert [r["many"]["socket"] for r in job] == [[True, True, 0]] * 8
    # every message between ranks of one host went through a segment
    assert [r["many"]["shm"][2] for r in job] == [r["many"]["inside"] for r in job]
    assert sum(r["many"]["inside"] for r in job[:4]) > 0 and sum(
        r["many"]["inside"] for r in job[4:]) > 0
    for r in job:
        assert "intra" in r["many"]["mixed"] and "3" in r["many"]["mixed"], r["many"]["mixed"]


# -- a rank dies while its host's receivers read its segment -----------------------------------
def _dies_mid_fan_out(rank: int, victim: int, out_dir: str) -> str:
    from meshcast.runtime import shm

    if rank == victim:  # the leader dies writing its 20th chunk (after publishing a piece of 16);
        # a member waiting for the 2nd piece
        if rank == 4:
            put, seen = shm.ShmWriter.put, [0]

            def dying_put(self, k, src):
                seen[0] += 1
                if seen[0] == 20:
                    os._exit(3)
                return put(self, k, src)

            shm.ShmWriter.put = dying_put
        else:
            wait = shm.ShmReader._wait

            def dying_wait(self, work, what):
                if "piece 2/" in what:
                    os._exit(3)
                return wait(self, work, what)

            shm.ShmReader._wait = dying_wait
    os.environ["MESHCAST_INTRA"] = "shm"
    task = ReshardTask((8 << 20,), "int32", Layout(Mesh([[0]]), "R"), Layout(DST, "R"))
    local = torch.ones(8 << 20, dtype=torch.int32) if rank == 0 else None
    p = meshcast.plan(task, TOPOLOGY, strategy="broadcast")
    # 8 pieces of 16 chunks in a ring of 4 slots (shm.SLOTS): the leader writes the 6th piece
    # only once every member acknowledged the 2nd, so a member that dies holds up its
    # host-mates (with 4 pieces, no slot is reused: they could finish before its death is known)
    return _attempt(rank, out_dir, lambda: meshcast.reshard(local, p, timeout=20,
                                                            chunk_bytes=256 << 10))


def _attempt(rank: int, out_dir: str, call) -> str:
    """Run ``call``; write whether it returned or raised (naming whom), how long it took, the
    segments still mapped and meshcast's threads still alive to ``out_dir``."""
    start = time.monotonic()
    try:
        call()
        result: dict = {"ok": True}
    except meshcast.ReshardError as exc:
        result = {"ok": False, "error": str(exc), "failed": list(exc.failed)}
    result["seconds"] = time.monotonic() - start
    result["mapped"] = _segments_mapped()
    result["threads"] = [t.name for t in threading.enumerate() if t.name.startswith("meshcast")]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    return "done"


def _host_mates_raised(tmp_path: Path, victim: int, fn) -> None:
    """Launch ``fn`` with ``victim`` dying: it exits with code 3, and each of its host-mates
    raises naming it within 15 s, with no segment mapped and no meshcast thread left."""
    with pytest.raises(LaunchError) as info:
        meshcast.launch(fn, 8, hosts=TOPOLOGY, args=(victim, str(tmp_path)), timeout=120)
    assert "exited with code 3" in info.value.failures[victim]
    for rank in [r for r in (4, 5, 6, 7) if r != victim]:
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert not r["ok"], f"rank {rank} returned although rank {victim} died"
        assert victim in r["failed"], r["error"]
        assert r["mapped"] == 0 and r["threads"] == []
        assert r["seconds"] < 15


@pytest.mark.timeout(240)
@pytest.mark.parametrize("victim", [4, 6], ids=["leader", "member"])
def test_a_rank_dying_mid_fan_out_leaves_no_segment(tmp_path: Path, victim: int) -> None:
    _host_mates_raised(tmp_path, victim, _dies_mid_fan_out)
    assert not [f for f in os.listdir("/dev/shm") if "meshcast" in f]


def _dies_mid_many(rank: int, victim: int, out_dir: str) -> str:
    """reshard_many of 1 MiB from rank 4 to its host-mates in 16 buckets: rank 4 dies posting its
    5th message through a segment, or rank 6 reading its 2nd."""
    from meshcast.runtime import shm_messages

    if rank == victim:
        name = "send" if rank == 4 else "read"
        real, seen = getattr(shm_messages.ShmMessages, name), [0]

        def dying(self, *args):
            seen[0] += 1
            if seen[0] == (5 if rank == 4 else 2):
                os._exit(3)
            return real(self, *args)

        setattr(shm_messages.ShmMessages, name, dying)
    os.environ["MESHCAST_INTRA"] = "shm"
    task = ReshardTask((1 << 18,), "int32", Layout(Mesh([[4]]), "R"), Layout(DST, "R"))
    local = torch.ones(1 << 18, dtype=torch.int32) if rank == 4 else None
    p = meshcast.plan(task, TOPOLOGY)
    return _attempt(rank, out_dir, lambda: meshcast.reshard_many([local], [p],
                                                                 bucket_bytes=64 << 10,
                                                                 timeout=20))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("victim", [4, 6], ids=["sender", "receiver"])
def test_a_rank_dying_mid_reshard_many_leaves_no_segment(tmp_path: Path, victim: int) -> None:
    _host_mates_raised(tmp_path, victim, _dies_mid_many)


def test_chunks_are_grouped_into_pieces_the_same_way_on_both_sides() -> None:
    from meshcast.runtime.shm import PIECE_BYTES, Ring

    mib = 1 << 20
    assert 4 * mib == PIECE_BYTES
    ring = Ring([3 * mib, 3 * mib, mib, 5 * mib, 10])
    assert ring.piece_of == [0, 1, 1, 2, 3]
    assert ring.offset == [0, 0, 3 * mib, 0, 0]
    assert ring.last == [0, 2, 3, 4]
    assert [ring.piece_bytes(p) for p in range(4)] == [3 * mib, 4 * mib, 5 * mib, 10]
    assert ring.slot_bytes == 5 * mib


def _planned_for_other_hosts(rank: int) -> list[bool]:
    os.environ["MESHCAST_INTRA"] = "shm"
    topo = Topology.uniform(2, 2)  # the plan's hosts {0, 1} {2, 3}; the job's: one machine
    got = []
    for dst in ([[2, 3]], [[1, 2, 3]], [[3], [1]]):
        task = ReshardTask((40, 8), "int32", Layout(Mesh([[0]]), "RR"), Layout(Mesh(dst), "RR"))
        full = _full(task.shape)
        p = meshcast.plan(task, topo, strategy="broadcast")
        out = meshcast.reshard(full.clone() if rank == 0 else None, p, chunk_bytes=96)
        got.append(out is None if task.dst_box(rank) is None else torch.equal(out, full))
    return got


def test_a_broadcast_planned_for_other_hosts_than_the_real_ones_is_exact() -> None:
    # the chain's next leader sits on the sender's real host: it must still get messages
    got = meshcast.launch(_planned_for_other_hosts, 4, timeout=300)
    assert got == [[True] * 3] * 4
