"""Names and fusion: which trainer tensor fills which engine tensor, or which part of one.

A trainer and an inference engine name and group their weights differently: the trainer holds
``q_proj``, ``k_proj``, ``v_proj`` and one tensor per MoE expert, the engine one fused
``qkv_proj`` and the experts stacked (``w13[e] = [gate_e; up_e]``). A **mapping** says, for every
engine tensor, where it comes from, as a rule:

* a trainer name (a string): the same tensor under another name (and layout);
* :class:`Fuse`: the engine tensor is the concatenation along ``dim`` of parts, each one trainer
  tensor (the engine layout names the parts, ``{q=...+k=...+v=...}``, see :mod:`.fused`; an
  unsplit dimension may be plain, ``R``);
* :class:`Stack`: the engine tensor stacks its items along ``dim`` (that dimension dropped in
  each item), each item a rule itself (a trainer name, or a :class:`Fuse` for ``w13``).

:func:`map_weights` checks a mapping against both sides' descriptions (every problem in one
``ValueError``) and returns one :class:`Piece` per trainer tensor it moves: the
:class:`~meshcast.ReshardTask` from the trainer's layout straight into the engine part's layout
(:func:`meshcast.part_layout`, :func:`meshcast.core.stacked.index_layout`), and where that part
lies in each engine rank's shard (:meth:`Piece.dst_view`). Nothing is assembled anywhere.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from .checks import as_shape
from .dtypes import dtype_name
from .fused import fused_part_index, part_layout, part_names
from .layout import Layout
from .splits import DimSplit, Part
from .stacked import index_layout, index_local
from .task import ReshardTask

__all__ = ["Fuse", "Piece", "Rule", "Stack", "TensorSpec", "map_weights", "rule_sources"]

TensorSpec = tuple[Sequence[int], Any, Layout]
"""A tensor's description: ``(shape, dtype, layout)``."""


@dataclass(frozen=True)
class Fuse:
    """The engine tensor is the concatenation along ``dim`` of ``parts``, ``{part name: trainer
    name}`` in order (the part names of the engine layout's fused dimension)."""

    parts: tuple[tuple[str, str], ...]
    dim: int = 0

    def __init__(self, parts: Mapping[str, str] | Sequence[tuple[str, str]], dim: int = 0):
        items = tuple(parts.items()) if isinstance(parts, Mapping) else tuple(parts)
        if not all(isinstance(i, tuple) and len(i) == 2 for i in items):
            raise TypeError(f"Fuse takes {{part name: trainer name}} or (part name, trainer "
                            f"name) pairs, got {parts!r:.200}")
        object.__setattr__(self, "parts", tuple((str(p), str(t)) for p, t in items))
        object.__setattr__(self, "dim", _dim(dim, "Fuse"))


@dataclass(frozen=True)
class Stack:
    """The engine tensor stacks ``items`` along ``dim``: item ``i`` (a rule) fills
    ``tensor[i]`` along ``dim``, that dimension dropped."""

    items: tuple[Rule, ...]
    dim: int = 0

    def __init__(self, items: Sequence[Rule], dim: int = 0):
        object.__setattr__(self, "items", tuple(items))
        object.__setattr__(self, "dim", _dim(dim, "Stack"))


def _dim(dim: object, what: str) -> int:
    try:
        if isinstance(dim, bool):
            raise TypeError
        return operator.index(dim)  # an int, or any integer type (numpy's)
    except TypeError:
        raise TypeError(f"{what}'s dim must be an int, got {dim!r}") from None


Rule = Union[str, Fuse, Stack]  # noqa: UP007 (a runtime alias: Stack refers to it)
"""Where an engine tensor comes from: a trainer name, a :class:`Fuse` or a :class:`Stack`."""


def rule_sources(rule: Rule) -> list[str]:
    """The trainer names a rule reads, in order."""
    if isinstance(rule, str):
        return [rule]
    if isinstance(rule, Fuse):
        return [t for _, t in rule.parts]
    if isinstance(rule, Stack):
        return [t for item in rule.items for t in rule_sources(item)]
    raise TypeError(f"a rule is a trainer name, Fuse or Stack, got {rule!r}")


@dataclass(frozen=True)
class Piece:
    """One trainer tensor moved into (part of) one engine tensor.

    ``task`` moves ``trainer`` from its layout to the layout of its place in ``engine`` (a
    tensor of its own, in the engine's dtype: a conversion happens on the sending side);
    ``path`` is that place: ``("stack", dim, index)`` and ``("part", dim, name)`` steps from
    the engine tensor of ``engine_shape`` and ``engine_layout`` down.
    """

    trainer: str
    engine: str
    task: ReshardTask
    trainer_dtype: str
    engine_shape: tuple[int, ...]
    engine_layout: Layout
    path: tuple[tuple[str, int, Any], ...] = ()

    def dst_indices(self, rank: int) -> list[tuple] | None:
        """The indices that, applied in turn to ``rank``'s shard of the engine tensor, give its
        shard of this piece (views); None where the rank holds none of it."""
        layout, shape, out = self.engine_layout, self.engine_shape, []
        for kind, dim, key in self.path:
            if kind == "stack":
                i = index_local(layout, shape, rank, dim, key)
                if i is None:
                    return None
                out.append((slice(None),) * dim + (i,))
                layout, shape = index_layout(layout, shape, dim, key)
            else:
                index = fused_part_index(layout, shape, rank, key, dim)
                if index is None:
                    return None
                out.append(index)
                layout, shape = part_layout(layout, shape, key, dim)
        if layout.region(rank, shape) is None:
            return None
        return out

    def dst_view(self, local: Any, rank: int) -> Any:
        """``rank``'s shard of this piece inside its shard ``local`` of the engine tensor (a
        torch tensor or numpy array): a view to receive into; None off the piece's mesh."""
        indices = self.dst_indices(rank)
        if indices is None:
            return None
        for index in indices:
            local = local[index]
        return local


def _as_spec(name: str, spec: Any, side: str) -> tuple[tuple[int, ...], str, Layout]:
    if not (isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[2], Layout)):
        raise TypeError(f"{side}[{name!r}] must be (shape, dtype, meshcast.Layout), got {spec!r}")
    shape = as_shape(spec[0])
    spec[2].check_shape(shape, argument=f"{side}[{name!r}] shape {shape}")
    return shape, dtype_name(spec[1]), spec[2]


def _specs(specs: Mapping[str, Any], side: str, problems: list[str]) -> dict[str, tuple]:
    """The descriptions that are well formed; a problem for each other one."""
    out = {}
    for name, spec in specs.items():
        try:
            out[name] = _as_spec(name, spec, side)
        except (TypeError, ValueError) as exc:
            problems.append(str(exc))
    return out


class _Walk:
    """Expands the rules into pieces, collecting every problem."""

    def __init__(self, trainer: Mapping[str, tuple], problems: list[str]) -> None:
        self.trainer, self.problems, self.pieces = trainer, problems, []

    def rule(self, engine: str, rule: Rule, layout: Layout, shape: tuple[int, ...],
             path: tuple, top: tuple) -> None:
        """Expand ``rule`` for the (sub)tensor at ``path`` of engine tensor ``top`` =
        (shape, dtype, layout), now of ``layout`` and ``shape``."""
        where = engine + "".join(f"[{k}]" if kind == "stack" else f".{k}"
                                 for kind, _, k in path)
        if isinstance(rule, str):
            self.leaf(engine, rule, layout, shape, path, top, where)
        elif isinstance(rule, Stack):
            if not 0 <= rule.dim < len(shape) or shape[rule.dim] != len(rule.items):
                self.problems.append(
                    f"{where}: Stack of {len(rule.items)} items along dim {rule.dim}, but the "
                    f"tensor's shape is {shape}")
                return
            for i, item in enumerate(rule.items):
                sub, sub_shape = index_layout(layout, shape, rule.dim, i)
                self.rule(engine, item, sub, sub_shape, (*path, ("stack", rule.dim, i)), top)
        else:
            self.fuse(engine, rule, layout, shape, path, top, where)

    def fuse(self, engine: str, rule: Fuse, layout: Layout, shape: tuple[int, ...],
             path: tuple, top: tuple, where: str) -> None:
        fused = self.fused_layout(rule, layout, shape, where)
        if fused is None:
            return
        if fused != layout:  # a plain unsplit dimension, now written fused: the same regions
            top = (top[0], top[1], _fused_top(top, path, rule.dim, fused.splits(len(shape))))
        layout = fused
        for part, name in rule.parts:
            sub, sub_shape = part_layout(layout, shape, part, rule.dim)
            self.leaf(engine, name, sub, sub_shape, (*path, ("part", rule.dim, part)), top,
                      f"{where}.{part}")

    def fused_layout(self, rule: Fuse, layout: Layout, shape: tuple[int, ...],
                     where: str) -> Layout | None:
        """``layout`` with dimension ``rule.dim`` fused as ``rule`` says (an unsplit plain
        dimension gets the parts' sizes from the trainer's shapes), or None after a problem."""
        if not 0 <= rule.dim < len(shape):
            self.problems.append(f"{where}: Fuse along dim {rule.dim} of shape {shape}")
            return None
        names = [p for p, _ in rule.parts]
        split = layout.splits(len(shape))[rule.dim]
        if split.parts:
            have = list(part_names(layout, shape, rule.dim))
            if have != names:
                self.problems.append(f"{where}: Fuse parts {names} but layout {layout.spec!r} "
                                     f"fuses {have} along dim {rule.dim}")
                return None
            return layout
        if split.steps:
            self.problems.append(
                f"{where}: layout {layout.spec!r} splits the fused dim {rule.dim} plainly, which "
                f"cuts across its parts; write it fused, {{{names[0]}=SIZE:SPLIT+...}}")
            return None
        sizes = [self.trainer[t][0][rule.dim] if t in self.trainer and
                 len(self.trainer[t][0]) > rule.dim else None for _, t in rule.parts]
        if None in sizes or sum(sizes) != shape[rule.dim]:
            self.problems.append(f"{where}: parts of sizes {sizes} along dim {rule.dim} do not "
                                 f"make its {shape[rule.dim]}")
            return None
        splits = list(layout.splits(len(shape)))
        splits[rule.dim] = DimSplit(parts=tuple(Part(p, n, ()) for p, n in zip(names, sizes)))
        return Layout(layout.mesh, "".join(s.token() for s in splits))

    def leaf(self, engine: str, name: str, layout: Layout, shape: tuple[int, ...],
             path: tuple, top: tuple, where: str) -> None:
        if name not in self.trainer:
            return  # reported once, with every missing name
        t_shape, t_dtype, t_layout = self.trainer[name]
        if t_shape != shape:
            self.problems.append(f"{where}: trainer {name!r} has shape {t_shape}, its place in "
                                 f"the engine has shape {shape}")
            return
        e_shape, e_dtype, e_layout = top
        self.pieces.append(Piece(name, engine, ReshardTask(shape, e_dtype, t_layout, layout),
                                 t_dtype, e_shape, e_layout, path))


def _fused_top(top: tuple, path: tuple, dim: int, splits: tuple[DimSplit, ...]) -> Layout:
    """The engine layout ``top[2]`` with the dimension that is ``dim`` after the stack steps
    of ``path`` written as ``splits[dim]`` (a fused form of the same split)."""
    dims = list(range(len(top[0])))
    for kind, d, _ in path:
        if kind == "stack":
            dims.pop(d)
    whole = list(top[2].splits(len(top[0])))
    whole[dims[dim]] = splits[dim]
    return Layout(top[2].mesh, "".join(s.token() for s in whole))


def _name_problems(trainer: Mapping, engine: Mapping, mapping: Mapping) -> list[str]:
    used = {t for rule in mapping.values() for t in rule_sources(rule)}
    found = [
        ("engine tensors the mapping does not fill", [e for e in engine if e not in mapping]),
        ("mapping names engine tensors the engine does not have",
         [e for e in mapping if e not in engine]),
        ("trainer tensors the mapping does not use", [t for t in trainer if t not in used]),
        ("mapping reads trainer tensors the trainer does not have",
         sorted(used - set(trainer), key=str)),
    ]
    return [f"{what}: {', '.join(map(repr, names))}" for what, names in found if names]


def map_weights(
    trainer: Mapping[str, TensorSpec],
    engine: Mapping[str, TensorSpec],
    mapping: Mapping[str, Rule],
) -> list[Piece]:
    """The pieces that move the trainer's tensors into the engine's, as ``mapping`` says.

    ``trainer`` and ``engine`` map each name to ``(shape, dtype, layout)``; ``mapping`` maps
    every engine name to its rule (module docstring). Every engine tensor must be filled, every
    trainer tensor used (a trainer tensor may fill several places, e.g. tied embeddings), every
    name known and every shape match: otherwise one ``ValueError`` lists every problem. The
    pieces come in the order of ``engine``, then of each rule; each task's dtype is the
    engine's.
    """
    for argument, value in (("trainer", trainer), ("engine", engine), ("mapping", mapping)):
        if not isinstance(value, Mapping):
            raise TypeError(f"{argument} must be a mapping of names, got {type(value).__name__}")
    problems: list[str] = []
    t_specs = _specs(trainer, "trainer", problems)
    e_specs = _specs(engine, "engine", problems)
    problems += _name_problems(trainer, engine, mapping)
    walk = _Walk(t_specs, problems)
    for name, (shape, dtype, layout) in e_specs.items():
        if name in mapping:
            walk.rule(name, mapping[name], layout, shape, (), (shape, dtype, layout))
    if problems:
        raise ValueError(f"the mapping does not fit ({len(problems)} problems):\n  "
                         + "\n  ".join(problems))
    return walk.pieces
