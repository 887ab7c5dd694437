"""The package's layout keeps the pipeline readable: no import cycles, browser code in files."""

from __future__ import annotations

import ast
import pathlib

import jupyter_memprof

PACKAGE = pathlib.Path(jupyter_memprof.__file__).parent
NAME = "jupyter_memprof"


def _module_name(path: pathlib.Path) -> str:
    parts = [NAME, *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "labextension" not in p.parts}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """Every module of the package that ``name`` imports, at any depth of its code (imports
    inside functions count: they are cycles too, only deferred), except under TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    found.add(sub)
                elif target in known:
                    found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = walk(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = walk(node)
            if found:
                return found
    return None


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    # a package's own __init__ re-exports lazily; the public surface may import anything
    return {
        name: {m for m in _imports(name, path, known) if m != NAME}
        for name, path in mods.items()
        if name != NAME
    }


def test_import_graph_has_no_cycles():
    graph = import_graph()
    assert len(graph) > 20
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_layers_only_import_downwards():
    """producers and analysis never import views or front ends; views never import front
    ends; nothing below the front ends imports IPython at module level."""
    graph = import_graph()
    order = ["_producers", "_analysis", "_views", "_frontends"]

    def layer(mod: str) -> int | None:
        part = mod.split(".")[1]
        return order.index(part) if part in order else None

    wrong = []
    for mod, deps in graph.items():
        lm = layer(mod)
        if lm is None or mod.split(".")[1] in ("_views", "_frontends"):
            continue
        for dep in deps:
            ld = layer(dep)
            if ld is not None and ld > lm:
                wrong.append(f"{mod} -> {dep}")
    assert wrong == []


def test_no_javascript_in_python_strings():
    """Browser code lives in .js files shipped as package data, where a linter sees it."""
    offenders = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if ("cb_obj" in text or "=>" in text or "function(" in text) and ";" in text:
                    offenders.append(f"{name}:{node.lineno}")
    assert offenders == []
