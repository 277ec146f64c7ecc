"""The pipeline step-time simulator: exact results on small cases, and its invariants."""

from __future__ import annotations

import itertools

import pytest

from meshcast.pipeline import (
    SCHEDULES,
    Action,
    Link,
    chain_links,
    schedule,
    simulate_pipeline,
)


@pytest.mark.parametrize("name", SCHEDULES)
def test_free_communication_unit_times_reproduce_the_clock_table(name: str) -> None:
    for n, m in itertools.product(range(1, 7), range(1, 13)):
        table = schedule(name, n, m)
        timing = simulate_pipeline(table, 1, 1, chain_links(n, 0.0), overlap=False)
        assert timing.step_s == table.num_clocks == 2 * (n + m - 1)
        for i in range(n):
            for a, start in zip(table.actions(i), timing.starts[i]):
                assert start == table.clock_of(i, a)


def test_two_stages_one_microbatch_by_hand() -> None:
    # F0 on 0 [0,1]; activation 0.5 -> F0 on 1 [1.5,2.5]; B0 on 1 [2.5,4.5];
    # gradient 0.25 -> B0 on 0 [4.75,6.75]
    table = schedule("1f1b", 2, 1)
    for overlap in (False, True):
        t = simulate_pipeline(table, 1.0, 2.0, chain_links(2, 0.5, 0.25), overlap=overlap)
        assert t.step_s == 6.75
        assert t.starts == ((0.0, 4.75), (1.5, 2.5))
        assert [(x.kind, x.start, x.end) for x in t.transfers] == [
            ("F", 1.0, 1.5), ("B", 4.5, 4.75)]


def test_blocking_send_delays_the_sender_overlap_does_not() -> None:
    # GPipe, 2 stages, 2 microbatches, activation transfer 1: F1 on stage 0 waits for the send
    table = schedule("gpipe", 2, 2)
    blocking = simulate_pipeline(table, 1, 1, chain_links(2, 1.0, 0.0), overlap=False)
    overlapped = simulate_pipeline(table, 1, 1, chain_links(2, 1.0, 0.0), overlap=True)
    assert blocking.start_of(0, Action("F", 1)) == 2.0
    assert overlapped.start_of(0, Action("F", 1)) == 1.0
    # stage 1 gets F0 at 2 and F1 at 3 (link serialises: 1..2, 2..3) when overlapped
    assert overlapped.start_of(1, Action("F", 1)) == 3.0
    assert blocking.start_of(1, Action("F", 1)) == 4.0
    assert (blocking.step_s, overlapped.step_s) == (8.0, 7.0)


def test_link_serialises_transfers() -> None:
    # overlapped forwards of 0.1 s, transfers of 1 s: the link is the bottleneck
    table = schedule("gpipe", 2, 4)
    t = simulate_pipeline(table, 0.125, 0.125, chain_links(2, 1.0, 0.0), overlap=True)
    forward = [x for x in t.transfers if x.kind == "F"]
    assert [(x.start, x.end) for x in forward] == [(0.125, 1.125), (1.125, 2.125), (2.125, 3.125),
                                                  (3.125, 4.125)]


def test_paper_direction() -> None:
    # 4 stages, 8 microbatches, backward = 2 x forward
    n, m = 4, 8

    def step(name: str, comm: float, overlap: bool) -> float:
        return simulate_pipeline(schedule(name, n, m), 1.0, 2.0, chain_links(n, comm),
                                 overlap=overlap).step_s

    # free communication: all schedules tie at (n + m - 1)(f + b)
    assert {step(s, 0.0, o) for s in SCHEDULES for o in (False, True)} == {33.0}
    # communication comparable to compute: eager-1F1B with overlap beats 1F1B with or without
    assert step("eager_1f1b", 1.0, True) == 46.0
    assert step("1f1b", 1.0, True) == 50.0
    assert step("1f1b", 1.0, False) == 52.0
    assert step("eager_1f1b", 2.0, True) < step("1f1b", 2.0, True)


@pytest.mark.parametrize("name", SCHEDULES)
def test_invariants_over_a_grid(name: str) -> None:
    for n, m, comm in itertools.product((2, 3, 5), (1, 4, 9), (0.0, 0.375, 1.5)):
        table = schedule(name, n, m)
        fwd = [1.0 + 0.25 * i for i in range(n)]
        bwd = [2.0 - 0.125 * i for i in range(n)]
        links = chain_links(n, comm, comm / 2)
        blocking = simulate_pipeline(table, fwd, bwd, links, overlap=False)
        overlapped = simulate_pipeline(table, fwd, bwd, links, overlap=True)
        both = simulate_pipeline(table, fwd, bwd, links, overlap=True, overlap_backward=True)
        free = simulate_pipeline(table, fwd, bwd, chain_links(n, 0.0))
        assert free.step_s <= both.step_s <= overlapped.step_s <= blocking.step_s
        for t in (blocking, overlapped, both):
            # every stage computes all of its work; nothing starts before its clock-table order
            assert t.step_s >= max(m * (f + b) for f, b in zip(fwd, bwd))
            for i in range(n):
                assert abs(t.compute_s(i) - m * (fwd[i] + bwd[i])) < 1e-9
                assert all(s1 >= e0 for e0, s1 in zip(t.ends[i], t.starts[i][1:]))
                assert 0.0 <= t.bubble(i) < 1.0
        # more communication never helps
        slower = simulate_pipeline(table, fwd, bwd, chain_links(n, comm + 0.5), overlap=True)
        assert slower.step_s >= overlapped.step_s


def test_skip_links_between_non_adjacent_stages() -> None:
    # a 3-stage U-shape: stage 0 also sends a skip tensor straight to stage 2
    table = schedule("1f1b", 3, 1)
    links = (*chain_links(3, 0.0), Link(0, 2, 5.0, 1.0, "skip"))
    t = simulate_pipeline(table, 1, 1, links, overlap=True)
    # F0: stage 0 [0,1], stage 1 [1,2], stage 2 waits for the skip: arrives 6 -> [6,7]
    assert t.start_of(2, Action("F", 0)) == 6.0
    # B0: stage 2 [7,8]; its gradient sends block stage 2 (chain 0 s, skip 1 s) but stage 1 only
    # needs the chain gradient: [8,9]; stage 0 needs the skip gradient (arrives 9) and B0 of 1
    assert t.start_of(1, Action("B", 0)) == 8.0
    assert t.start_of(0, Action("B", 0)) == 9.0
    assert t.step_s == 10.0


def test_bad_arguments() -> None:
    table = schedule("1f1b", 3, 2)
    with pytest.raises(ValueError, match="3 numbers"):
        simulate_pipeline(table, [1.0, 1.0], 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        simulate_pipeline(table, -1.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        simulate_pipeline(table, float("inf"), 1.0)
    with pytest.raises(ValueError, match="src < dst"):
        simulate_pipeline(table, 1.0, 1.0, [Link(2, 1, 0.0, 0.0)])
    with pytest.raises(TypeError, match="ClockTable"):
        simulate_pipeline("1f1b", 1.0, 1.0)
    with pytest.raises(ValueError, match="2 numbers"):
        chain_links(3, [1.0])
