"""The ``.js`` files of ``_views/js``, read as package data.

Everything linked runs in the page, so the notebook widget and the exported HTML file behave
the same without a kernel. Each CustomJS body is one file of ``js/``, after the files it uses:
``units.js`` (the byte and time formatters, the same rules as :mod:`jupyter_memprof._units`)
and ``prelude.js`` (the HTML escaper ``esc`` and the selection bookkeeping). A file's
``/* global ... */`` comment names what it receives from Bokeh (the CustomJS ``args``) and
from the files before it. Every user-controlled string (op names, module paths, callsites,
``record_function`` labels, tensor names) that goes into a Div's HTML passes through ``esc``.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

__all__ = ["code", "source"]


@cache
def source(name: str) -> str:
    """The text of ``js/<name>`` (shipped in the package)."""
    return files("jupyter_memprof._views").joinpath("js", name).read_text(encoding="utf-8")


@cache
def code(*names: str) -> str:
    """The files ``names``, in order, as one CustomJS body (one function scope)."""
    return "\n".join(source(n) for n in names)


def op_selected() -> str:
    return code("units.js", "prelude.js", "op_selected.js")


def alloc_selected() -> str:
    return code("units.js", "prelude.js", "alloc_selected.js")


def range_selected() -> str:
    return code("range_selected.js")


def range_cleared() -> str:
    return code("range_cleared.js")


def restack() -> str:
    return code("restack.js")


def bytes_hover() -> str:
    return code("units.js", "bytes_hover.js")


def bytes_tick() -> str:
    return code("units.js", "bytes_tick.js")


def zoom() -> str:
    return code("zoom.js")


def ready() -> str:
    return code("ready.js")
