"""Sub-groups of the ``"collectives"`` transport, created once per distinct set of ranks and
backend and reused (a :class:`~meshcast.core.cache.BoundedCache` named ``"runtime.groups"``).

Only the members of a group create it: a rank outside a plan never has to be there. torch's own
``new_group(use_local_synchronization=True)`` names a group after the ranks *and the number of
groups the calling process already has*, so two members that took part in different earlier plans
disagree on the name and wait for each other forever. We therefore build the backend group
directly on a prefix of the default store named by the ranks and by how many times this member
has created that rank set before (a counter kept in the store, so a cleared or evicted entry is
re-created under a new name rather than over the old one's keys), and members create the groups
they share in one canonical order (smaller groups first, then by ranks), as torch requires.
Members must therefore keep the same groups: clear the cache (``meshcast.clear_caches()``) on
every rank together, and keep the distinct rank sets of a job under :data:`MAX_GROUPS`.

Groups are forgotten when the default process group changes (``destroy_process_group`` and a new
``init_process_group``). The ``"p2p"`` transport needs no groups at all.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..core.cache import BoundedCache

__all__ = ["MAX_GROUPS", "GroupCache", "canonical_order", "group_cache"]

RankSet = tuple[int, ...]
MAX_GROUPS = 1024
"""Sub-groups kept per process (each holds connections to its members)."""


def canonical_order(rank_sets: Iterable[Iterable[int]]) -> list[RankSet]:
    """Distinct sorted rank tuples in the order every rank creates them."""
    unique = {tuple(sorted(set(s))) for s in rank_sets}
    return sorted(unique, key=lambda s: (len(s), s))


def _backend_of(device: torch.device | str | None) -> str:
    return "nccl" if torch.device(device or "cpu").type == "cuda" else "gloo"


class GroupCache:
    """``{(global rank set, backend): backend process group}`` of the current default group."""

    def __init__(self) -> None:
        self._groups: BoundedCache[tuple[RankSet, str], object] = BoundedCache(
            "runtime.groups", MAX_GROUPS,
            "sub-groups of the collectives transport, by rank set and backend")
        self._world: object | None = None
        self._lock = threading.Lock()

    def ensure(
        self, rank_sets: Iterable[Iterable[int]], timeout: float,
        device: torch.device | str | None = None,
    ) -> None:
        """Create the missing groups among ``rank_sets`` (each must contain this rank) for
        tensors on ``device`` (CUDA: NCCL groups, else gloo)."""
        backend = _backend_of(device)
        with self._lock:
            if dist.group.WORLD is not self._world:
                self._groups.clear()
                self._world = dist.group.WORLD
            me = dist.get_rank()
            for ranks in canonical_order(rank_sets):
                if self._groups.get((ranks, backend)) is not None:
                    continue
                if me not in ranks:
                    raise ValueError(f"rank {me} asked for a group {list(ranks)} it is not in")
                try:
                    self._groups.put((ranks, backend), _new_group(ranks, me, timeout, backend))
                except Exception as exc:
                    raise RuntimeError(
                        f"rank {me}: creating the {backend} process group of ranks "
                        f"{list(ranks)} failed within {timeout:g} s (every one of them must call "
                        f"meshcast.reshard with the same plan): {exc}"
                    ) from exc

    def get(
        self, ranks: Iterable[int], timeout: float, device: torch.device | str | None = None
    ) -> object:
        """The group of exactly ``ranks`` (global), creating it if needed."""
        key = tuple(sorted(set(ranks)))
        self.ensure([key], timeout, device)
        group = self._groups.get((key, _backend_of(device)))
        assert group is not None
        return group

    def __len__(self) -> int:
        return self._groups.info().size

    def clear(self) -> None:
        """Forget every cached group (on every rank together, see the module docstring)."""
        self._groups.clear()


def _new_group(ranks: RankSet, me: int, timeout: float, backend: str) -> object:
    default = c10d._get_default_store()
    base = f"meshcast/groups/{backend}/" + "_".join(map(str, ranks))
    made = default.add(f"{base}/made-by/{me}", 1)  # the same count on every member
    store = dist.PrefixStore(f"{base}/{made}/", default)
    wait = datetime.timedelta(seconds=timeout)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = wait
        return dist.ProcessGroupNCCL(store, ranks.index(me), len(ranks), options)
    return dist.ProcessGroupGloo(store, ranks.index(me), len(ranks), wait)


group_cache = GroupCache()
"""The process-wide cache used by the ``"collectives"`` transport of :func:`meshcast.reshard`."""
