"""DTensor interop: read a DTensor's layout, and move DTensors to another DeviceMesh.

PyTorch's ``DTensor.redistribute`` refuses a different device mesh ("Cross device mesh comm not
supported yet"); :func:`reshard_dtensor` does exactly that, with meshcast's planner and runtime.

* A DeviceMesh's ranks are global ranks of the default process group, so plan ranks are global
  ranks; every rank of the default group that is in the source or destination mesh must call.
* ``Partial`` placements on the source are reduced on the way: on the source mesh, before any
  data leaves it, DTensor's own ``redistribute`` turns each ``Partial`` mesh axis into
  ``Replicate`` (an all-reduce with the Partial's reduce op along that axis), or with
  ``reduce_partial="reduce_scatter"`` into ``Shard`` of the dimension the destination splits (a
  reduce-scatter: half the bytes on the source mesh; docs/dtensor.md measures both). A ``Partial``
  destination axis receives the value replicated, and DTensor's own ``redistribute`` then makes
  it partial on each rank, without communication, as DTensor does from ``Replicate`` (``sum``:
  each rank holds value / n; ``avg``, ``max``, ``min``: the value).
* Uneven sizes follow DTensor's chunking exactly (``Layout`` boxes equal DTensor's local shapes
  and offsets).
* The whole spec is read (:mod:`.dtensor_spec`): shard order, ``_StridedShard`` with any split
  factor (a shard of several boxes, in DTensor's local order), sub-meshes (read on the root
  mesh, the same on every rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from ..core.job import job_topology
from ..core.layout import Layout
from ..core.plan import Plan
from ..core.task import ReshardTask
from ..core.topology import Topology
from ..planning.many import plan_many
from .dtensor_spec import has_partial, layout_from_spec, placement_kind

__all__ = [
    "PARTIALS",
    "REDUCTIONS",
    "as_dtensor",
    "dtensor_task",
    "layout_from_dtensor",
    "layout_from_placements",
    "local_source",
    "reduced_placements",
    "reshard_dtensor",
    "resolve_topology",
    "source_shard",
]


PARTIALS = ("sum", "avg", "max", "min")
"""Reduce ops of the Partial destinations DTensor can make from a value (``sum``: value / n)."""


def layout_from_placements(
    device_mesh: DeviceMesh, placements: Sequence[Any], ndim: int, *, argument: str = "placements"
) -> Layout:
    """The meshcast :class:`~meshcast.Layout` of ``placements`` on ``device_mesh``, for a tensor
    of ``ndim`` dimensions, in DTensor's default shard order: ``Shard``, ``_StridedShard`` and
    ``Replicate``; a sub-mesh is read whole (:mod:`meshcast.interop.dtensor_spec`)."""
    return layout_from_spec(device_mesh, placements, ndim, argument=argument)


def _replicated(placements: Sequence[Any]) -> tuple[Any, ...]:
    """``placements`` with every Partial read as Replicate."""
    return tuple(Replicate() if placement_kind(p) == "partial" else p for p in placements)


REDUCTIONS = ("all_reduce", "reduce_scatter")
"""How a Partial source is reduced on its mesh: to ``Replicate`` (an all-reduce, every rank then
holds the sum), or to ``Shard`` of the dimension the destination splits (a reduce-scatter: half
the bytes on the source mesh, each rank then holds one piece to send)."""


def reduced_placements(
    dt: DTensor, placements: Sequence[Any], reduce_partial: str = "all_reduce"
) -> tuple[Any, ...]:
    """``dt``'s placements with every Partial reduced as ``reduce_partial`` says
    (:data:`REDUCTIONS`), toward the destination ``placements``: ``reduce_scatter`` shards the
    first tensor dimension the destination shards, else the longest one, leaving out dimensions
    a ``_StridedShard`` of ``dt`` splits (DTensor cannot shard those again consistently); with
    none left, an all-reduce."""
    if reduce_partial not in REDUCTIONS:
        raise ValueError(f"reduce_partial must be one of {', '.join(map(repr, REDUCTIONS))}, "
                         f"got {reduce_partial!r}")
    strided = {p.dim % dt.ndim for p in dt.placements if placement_kind(p) == "strided"}
    free = [d for d in range(dt.ndim) if d not in strided]
    if reduce_partial == "all_reduce" or not free:
        return _replicated(dt.placements)
    split = [p.dim % dt.ndim for p in placements if placement_kind(p) in ("shard", "strided")
             and p.dim % dt.ndim in free]
    dim = split[0] if split else max(free, key=lambda d: (dt.shape[d], -d))
    return tuple(Shard(dim) if placement_kind(p) == "partial" else p for p in dt.placements)


def _source_spec(dt: DTensor, reduced: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any]:
    """``dt``'s placements after reducing its Partial ones to ``reduced``, and its shard order
    (None: default). A Partial source is reduced by ``redistribute`` to a spec in the default
    order (see :func:`local_source`), so its order is the default one."""
    if has_partial(dt):
        return reduced, None
    return tuple(dt.placements), getattr(dt._spec, "shard_order", None)


def layout_from_dtensor(dt: DTensor, *, own_mesh: bool = False) -> Layout:
    """The meshcast :class:`~meshcast.Layout` of ``dt``: its DeviceMesh (a sub-mesh read whole,
    or with ``own_mesh`` only this rank's member of it), placements and shard order.

    Raises ``ValueError`` for ``Partial`` placements (reduce first, or use
    :func:`reshard_dtensor`, which reduces on the way).
    """
    if not isinstance(dt, DTensor):
        raise TypeError(f"dt must be a torch DTensor, got {type(dt).__name__}")
    return layout_from_spec(dt.device_mesh, dt.placements, dt.ndim,
                            shard_order=getattr(dt._spec, "shard_order", None),
                            argument="dt.placements", own_mesh=own_mesh)


def dtensor_task(
    dt: DTensor, device_mesh: DeviceMesh, placements: Sequence[Any],
    reduce_partial: str = "all_reduce",
) -> ReshardTask:
    """The :class:`~meshcast.ReshardTask` moving ``dt`` to ``placements`` on ``device_mesh``
    (a Partial source reduced as ``reduce_partial`` says, a Partial destination read as
    Replicate: module docstring)."""
    if not isinstance(dt, DTensor):
        raise TypeError(f"dt must be a torch DTensor, got {type(dt).__name__}")
    src_placements, order = _source_spec(dt, reduced_placements(dt, placements, reduce_partial))
    src = layout_from_spec(dt.device_mesh, src_placements, dt.ndim, shard_order=order,
                           argument="dt.placements")
    for i, p in enumerate(placements):
        if placement_kind(p) != "partial":
            continue
        if type(p) is not Partial:
            raise ValueError(
                f"placements[{i}] is {p!r}: an internal DTensor placement (a masked partial of "
                f"an embedding lookup) cannot be a destination; use Partial or Replicate"
            )
        if p.reduce_op not in PARTIALS:
            raise ValueError(
                f"placements[{i}] is {p!r}: DTensor makes a Partial from a value only for "
                f"reduce ops {', '.join(PARTIALS)} (a product or bitwise op has no exact "
                f"inverse); choose one of those or Replicate"
            )
        _check_partial_destination(placements, i, p, device_mesh, dt.dtype)
    dst = layout_from_placements(device_mesh, _replicated(placements), dt.ndim)
    return ReshardTask(tuple(dt.shape), dt.dtype, src, dst)


def _check_partial_destination(placements: Sequence[Any], i: int, p: Any,
                               device_mesh: DeviceMesh, dtype: torch.dtype) -> None:
    """Refuse, before anything moves, a Partial destination DTensor could not make (on every
    rank alike: it depends on the arguments only): mixed reduce ops, or a value of ``dtype``
    that DTensor's partitioning cannot compute (a sum divides by the mesh dimension's size)."""
    ops = {q.reduce_op for q in placements if placement_kind(q) == "partial"}
    if len(ops) > 1:
        raise ValueError(f"placements mix Partial reduce ops {sorted(ops)}: DTensor supports one "
                         f"reduce op per tensor; use one, or Replicate")
    if device_mesh.size(i) == 1:
        return  # nothing to partition (as DTensor's redistribute skips it)
    try:
        p._partition_value(torch.zeros(1, dtype=dtype, device=device_mesh.device_type),
                           device_mesh, i)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        raise ValueError(f"placements[{i}] is {p!r}, but DTensor cannot make it for {dtype} "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0]}); choose "
                         f"Replicate or another dtype") from None


def resolve_topology(topology: Topology | None) -> Topology | None:
    """``topology`` if given; else the job's topology read from its environment without a
    collective (:func:`meshcast.job_topology`); else None (the planner's default, which reads
    the same environment)."""
    if topology is not None:
        return topology
    return job_topology()


def local_source(
    dt: DTensor, placements: Sequence[Any] = (), reduce_partial: str = "all_reduce"
) -> torch.Tensor | None:
    """This rank's source shard of ``dt``, with Partial mesh axes reduced toward the destination
    ``placements`` as :func:`reduced_placements` says (a collective on the source mesh: every
    rank of it must call); None off the source mesh."""
    if dt.device_mesh.get_coordinate() is None:
        return None
    if has_partial(dt):
        dt = dt.redistribute(dt.device_mesh, reduced_placements(dt, placements, reduce_partial))
    return dt.to_local()


def source_shard(
    dt: DTensor, placements: Sequence[Any], reduce_partial: str, errors: list[str], label: str
) -> torch.Tensor | None:
    """:func:`local_source`, where a Partial reduction that cannot be computed (an average of
    integers, a sum of float8 or the maximum of complex values over gloo, a product) becomes an
    input error in ``errors``, which the runtime raises on every rank through its agreement before
    anything moves, instead of an exception on the source ranks alone (the destination ranks
    would wait out the timeout). ``label`` names the tensor."""
    try:
        return local_source(dt, placements, reduce_partial)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
        errors.append(
            f"{label} ({tuple(dt.placements)}, {dt.dtype}) could not be reduced on rank "
            f"{dist.get_rank()} ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            f"reduce its Partial placements first, or use another dtype")
        return None


def as_dtensor(
    out: torch.Tensor, device_mesh: DeviceMesh, placements: Sequence[Any], task: ReshardTask
) -> DTensor:
    """``out``, this rank's destination shard of ``task``, as the DTensor with ``placements`` on
    ``device_mesh`` (the global shape and contiguous strides of ``task``; no check). Partial
    placements are made from the replicated value by DTensor (module docstring): every rank of
    ``device_mesh`` calls then."""
    shape = torch.Size(task.shape)
    stride = []
    acc = 1
    for n in reversed(task.shape):
        stride.append(acc)
        acc *= max(n, 1)
    for axis, p in enumerate(placements):
        # DTensor's own Replicate -> Partial, on this rank (nothing on a dimension of size 1)
        if placement_kind(p) == "partial" and device_mesh.size(axis) > 1:
            out = p._partition_value(out, device_mesh, axis)
    return DTensor.from_local(
        out, device_mesh, tuple(placements), run_check=False, shape=shape,
        stride=tuple(reversed(stride)),
    )


def _task_and_plan(
    dt: DTensor, device_mesh: DeviceMesh, placements: Sequence[Any], reduce_partial: str,
    plan: Plan | None, topology: Topology | None, strategy: str | None, balance: str | None,
) -> tuple[ReshardTask, Plan | None]:
    """The task of :func:`reshard_dtensor`'s arguments and the plan to run (``plan`` checked
    against the task, or planned); the plan is None on a rank outside both meshes. Raises
    ``TypeError``/``ValueError`` for arguments it cannot read."""
    if not isinstance(dt, DTensor):
        raise TypeError(f"dt must be a torch DTensor, got {type(dt).__name__}")
    if not isinstance(placements, (list, tuple)):  # DTensor's redistribute needs them too
        raise TypeError(f"placements must be a list or tuple of placements, one per dimension "
                        f"of the destination mesh, got {type(placements).__name__}")
    task = dtensor_task(dt, device_mesh, placements, reduce_partial)
    if plan is not None and plan.task != task:
        raise ValueError(
            f"plan is for {plan.task.describe()}, but dt and the destination give {task.describe()}"
        )
    me = dist.get_rank()
    if task.src.mesh.position(me) is None and task.dst.mesh.position(me) is None:
        return task, None
    if plan is None:
        if balance is None:  # meshcast.plan's defaults (plan_many's would be a joint plan)
            balance = "auto" if strategy is None else "none"
        (plan,) = plan_many([task], resolve_topology(topology), strategy=strategy,
                            balance=balance)
    return task, plan


def reshard_dtensor(
    dt: DTensor,
    device_mesh: DeviceMesh,
    placements: Sequence[Any],
    *,
    topology: Topology | None = None,
    strategy: str | None = None,
    balance: str | None = None,
    timeout: float | None = None,
    plan: Plan | None = None,
    reduce_partial: str = "all_reduce",
    **runtime_options: Any,
) -> DTensor | None:
    """Move ``dt`` to ``device_mesh`` with ``placements``; return the new DTensor, or None on a
    rank outside ``device_mesh``.

    Works where ``dt.redistribute`` refuses: disjoint, overlapping or identical meshes, uneven
    shards as DTensor makes them. Call it on every rank of the default process group (SPMD: every
    rank holds a DTensor object; ranks outside both meshes return None at once). ``Partial``
    source placements are reduced on the source mesh first, as ``reduce_partial`` says
    (:data:`REDUCTIONS`; module docstring). ``strategy`` and
    ``balance`` go to :func:`meshcast.plan` (default: ``balance="auto"``); ``topology`` defaults
    to :func:`resolve_topology`. Plans are cached by (shape, dtype, layouts, topology, options);
    ``plan`` skips planning altogether. ``bucket_bytes`` goes to :func:`meshcast.reshard_many`,
    which runs the plan; any other keyword is refused on every rank. The result is a new
    tensor that does not require grad.
    """
    from ..runtime.arguments import publish_refusal
    from ..runtime.execute import DEFAULT_TIMEOUT
    from ..runtime.many import agree_before, run_many

    try:  # what this rank alone gets wrong is told to the others before they wait for it
        unknown = sorted(set(runtime_options) - {"bucket_bytes"})
        if unknown:
            raise TypeError(f"reshard_dtensor got unexpected keyword arguments {unknown} (it "
                            f"passes bucket_bytes on to meshcast.reshard_many, nothing else)")
        task, plan = _task_and_plan(dt, device_mesh, placements, reduce_partial, plan,
                                    topology, strategy, balance)
    except (TypeError, ValueError) as exc:
        publish_refusal(None, exc)
        raise
    if plan is None:  # this rank is outside both meshes
        return None
    in_dst = task.dst.mesh.position(dist.get_rank()) is not None
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if has_partial(dt):
        agree_before([plan], "reducing dt's Partial placements on its mesh", timeout=timeout,
                     caller="meshcast.reshard_dtensor")
    errors: list[str] = []
    local = source_shard(dt, placements, reduce_partial, errors, "dt")
    device = torch.device(device_mesh.device_type) if device_mesh.device_type == "cpu" else None
    (out,) = run_many([local], [plan], timeout=timeout,
                      device=device, names=["dt"], errors=errors,
                      caller="meshcast.reshard_dtensor", **runtime_options)
    if not in_dst:
        return None
    assert out is not None
    return as_dtensor(out, device_mesh, placements, task)
