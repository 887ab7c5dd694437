"""The dashboard's JavaScript files: valid syntax, the arguments they name are the ones Bokeh
passes, and the page formats numbers exactly as Python does (run in node)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib.resources import files

import pytest
from bokeh.models import CustomJS, CustomJSHover, CustomJSTickFormatter

from jupyter_memprof._units import format_bytes, format_ms, format_records
from jupyter_memprof._views.dashboard import js as dashboard_js

JS = files("jupyter_memprof._views").joinpath("js")
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")

# given by Bokeh itself to every CustomJS, CustomJSHover and CustomJSTickFormatter body
BOKEH_PARAMETERS = {"cb_obj", "cb_data", "cb_context", "value", "format", "special_vars", "tick"}


def _js_files() -> list[str]:
    return sorted(p.name for p in JS.iterdir() if p.name.endswith(".js"))


def _declared(code: str, word: str) -> set[str]:
    names: set[str] = set()
    for body in re.findall(rf"/\*\s*{word}\s+([^*]*)\*/", code):
        names |= {n.strip() for n in body.split(",") if n.strip()}
    return names


def test_the_browser_code_ships_as_package_files():
    names = _js_files()
    assert {"units.js", "prelude.js", "op_selected.js", "page_loader.js"} <= set(names)
    for name in names:
        assert dashboard_js.source(name).strip()


@needs_node
@pytest.mark.parametrize("name", _js_files())
def test_every_js_file_is_valid_javascript(name):
    # node --check parses a file as a CommonJS module body, where a top-level `return` (as in
    # a CustomJS body) is allowed
    path = str(JS.joinpath(name))
    done = subprocess.run([NODE, "--check", path], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_callbacks_receive_every_name_their_files_use(mlp_adam_profile):
    """Each CustomJS body's ``/* global */`` names are Bokeh's own parameters, names the files
    before it export, or ``args`` the dashboard passes."""
    from jupyter_memprof._views.dashboard.page import build

    prof, _ = mlp_adam_profile
    built = build(prof)
    models = [
        m
        for m in built.layout.references()
        if isinstance(m, (CustomJS, CustomJSHover, CustomJSTickFormatter))
    ]
    assert {type(m).__name__ for m in models} == {
        "CustomJS",
        "CustomJSHover",
        "CustomJSTickFormatter",
    }
    for m in models:
        wanted = _declared(m.code, "global") - _declared(m.code, "exported") - BOKEH_PARAMETERS
        assert wanted <= set(m.args), (m.code[:80], wanted - set(m.args))


def test_the_comparison_passes_exactly_the_names_compare_js_declares(mlp_adam_profile):
    """compare.js (read through the one loader, dashboard_js.source) gets every name its
    ``/* global */`` comment lists, and nothing it does not declare."""
    import jupyter_memprof
    from jupyter_memprof._views.compare import build

    prof, _ = mlp_adam_profile
    built = build(jupyter_memprof.compare(prof, prof))
    models = [m for m in built.layout.references() if isinstance(m, CustomJS)]
    code = dashboard_js.source("compare.js")
    ours = [m for m in models if m.code == code]
    assert len(ours) == 2  # a row clicked, the grouping changed
    declared = _declared(code, "global") - BOKEH_PARAMETERS
    assert "mode" in declared and "rows" in declared
    for m in ours:
        assert set(m.args) == declared, set(m.args) ^ declared
    assert {m.args["mode"] for m in ours} == {"select", "by"}


BYTES = [0, 1, 1023, 1024, 1280, 1536, 4000, 10239, 1024**2 - 1, 1024**2 - 52, 1536 * 1024]
BYTES += [5 * 1024**3 + 1, 1024**4 * 3 + 1024**3 // 20, 1024**5 * 2, -2048, -1280, 1279.9]
MS = [0.0, 0.0004, 0.0005, 0.00125, 0.0625, 0.9999, 0.99996, 1.0, 1.0625, 12.3456789]
MS += [999.9994, 999.9996, 1000.0, 1234.5678, 86_400_000.0, -0.25, -3.5, float("nan")]


@needs_node
def test_page_and_python_format_numbers_the_same():
    script = dashboard_js.source("units.js") + (
        "\nconst input = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "\nconsole.log(JSON.stringify({bytes: input.bytes.map(format_bytes),"
        " ms: input.ms.map((v) => format_ms(v === null ? NaN : v)),"
        " records: input.records.map((v) => format_records(v === null ? NaN : v))}));"
    )
    ms = [None if v != v else v for v in MS]
    payload = json.dumps({"bytes": BYTES, "ms": ms, "records": ms + [1234.4, 1234.5, 2e6]})
    done = subprocess.run(
        [NODE, "-e", script], input=payload, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["bytes"] == [format_bytes(v) for v in BYTES]
    assert out["ms"] == [format_ms(v) for v in MS]
    assert out["records"] == [format_records(v) for v in [*MS, 1234.4, 1234.5, 2e6]]
    assert out["records"][-3:] == ["record #1,234", "record #1,235", "record #2,000,000"]
    # and the rules themselves
    assert out["bytes"][:11] == [
        "0 B",
        "1 B",
        "1023 B",
        "1.0 KiB",
        "1.3 KiB",
        "1.5 KiB",
        "3.9 KiB",
        "10.0 KiB",
        "1.0 MiB",
        "1023.9 KiB",
        "1.5 MiB",
    ]
    assert out["ms"][:10] == [
        "0.0 µs",
        "0.4 µs",
        "0.5 µs",
        "1.3 µs",
        "62.5 µs",
        "999.9 µs",
        "1.000 ms",
        "1.000 ms",
        "1.063 ms",
        "12.346 ms",
    ]
