"""Whole-model resharding: move a state dict from one set of layouts to another in one call.

Two forms, both SPMD (every rank of the default process group that holds or receives any tensor
calls, with the same ``layouts`` in the same order):

* **plain tensors**: ``state_dict[name]`` is this rank's source shard of tensor ``name`` (absent
  or None where the rank is outside its source mesh) and ``layouts[name]`` a
  :class:`~meshcast.ReshardTask` declaring its global shape, dtype, source and destination
  layouts. The result maps each name whose destination mesh holds this rank to its shard.
* **DTensors**: ``state_dict[name]`` is a DTensor (every rank holds the object, as in SPMD) and
  ``layouts[name]`` is ``(device_mesh, placements)``. The result maps each name whose destination
  mesh holds this rank to a DTensor there.

All tensors are planned together (:func:`meshcast.plan_many`, cached) and moved together in
bounded buckets (:func:`meshcast.reshard_many`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..core.task import ReshardTask
from ..core.topology import Topology
from ..planning.many import DEFAULT_BUCKET_BYTES, plan_many
from ..runtime.many import run_many

__all__ = ["reshard_state_dict"]


def _is_dtensor(x: object) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(x, DTensor)


def reshard_state_dict(
    state_dict: Mapping[str, Any],
    layouts: Mapping[str, Any],
    *,
    topology: Topology | None = None,
    strategy: str | None = None,
    balance: str | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    timeout: float | None = None,
    reduce_partial: str = "all_reduce",
) -> dict[str, Any]:
    """Move every tensor of ``state_dict`` to the destination ``layouts`` declares for it.

    See the module docstring for the two forms. Names are taken in the order of ``layouts``.
    Before any data moves, every rank checks its entries: a name in ``state_dict`` that
    ``layouts`` does not declare, a missing shard, or a shard whose shape or dtype differs from
    its declared layout raises ``ValueError`` on every rank, naming the tensor and the rule.
    ``strategy``/``balance`` go to :func:`meshcast.plan_many` (default: joint broadcast plan);
    ``topology`` defaults to :func:`meshcast.interop.dtensor.resolve_topology`; ``bucket_bytes``
    bounds each rank's staging memory (:func:`meshcast.reshard_many`); ``reduce_partial`` says
    how Partial DTensors are reduced on their mesh (:func:`meshcast.reshard_dtensor`).
    """
    from ..runtime.execute import DEFAULT_TIMEOUT, publish_refusal
    from .dtensor import as_dtensor, resolve_topology

    try:  # what this rank alone gets wrong is told to the others before they wait for it
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping of names to tensors, got "
                            f"{type(state_dict).__name__}")
        if not isinstance(layouts, Mapping):
            raise TypeError(f"layouts must be a mapping of names to layouts, got "
                            f"{type(layouts).__name__}")
        names = list(layouts)
        errors = [
            f"state_dict[{name!r}] has no entry in layouts: declare its layout (every name must "
            f"be declared, in the same order on every rank)"
            for name in state_dict if name not in layouts
        ]
        dtensor_form = any(_is_dtensor(v) for v in state_dict.values())
        tasks, locals_ = _entries(state_dict, layouts, dtensor_form, reduce_partial, errors)
        plans = plan_many(tasks, resolve_topology(topology), strategy=strategy, balance=balance)
    except (TypeError, ValueError) as exc:
        publish_refusal(None, exc)
        raise
    outs = run_many(
        locals_,
        plans,
        bucket_bytes=bucket_bytes,
        timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
        names=[f"state_dict[{n!r}]" for n in names],
        errors=errors,
        caller="meshcast.reshard_state_dict",
    )
    result: dict[str, Any] = {}
    for k, name in enumerate(names):
        if outs[k] is not None:
            result[name] = (as_dtensor(outs[k], *layouts[name], tasks[k]) if dtensor_form
                            else outs[k])
    return result


def _entries(
    state_dict: Mapping[str, Any], layouts: Mapping[str, Any], dtensor_form: bool,
    reduce_partial: str, errors: list[str],
) -> tuple[list[ReshardTask], list[torch.Tensor | None]]:
    """The task and this rank's source shard of every name of ``layouts``, in order (a Partial
    source that cannot be reduced goes to ``errors``, raised on every rank by the runtime)."""
    from .dtensor import dtensor_task, source_shard

    tasks: list[ReshardTask] = []
    locals_: list[torch.Tensor | None] = []
    for name, spec in layouts.items():
        value = state_dict.get(name)
        if not dtensor_form:
            if not isinstance(spec, ReshardTask):
                raise TypeError(
                    f"layouts[{name!r}] must be a meshcast.ReshardTask (shape, dtype, source and "
                    f"destination layouts) for a plain tensor, got {type(spec).__name__}"
                )
            tasks.append(spec)
            locals_.append(value)
            continue
        if not _is_dtensor(value):
            raise TypeError(
                f"state_dict[{name!r}] must be a DTensor like the other entries (every rank "
                f"holds every DTensor in SPMD), got {type(value).__name__}"
            )
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise TypeError(
                f"layouts[{name!r}] must be (device_mesh, placements) for a DTensor, got {spec!r}"
            )
        try:
            tasks.append(dtensor_task(value, spec[0], spec[1], reduce_partial))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"layouts[{name!r}]: {exc}") from None
        locals_.append(source_shard(value, spec[1], reduce_partial, errors,
                                    f"state_dict[{name!r}]"))
    return tasks, locals_
