"""``meshcast bench resharding``: small real runs (loopback always; the emulated cluster where
namespaces work) give exact data and well-formed JSON, and a run with corrupted data is refused.

Timings are never asserted; byte counters are (they are exact). ~30-40 s in all.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from meshcast.bench import resharding as rb
from meshcast.cli import main

SIZE = "256KiB"
NBYTES = 256 * 2**10
METHODS = "send_recv/none,broadcast/none,gather-scatter,per-rank-p2p"


def _run_cli(tmp_path, *extra: str) -> tuple[int, dict]:
    code = main(
        [
            "bench",
            "resharding",
            "--suite",
            "1-to-m",
            "--cases",
            "1x1,1x2",
            "--size",
            SIZE,
            "--reps",
            "1",
            "--warmup",
            "1",
            "--methods",
            METHODS,
            "--no-plots",
            "--out",
            str(tmp_path),
            *extra,
        ]
    )
    with open(tmp_path / "resharding.json") as f:
        return code, json.load(f)


def _check_document(doc: dict, where: str) -> dict[tuple[str, str], dict]:
    assert set(doc) >= {"meta", "rows", "failures", "probes"}
    assert doc["failures"] == []
    assert doc["meta"]["reps"] == 1 and doc["meta"]["suite"] == "1-to-m"
    rows = {(r["case"], r["method"]): r for r in doc["rows"]}
    assert set(rows) == {(c, m) for c in ("1x1", "1x2") for m in METHODS.split(",")}
    for r in rows.values():
        assert r["nbytes"] == NBYTES
        if "skipped" in r:
            continue
        assert where in r["where"]
        assert r["time_s"] > 0 and len(r["times_s"]) == 1
        assert r["efficiency"] > 0 and r["sim_s"] > 0 and r["bandwidth_gbit"] > 0
    # per-rank p2p applies to 1x1 only (the meshes must have the same shape)
    assert "skipped" not in rows["1x1", "per-rank-p2p"]
    assert "meshes differ" in rows["1x2", "per-rank-p2p"]["skipped"]
    # exact byte counters: broadcast crosses into the destination host once, send/recv and
    # gather-scatter once per receiver
    assert rows["1x2", "broadcast/none"]["cross_host_bytes"] == NBYTES
    assert rows["1x2", "send_recv/none"]["cross_host_bytes"] == 2 * NBYTES
    assert rows["1x2", "gather-scatter"]["cross_host_bytes"] == 2 * NBYTES
    for m in METHODS.split(","):
        assert rows["1x1", m]["cross_host_bytes"] == NBYTES
    return rows


def test_loopback_run_is_exact_and_json_well_formed(tmp_path):
    code, doc = _run_cli(tmp_path, "--loopback")
    assert code == 0
    rows = _check_document(doc, "loopback")
    assert rows["1x1", "send_recv/none"]["nic_tx_bytes"] is None  # no emulated NIC


def test_cluster_run_is_exact_and_json_well_formed(tmp_path):
    from meshcast.cluster import available

    ok, why = available()
    if not ok:
        pytest.skip(f"emulated cluster unavailable: {why}")
    code, doc = _run_cli(tmp_path, "--cluster", "2")
    assert code == 0
    rows = _check_document(doc, "cluster")
    r = rows["1x2", "broadcast/none"]
    assert r["nic_tx_bytes"] >= NBYTES  # the NIC counters see at least the payload


def test_corrupted_run_is_refused(tmp_path, monkeypatch):
    """The test hook flips one received byte of broadcast/none: exit status 3, no timings for
    that run, the others still reported."""
    monkeypatch.setenv(rb.CORRUPT_ENV, "broadcast/none")
    code = main(
        [
            "bench",
            "resharding",
            "--loopback",
            "--suite",
            "1-to-m",
            "--cases",
            "1x2",
            "--size",
            SIZE,
            "--reps",
            "1",
            "--warmup",
            "0",
            "--methods",
            "send_recv/none,broadcast/none",
            "--no-plots",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 3
    doc = json.loads((tmp_path / "resharding.json").read_text())
    rows = {r["method"]: r for r in doc["rows"]}
    assert "wrong data on ranks [2]" in rows["broadcast/none"]["error"]
    assert "time_s" not in rows["broadcast/none"]
    assert "time_s" in rows["send_recv/none"]
    assert [f["method"] for f in doc["failures"]] == ["broadcast/none"]


def test_check_results_refuses_any_wrong_run():
    """A wrong warm-up on one rank is enough; nothing of that method is reported."""
    case = rb.suite_cases("1-to-m", NBYTES, ["1x2"])[0]
    spec = rb.JobSpec(case, ["broadcast/none"], {}, reps=2, warmup=1)
    good = (0.0, 1.0, True, 0, None)
    results = [{"probe": {}, "runs": {"broadcast/none": [good] * 3}} for _ in range(4)]
    assert "time_s" in rb.check_results(spec, results)["broadcast/none"]
    results[3]["runs"]["broadcast/none"] = [(0.0, 1.0, False, 0, None), good, good]
    got = rb.check_results(spec, results)["broadcast/none"]
    assert got == {"error": "wrong data on ranks [3] in runs [0] (of 3, warm-ups first)"}


def test_cases_and_applicability():
    cases = {c.key: c for c in rb.suite_cases("all")}
    assert len(cases) == 15
    assert {k for k, c in cases.items() if rb.applies(c, "per-rank-p2p") is None} == {
        "1x1",
        "case1",
        "case2",
    }
    assert all(rb.applies(c, "gather-scatter") is None for c in cases.values())
    # emulated shapes: hosts = mesh rows; 1-to-m sources padded to the destination's row width
    assert (cases["case1"].hosts, cases["case1"].devices_per_host) == (4, 4)
    assert (cases["case6"].hosts, cases["case7"].hosts) == (5, 3)
    assert (cases["4x2"].hosts, cases["4x2"].devices_per_host, cases["4x2"].world) == (5, 2, 10)
    assert cases["4x2"].task.dst.mesh.devices[0] == 2
    assert all(c.task.nbytes == 64 * 2**20 for k, c in cases.items() if k != "case6")
    with pytest.raises(ValueError, match="power of two"):
        rb.suite_cases("n-to-m", 3 * 2**20)


def test_cli_import_does_not_import_torch():
    code = (
        "import sys, meshcast, meshcast.cli.bench_resharding, meshcast.bench.plots; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
