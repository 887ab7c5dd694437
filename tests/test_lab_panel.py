"""The "Memory profiles" panel in a real JupyterLab (headless Debian chromium), 400 px wide and
in an 1100 px window: labels wrap at their spaces, never inside a word, and the peak bars of
captures and estimates, or of different devices, are each drawn on their own scale. One server
and one browser page serve every test here, in order."""

from __future__ import annotations

import os
import shutil

import pytest
from _browser import ARTIFACTS, chromium_page, chromium_path, screenshot
from _jupyterlab import APP, jupyterlab, kernel_idle, notebook_js, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = notebook_js("panel.ipynb")
LABEL = "model forward and backward on torch with a long descriptive label"
CELLS = [
    "import torch\n%load_ext jupyter_memprof\n"
    "model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), "
    "torch.nn.Linear(256, 8))\n"
    "def step(batch):\n"
    "    model(torch.randn(batch, 64)).square().mean().backward()",
    f'%%memprofile --no-display --label "{LABEL}"\nstep(32)',
    "%%memprofile --no-display --label small\nstep(2)",
    '%%memprofile --no-display --estimate --device cuda:0 --label "cuda estimate"\nstep(4096)',
]
ENTRIES = 3

# Per entry: its label, its bar's scale and width (% of its track), and each word of the label
# that is drawn on more than one line (a word broken inside).
ENTRY_FACTS = """panel => Array.from(panel.querySelectorAll('.memprof-entry')).map(li => {
  const label = li.querySelector('.memprof-entry-label');
  const text = label.firstChild;
  const broken = [];
  const lines = new Set();
  const re = /\\S+/g;
  let m;
  while ((m = re.exec(text.textContent)) !== null) {
    const range = document.createRange();
    range.setStart(text, m.index);
    range.setEnd(text, m.index + m[0].length);
    const tops = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
    if (tops.size > 1) broken.push(m[0]);
    tops.forEach(t => lines.add(t));
  }
  const bar = li.querySelector('.memprof-entry-bar');
  const fill = li.querySelector('.memprof-entry-bar-fill');
  const style = getComputedStyle(label);
  return {
    label: text.textContent,
    lines: lines.size,
    broken,
    wrap: [style.overflowWrap, style.wordBreak, style.hyphens],
    scale: bar.dataset.scale,
    peak: li.querySelector('.memprof-entry-peak').textContent,
    width: fill.getBoundingClientRect().width / bar.getBoundingClientRect().width,
    overflow: li.scrollWidth > li.clientWidth + 1,
  };
})"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    chromium_path()
    root = tmp_path_factory.mktemp("lab")
    write_notebook(root / "panel.ipynb", CELLS)
    with jupyterlab(root) as base, chromium_page(viewport=(1400, 1000)) as page:
        try:
            yield base, page
        finally:
            os.makedirs(ARTIFACTS, exist_ok=True)
            shutil.copy(root / "server.log", os.path.join(ARTIFACTS, "lab-panel-server.log"))


def _panel_with_entries(page):
    page.evaluate(f"() => {{ {APP}.shell.activateById('jupyter-memprof-panel'); }}")
    panel = page.locator("#jupyter-memprof-panel")
    panel.locator(".memprof-entry").nth(ENTRIES - 1).wait_for(timeout=180_000)
    return panel


def _set_panel_width(page, width: int) -> None:
    """The left side panel ``width`` px wide (the shell's split between the sides and the
    main area)."""
    page.evaluate(
        f"""width => {{
            const split = {APP}.shell._hsplitPanel;
            const total = split.node.getBoundingClientRect().width;
            split.setRelativeSizes([width / total, 1 - width / total, 0]);
        }}""",
        width,
    )
    page.wait_for_timeout(300)


def _bytes(text: str) -> float:
    """``1.5 MiB`` -> bytes."""
    number, unit = text.split()
    return float(number) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(unit)


def _facts(page, panel, width):
    got = panel.evaluate("el => el.getBoundingClientRect().width")
    assert abs(got - width) <= 2, got
    return {f["label"]: f for f in panel.evaluate(ENTRY_FACTS)}


def test_the_profiles_are_listed(lab):
    base, page = lab
    page.goto(base.url("/lab/tree/panel.ipynb?reset"))
    kernel_idle(page, NOTEBOOK)
    page.evaluate(f"() => {{ {APP}.commands.execute('notebook:run-all-cells'); }}")
    panel = _panel_with_entries(page)
    labels = panel.locator(".memprof-entry-label").all_inner_texts()
    assert sorted(labels) == sorted([LABEL, "small", "cuda estimate"])


@pytest.mark.parametrize("window, width", [(1400, 400), (1100, None)])
def test_labels_wrap_at_spaces_and_bars_keep_to_their_scale(lab, window, width):
    base, page = lab
    page.set_viewport_size({"width": window, "height": 900})
    panel = _panel_with_entries(page)
    if width is not None:
        _set_panel_width(page, width)
    else:  # the panel as JupyterLab sizes it in an 1100 px window
        page.wait_for_timeout(300)
        width = panel.evaluate("el => el.getBoundingClientRect().width")
    facts = _facts(page, panel, width)
    long = facts[LABEL]
    assert long["wrap"] == ["normal", "normal", "none"]
    # the long label takes several lines, each word whole
    assert long["lines"] >= 2, long
    for f in facts.values():
        assert f["broken"] == [], f
        assert not f["overflow"], f
    # captures on the CPU share a scale (the larger one fills its track, the other is drawn
    # in proportion); the cuda:0 estimate, many times larger, has its own
    cpu = [long, facts["small"]]
    estimate = facts["cuda estimate"]
    assert [f["scale"] for f in cpu] == ["cpu capture"] * 2
    assert estimate["scale"] == "cuda:0 estimate"
    peaks = {f["label"]: _bytes(f["peak"]) for f in facts.values()}
    assert peaks["cuda estimate"] > 10 * max(peaks[LABEL], peaks["small"])
    assert estimate["width"] == pytest.approx(1.0, abs=0.01)
    top = max(peaks[LABEL], peaks["small"])
    for f in cpu:
        assert f["width"] == pytest.approx(peaks[f["label"]] / top, abs=0.02), f
    screenshot(page, f"lab-panel-{window}.png")
