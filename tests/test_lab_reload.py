"""A saved notebook with dashboards, reloaded in a real JupyterLab (headless Debian chromium):
the dashboards draw again with no error in the browser console, ``window.memprofReady`` is
set for a notebook's dashboards as for the standalone page, and with a new kernel each saved
dashboard says that it is gone, without an error. One server and one browser page
serve every test here, in order."""

from __future__ import annotations

import os
import shutil

import pytest
from _browser import ARTIFACTS, chromium_page, chromium_path, screenshot
from _jupyterlab import APP, BUILD, api, jupyterlab, kernel_idle, notebook_js, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = notebook_js("reload.ipynb")
CELLS = [
    "import torch\n%load_ext jupyter_memprof\n"
    "model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), "
    "torch.nn.Linear(256, 8))\n"
    "def step(batch):\n"
    "    model(torch.randn(batch, 64)).square().mean().backward()",
    "%%memprofile -o first\nstep(32)",
    "%%memprofile -o second\nstep(64)",
]
DASHBOARDS = 2
# labextension/src/guard.ts GONE_NOTE
GONE = "The dashboard is not in this kernel: run the cell again to draw it."


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    chromium_path()
    root = tmp_path_factory.mktemp("lab")
    write_notebook(root / "reload.ipynb", CELLS)
    with jupyterlab(root) as base, chromium_page(viewport=(1400, 1000)) as page:
        console: list[str] = []
        page.on(
            "console",
            lambda m: console.append(m.text) if m.type == "error" else None,
        )
        page.on("pageerror", lambda e: console.append(f"page error: {e}"))
        page.console = console
        try:
            yield base, page
        finally:
            os.makedirs(ARTIFACTS, exist_ok=True)
            shutil.copy(root / "server.log", os.path.join(ARTIFACTS, "lab-reload-server.log"))


def _dashboards_drawn(page) -> None:
    cells = page.locator(".jp-Notebook .jp-Cell")
    for n in range(1, 1 + DASHBOARDS):
        cells.nth(n).locator(".memprof-timeline").first.wait_for(timeout=120_000)


def test_the_server_serves_this_checkouts_extension(lab):
    base, page = lab
    if not (BUILD / "package.json").is_file():
        pytest.skip("no build of the extension in this checkout")
    page.goto(base.url("/lab/tree/reload.ipynb?reset"))
    page.wait_for_function(f"() => !!{NOTEBOOK}", timeout=60_000)
    extensions = page.evaluate(
        "() => JSON.parse(document.getElementById('jupyter-config-data').textContent)"
        ".federated_extensions"
    )
    ours = [e for e in extensions if e["name"] == "jupyter-memprof"]
    built = next((BUILD / "static").glob("remoteEntry.*.js")).name
    assert [e["load"] for e in ours] == [f"static/{built}"]


def test_dashboards_in_a_notebook_set_memprof_ready(lab):
    base, page = lab
    page.goto(base.url("/lab/tree/reload.ipynb?reset"))
    kernel_idle(page, NOTEBOOK)
    assert page.evaluate("() => window.memprofReady") is None
    page.evaluate(f"() => {{ {APP}.commands.execute('notebook:run-all-cells'); }}")
    _dashboards_drawn(page)
    page.wait_for_function("() => typeof window.memprofReady === 'number'", timeout=60_000)
    kernel_idle(page, NOTEBOOK)
    assert page.console == []


def test_a_reload_draws_the_dashboards_again_with_no_console_error(lab):
    base, page = lab
    page.evaluate(f"() => {APP}.commands.execute('docmanager:save')")
    page.wait_for_function(f"() => !{NOTEBOOK}.context.model.dirty", timeout=30_000)
    page.console.clear()
    page.reload()
    kernel_idle(page, NOTEBOOK)
    _dashboards_drawn(page)
    page.wait_for_function("() => typeof window.memprofReady === 'number'", timeout=60_000)
    # nothing is left to draw: no error view, no "model not found"
    assert page.locator(".jupyter-widgets-error-widget").count() == 0
    assert page.get_by_text("Error displaying widget").count() == 0
    page.wait_for_timeout(1000)
    screenshot(page, "lab-reload.png")
    assert page.console == []
    # redrawn from the running kernel's widgets: the notebook itself was not changed
    assert not page.evaluate(f"() => {NOTEBOOK}.context.model.dirty")


def test_a_reload_without_the_browsers_copy_of_bokehjs(lab):
    """A browser that keeps no BokehJS (storage cleared or full): the dashboards wait for the
    copy the panel's link fetches from the kernel, and draw once, with no console error."""
    base, page = lab
    page.evaluate("() => window.localStorage.clear()")
    page.console.clear()
    page.reload()
    kernel_idle(page, NOTEBOOK)
    _dashboards_drawn(page)
    assert page.locator(".jupyter-widgets-error-widget").count() == 0
    page.wait_for_timeout(1000)
    assert page.console == []


def test_a_saved_notebook_with_a_new_kernel(lab):
    """The kernel gone (a restarted server): the saved outputs name widgets the new kernel does
    not have. Each says so, quietly, until its cell runs again."""
    base, page = lab

    for kernel in api(base, "/api/kernels") or []:
        api(base, f"/api/kernels/{kernel['id']}", method="DELETE")
    for session in api(base, "/api/sessions") or []:
        api(base, f"/api/sessions/{session['id']}", method="DELETE")
    page.console.clear()
    page.reload()
    kernel_idle(page, NOTEBOOK)
    notes = page.locator(".memprof-dashboard-gone")
    page.wait_for_function(
        f"() => document.querySelectorAll('.memprof-dashboard-gone').length === {DASHBOARDS}",
        timeout=60_000,
    )
    assert notes.all_inner_texts() == [GONE] * DASHBOARDS
    page.wait_for_timeout(3000)  # ipywidgets' own attempt would have failed by now
    screenshot(page, "lab-new-kernel.png")
    assert page.get_by_text("Error displaying widget").count() == 0
    assert page.console == []
    assert not page.evaluate(f"() => {NOTEBOOK}.context.model.dirty")
    # the cells run again: the dashboards are drawn in place of the notes
    page.evaluate(f"() => {{ {APP}.commands.execute('notebook:run-all-cells'); }}")
    _dashboards_drawn(page)
    kernel_idle(page, NOTEBOOK)
    assert notes.count() == 0
    assert page.console == []
