"""The gloo process groups of the pipeline runtime: one per (kind of traffic, ranks), cached in the
bounded cache ``pipeline.groups`` (``meshcast.clear_caches(["pipeline.groups"])`` empties it)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch.distributed as dist

from ..core.cache import BoundedCache

__all__ = ["default_store", "tensor_parallel_group"]

_GROUPS: BoundedCache[tuple[object, str, tuple[int, ...]], dist.ProcessGroup] = BoundedCache(
    "pipeline.groups", 256, "gloo groups of the pipeline runtime, per (world, purpose, ranks)"
)


def tensor_parallel_group(ranks: Sequence[int], timeout: float = 120.0, purpose: str = "tp"
                          ) -> dist.ProcessGroup:
    """A gloo group of ``ranks`` for one kind of traffic (``purpose``: tensor-parallel
    collectives, activations, gradients), distinct from every other group. Every rank of the
    default group must call this with the same arguments in the same order
    (``dist.new_group``); groups are cached per (purpose, ranks)."""
    key = (dist.group.WORLD, purpose, tuple(ranks))
    return _GROUPS.get_or_make(
        key, lambda: dist.new_group(list(ranks), timeout=datetime.timedelta(seconds=timeout))
    )


def default_store() -> dist.Store | None:
    """The default group's store (None where torch's private accessor is missing: failures
    then travel through timeouts only)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None
