"""Which ranks combine which blocks' magnitudes before a scaled conversion (pure, numpy only).

To convert a sharded weight to FP8 on the sending side exactly as the whole tensor would be,
every sender needs the final ``amax`` of each block its shard touches (per tensor: of the whole
tensor, one block), and the engine needs the scales in its layout. A source rank whose shard cuts
a block knows only a partial ``amax``. :func:`plan_amax` plans one exchange that settles both: for
every block, the **contributors** (the one rank holding it whole, if any; else one rank per
distinct source shard touching it: replicas do not repeat) send their partial ``amax`` to every
rank that needs the block and does not hold it whole (the source ranks touching it, and the ranks
holding its scale in the scale layout), which take the maximum. Maximum is exact in any order,
so every rank ends with the bits of the whole tensor's ``amax``. All messages between a pair of
ranks are one (:meth:`AmaxPlan.pairs`); :func:`combine_local` runs a plan in one process, the
reference for :func:`meshcast.runtime.convert.combine_amax`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..core.cache import BoundedCache
from ..core.checks import as_shape
from ..core.layout import Layout
from ..core.region import Region
from ..core.scales import grid_shape, touched_blocks

__all__ = ["AmaxPlan", "combine_local", "plan_amax"]


def _flat(ids: Sequence[np.ndarray], grid: tuple[int, ...]) -> np.ndarray:
    """Row-major grid ids of the product of per-dimension ids (increasing when they are)."""
    if not grid:
        return np.zeros(1, np.int64)
    return np.ravel_multi_index(np.ix_(*ids), grid).reshape(-1).astype(np.int64)


@dataclass(frozen=True, eq=False)
class AmaxPlan:
    """The exchange of partial block magnitudes for one tensor (module docstring).

    ``partial[r]``: the grid ids of the blocks source rank ``r`` touches, in the row-major order
    of its partial tensor (shape ``partial_shape[r]``); ``scale[r]``: the grid ids of rank
    ``r``'s shard of the scale layout ``dst``, in local order; ``known[r]``: every id ``r`` ends
    up knowing (increasing); ``messages[(c, r)]``: the ids ``c`` sends ``r`` (increasing).
    """

    shape: tuple[int, ...]
    block: tuple[int, ...] | None
    grid: tuple[int, ...]
    src: Layout
    dst: Layout | None
    partial: Mapping[int, np.ndarray]
    partial_shape: Mapping[int, tuple[int, ...]]
    scale: Mapping[int, np.ndarray]
    known: Mapping[int, np.ndarray]
    messages: Mapping[tuple[int, int], np.ndarray]

    def pairs(self) -> list[tuple[int, int]]:
        """Every ``(sender, receiver)`` pair with a message, sorted."""
        return sorted(self.messages)

    def slots(self, rank: int, ids: np.ndarray) -> np.ndarray:
        """Positions of ``ids`` in ``known[rank]``."""
        return np.searchsorted(self.known[rank], ids)

    def send_slots(self, sender: int, receiver: int) -> np.ndarray:
        """Positions in ``sender``'s partial (flattened) of what it sends ``receiver``."""
        return np.searchsorted(self.partial[sender], self.messages[(sender, receiver)])


def _holders(src: Layout, shape: tuple[int, ...], block, grid) -> dict:
    """Per source rank holding elements: (touched ids, wholly held ids, partial shape)."""
    out = {}
    for rank, region in sorted(src.regions(shape).items()):
        if region.size == 0:
            continue
        per_dim = touched_blocks(region, shape, block)
        # (np.ix_ reads a boolean array as a mask: give it 0/1)
        whole = functools.reduce(np.logical_and, np.ix_(*(w.astype(np.int8) for _, _, w in
                                                          per_dim)), True)
        ids = _flat([i for i, _, _ in per_dim], grid)
        out[rank] = (region, ids, ids[np.asarray(whole).reshape(-1)],
                     tuple(len(i) for i, _, _ in per_dim))
    return out


def _contributors(holders: dict, size: int) -> dict[int, np.ndarray]:
    """Per holder, the ids it contributes: the whole block's lowest holder if any, else the
    lowest rank of each distinct region touching the block."""
    owner = np.full(size, -1, np.int64)
    for rank in sorted(holders, reverse=True):
        owner[holders[rank][2]] = rank
    first: dict[Region, int] = {}
    for rank in sorted(holders):
        first.setdefault(holders[rank][0], rank)
    out = {}
    for rank, (region, ids, _, _) in holders.items():
        mine = (owner[ids] == rank) | ((owner[ids] < 0) & (first[region] == rank))
        out[rank] = ids[mine]
    return out


AMAX_PLANS: BoundedCache[tuple, AmaxPlan] = BoundedCache(
    "planning.plan_amax", 256, "plan_amax's plans by (shape, block, source, scale layouts)")
"""The plans :func:`plan_amax` made (listed by :func:`meshcast.cache_info`, emptied by
:func:`meshcast.clear_caches`)."""


def _plan(shape: tuple[int, ...], block, src: Layout, dst: Layout | None) -> AmaxPlan:
    grid = grid_shape(shape, block)
    size = int(np.prod(grid, dtype=np.int64))
    holders = _holders(src, shape, block, grid)
    contrib = _contributors(holders, size)
    if dst is None:
        scale = {}
    elif block is None:  # one scale, on every rank of dst
        scale = {r: np.zeros(1, np.int64) for r in dst.mesh.devices}
    else:
        scale = {r: _flat(reg.indices(), grid) for r, reg in dst.regions(grid).items()
                 if reg.size}
    need, known = {}, {}
    for rank in sorted(set(holders) | set(scale)):
        h = holders.get(rank)
        ids = np.union1d(h[1] if h else [], scale.get(rank, [])).astype(np.int64)
        known[rank] = ids
        need[rank] = np.setdiff1d(ids, h[2]) if h else ids
    messages = {}
    for c in sorted(contrib):
        for r in sorted(need):
            if c == r or (r in holders and holders[r][0] == holders[c][0]):
                continue  # a replica's own partial is the same
            ids = np.intersect1d(contrib[c], need[r])
            if len(ids):
                messages[(c, r)] = ids
    return AmaxPlan(shape, block, grid, src, dst, {r: h[1] for r, h in holders.items()},
                    {r: h[3] for r, h in holders.items()}, scale, known, messages)


def plan_amax(
    shape: Sequence[int], block: Sequence[int] | None, src: Layout, dst: Layout | None = None
) -> AmaxPlan:
    """The exchange that gives every source rank of a weight of ``shape`` and layout ``src`` the
    whole tensor's ``amax`` of each block it touches (``block``: trailing block sizes, e.g.
    ``(128, 128)``, or None per tensor), and every rank of ``dst`` (the scale layout,
    :func:`meshcast.core.scales.scale_layout`; None: the senders only) its shard of them.
    Deterministic and cached."""
    shape = as_shape(shape)
    src.check_shape(shape)
    block = None if block is None else tuple(int(b) for b in block)
    if dst is not None:
        dst.check_shape(grid_shape(shape, block) if block is not None else ())
    key = (shape, block, src, dst)
    hit = AMAX_PLANS.get(key)
    return hit if hit is not None else AMAX_PLANS.put(key, _plan(*key))


def combine_local(
    plan: AmaxPlan, partials: Mapping[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """Run ``plan`` in one process: from each source rank's partial ``amax`` (shape
    ``plan.partial_shape[r]``) to what each rank knows, ``{rank: values over known[rank]}``."""
    known = {r: np.zeros(len(ids), np.float32) for r, ids in plan.known.items()}
    for r, ids in plan.partial.items():
        known[r][plan.slots(r, ids)] = np.asarray(partials[r], np.float32).reshape(-1)
    for c, r in plan.pairs():
        sent = np.asarray(partials[c], np.float32).reshape(-1)[plan.send_slots(c, r)]
        at = plan.slots(r, plan.messages[(c, r)])
        known[r][at] = np.maximum(known[r][at], sent)
    return known
