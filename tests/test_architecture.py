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


def _imports(name: str, path: pathlib.Path, known: set[str], *, lazy: bool = True) -> set[str]:
    """Every module of the package that ``name`` imports, at any depth of its code: imports
    inside functions count (they are cycles too, only deferred), and so do type-hint imports
    under ``TYPE_CHECKING`` (a layer that names another's type depends on it).
    ``lazy=False``: only the imports that run when the module is imported (none inside a
    function)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if not lazy and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
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


#: The layers of docs/architecture.md, bottom up, and what each may import. Every module
#: belongs to one: a new top-level module must be placed here (the test says so).
BASE = {"_vocab", "_errors", "_units", "_io", "_devices", "_version"}
SUBPACKAGES = {
    "_producers": "producers",
    "_analysis": "analysis",
    "_views": "views",
    "_results": "result",
    "_frontends": "frontends",
    "_cli": "frontends",  # the command line, the pytest plugin's work, the MCP server
    "__main__": "frontends",  # python -m jupyter_memprof
    "pytest_plugin": "frontends",  # the pytest11 entry point
}
MAY_IMPORT = {
    "base": {"base"},
    "records": {"base", "records"},
    "producers": {"base", "records", "producers"},  # never the analysis: it sees only records
    "analysis": {"base", "records", "analysis"},  # never a producer
    "views": {"base", "records", "analysis", "views"},  # results reach views as protocols
    "result": {"base", "records", "analysis", "views", "result"},
    "frontends": {"base", "records", "producers", "analysis", "result", "views", "frontends"},
}


def _layer(mod: str) -> str | None:
    if mod == NAME:
        return "frontends"  # the public surface (its imports are lazy)
    part = mod.split(".")[1]
    if part in BASE:
        return "base"
    if part == "_records":
        return "records"
    return SUBPACKAGES.get(part)


def test_every_module_has_a_layer():
    unplaced = [m for m in import_graph() if _layer(m) is None]
    assert unplaced == [], "place these in a layer (docs/architecture.md, MAY_IMPORT here)"


def test_layers_only_import_downwards():
    """Each layer imports only the layers below it (MAY_IMPORT), counting imports inside
    functions and type-hint imports. Results sit above the views: a profile draws itself
    with them, and the views read it through :mod:`_views.protocols`."""
    graph = import_graph()
    wrong = []
    for mod, deps in sorted(graph.items()):
        lm = _layer(mod)
        for dep in sorted(deps):
            ld = _layer(dep)
            if lm is None or ld is None or ld in MAY_IMPORT[lm]:
                continue
            wrong.append(f"{mod} ({lm}) -> {dep} ({ld})")
    assert wrong == []


def test_ipython_is_imported_at_module_level_by_front_ends_only():
    """Below the front ends, IPython is imported inside the function that needs it, so the
    analysis, views and saved profiles work in a plain Python process."""
    offenders = []
    for name, path in _modules().items():
        if _layer(name) in (None, "frontends"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                roots = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [node.module or ""]
            else:
                continue
            if any(r.split(".")[0] == "IPython" for r in roots):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def _private_torch(node: ast.AST) -> str | None:
    """The dotted name when ``node`` reaches a private part of torch (``torch._C``,
    ``torch.utils._python_dispatch``, ``torch.autograd._disable_profiler``), else None."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    elif isinstance(node, ast.Attribute):
        parts = []
        cur: ast.AST = node
        while isinstance(cur, ast.Attribute):
            parts.append(cur.attr)
            cur = cur.value
        if not (isinstance(cur, ast.Name) and cur.id == "torch"):
            return None
        names = [".".join(["torch", *reversed(parts)])]
    else:
        return None
    for dotted in names:
        parts = dotted.split(".")
        private = [p for p in parts[1:] if p.startswith("_") and not p.endswith("__")]
        if parts[0] == "torch" and private:
            return dotted
    return None


def test_only_producers_touch_private_torch():
    """torch's private APIs (what changes between torch releases) are used by producers only:
    the analysis, views and front ends see records and tables, and public torch at most."""
    offenders = []
    for name, path in _modules().items():
        if _layer(name) == "producers":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            found = _private_torch(node)
            if found:
                offenders.append(f"{name}:{node.lineno} {found}")
    assert offenders == []


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


def test_modules_and_functions_stay_small():
    """No module over 600 lines and no function over 80, so each reads as one idea."""
    big, long = [], []
    for name, path in _modules().items():
        text = path.read_text()
        if text.count("\n") > 600:
            big.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert big == [] and long == []


def test_no_private_name_is_imported_across_modules():
    """What one module takes from another is that module's public name: a leading
    underscore means "only here" (private modules of the package, ``_analysis`` and the
    like, are imported by their names as usual)."""
    crossing = []
    for name, path in _modules().items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join([*base, node.module] if node.module else base)
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{target}.{alias.name}" not in _modules():
                    crossing.append(f"{name}:{node.lineno} takes {target}.{alias.name}")
    assert crossing == []
