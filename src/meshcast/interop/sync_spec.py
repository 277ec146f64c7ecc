"""What each side of a weight sync holds, and the tasks that move the trainer's weights to the
engine's: the description half of :class:`meshcast.WeightSync` (no communication here).

A side's description maps each parameter name to its global shape, dtype and layout over the
side's own job ranks: given as a DTensor (read with :func:`meshcast.layout_from_dtensor`) or as a
:class:`ParamSpec` ``(shape, dtype, layout)``. Each rank describes the parameters it holds (with
pipeline parallelism, its stage's), the records of a side's ranks are merged into the side's
description (:func:`merge_side`), and the two sides' descriptions are matched name by name
(:func:`match_sides`) into one :class:`~meshcast.ReshardTask` per engine tensor, in joint ranks
(the engine's layouts shifted past the trainer's ranks). Every rank computes the same tasks, or
the same error, from the same records.

``name_map`` (trainer name -> engine name; a mapping or a function; default: the same name) is
the hook of the name mapping; the task's dtype is the engine's, and the trainer converts its shard
to it before the wire (:class:`meshcast.WeightSync`, ``convert``). Fused and stacked engine
tensors take a ``mapping`` of rules instead (``{engine name: rule}``, :mod:`meshcast.core.names`,
e.g. :func:`meshcast.llama_mapping`): :func:`match_mapping` gives one route per
:class:`~meshcast.core.names.Piece`, each moving a trainer tensor straight into its part of an
engine tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ..core.dtypes import dtype_name
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.names import Piece, Rule, map_weights
from ..core.task import ReshardTask

__all__ = ["NameMap", "ParamSpec", "Route", "describe_params", "describe_record",
           "dtensor_layout_problem", "engine_whole", "match_mapping", "match_sides",
           "merge_side", "params_problem", "shared_targets_problem", "shift_layout",
           "trainer_shard_problem"]

NameMap = Mapping[str, str] | Callable[[str], str] | None
"""Trainer name -> engine name (None: the same names)."""


class ParamSpec(NamedTuple):
    """One parameter as a side holds it: global ``shape``, ``dtype`` and ``layout`` (a
    :class:`~meshcast.Layout` over the side's own job ranks)."""

    shape: Sequence[int]
    dtype: Any
    layout: Layout


class Route(NamedTuple):
    """One engine tensor of the sync, or with ``piece`` one part of it: fed by trainer tensor
    ``source`` through ``task`` (joint ranks, the engine's dtype); ``piece`` (joint ranks) says
    where the part lies in each engine rank's shard of ``target``."""

    source: str
    target: str
    task: ReshardTask
    piece: Piece | None = None

    @property
    def label(self) -> str:
        """The engine tensor's name, with the part's place (``qkv.weight.k``, ``w13[1].up``)."""
        path = () if self.piece is None else self.piece.path
        return self.target + "".join(f"[{k}]" if kind == "stack" else f".{k}"
                                     for kind, _, k in path)


def _is_dtensor(x: object) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(x, DTensor)


def describe_params(params: Mapping[str, Any], argument: str = "params",
                    job_size: int | None = None) -> dict[str, dict]:
    """``{name: {"shape", "dtype", "layout"}}`` (JSON-ready) of what this rank holds;
    ``job_size``: the ranks of this side's job (a layout over others is refused)."""
    if not isinstance(params, Mapping):
        raise TypeError(f"{argument} must be a mapping of names to DTensors or "
                        f"meshcast.ParamSpec(shape, dtype, layout), got {type(params).__name__}")
    out: dict[str, dict] = {}
    for name, spec in params.items():
        where = f"{argument}[{name!r}]"
        if _is_dtensor(spec):
            from .dtensor import layout_from_dtensor

            shape, dtype = tuple(spec.shape), spec.dtype
            layout = layout_from_dtensor(spec, own_mesh=True)  # replicas: merge_side
        elif isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[2], Layout):
            shape, dtype, layout = spec
        else:
            raise TypeError(f"{where} must be a DTensor or meshcast.ParamSpec(shape, dtype, "
                            f"layout), got {type(spec).__name__}")
        try:
            task = ReshardTask(shape, dtype, layout, layout)  # checks shape, dtype and layout
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
        if job_size is not None and max(layout.mesh.devices) >= job_size:
            raise ValueError(f"{where}: its layout {layout.notation()} uses rank "
                             f"{max(layout.mesh.devices)}, but this job has {job_size} ranks "
                             f"(layouts name the job's own ranks, 0..{job_size - 1})")
        out[name] = {"shape": list(task.shape), "dtype": task.dtype,
                     "layout": layout.to_json()}
    return out


def merge_side(records: Mapping[int, Mapping[str, dict]], role: str) -> dict[str, dict]:
    """One side's description from its ranks' records (``{rank: describe_params(...)}``): every
    name once, in the order of the lowest rank that holds it; a name described differently by two
    ranks raises ``ValueError`` naming both."""
    merged: dict[str, dict] = {}
    first: dict[str, int] = {}
    members: dict[str, list[dict]] = {}
    for rank in sorted(records):
        for name, entry in records[rank].items():
            if name not in merged:
                merged[name], first[name] = dict(entry), rank
                members[name] = [entry]
            elif merged[name] != entry and entry not in members[name]:
                if not _replica(members[name][0], entry):
                    raise ValueError(
                        f"{role} ranks {first[name]} and {rank} describe {name!r} differently "
                        f"({_show(merged[name])} vs {_show(entry)}): every rank must give the "
                        f"same global shape, dtype and layout")
                members[name].append(entry)
                merged[name] = _replicated(members[name])
    return merged


def _replica(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether ``b`` is ``a`` on other ranks (another member of a DTensor's sub-mesh family: a
    data-parallel replica): the same shape, dtype and split (placements or spec) on a disjoint
    mesh of the same shape."""
    if (a["shape"], a["dtype"]) != (b["shape"], b["dtype"]) or _split_of(a) != _split_of(b):
        return False
    ma, mb = Mesh.from_json(a["layout"]["mesh"]), Mesh.from_json(b["layout"]["mesh"])
    return ma.shape == mb.shape and not set(ma.devices) & set(mb.devices)


def _split_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    """How an entry's layout splits the tensor, without its mesh (placements or spec)."""
    return {k: v for k, v in entry["layout"].items() if k != "mesh"}


def _replicated(entries: list[dict]) -> dict:
    """Replicas (:func:`_replica`) as one entry: their meshes stacked on a new first axis, over
    which the tensor is replicated (each mesh axis of the members' layout one further on)."""
    import numpy as np

    base = Layout.from_json(entries[0]["layout"])
    mesh = Mesh(np.stack([Mesh.from_json(e["layout"]["mesh"]).array for e in entries]))
    later = {a: a + 1 for a in range(base.mesh.ndim)}
    spec = "".join(s.renumbered(later).token() for s in base.splits(len(entries[0]["shape"])))
    layout = Layout(mesh, spec)
    if base.ndim is None:  # placement-style, as given
        layout = Layout(mesh, list(layout.placements))
    return {**entries[0], "layout": layout.to_json()}


def _show(entry: Mapping[str, Any]) -> str:
    return (f"shape {tuple(entry['shape'])}, {entry['dtype']}, "
            f"{Layout.from_json(entry['layout']).notation()}")


def shift_layout(layout: Layout, offset: int) -> Layout:
    """``layout`` with every mesh rank moved up by ``offset`` (job ranks -> joint ranks)."""
    if offset == 0:
        return layout
    data = layout.to_json()
    data["mesh"] = Mesh(layout.mesh.array + offset).to_json()
    return Layout.from_json(data)


def _map_names(trainer: Sequence[str], name_map: NameMap) -> dict[str, str]:
    if name_map is None:
        return {n: n for n in trainer}
    if isinstance(name_map, Mapping):
        return {n: name_map[n] for n in trainer if n in name_map}
    if callable(name_map):
        try:
            return {n: name_map(n) for n in trainer}
        except Exception as exc:  # the caller's function: every rank of both jobs is told
            raise ValueError(f"name_map raised {type(exc).__name__}: {exc}") from exc
    raise TypeError(f"name_map must be a mapping or a function of trainer names, got "
                    f"{type(name_map).__name__}")


def match_sides(
    trainer: Mapping[str, dict], engine: Mapping[str, dict], engine_offset: int,
    name_map: NameMap = None,
) -> list[Route]:
    """One :class:`Route` per engine tensor, in the engine's order (the bucketed schedule keeps
    every source host sending: meshcast.planning.buckets); every problem (an engine tensor nothing
    feeds, a trainer tensor that goes nowhere, two feeding one, a shape that differs) in one
    ``ValueError`` listing them all."""
    mapped = _map_names(list(trainer), name_map)
    fed: dict[str, list[str]] = {}
    for src, dst in mapped.items():
        fed.setdefault(dst, []).append(src)
    problems = []
    unmapped = [n for n in trainer if n not in mapped or mapped[n] not in engine]
    if unmapped:
        problems.append(f"trainer tensors with no engine tensor: {_names(unmapped, mapped)}")
    missing = [n for n in engine if n not in fed]
    if missing:
        problems.append(f"engine tensors that no trainer tensor feeds: {', '.join(missing)}")
    twice = {d: s for d, s in fed.items() if len(s) > 1 and d in engine}
    for dst, srcs in twice.items():
        problems.append(f"engine tensor {dst!r} is fed by several trainer tensors {srcs}")
    routes = []
    for dst, entry in engine.items():
        if dst not in fed or dst in twice:
            continue
        src = fed[dst][0]
        have = trainer[src]
        if list(have["shape"]) != list(entry["shape"]):
            problems.append(f"{src!r} has shape {tuple(have['shape'])} on the trainer but "
                            f"{dst!r} has {tuple(entry['shape'])} on the engine")
            continue
        task = ReshardTask(entry["shape"], dtype_name(entry["dtype"]),
                           Layout.from_json(have["layout"]),
                           shift_layout(Layout.from_json(entry["layout"]), engine_offset))
        routes.append(Route(src, dst, task))
    if problems:
        raise ValueError("the trainer's and the engine's parameters do not match: "
                         + "; ".join(problems))
    return routes


def match_mapping(
    trainer: Mapping[str, dict], engine: Mapping[str, dict], engine_offset: int,
    mapping: Mapping[str, Rule],
) -> list[Route]:
    """One :class:`Route` per piece of :func:`meshcast.map_weights` over the two sides'
    descriptions (the engine's shifted to joint ranks); every problem in one ``ValueError``
    listing them all."""
    def specs(side: Mapping[str, dict], offset: int) -> dict[str, tuple]:
        return {n: (tuple(e["shape"]), e["dtype"],
                    shift_layout(Layout.from_json(e["layout"]), offset))
                for n, e in side.items()}

    try:
        pieces = map_weights(specs(trainer, 0), specs(engine, engine_offset), mapping)
    except ValueError as exc:
        raise ValueError(f"the trainer's and the engine's parameters do not match: {exc}") \
            from None
    return [Route(p.trainer, p.engine, p.task, p) for p in pieces]


def _names(names: list[str], mapped: Mapping[str, str]) -> str:
    return ", ".join(f"{n} (-> {mapped[n]})" if n in mapped and mapped[n] != n else n
                     for n in names)


def describe_record(params: Mapping[str, Any], name_map: NameMap,
                    mapping: Mapping[str, Rule] | None, job_size: int) -> dict[str, Any]:
    """What this rank tells the others: its parameters' description and its mapping's digest
    (or the error in its arguments)."""
    import hashlib

    try:
        if name_map is not None and mapping is not None:
            raise TypeError("give name_map (trainer name -> engine name) or mapping (engine "
                            "name -> rule, with Fuse and Stack), not both")
        if mapping is not None and not isinstance(mapping, Mapping):
            raise TypeError(f"mapping must be a mapping of engine names to rules, got "
                            f"{type(mapping).__name__}")
        digest = None if mapping is None else hashlib.sha256(
            repr(sorted(mapping.items(), key=lambda kv: str(kv[0]))).encode()).hexdigest()
        return {"params": describe_params(params, job_size=job_size), "mapping": digest}
    except (TypeError, ValueError) as exc:
        return {"error": str(exc), "mapping": None}


def params_problem(params: object, rank: int) -> list[str]:
    """[why ``params`` is not a mapping] (an input error of the sync: every rank refuses)."""
    if isinstance(params, Mapping):
        return []
    return [f"params must be a mapping of names to DTensors or local shards, got "
            f"{type(params).__name__} on rank {rank}"]


def dtensor_layout_problem(value: Any, described: Mapping[str, Any] | None, rank: int
                           ) -> str | None:
    """Why DTensor ``value`` cannot stand for what this rank (``rank`` of its job) ``described``
    when the sync was built: its layout gives this rank other indices (a local shard of the same
    shape would move the wrong elements); None for anything else, or where it gives the same."""
    if described is None or not _is_dtensor(value):
        return None
    from .dtensor import layout_from_dtensor

    layout = layout_from_dtensor(value, own_mesh=True)
    want, shape = Layout.from_json(described["layout"]), tuple(described["shape"])
    if tuple(value.shape) == shape and layout.region(rank, shape) == want.region(rank, shape):
        return None
    return (f"is a DTensor of shape {tuple(value.shape)} laid out as {layout.notation()}, which "
            f"gives rank {rank} other elements than the sync was built with (shape {shape}, "
            f"{want.notation()})")


def engine_whole(route: Route, target: Any, me: int, rank: int, errors: list[str]) -> Any:
    """This rank's (``me``: joint rank; ``rank``: engine rank) whole shard of a fused or stacked
    engine tensor, into which its pieces are received: ``target`` (checked: a problem goes to
    ``errors``, and None is returned), or a fresh CPU tensor when it is None."""
    import torch

    from ..runtime.tensors import torch_dtype

    piece = route.piece
    shape = piece.engine_layout.region(me, piece.engine_shape).shape
    dtype = torch_dtype(route.task.dtype)
    if target is None:
        return torch.empty(shape, dtype=dtype)
    if tuple(target.shape) != tuple(shape) or target.dtype != dtype:
        errors.append(f"params[{route.target!r}] is {tuple(target.shape)} {target.dtype} on "
                      f"engine rank {rank}; its layout {piece.engine_layout.notation()} of "
                      f"global shape {piece.engine_shape} gives this rank {tuple(shape)} {dtype}")
        return None
    return target


def shared_targets_problem(targets: dict[str, Any], routes: Sequence[Route], rank: int
                           ) -> list[str]:
    """[why] engine ``targets`` (name -> tensor or None) that share memory cannot all be received
    into (each would get another tensor's data; staged, the last copy into them would win). A
    tied weight, the same tensor under two names that are each fed whole from the same trainer
    tensor alike, is received once: the target of every name but the first becomes None here
    (its result is the caller's tensor, which the first fills)."""
    from ..runtime.overlap import shared_pair

    feeds: dict[str, list[Route]] = {}
    for route in routes:
        feeds.setdefault(route.target, []).append(route)
    first: dict[tuple, str] = {}
    for name, t in list(targets.items()):
        feed = feeds.get(name, [])
        if t is None or len(feed) != 1 or (feed[0].piece is not None and feed[0].piece.path):
            continue  # (a piece without a path is the whole tensor)
        key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), feed[0].source, feed[0].task)
        if key in first:  # the same view, fed alike: the tied name's data comes with the first
            targets[name] = None
        first.setdefault(key, name)
    shared = shared_pair([(f"params[{n!r}]", t) for n, t in targets.items() if t is not None], [])
    if shared is None:
        return []
    return [f"{shared[0]} shares memory with {shared[1]} on engine rank {rank}: what one "
            f"receives would overwrite the other; a tied weight is received once where its "
            f"names are the same tensor fed from one trainer tensor (mapping), else declare it "
            f"under one name"]


def trainer_shard_problem(shard: Any, route: Route, declared: str, me: int) -> str | None:
    """Why ``shard`` cannot be this rank's part of ``route``'s trainer tensor (declared
    ``declared``), checked before anything moves; None: it can."""
    import torch

    if shard is None:
        return "is missing, and this rank holds part of it"
    want = route.task.src_region(me).shape
    if not isinstance(shard, torch.Tensor):
        return f"must be a torch.Tensor, got {type(shard).__name__}"
    if tuple(shard.shape) != want:
        return f"has shape {tuple(shard.shape)}; its declared layout gives this rank {want}"
    if str(shard.dtype).removeprefix("torch.") != declared:
        return f"has dtype {shard.dtype}; it was declared {declared}"
    return None
