"""docs/architecture.md stays true to the code: every module and test file it names exists,
and every module of the package and every test file is named there."""

from __future__ import annotations

import re
from pathlib import Path

import jupyter_memprof

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(jupyter_memprof.__file__).parent
DOC = ROOT / "docs" / "architecture.md"
#: a file name as the map writes it: ``_views/summary.py``, ``summary.py``, ``test_x.py``
NAMED = re.compile(r"(?<![\w.])((?:_?[a-z]\w*/)*_?[a-z]\w*\.py)\b")


def _named() -> set[str]:
    return set(NAMED.findall(DOC.read_text(encoding="utf-8")))


def _package_modules() -> list[Path]:
    return [
        p.relative_to(PACKAGE)
        for p in PACKAGE.rglob("*.py")
        if "labextension" not in p.parts and p.name not in ("__init__.py", "__main__.py")
    ]


def _test_files() -> list[str]:
    return sorted(p.name for p in (ROOT / "tests").glob("*.py") if p.name != "conftest.py")


def _ends_with(module: str, name: str) -> bool:
    """``dashboard/data.py`` names ``_views/dashboard/data.py``: a map under a folder's line
    writes the rest of the path."""
    return module == name or module.endswith("/" + name)


def test_every_module_of_the_package_is_in_the_map():
    named = _named()
    missing = [
        str(path)
        for path in _package_modules()
        if path.name not in named and not any(_ends_with(path.as_posix(), n) for n in named)
    ]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_every_test_file_is_in_the_map():
    named = _named()
    missing = [name for name in _test_files() if name not in named]
    assert not missing, f"docs/architecture.md does not name these test files: {missing}"


def test_every_file_the_map_names_exists():
    modules = {p.as_posix() for p in _package_modules()} | {"__init__.py", "__main__.py"}
    basenames = {p.rsplit("/", 1)[-1] for p in modules}
    tests = set(_test_files())
    other = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("*/*.py")}
    gone = [
        name
        for name in _named()
        if name not in modules
        and name not in basenames
        and name not in tests
        and name not in other
        and not any(m.endswith("/" + name) for m in modules)
    ]
    assert not gone, f"docs/architecture.md names files that do not exist: {sorted(gone)}"
