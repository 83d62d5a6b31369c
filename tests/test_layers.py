"""Layering of ``src/tider``: no import cycle between its subpackages or between its modules,
and the layers below training (evaluation, memory, serving, the locator, retrieval) never
import ``tider.train``. Imports inside functions count: a deferred import still makes the
lower layer need the upper one to run, which is what the layering is about (issue 37)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Layers that must run without the training stack (a served or evaluated locator, a memory
# store, the data loaders), as module-name prefixes: every command but those that train.
BELOW_TRAIN = ("tider.data", "tider.eval", "tider.memory", "tider.commands", "tider.locator", "tider.retrieval")
TRAINING_COMMANDS = ("tider.commands.train", "tider.commands.export", "tider.commands.launch", "tider.commands.demo")

# Known exceptions, each with why it is not untangled yet. A new edge or cycle fails the test;
# removing one of these without deleting it here fails it too, so the list only shrinks.
KNOWN_LAYER_IMPORTS: dict[tuple[str, str], str] = {}
KNOWN_MODULE_CYCLES: dict[frozenset[str], str] = {}
KNOWN_PACKAGE_CYCLES: dict[frozenset[str], str] = {}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module an ``ImportFrom`` names, relative imports resolved against ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, module: str, modules: set[str]) -> set[str]:
    """The ``tider`` modules ``path`` imports, at module level or inside functions.
    ``from pkg import sub`` counts as importing ``pkg.sub`` when that is a module."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, module, path.name == "__init__.py")
            subs = {f"{target}.{alias.name}" for alias in node.names} & modules
            out.update(subs or {target})
    return {m for m in out if m in modules and m != module}


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    paths = {module_name(p, root): p for p in sorted((root / "tider").rglob("*.py"))}
    modules = set(paths)
    return {m: imports_of(p, m, modules) for m, p in paths.items()}


def package_of(module: str) -> str:
    """The unit a cycle is counted between: ``tider.X`` for ``tider.X.*``."""
    return ".".join(module.split(".")[:2])


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        mine = package_of(module)
        out.setdefault(mine, set()).update(package_of(t) for t in targets if package_of(t) != mine)
    return out


def layer_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """``(importer, imported)`` for every import of ``tider.train`` from a layer below it."""
    below = [
        m for m in graph if any(m == p or m.startswith(p + ".") for p in BELOW_TRAIN) and m not in TRAINING_COMMANDS
    ]
    return {(m, t) for m in below for t in graph[m] if t == "tider.train" or t.startswith("tider.train.")}


def _fmt(found) -> str:
    return "\n".join(sorted(" <-> ".join(sorted(c)) if isinstance(c, frozenset) else " -> ".join(c) for c in found))


def test_no_layer_below_train_imports_train():
    found, known = layer_imports(import_graph()), set(KNOWN_LAYER_IMPORTS)
    assert found - known == set(), "new imports of tider.train:\n" + _fmt(found - known)
    assert known - found == set(), "fixed; delete from KNOWN_LAYER_IMPORTS:\n" + _fmt(known - found)


def test_no_cycle_between_subpackages():
    found = cycles(package_graph(import_graph()))
    assert found - set(KNOWN_PACKAGE_CYCLES) == set(), "new cycles:\n" + _fmt(found - set(KNOWN_PACKAGE_CYCLES))
    assert set(KNOWN_PACKAGE_CYCLES) - found == set(), "fixed; delete from KNOWN_PACKAGE_CYCLES"


def test_no_cycle_between_modules():
    found = cycles(import_graph())
    assert found - set(KNOWN_MODULE_CYCLES) == set(), "new cycles:\n" + _fmt(found - set(KNOWN_MODULE_CYCLES))
    assert set(KNOWN_MODULE_CYCLES) - found == set(), "fixed; delete from KNOWN_MODULE_CYCLES"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checks_catch_a_function_level_cycle_and_a_layer_import(tmp_path):
    root = _tree(
        tmp_path,
        {
            "tider/__init__.py": "",
            "tider/eval/__init__.py": "",
            "tider/eval/a.py": "def f():\n    from ..memory import b\n",
            "tider/memory/__init__.py": "",
            "tider/memory/b.py": "from tider.eval.a import f\nimport tider.train.c\n",
            "tider/train/__init__.py": "",
            "tider/train/c.py": "x = 1\n",
        },
    )
    graph = import_graph(root)
    assert graph["tider.eval.a"] == {"tider.memory.b"}
    assert cycles(graph) == {frozenset({"tider.eval.a", "tider.memory.b"})}
    assert cycles(package_graph(graph)) == {frozenset({"tider.eval", "tider.memory"})}
    assert layer_imports(graph) == {("tider.memory.b", "tider.train.c")}
