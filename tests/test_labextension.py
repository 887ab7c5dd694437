"""The JupyterLab extension: installed as a prebuilt extension, and the "Memory profiles"
panel used the way a user uses it, in a real JupyterLab driven by headless chromium."""

from __future__ import annotations

import json
import os
import pathlib
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from _browser import ARTIFACTS, chromium_page, chromium_path, docs_image, screenshot
from _jupyterlab import APP, jupyterlab, kernel_idle, notebook_js, write_notebook

import jupyter_memprof
from jupyter_memprof._units import format_bytes

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# -- installation ------------------------------------------------------------------------------
def test_labextension_is_installed_prebuilt_and_enabled():
    out = subprocess.run(
        [str(BIN / "jupyter"), "labextension", "list"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [ANSI.sub("", line).split() for line in (out.stdout + out.stderr).splitlines()]
    ours = [words for words in lines if words and words[0] == "jupyter-memprof"]
    assert ours, out.stdout + out.stderr
    name, version, enabled, ok, *source = ours[0]
    assert version == f"v{jupyter_memprof.__version__}"
    assert (enabled, ok) == ("enabled", "OK")
    assert " ".join(source) == "(python, jupyter_memprof)"


def test_installed_labextension_carries_the_package_version():
    from jupyter_core.paths import jupyter_path

    found = [
        pathlib.Path(d) / "jupyter-memprof" / "package.json"
        for d in jupyter_path("labextensions")
        if (pathlib.Path(d) / "jupyter-memprof" / "package.json").is_file()
    ]
    assert found, "jupyter-memprof is not under any share/jupyter/labextensions"
    built = json.loads(found[0].read_text())
    source = json.loads((ROOT / "labextension" / "package.json").read_text())
    assert built["name"] == source["name"] == "jupyter-memprof"
    assert built["version"] == source["version"] == jupyter_memprof.__version__
    assert built["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")


# -- the panel in a browser --------------------------------------------------------------------
# The notebook of a user tuning the batch size of a small training step.
CELLS = [
    "import torch\n"
    "import jupyter_memprof\n"
    "%load_ext jupyter_memprof\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Sequential(\n"
    "    torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))\n"
    "opt = torch.optim.Adam(model.parameters())\n"
    "def step(batch):\n"
    "    opt.zero_grad()\n"
    "    loss = model(torch.randn(batch, 256)).logsumexp(-1).mean()\n"
    "    loss.backward()\n"
    "    opt.step()",
    "%%memprofile -o bs32 --no-display\nstep(32)",
    "%%memprofile -o bs1024 --no-display\nstep(1024)",
    "print('PEAKS', bs32.peak().attrs['peak_bytes'], bs1024.peak().attrs['peak_bytes'])",
]
# Added while the test runs: a profile whose label is markup, which the panel must show as text.
MARKUP_CELL = (
    "with jupyter_memprof.profile(label='<b id=\"memprof-markup\">bold</b>') as odd:\n"
    "    z = torch.zeros(64, 64) + 1"
)
# Added while the test runs: an estimate whose label does not say so; the panel says it.
ESTIMATE_CELL = "%%memprofile --estimate --device cuda:0 --no-display --label bs4096\nstep(4096)"
# Added after a kernel restart, run with "Profile memory of this cell".
COMMAND_CELL = "import torch\nw = torch.ones(256, 256) * 2"


def _notebook(path: pathlib.Path) -> None:
    write_notebook(path, CELLS)


def _entries(page) -> list[dict]:
    return page.eval_on_selector_all(
        "#jupyter-memprof-panel .memprof-entry",
        """els => els.map(e => ({
            sid: Number(e.dataset.sid),
            label: e.querySelector('.memprof-entry-label').textContent,
            peak: e.querySelector('.memprof-entry-peak').textContent,
            bar: parseFloat(e.querySelector('.memprof-entry-bar-fill').style.width),
            estimate: e.querySelector('.memprof-entry-estimate')?.textContent ?? null,
            meta: e.querySelector('.memprof-entry-meta').textContent,
        }))""",
    )


def _wait_entries(page, n: int, timeout: float = 60_000) -> list[dict]:
    page.wait_for_function(
        f"document.querySelectorAll('#jupyter-memprof-panel .memprof-entry').length === {n}",
        timeout=timeout,
    )
    return _entries(page)


@pytest.mark.browser
@pytest.mark.slow
def test_memory_profiles_panel_lists_opens_releases_and_follows_restarts():
    chromium_path()
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        _notebook(root / "panel.ipynb")
        with jupyterlab(root) as base, chromium_page() as page:
            try:
                _drive(page, base)
            except Exception:
                screenshot(page, "labextension-failure.png")
                shutil.copy(root / "server.log", _artifact("labextension-server.log"))
                raise


def _artifact(name: str) -> str:
    os.makedirs(ARTIFACTS, exist_ok=True)
    return os.path.join(ARTIFACTS, name)


# The test's notebook panel (the current widget is a dashboard tab once one is open);
# undefined until JupyterLab has set window.jupyterapp, which can come after the page loads.
NOTEBOOK = notebook_js("panel.ipynb")


def _run_new_cell(page, source: str, command: str) -> None:
    """Append a code cell to the notebook, make it active and run ``command`` on it."""
    page.evaluate(
        f"""source => {{
            const nb = {NOTEBOOK}.content;
            const n = nb.model.sharedModel.cells.length;
            nb.model.sharedModel.insertCell(n, {{cell_type: 'code', source}});
            nb.activeCellIndex = n;
            {APP}.commands.execute('{command}');
        }}""",
        source,
    )


def _drive(page, base: str) -> None:
    page.goto(base.url("/lab/tree/panel.ipynb?reset"))
    kernel_idle(page, NOTEBOOK, timeout=60_000)
    page.evaluate(f"() => {{ {APP}.commands.execute('notebook:run-all-cells'); }}")
    peaks_out = page.locator(".jp-OutputArea-output", has_text="PEAKS")
    peaks_out.wait_for(timeout=120_000)
    _, bs32, bs1024 = peaks_out.inner_text().split()
    bs32, bs1024 = int(bs32), int(bs1024)
    assert bs1024 > bs32 > 0

    # The side panel, opened from its tab in the left side bar: newest first, with peaks.
    page.locator('.jp-SideBar.jp-mod-left [data-id="jupyter-memprof-panel"]').click()
    panel = page.locator("#jupyter-memprof-panel")
    entries = _wait_entries(page, 2)
    assert [e["label"] for e in entries] == ["bs1024", "bs32"]
    assert [e["peak"] for e in entries] == [format_bytes(bs1024), format_bytes(bs32)]
    assert entries[0]["sid"] > entries[1]["sid"]
    assert entries[0]["bar"] == 100.0
    assert entries[1]["bar"] == pytest.approx(100 * bs32 / bs1024, abs=0.1)
    box, last = panel.bounding_box(), panel.locator(".memprof-entry").last.bounding_box()
    clip = dict(box, height=last["y"] + last["height"] - box["y"] + 16)
    page.screenshot(path=_artifact("panel.png"), clip=clip)
    docs_image("panel.png")

    # A click opens the profile's dashboard, drawn by the kernel, in a main-area tab.
    small_entry = panel.locator(f'.memprof-entry[data-sid="{entries[1]["sid"]}"]')
    small_entry.click()
    tab = page.locator(".memprof-dashboard-tab")
    tab.wait_for(timeout=30_000)
    assert page.locator(".lm-TabBar-tab.lm-mod-current", has_text="Memory: bs32").count() == 1
    tab.locator(".memprof-timeline").first.wait_for(timeout=120_000)
    screenshot(page, "labextension-dashboard.png")
    # The dashboard ran without taking an execution count.
    kernel_idle(page, NOTEBOOK, timeout=60_000)
    counts = page.evaluate(
        f"() => {NOTEBOOK}.content.model.sharedModel.cells.map(c => c.execution_count)"
    )
    assert counts == [1, 2, 3, 4]

    # Ctrl-click two profiles, then Compare: the kernel draws the comparison in a tab, and
    # releasing either profile closes it.
    compare = panel.locator(".memprof-compare-button")
    assert compare.is_disabled()
    for e in entries:
        panel.locator(f'.memprof-entry[data-sid="{e["sid"]}"]').click(modifiers=["Control"])
    assert compare.is_enabled()
    compare.click()
    cmp_tab = page.locator(".memprof-compare-tab")
    cmp_tab.wait_for(timeout=30_000)
    current = page.locator(".lm-TabBar-tab.lm-mod-current", has_text="Memory: bs32 vs bs1024")
    assert current.count() == 1
    cmp_tab.locator(".memprof-compare-table").first.wait_for(timeout=120_000)
    # the headline (Bokeh draws inside shadow roots, which text locators pierce)
    cmp_tab.get_by_text(re.compile(r"^peak \+\S+ MiB \(\+")).first.wait_for(timeout=30_000)
    screenshot(page, "labextension-compare.png")

    # Labels are text, never markup; jupyter_memprof.profile() is announced like the magic.
    _run_new_cell(page, MARKUP_CELL, "notebook:run-cell")
    entries = _wait_entries(page, 3)
    assert [e["label"] for e in entries] == ['<b id="memprof-markup">bold</b>', "bs1024", "bs32"]
    assert page.locator("#memprof-markup").count() == 0
    assert [e["estimate"] for e in entries] == [None, None, None]

    # An estimate (on fake tensors, for a GPU this machine does not have) says so.
    _run_new_cell(page, ESTIMATE_CELL, "notebook:run-cell")
    entries = _wait_entries(page, 4, timeout=120_000)
    assert entries[0]["label"] == "bs4096" and entries[0]["estimate"] == "estimate"
    # its devices: cuda:0, and the CPU that keeps Adam's step counters (as torch does)
    assert entries[0]["meta"].startswith("cpu 16 B, cuda:0 "), entries[0]["meta"]
    assert "estimated in" in entries[0]["meta"]
    assert [e["estimate"] for e in entries[1:]] == [None, None, None]
    assert "ran " in entries[1]["meta"]

    # Releasing a profile frees it in the kernel: its entry and its dashboard go away.
    small_entry.locator(".memprof-entry-release").click()
    entries = _wait_entries(page, 3)
    assert [e["label"] for e in entries] == ["bs4096", '<b id="memprof-markup">bold</b>', "bs1024"]
    tab.wait_for(state="detached", timeout=10_000)
    cmp_tab.wait_for(state="detached", timeout=10_000)

    # After a page reload the panel finds the kernel's profiles again.
    page.reload()
    kernel_idle(page, NOTEBOOK, timeout=60_000)
    page.locator('.jp-SideBar.jp-mod-left [data-id="jupyter-memprof-panel"]').click()
    assert [e["label"] for e in _wait_entries(page, 3)] == [
        "bs4096",
        '<b id="memprof-markup">bold</b>',
        "bs1024",
    ]
    # Its notebook shows no dashboard, so the page fetched no BokehJS from the kernel (a
    # reply would come within a second of the comm's list).
    page.wait_for_timeout(1500)
    assert page.evaluate("() => window.Bokeh === undefined")

    # The panel follows the active notebook: another notebook's kernel has no profiles.
    page.evaluate(
        f"() => {{ {APP}.commands.execute('notebook:create-new', {{kernelName: 'python3'}}); }}"
    )
    page.locator(".lm-TabBar-tab.lm-mod-current", has_text="Untitled").wait_for(timeout=30_000)
    # wait for the panel to switch (its status names the notebook it follows), then count
    panel.locator(".memprof-panel-status", has_text=re.compile(r"^Untitled")).wait_for(
        state="attached", timeout=30_000
    )
    assert _wait_entries(page, 0) == []
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="panel.ipynb").click()
    assert len(_wait_entries(page, 3)) == 3

    # A kernel restart empties the list; the panel says how to start again.
    page.evaluate(f"() => {{ {NOTEBOOK}.sessionContext.session.kernel.restart(); }}")
    _wait_entries(page, 0)
    status = panel.locator(".memprof-panel-status")
    assert "%load_ext jupyter_memprof" in status.inner_text()

    # "Profile memory of this cell" loads the extension on demand and runs the cell under
    # %%memprofile, leaving its text alone.
    kernel_idle(page, NOTEBOOK, timeout=60_000)
    _run_new_cell(page, COMMAND_CELL, "jupyter-memprof:profile-cell")
    entries = _wait_entries(page, 1, timeout=120_000)
    assert entries[0]["label"] == "In[1]"
    value, unit = entries[0]["peak"].split()
    assert unit == "KiB" and float(value) >= 256.0  # at least the 256x256 float32 result
    cell = f"{NOTEBOOK}.content.activeCell.model"
    page.wait_for_function(f"() => {cell}.executionCount === 1", timeout=60_000)
    assert page.evaluate(f"() => {cell}.sharedModel.getSource()") == COMMAND_CELL
    summary = page.locator(".jp-Notebook .jp-Cell.jp-mod-active .memprof-summary").first
    assert summary.inner_text().startswith("memory profile In[1]")


# -- the kernel side of the comm, without a browser --------------------------------------------
class _Kernel:
    """A real ipykernel driven over its ZMQ channels, like a front end does."""

    def __init__(self, root: pathlib.Path):
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        env = dict(os.environ, OMP_NUM_THREADS="1", IPYTHONDIR=str(root / ".ipython"))
        self.km.start_kernel(cwd=str(root), env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.seen: list[dict] = []  # iopub comm messages, in order

    def run(self, code: str) -> str:
        """Execute ``code``; returns its stdout, keeps the comm messages it published."""
        out: list[str] = []

        def hook(msg):
            kind = msg["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                raise AssertionError("\n".join(msg["content"]["traceback"]))
            elif kind.startswith("comm_"):
                self.seen.append(msg)

        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)

    def send(self, msg_type: str, content: dict) -> None:
        self.kc.shell_channel.send(self.kc.session.msg(msg_type, content))

    def comm_data(self, comm_id: str, kind: str, timeout: float = 30) -> dict:
        """The first ``kind`` message the kernel sent on ``comm_id`` (waiting for it)."""

        def match(msg):
            content = msg["content"]
            return content.get("comm_id") == comm_id and content["data"].get("type") == kind

        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for msg in self.seen[seen:]:
                if match(msg):
                    return msg["content"]["data"]
            seen = len(self.seen)
            if time.monotonic() > deadline:
                raise AssertionError(f"no {kind!r} message on comm {comm_id}")
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            if msg["msg_type"].startswith("comm_"):
                self.seen.append(msg)

    def drain(self, quiet_s: float = 3.0) -> None:
        """Keep every comm message published until the kernel has been quiet for
        ``quiet_s`` (replies to comm requests are no children of an execution, so
        :meth:`run` does not see them)."""
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=quiet_s)
            except queue.Empty:
                return
            if msg["msg_type"].startswith("comm_"):
                self.seen.append(msg)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.mark.slow
def test_kernel_serves_the_panel_only_while_a_front_end_listens(tmp_path):
    import uuid

    k = _Kernel(tmp_path)
    try:
        k.run("import torch, jupyter_memprof\n%load_ext jupyter_memprof")
        # Loading announces the extension to a panel that may be watching this kernel.
        (hello,) = [m for m in k.seen if m["msg_type"] == "comm_open"]
        assert hello["content"]["target_name"] == "jupyter_memprof"
        assert hello["content"]["data"] == {
            "type": "hello",
            "version": jupyter_memprof.__version__,
        }
        # A front end without the panel closes it: the kernel then sends nothing more.
        k.send("comm_close", {"comm_id": hello["content"]["comm_id"], "data": {}})
        k.seen.clear()
        k.run("%%memprofile -o p1 --no-display\nx = torch.ones(100, 100) @ torch.ones(100, 100)")
        assert k.seen == []
        assert (
            k.run("import jupyter_memprof._frontends.session as s; print(len(s._listeners))")
            == "0\n"
        )

        # A panel opens a comm and asks for the list.
        cid = uuid.uuid4().hex
        k.send("comm_open", {"comm_id": cid, "target_name": "jupyter_memprof", "data": {}})
        k.send("comm_msg", {"comm_id": cid, "data": {"type": "list"}})
        (p1,) = k.comm_data(cid, "list")["profiles"]
        truth = k.run(
            "print(p1.session_id, p1.peak('cpu').attrs['peak_bytes'], len(p1.ops),"
            " len(p1.allocations), len(p1.events), p1.meta['captured_at'] // 1_000_000)"
        ).split()
        sid, peak, n_ops, n_allocs, n_events, taken_ms = map(int, truth)
        assert p1["sid"] == sid and p1["label"] == "p1"
        assert p1["peaks"] == [{"device": "cpu", "bytes": peak, "text": format_bytes(peak)}]
        assert p1["peak_bytes"] == peak >= 3 * 100 * 100 * 4
        assert p1["peak_text"] == format_bytes(peak)
        assert p1["counts"] == {"ops": n_ops, "allocations": n_allocs, "events": n_events}
        assert p1["taken_ms"] == taken_ms and p1["error"] is None
        assert p1["wall_s"] > 0 and p1["wall_text"]

        # Every new profile is announced, the magic's and profile()'s alike.
        k.run("with jupyter_memprof.profile(label='ctx') as p2:\n    y = torch.zeros(10) + 1")
        added = k.comm_data(cid, "added")["profile"]
        assert added["label"] == "ctx" and added["sid"] == sid + 1

        # The dashboard tab's code displays the dashboard; closing the tab closes its widgets.
        k.run(
            "import jupyter_memprof._frontends.comm as c\n"
            "import jupyter_memprof._frontends.session as s\n"
            f"c.show({sid})"
        )
        assert k.run(f"print(len(s._tracked[{sid}]))") == "1\n"
        k.send("comm_msg", {"comm_id": cid, "data": {"type": "hide", "sid": sid}})
        assert k.run(f"print({sid} in s._tracked)") == "False\n"

        # Release frees the profile in the kernel and tells the panel.
        k.send("comm_msg", {"comm_id": cid, "data": {"type": "release", "sid": sid}})
        assert k.comm_data(cid, "released")["sid"] == sid
        assert k.run("print(sorted(dict(s.items())))") == f"[{sid + 1}]\n"
        k.send("comm_msg", {"comm_id": cid, "data": {"type": "frobnicate"}})
        assert "frobnicate" in k.comm_data(cid, "error")["message"]

        # Unloading closes the panel's comm and forgets the listener.
        k.run("%unload_ext jupyter_memprof")
        assert any(m["msg_type"] == "comm_close" and m["content"]["comm_id"] == cid for m in k.seen)
        assert k.run("print(len(s._listeners))") == "0\n"
    finally:
        k.close()


def test_start_outside_a_kernel_does_nothing(ipython_shell):
    from jupyter_memprof._frontends import comm as _comm
    from jupyter_memprof._frontends import session as _session

    listeners = list(_session._listeners)
    _comm.start(ipython_shell)
    assert _comm._manager is None and _comm._comms == {}
    assert _session._listeners == listeners
    _comm.stop(ipython_shell)
