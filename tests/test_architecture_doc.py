"""docs/architecture.md stays true to the code: its map of modules is the one
docs/_ext/architecture_map.py writes from the code, every module and test file it names
exists, and every module of the package and every test file is named there."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

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
    found = [*ROOT.glob("*/*.py"), *ROOT.glob("docs/_ext/*.py")]
    other = {p.relative_to(ROOT).as_posix() for p in found}
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


# The map of modules between the page's markers is generated (docs/_ext/architecture_map.py).

sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import architecture_map  # noqa: E402
from test_architecture import _layer  # noqa: E402

#: the map's layer labels as tests/test_architecture.py names the layers
LAYER_NAMES = {
    "producers": "producers",
    "records": "records",
    "analysis": "analysis",
    "views": "views",
    "results": "result",
    "front ends": "frontends",
    "base": "base",
}


def test_the_map_is_generated_from_the_code():
    text = DOC.read_text(encoding="utf-8")
    assert text == architecture_map.updated(text), (
        f"docs/architecture.md's map is out of date: run `{architecture_map.COMMAND}`"
    )


def test_the_map_places_every_module_in_the_layer_the_architecture_test_gives_it():
    placed = architecture_map.placement()
    modules = {p.as_posix() for p in PACKAGE.rglob("*.py") if "labextension" not in p.parts}
    assert set(placed) == {Path(m).relative_to(PACKAGE).as_posix() for m in modules}
    wrong = {}
    for path, label in placed.items():
        parts = ["jupyter_memprof", *Path(path).with_suffix("").parts]
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if _layer(name) != LAYER_NAMES[label]:
            wrong[path] = (label, _layer(name))
    assert not wrong, f"the map and tests/test_architecture.py disagree: {wrong}"


def test_no_line_of_the_map_is_wider_than_100_columns():
    wide = [line for line in architecture_map.render().splitlines() if len(line) > 100]
    assert not wide


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_a_small_package_drawn_exactly(tmp_path):
    """Folders under their ``__init__``'s line, modules sorted, reST unwrapped, long lines cut
    at a word, a module without a docstring said so."""
    _write(tmp_path / "_records.py", '"""The records."""\n')
    _write(tmp_path / "_producers" / "__init__.py", '"""Producers: see :mod:`.fake.run`.\n"""\n')
    _write(tmp_path / "_producers" / "live.py", "x = 1\n")
    _write(tmp_path / "_producers" / "fake" / "__init__.py", '"""Fake: ``FakeTensorMode``."""')
    long = "A first line that is far too long for the map " + "and goes on " * 5 + "to the end."
    _write(tmp_path / "_producers" / "fake" / "run.py", f'"""{long}\n\nMore.\n"""\n')
    text = architecture_map.render(tmp_path)
    assert text.splitlines()[3:] == [
        " " * 36 + "|",
        " " * 36 + "v",
        "  producers   _producers/  Producers: see run",
        "                live.py    (no docstring)",
        "                fake/      Fake: FakeTensorMode",
        "                  run.py   A first line that is far too long for the map and goes on"
        " and goes on...",
        " " * 36 + "|",
        " " * 36 + "v",
        "  records     _records.py  The records",
        "```",
    ]
    assert max(len(line) for line in text.splitlines()) <= 100


def test_cut_keeps_whole_words():
    assert architecture_map.cut("short enough", 12) == "short enough"
    assert architecture_map.cut("the peak, its causes and more", 20) == "the peak, its..."
    assert architecture_map.cut("unbreakableword", 8) == "unbre..."


def test_a_module_in_no_layer_is_one_clear_line(tmp_path):
    _write(tmp_path / "_records.py", '"""The records."""\n')
    _write(tmp_path / "_newlayer" / "__init__.py", '"""New."""\n')
    with pytest.raises(architecture_map.MapError, match=r"place _newlayer in a layer: LAYERS"):
        architecture_map.render(tmp_path)


def test_a_page_without_the_markers_is_one_clear_line():
    with pytest.raises(architecture_map.MapError, match="lacks the map's markers"):
        architecture_map.updated("# Architecture\n\nno map here\n")
