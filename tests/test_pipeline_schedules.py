"""Pipeline schedules: every (n <= 8 stages, m <= 32 microbatches) table, checked from scratch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from meshcast.pipeline import SCHEDULES, Action, ClockTable, schedule

SIZES = [(n, m) for n in range(1, 9) for m in range(1, 33)]


def expected_peak(name: str, n: int, m: int, i: int) -> int:
    """Peak in-flight microbatches on stage i: what the tables achieve exactly."""
    if name == "gpipe":
        return m
    if name == "1f1b":
        return min(m, n - i)  # n - i once m >= n - i; all m when there are fewer microbatches
    return min(m, 2 * (n - i) - 1)


def check_table(table: ClockTable, name: str, n: int, m: int) -> None:
    """Checks independent of how the table was built."""
    assert (table.name, table.num_stages, table.num_microbatches) == (name, n, m)
    assert all(len(row) == n for row in table.clocks)
    when: dict[tuple[int, str, int], int] = {}
    for t, row in enumerate(table.clocks):
        for i, a in enumerate(row):
            if a is None:
                continue
            assert a.kind in ("F", "B") and 0 <= a.microbatch < m
            assert (i, a.kind, a.microbatch) not in when, f"stage {i} runs {a} twice"
            when[(i, a.kind, a.microbatch)] = t
    # each stage runs every forward and every backward exactly once
    assert len(when) == 2 * n * m
    for i in range(n):
        for b in range(m):
            f, bw = when[(i, "F", b)], when[(i, "B", b)]
            assert bw > f, f"stage {i}: backward of {b} before its forward"
            if i > 0:
                assert f > when[(i - 1, "F", b)], f"stage {i}: F{b} before stage {i - 1}'s"
            if i < n - 1:
                assert bw > when[(i + 1, "B", b)], f"stage {i}: B{b} before stage {i + 1}'s"
            if name == "eager_1f1b":  # the paper's placement rule
                assert bw >= (n - 1) + (2 * b + 1) + (n - 1 - i)
    # no clock is wasted at either end, and the length is the paper's
    assert any(a is not None for a in table.clocks[0])
    assert any(a is not None for a in table.clocks[-1])
    assert table.num_clocks == 2 * (n + m - 1)
    # peak activation memory, counted from the table
    for i in range(n):
        live, peak = 0, 0
        for row in table.clocks:
            if row[i] is not None:
                live += 1 if row[i].kind == "F" else -1
                peak = max(peak, live)
        assert peak == expected_peak(name, n, m, i), (name, n, m, i, peak)
        assert table.peak_inflight(i) == peak


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_schedule_up_to_8_stages_and_32_microbatches(name: str) -> None:
    for n, m in SIZES:
        check_table(schedule(name, n, m), name, n, m)


@pytest.mark.parametrize("name", SCHEDULES)
def test_warmup_counts_follow_the_paper(name: str) -> None:
    for n, m in SIZES:
        table = schedule(name, n, m)
        for i in range(n):
            actions = table.actions(i)
            warmup = next(k for k, a in enumerate(actions) if a.kind == "B")
            expected = {
                "gpipe": m,
                "1f1b": min(n - i - 1, m),
                "eager_1f1b": min(m, 2 * (n - i) - 1),
            }[name]
            # 1F1B's steady state starts with a forward, so one more forward precedes B0
            assert warmup == (expected + 1 if name == "1f1b" and expected < m else expected)
            assert actions[:expected] == tuple(Action("F", b) for b in range(expected))


def test_eager_backwards_sit_exactly_on_the_paper_clock_once_steady() -> None:
    # with enough microbatches every backward is at its lower bound: same clocks as 1F1B
    for n in range(1, 9):
        m = 2 * n + 3
        eager, plain = schedule("eager_1f1b", n, m), schedule("1f1b", n, m)
        for i in range(n):
            for b in range(m):
                bw = Action("B", b)
                assert eager.clock_of(i, bw) == (n - 1) + (2 * b + 1) + (n - 1 - i)
                assert eager.clock_of(i, bw) == plain.clock_of(i, bw)


def test_paper_example_peaks_n4() -> None:
    m = 16
    assert [schedule("eager_1f1b", 4, m).peak_inflight(i) for i in range(4)] == [7, 5, 3, 1]
    assert [schedule("1f1b", 4, m).peak_inflight(i) for i in range(4)] == [4, 3, 2, 1]
    assert [schedule("gpipe", 4, m).peak_inflight(i) for i in range(4)] == [m] * 4


def test_eager_produces_forwards_ahead_of_their_consumer() -> None:
    # the point of eager-1F1B: in steady state stage i+1 consumes F b at least 2 clocks after
    # stage i produced it, where 1F1B consumes it on the next clock
    n, m = 4, 16
    eager, plain = schedule("eager_1f1b", n, m), schedule("1f1b", n, m)
    slack_eager = min(
        eager.clock_of(i + 1, Action("F", b)) - eager.clock_of(i, Action("F", b))
        for i in range(n - 1) for b in range(2 * n, m)
    )
    slack_plain = min(
        plain.clock_of(i + 1, Action("F", b)) - plain.clock_of(i, Action("F", b))
        for i in range(n - 1) for b in range(2 * n, m)
    )
    assert slack_plain == 1
    assert slack_eager == 3


def test_text_chart_and_json_round_trip() -> None:
    table = schedule("1f1b", 2, 3)
    assert str(table) == (
        "1f1b: 2 stages, 3 microbatches, 8 clocks, peak in-flight per stage 2,1\n"
        "clock     0  1  2  3  4  5  6  7\n"
        "stage 0  F0 F1  . B0 F2 B1  . B2\n"
        "stage 1   . F0 B0 F1 B1 F2 B2  ."
    )
    assert ClockTable.from_json(table.to_json()) == table
    assert table.actions(1) == (
        Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1), Action("F", 2),
        Action("B", 2),
    )
    assert table.inflight(0) == (1, 2, 2, 1, 2, 1, 1, 0)
    assert table.idle_clocks(0) == 2
    assert schedule("gpipe", 3, 5) == schedule("gpipe", 3, 5)  # deterministic plain data
    assert "more clocks" in schedule("gpipe", 2, 20).chart(max_clocks=10)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown"):
        schedule("interleaved", 4, 8)
    with pytest.raises(ValueError, match="at least 1"):
        schedule("1f1b", 0, 8)
    with pytest.raises(TypeError, match="integer"):
        schedule("1f1b", 4, 2.0)
    table = schedule("1f1b", 2, 2)
    with pytest.raises(ValueError, match="stage must be in"):
        table.actions(2)
    with pytest.raises(ValueError, match="never runs"):
        table.clock_of(0, Action("F", 5))
    # tables no pipeline can run are refused when read
    data = table.to_json()
    data["clocks"][0], data["clocks"][-1] = data["clocks"][-1], data["clocks"][0]
    with pytest.raises(ValueError, match="not a valid clock table: stage 0 runs B0"):
        ClockTable.from_json(data)
    data = table.to_json()
    data["clocks"][0][0] = None
    with pytest.raises(ValueError, match="stage 0 never runs F0"):
        ClockTable.from_json(data)
    with pytest.raises(ValueError, match="not a valid clock table"):
        ClockTable.from_json({**table.to_json(), "num_stages": "two"})


def test_import_does_not_pull_in_torch() -> None:
    code = "import sys, meshcast.pipeline; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_plot_schedule_writes_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from meshcast.pipeline import plot_schedule

    path = tmp_path / "chart.png"
    plot_schedule(schedule("eager_1f1b", 3, 4), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
