"""The bounded cache mechanism (meshcast.core.cache): least recently used out, named, listed and
cleared through the public functions."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

import meshcast
from meshcast.core.cache import BoundedCache


def test_a_cache_keeps_the_most_recently_used_entries() -> None:
    cache: BoundedCache[int, str] = BoundedCache("test-lru", 2, "three keys, room for two")
    cache.put(1, "a")
    cache.put(2, "b")
    assert cache.get(1) == "a"  # 1 is now the most recent
    cache.put(3, "c")  # drops 2
    assert cache.get(2) is None and cache.get(3) == "c"
    assert cache.get_or_make(4, lambda: "d") == "d"
    info = meshcast.cache_info()["test-lru"]
    assert (info.size, info.maxsize, info.hits, info.misses) == (2, 2, 2, 2)
    meshcast.clear_caches(["test-lru"])
    assert meshcast.cache_info()["test-lru"].size == 0


def test_a_weighed_cache_keeps_its_weight_bound() -> None:
    cache: BoundedCache[str, list[int]] = BoundedCache("test-weight", 10, "lists, 5 items",
                                                        weight=len, max_weight=5)
    cache.put("a", [1, 2])
    cache.put("b", [3, 4])
    cache.put("c", [5, 6])  # 6 items: drops "a"
    assert cache.get("a") is None and cache.get("b") == [3, 4]
    cache.put("big", list(range(9)))  # alone over the bound: kept, the others dropped
    assert cache.values() == [list(range(9))]
    cache.pop("big")
    cache.put("d", [7])
    assert cache.values() == [[7]]
    with pytest.raises(ValueError, match="max_weight must be an integer >= 1, got 0"):
        BoundedCache("test-weight-zero", 1, "", weight=len)


def test_bad_names_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="maxsize must be an integer >= 1, got 0"):
        BoundedCache("test-zero", 0, "")
    BoundedCache("test-twice", 1, "")
    with pytest.raises(ValueError, match="a cache named 'test-twice' exists already"):
        BoundedCache("test-twice", 1, "")
    with pytest.raises(ValueError, match=r"no cache named \['nope'\]"):
        meshcast.clear_caches(["nope"])


def test_plan_serves_a_repeated_call_from_its_cache() -> None:
    from meshcast.core.cases import PAPER_CASES

    meshcast.clear_plan_cache()
    task = PAPER_CASES[2].task()
    topo = meshcast.Topology.preset("p3.8xlarge", 4)
    first = meshcast.plan(task, topo)
    again = meshcast.plan(meshcast.ReshardTask.from_json(task.to_json()), topo)  # equal, new
    assert again is first
    info = meshcast.cache_info()["planning.plan"]
    assert (info.size, info.hits, info.misses) == (1, 1, 1)
    fresh = meshcast.plan(task, topo, cache=False)  # planned anew, the cache left as it is
    assert fresh is not first and fresh == first
    assert meshcast.cache_info()["planning.plan"].misses == 1
    assert meshcast.plan(task, topo, balance="none") is not first  # other options: a miss
    assert meshcast.plan(task) is meshcast.plan(task)  # the default topology too
    meshcast.clear_plan_cache()
    assert meshcast.cache_info()["planning.plan"].size == 0


def test_a_repeated_call_checks_the_topology_once_and_hashes_are_kept() -> None:
    """The coverage check of a (topology, meshes) pair is remembered, a rank outside is still
    refused, and the kept hashes of meshes and topologies agree with equality, also after a copy
    to another process (pickle) and for a topology differing only by name."""
    topo = meshcast.Topology.preset("h100x8", 2)
    inside, outside = meshcast.Mesh.from_range(0, (2, 8)), meshcast.Mesh.from_range(8, (2, 8))
    topo.covers_meshes([inside])
    assert inside in topo._covered
    with pytest.raises(ValueError, match="does not place ranks \\[16"):
        topo.covers_meshes([inside, outside])
    assert outside not in topo._covered
    copy = pickle.loads(pickle.dumps(topo))
    assert copy == topo and hash(copy) == hash(topo)
    renamed = dataclasses.replace(topo, name="other")
    assert renamed != topo and hash(renamed) == hash(topo)
    assert hash(pickle.loads(pickle.dumps(inside))) == hash(meshcast.Mesh.from_range(0, (2, 8)))
