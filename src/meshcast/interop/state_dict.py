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

from ..core.plan import Plan
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
    from ..runtime import arguments, execute
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
        tasks = _tasks(state_dict, layouts, dtensor_form, reduce_partial)
        plans = plan_many(tasks, resolve_topology(topology), strategy=strategy, balance=balance)
    except (TypeError, ValueError) as exc:
        arguments.publish_refusal(None, exc)
        raise
    timeout = execute.DEFAULT_TIMEOUT if timeout is None else timeout
    outs = run_many(
        _sources(state_dict, layouts, plans, dtensor_form, reduce_partial, errors, timeout),
        plans,
        bucket_bytes=bucket_bytes,
        timeout=timeout,
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


def _sources(
    state_dict: Mapping[str, Any], layouts: Mapping[str, Any], plans: list[Plan],
    dtensor_form: bool, reduce_partial: str, errors: list[str], timeout: float,
) -> list[Any]:
    """This rank's source shard of every name of ``layouts``, in order. Partial DTensors are
    reduced on their meshes (collectives) only once every rank of the plans has agreed to go
    ahead: a rank that refused its arguments would leave its peers waiting in the reduction, or
    pair it with the reduction of its next call. A reduction that cannot be computed goes to
    ``errors`` (:func:`meshcast.interop.dtensor.source_shard`)."""
    from ..runtime.many import agree_before
    from .dtensor import source_shard
    from .dtensor_spec import has_partial

    if not dtensor_form:
        return [state_dict.get(name) for name in layouts]
    if any(has_partial(state_dict[name]) for name in layouts):
        agree_before(plans, "reducing Partial placements of the state dict on their meshes",
                     timeout=timeout, caller="meshcast.reshard_state_dict", errors=errors)
    return [source_shard(state_dict[name], spec[1], reduce_partial, errors,
                         f"state_dict[{name!r}]") for name, spec in layouts.items()]


def _tasks(
    state_dict: Mapping[str, Any], layouts: Mapping[str, Any], dtensor_form: bool,
    reduce_partial: str,
) -> list[ReshardTask]:
    """The task of every name of ``layouts``, in order; raises ``TypeError``/``ValueError`` for
    an entry it cannot read, naming it."""
    from .dtensor import dtensor_task

    tasks: list[ReshardTask] = []
    for name, spec in layouts.items():
        value = state_dict.get(name)
        if not dtensor_form:
            if not isinstance(spec, ReshardTask):
                kind = type(value).__name__
                raise TypeError(
                    f"layouts[{name!r}] must be a meshcast.ReshardTask (shape, dtype, source and "
                    f"destination layouts) for a plain tensor, got {type(spec).__name__}"
                    + ("" if value is None or kind in ("Tensor", "Parameter") else
                       f" (state_dict[{name!r}] is a {kind}: a state dict holds DTensors, "
                       f"each with its (device_mesh, placements), or plain tensors)"))
            tasks.append(spec)
            continue
        if not _is_dtensor(value):
            raise TypeError(
                f"state_dict[{name!r}] must be a DTensor like the other entries (every rank "
                f"holds every DTensor in SPMD), got {type(value).__name__}; a plain tensor "
                f"that every rank holds alike (an optimizer's scalar 'step') moves as "
                f"DTensor.from_local(t, mesh, [Replicate()])"
            )
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise TypeError(
                f"layouts[{name!r}] must be (device_mesh, placements) for a DTensor, got {spec!r}"
            )
        try:
            tasks.append(dtensor_task(value, spec[0], spec[1], reduce_partial))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"layouts[{name!r}]: {exc}") from None
    return tasks
