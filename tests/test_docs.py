"""The documentation site: its generated pages follow the code, it builds, and it opens.

The site is built as ``make docs`` builds it (Sphinx, warnings as errors) into
docs/_build/html, once per session and incrementally (after ``make docs`` it only checks).
Without Sphinx (``pip install -e '.[docs]'``) the tests that need the built site skip.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
HTML = os.path.join(DOCS, "_build", "html")
sys.path.insert(0, os.path.join(DOCS, "_ext"))

import memprof_docs  # noqa: E402

import jupyter_memprof  # noqa: E402
from jupyter_memprof._frontends.magic_options import OPTIONS  # noqa: E402


def test_every_public_name_has_a_reference_page():
    pages, listing = memprof_docs.api_pages()
    names = jupyter_memprof.__all__
    assert sorted(pages) == sorted(memprof_docs.page_name(n) for n in names)
    for name in names:
        page = pages[memprof_docs.page_name(name)]
        assert f"jupyter_memprof.{name}" in page
        assert f"api/{memprof_docs.page_name(name)}.md" in listing
    assert ".. autofunction:: jupyter_memprof.estimate\n" in pages["estimate"]
    assert ".. autoclass:: jupyter_memprof.Profile\n   :members:" in pages["Profile"]
    assert "```{py:data} jupyter_memprof.__version__" in pages["version"]
    assert "| [`ProfileFileError`](api/ProfileFileError.md) |" in listing.split("## Errors")[1]


def test_magic_options_table_is_the_declaration():
    table = memprof_docs.magic_options_table()
    rows = table.splitlines()[2:]
    assert len(rows) == len(OPTIONS)
    for row, opt in zip(rows, OPTIONS):
        for flag in opt.flags:
            assert f"`{flag}`" in row
        assert opt.help.replace("|", "\\|") in row
    assert "| `--device` | `DEV` (repeatable) |" in table


def test_optional_pages_join_when_present(tmp_path):
    assert memprof_docs.optional_pages(tmp_path) == []
    (tmp_path / "traces.md").write_text("# Traces\n")
    (tmp_path / "cli.md").write_text("# CLI\n")
    assert memprof_docs.optional_pages(tmp_path) == ["traces", "cli"]


@pytest.fixture(scope="session")
def built_site():
    """docs/_build/html, brought up to date as ``make docs`` does."""
    pytest.importorskip("sphinx", reason="sphinx is not installed: pip install -e '.[docs]'")
    pytest.importorskip("myst_nb", reason="myst-nb is not installed: pip install -e '.[docs]'")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, HTML]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return HTML


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_built_reference_documents_every_public_name(built_site):
    for name in jupyter_memprof.__all__:
        page = os.path.join(built_site, "reference", "api", memprof_docs.page_name(name) + ".html")
        assert os.path.exists(page), name
        assert f'id="jupyter_memprof.{name}"' in _read(page), name
    estimate = _read(os.path.join(built_site, "reference", "api", "estimate.html"))
    assert "Parameters" in estimate and "Raises" in estimate and "EstimateError" in estimate


def test_built_site_has_the_recipes_and_the_options(built_site):
    index = _read(os.path.join(built_site, "index.html"))
    for page in ("fit-a-gpu", "memory-grows", "oom-snapshot", "compare-runs", "check-in-ci"):
        assert f'href="howto/{page}.html"' in index
    magic = _read(os.path.join(built_site, "reference", "magic.html"))
    assert "--world-size" in magic and "--no-stack" in magic
    quickstart = _read(os.path.join(built_site, "notebooks", "quickstart.html"))
    assert "memory profile" in quickstart  # a stored output, rendered


@pytest.mark.browser
def test_site_opens_in_a_browser(built_site):
    from _browser import chromium_page, screenshot

    with chromium_page(viewport=(1200, 900)) as page:
        page.goto("file://" + os.path.join(built_site, "index.html"))
        assert "jupyter_memprof" in page.title()
        page.get_by_role("link", name="Will my step fit on a 24 GB GPU?").first.click()
        page.wait_for_load_state()
        assert page.url.endswith("howto/fit-a-gpu.html")
        heading = page.locator("h1").first.inner_text()
        assert heading.startswith("Will my step fit on a 24 GB GPU?")
        assert page.locator("pre", has_text="jupyter_memprof.fit(").count() >= 1
        screenshot(page, "docs-howto-fit.png")


def _pages() -> list[str]:
    """The site's hand-written Markdown pages (generated ones are left out)."""
    skip = ("_build", "_generated", os.path.join("reference", "api"), "notebooks")
    out = []
    for folder, _, files in os.walk(DOCS):
        rel = os.path.relpath(folder, DOCS)
        if any(rel == s or rel.startswith(s + os.sep) for s in skip):
            continue
        out += [os.path.join(folder, f) for f in files if f.endswith(".md")]
    return sorted(out)


def test_code_blocks_of_every_page_are_python():
    """Every ``python`` and ``ipython`` block of the pages compiles (a typo in a recipe
    fails here; running them needs the reader's model, so only the README's are run)."""
    from IPython.core.inputtransformer2 import TransformerManager
    from test_readme import fenced_blocks

    to_python = TransformerManager().transform_cell
    pages = _pages()
    assert any(p.endswith(os.path.join("howto", "fit-a-gpu.md")) for p in pages)
    compiled = 0
    for page in pages:
        for line, info, code in fenced_blocks(_read(page)):
            language = (info.split() or [""])[0]
            if language not in ("python", "ipython"):
                continue
            source = to_python(code) if language == "ipython" else code
            try:
                compile(source, f"{page}:{line}", "exec")
            except SyntaxError as err:
                pytest.fail(f"{os.path.relpath(page, ROOT)}:{line}: {err}")
            compiled += 1
    assert compiled >= 30
