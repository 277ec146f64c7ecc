"""The one cache mechanism: bounded, least-recently-used caches, each registered under a name, so
that every cache meshcast keeps (plans, schedules, process groups, detected topologies) can be
inspected with :func:`cache_info` and emptied with :func:`clear_caches`.

A cache holds at most ``maxsize`` entries and drops the least recently used one beyond that, so no
process grows without bound however many distinct tasks it plans. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, NamedTuple, TypeVar

__all__ = ["BoundedCache", "CacheInfo", "cache_info", "clear_caches"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class CacheInfo(NamedTuple):
    """What one cache holds and how it has served: ``hits``/``misses`` since it was made or last
    cleared."""

    name: str
    size: int
    maxsize: int
    hits: int
    misses: int
    about: str


_REGISTRY: dict[str, BoundedCache] = {}
_REGISTRY_LOCK = threading.Lock()


class BoundedCache(Generic[K, V]):
    """A least-recently-used map of at most ``maxsize`` entries, registered as ``name``. With
    ``weight`` (a function of a value) the entries' weights also stay at most ``max_weight``
    together (the newest entry is kept even when it alone weighs more)."""

    def __init__(self, name: str, maxsize: int, about: str, *,
                 weight: Callable[[V], int] | None = None, max_weight: int = 0) -> None:
        if not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(f"maxsize must be an integer >= 1, got {maxsize!r}")
        if weight is not None and (not isinstance(max_weight, int) or max_weight < 1):
            raise ValueError(f"max_weight must be an integer >= 1, got {max_weight!r}")
        self.name = name
        self.maxsize = maxsize
        self.about = about
        self._weight = weight
        self._max_weight = max_weight
        self._weights: dict[K, int] = {}
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        with _REGISTRY_LOCK:
            if name in _REGISTRY:
                raise ValueError(f"a cache named {name!r} exists already")
            _REGISTRY[name] = self

    def get(self, key: K) -> V | None:
        """The value under ``key`` (now the most recently used), or None."""
        with self._lock:
            if key in self._data:
                self._hits += 1
                self._data.move_to_end(key)
                return self._data[key]
            self._misses += 1
            return None

    def put(self, key: K, value: V) -> V:
        """Store ``value`` under ``key``, dropping the least recently used entries while the
        cache is over ``maxsize`` entries (or over ``max_weight``)."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            if self._weight is not None:
                self._weights[key] = self._weight(value)
            while len(self._data) > self.maxsize or (
                len(self._data) > 1 and sum(self._weights.values()) > self._max_weight
            ):
                old, _ = self._data.popitem(last=False)
                self._weights.pop(old, None)
        return value

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The value under ``key``, made by ``make()`` and stored on a miss (``make`` runs
        outside the lock: two threads missing together may both make it; one is kept)."""
        value = self.get(key)
        return self.put(key, make()) if value is None else value

    def pop(self, key: K) -> V | None:
        """Remove and return the value under ``key`` (None if absent)."""
        with self._lock:
            self._weights.pop(key, None)
            return self._data.pop(key, None)

    def values(self) -> list[V]:
        """The values held, least recently used first."""
        with self._lock:
            return list(self._data.values())

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        with self._lock:
            self._data.clear()
            self._weights.clear()
            self._hits = self._misses = 0

    def info(self) -> CacheInfo:
        """Size and counters of this cache."""
        with self._lock:
            return CacheInfo(self.name, len(self._data), self.maxsize, self._hits, self._misses,
                             self.about)


def cache_info() -> dict[str, CacheInfo]:
    """Every cache meshcast keeps in this process, by name (``meshcast.cache_info()``)."""
    with _REGISTRY_LOCK:
        caches = list(_REGISTRY.values())
    return {c.name: c.info() for c in caches}


def clear_caches(names: Iterable[str] | None = None) -> None:
    """Empty the caches named (all of them by default; ``meshcast.clear_caches()``)."""
    with _REGISTRY_LOCK:
        known = dict(_REGISTRY)
    wanted = list(known) if names is None else list(names)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"no cache named {unknown}; the caches are {sorted(known)}")
    for name in wanted:
        known[name].clear()
