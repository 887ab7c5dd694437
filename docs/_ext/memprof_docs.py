"""Pages of the documentation made from the code, so that they cannot drift from it.

- ``reference/api/``: one page per name in ``jupyter_memprof.__all__`` (autodoc over its
  docstring), and ``_generated/api-list.md``, the list of them with each name's first
  docstring line and their table of contents (included by ``reference/api.md``);
- ``_generated/magic-options.md``: the table of ``%%memprofile``'s options, from
  ``jupyter_memprof._frontends.magic_options.OPTIONS`` (included by ``reference/magic.md``);
- ``notebooks/``: copies of the repository's executed notebooks (rendered by myst-nb with
  their stored outputs, never run here), and ``_generated/notebooks-toc.md``, their table of
  contents (the quickstart first);
- the pages other parts of the project add (``OPTIONAL_PAGES``) join the index's table of
  contents only when they exist, so the build passes with or without each.

autodoc's directives sit in ``eval-rst`` blocks: what they generate is reStructuredText,
which MyST would otherwise read as Markdown. Everything written here is git-ignored and rewritten only when its text changes (Sphinx
then rebuilds only what changed).
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent

#: Pages of docs/ that the index lists when they exist (added by other features' work).
OPTIONAL_PAGES = ("snapshots", "traces", "cli", "frameworks", "dashboard", "reliability")
#: The line of index.md replaced by the optional pages present.
OPTIONAL_MARKER = "OPTIONAL_PAGES"

#: The notebook listed first; the others follow in name order.
FIRST_NOTEBOOK = "quickstart"

_ROLE = re.compile(r":(?:py:)?(\w+):`([^`]+)`")


def public_names() -> list[str]:
    """``jupyter_memprof.__all__``, in its order."""
    import jupyter_memprof

    return list(jupyter_memprof.__all__)


def page_name(name: str) -> str:
    """The file name (without suffix) of a public name's reference page."""
    return name.strip("_") or name


def _kind(name: str, obj) -> str:
    if name == "__version__":
        return "data"
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    return "function"


def _summary(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    # reStructuredText roles (:class:`X`) as MyST writes them ({py:class}`X`)
    first = _ROLE.sub(r"{py:\1}`\2`", first)
    return first.replace("|", "\\|")


def api_pages() -> tuple[dict[str, str], str]:
    """Every reference page's text by file name, and the list of them (with its toctree)."""
    import jupyter_memprof

    pages: dict[str, str] = {}
    rows = {"function": [], "class": [], "exception": [], "data": []}
    for name in public_names():
        obj = getattr(jupyter_memprof, name)
        kind = _kind(name, obj)
        full = f"jupyter_memprof.{name}"
        if kind == "data":
            body = (
                f"```{{py:data}} {full}\n:type: str\n\nThe installed version, "
                f"``{obj}`` when these pages were built.\n```\n"
            )
            summary = "The installed version."
        elif kind == "function":
            body = f"```{{eval-rst}}\n.. autofunction:: {full}\n```\n"
            summary = _summary(obj)
        else:
            body = (
                f"```{{eval-rst}}\n.. autoclass:: {full}\n   :members:\n"
                "   :show-inheritance:\n```\n"
            )
            summary = _summary(obj)
        pages[page_name(name)] = f"# `{name}`\n\n{body}"
        rows[kind].append(f"| [`{name}`](api/{page_name(name)}.md) | {summary} |")
    titles = {
        "function": "Functions",
        "class": "Classes",
        "exception": "Errors",
        "data": "Data",
    }
    lines = ["```{py:currentmodule} jupyter_memprof", "```", ""]  # short names link
    for kind, title in titles.items():
        if rows[kind]:
            lines += [f"## {title}", "", "| name | what it is |", "|---|---|", *rows[kind], ""]
    toc = "\n".join(f"api/{page_name(n)}" for n in public_names())
    lines += ["```{toctree}", ":hidden:", "", toc, "```", ""]
    return pages, "\n".join(lines)


def magic_options_table() -> str:
    """The Markdown table of ``%%memprofile``'s options, from their declaration."""
    from jupyter_memprof._frontends.magic_options import OPTIONS

    lines = ["| option | value | what it does |", "|---|---|---|"]
    for opt in OPTIONS:
        flags = ", ".join(f"`{f}`" for f in opt.flags)
        value = "" if opt.value is None else f"`{opt.value}`"
        if opt.repeat:
            value += " (repeatable)"
        text = opt.help.replace("|", "\\|")
        lines.append(f"| {flags} | {value} | {text} |")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it (keeps incremental builds quick)."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _copy_if_changed(src: Path, dst: Path) -> None:
    if dst.exists() and dst.read_bytes() == src.read_bytes():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def generate(docs: Path = DOCS) -> None:
    """Write every generated page under ``docs``; drop generated files no longer wanted."""
    api_dir = docs / "reference" / "api"
    pages, listing = api_pages()
    _write(docs / "_generated" / "api-list.md", listing)
    for name, text in pages.items():
        _write(api_dir / f"{name}.md", text)
    for old in api_dir.glob("*.md"):
        if old.stem not in pages:
            old.unlink()
    _write(docs / "_generated" / "magic-options.md", magic_options_table())
    nb_dir = docs / "notebooks"
    wanted = sorted((ROOT / "notebooks").glob("*.ipynb"))
    for nb in wanted:
        _copy_if_changed(nb, nb_dir / nb.name)
    for old in nb_dir.glob("*.ipynb"):
        if not (ROOT / "notebooks" / old.name).exists():
            old.unlink()
    order = sorted(wanted, key=lambda nb: (nb.stem != FIRST_NOTEBOOK, nb.stem))
    toc = "\n".join(f"notebooks/{nb.stem}" for nb in order)
    _write(
        docs / "_generated" / "notebooks-toc.md", f"```{{toctree}}\n:maxdepth: 1\n\n{toc}\n```\n"
    )


def optional_pages(docs: Path = DOCS) -> list[str]:
    """The optional pages present in ``docs``, in :data:`OPTIONAL_PAGES`' order."""
    return [p for p in OPTIONAL_PAGES if (docs / f"{p}.md").exists()]


def _builder_inited(app) -> None:
    generate(Path(app.srcdir))


def _source_read(app, docname, source) -> None:
    if docname != "index":
        return
    pages = "\n".join(optional_pages(Path(app.srcdir)))
    source[0] = source[0].replace(OPTIONAL_MARKER, pages)


def _index_outdated(app, env, added, changed, removed) -> list[str]:
    """The index is read again on every build: which optional pages exist can change
    without the index's own file changing (an incremental build would keep the old list)."""
    return ["index"]


def setup(app):
    app.connect("builder-inited", _builder_inited)
    app.connect("source-read", _source_read)
    app.connect("env-get-outdated", _index_outdated)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}


if __name__ == "__main__":  # pragma: no cover - a manual check
    generate()
    print(os.linesep.join(sorted(api_pages()[0])))
