"""Process groups for the NCCL path, created once per distinct set of ranks and reused.

Only the members of a group create it: a rank outside a plan never has to be there. torch's own
``new_group(use_local_synchronization=True)`` names a group after the ranks *and the number of
groups the calling process already has*, so two members that took part in different earlier plans
disagree on the name and wait for each other forever. We therefore build the backend group
directly on a store prefix named by the ranks alone, and members create the groups they share in
one canonical order (smaller groups first, then by ranks), as torch requires.

The gloo path needs no groups at all: it runs on point-to-point messages of the caller's group.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterable

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = ["GroupCache", "canonical_order", "group_cache"]

RankSet = tuple[int, ...]


def canonical_order(rank_sets: Iterable[Iterable[int]]) -> list[RankSet]:
    """Distinct sorted rank tuples in the order every rank creates them."""
    unique = {tuple(sorted(set(s))) for s in rank_sets}
    return sorted(unique, key=lambda s: (len(s), s))


class GroupCache:
    """``{global rank set: backend process group}``; cleared when the default group changes."""

    def __init__(self) -> None:
        self._groups: dict[RankSet, object] = {}
        self._world: object | None = None
        self._lock = threading.Lock()

    def ensure(self, rank_sets: Iterable[Iterable[int]], timeout: float) -> None:
        """Create the missing groups among ``rank_sets`` (each must contain this rank)."""
        with self._lock:
            if dist.group.WORLD is not self._world:
                self._groups.clear()
                self._world = dist.group.WORLD
            me = dist.get_rank()
            for ranks in canonical_order(rank_sets):
                if ranks in self._groups:
                    continue
                if me not in ranks:
                    raise ValueError(f"rank {me} asked for a group {list(ranks)} it is not in")
                try:
                    self._groups[ranks] = _nccl_group(ranks, me, timeout)
                except Exception as exc:
                    raise RuntimeError(
                        f"rank {me}: creating the process group of ranks {list(ranks)} failed "
                        f"within {timeout:g} s (every one of them must call meshcast.reshard with "
                        f"the same plan): {exc}"
                    ) from exc

    def get(self, ranks: Iterable[int], timeout: float) -> object:
        """The group of exactly ``ranks`` (global), creating it if needed."""
        key = tuple(sorted(set(ranks)))
        self.ensure([key], timeout)
        return self._groups[key]

    def __len__(self) -> int:
        return len(self._groups)

    def clear(self) -> None:
        """Forget every cached group."""
        with self._lock:
            self._groups.clear()


def _nccl_group(ranks: RankSet, me: int, timeout: float) -> object:
    name = "meshcast/" + "_".join(map(str, ranks)) + "/"
    store = dist.PrefixStore(name, c10d._get_default_store())
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = datetime.timedelta(seconds=timeout)
    return dist.ProcessGroupNCCL(store, ranks.index(me), len(ranks), options)


group_cache = GroupCache()
"""The process-wide cache used by the NCCL path of :func:`meshcast.reshard`."""
