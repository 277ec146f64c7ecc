"""The simulator's calibration knob ``Topology.hop_bytes`` (what a broadcast relay receives before
it passes it on): zero keeps the former model (and every plan digest), a value adds each chain
hop's fill to the broadcast's start, exactly."""

from __future__ import annotations

import dataclasses

import pytest

from meshcast import Layout, Mesh, ReshardTask, Topology, plan, simulate
from meshcast.core.units import GBIT


def _broadcast_plan():
    topo = Topology.uniform(4, 2, nic_gbps=1.0, intra_gbps=8.0, latency_us=100.0)
    task = ReshardTask((1 << 20,), "int32", Layout(Mesh([[0]]), "R"),
                       Layout(Mesh([[2, 3], [4, 5], [6, 7]]), "R"))
    return plan(task, topo, strategy="broadcast"), topo


def test_zero_hop_bytes_is_the_former_model_and_round_trips() -> None:
    p, topo = _broadcast_plan()
    assert topo.hop_bytes == 0.0 and "hop_bytes" not in topo.to_json()
    with_hops = dataclasses.replace(topo, hop_bytes=1 << 20)
    assert Topology.from_json(with_hops.to_json()) == with_hops
    assert simulate(p, dataclasses.replace(topo, hop_bytes=0.0)).time_s == simulate(p, topo).time_s


def test_each_hop_after_the_first_adds_its_fill() -> None:
    p, topo = _broadcast_plan()
    hop = float(1 << 20)
    base = simulate(p, topo).time_s
    longer = simulate(p, dataclasses.replace(topo, hop_bytes=hop)).time_s
    # chain host 0 -> 1 -> 2 -> 3: two hops after the first at 1 Gbit/s, one fan-out inside
    assert longer - base == pytest.approx(2 * hop / GBIT + hop / (8 * GBIT))


def test_hop_bytes_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match=r"hop_bytes must be a finite number >= 0 .*, got -1"):
        Topology(((0,), (1,)), hop_bytes=-1)
