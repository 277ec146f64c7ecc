"""The architecture rules, checked on the source: layers import one way only (no import cycle at
all, imports inside functions counted), and no module or function is over the readable size.

Everything here reads the code as text (``ast``); nothing is imported or run. A module or
function may be longer only if its docstring says why it "cannot be split".
"""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
PACKAGE = "meshcast"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

LAYERS = (
    "core",
    "estimate",
    "planning",
    "runtime",
    "interop",
    "parallel",
    "pipeline",
    "models",
    "training",
    "cluster",
    "bench",
    "cli",
)
"""Sub-packages from the bottom up: a module may import its own layer and the layers below."""


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """Modules of the package that ``name`` imports anywhere (top level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            if target in MODULES and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    """Import edges between modules; a package ``__init__`` that only hands names on is followed
    through to the modules it imports (it is a face, not a node)."""
    raw = {name: _imports(name, path) for name, path in MODULES.items()}
    faces = {n for n, p in MODULES.items() if p.name == "__init__.py"}

    def through(target: str, seen: frozenset[str] = frozenset()) -> set[str]:
        if target not in faces:
            return {target}
        if target in seen:
            return set()
        out: set[str] = set()
        for t in raw[target]:
            out |= through(t, seen | {target})
        return out

    return {
        n: set().union(*(through(t) for t in targets)) - {n}
        for n, targets in raw.items()
        if n not in faces
    } | {n: set() for n in faces}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_import_cycle_counting_imports_inside_functions() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers_import_downwards_only() -> None:
    upward = []
    for name, targets in _graph().items():
        mine = _layer(name)
        for target in targets:
            theirs = _layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_every_module_sits_in_a_layer() -> None:
    loose = [n for n in MODULES if n != PACKAGE and _layer(n) is None]
    assert loose == []


def _explains_size(node: ast.AST) -> bool:
    doc = ast.get_docstring(node) or ""
    return "cannot be split" in doc


def test_modules_are_small() -> None:
    big = {}
    for name, path in MODULES.items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES and not _explains_size(ast.parse(path.read_text())):
            big[name] = lines
    assert big == {}


def test_functions_are_short() -> None:
    long = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and not _explains_size(node):
                    long[f"{name}.{node.name}"] = lines
    assert long == {}


TORCH_PRIVATE = {
    "_StridedShard",  # DTensor placement without a public name (read as a strided layout step)
    "_partition_value",  # Partial's own Replicate -> Partial (public redistribute refuses it)
    "_get_root_mesh",  # the root mesh of a DeviceMesh slice (sub-meshes are read whole)
    "_spec",  # DTensor's spec: placements and shard order together
    "_world",  # c10d's map of process groups to their stores
    "_get_default_store",  # the default group's store, for the input agreement
    "_timeout",  # a ProcessGroup option's time-out, copied to the groups meshcast makes
    "_replace",  # NamedTuple API
    "_fields",  # NamedTuple API
}
"""Private names of torch (and NamedTuple) that meshcast reads because no public one exists."""


def _defined_private(tree: ast.AST) -> set[str]:
    """The ``_names`` a module defines: functions, classes, attributes it assigns."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr" and \
                len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            names.add(str(node.args[1].value))
    return {n for n in names if n.startswith("_")}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_uses_another_modules_private_names() -> None:
    found = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        own = _defined_private(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                ours = node.level > 0 or (node.module or "").startswith(PACKAGE)
                found += [f"{name}: imports {a.name}" for a in node.names
                          if ours and _is_private(a.name)]
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if node.attr not in own and node.attr not in TORCH_PRIVATE:
                    found.append(f"{name}:{node.lineno}: reads .{node.attr}")
    assert found == []
