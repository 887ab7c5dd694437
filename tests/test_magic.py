"""%%memprofile / %memprofile driven through a real IPython shell (and a real kernel)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from jupyter_memprof._analysis import schema as _schema
from jupyter_memprof._frontends.magic import LAST
from jupyter_memprof._frontends.progress import Progress, progress_for
from jupyter_memprof._producers.torch_profiler import profiler_running
from jupyter_memprof._profile import Profile
from jupyter_memprof._views.summary import NO_ACTIVITY


@pytest.fixture(scope="module")
def shell():
    ip = globalipapp.get_ipython()
    ip.run_cell("%load_ext jupyter_memprof", store_history=True)
    ip.run_cell("import torch", store_history=True)
    yield ip
    ip.run_cell("%unload_ext jupyter_memprof", store_history=True)


@pytest.fixture
def run(shell, capsys):
    """Run a cell as a notebook does; returns (ExecutionResult, everything it printed)."""

    def run_cell(source: str):
        capsys.readouterr()
        result = shell.run_cell(source, store_history=True)
        captured = capsys.readouterr()
        return result, captured.out + captured.err

    return run_cell


def blocks_of(prof: Profile, nbytes: int):
    a = prof.allocations
    return a[(a["size_bytes"] == nbytes) & (a["device"] == "cpu")]


# -- loading -------------------------------------------------------------------------------
def test_load_twice_unload_leaves_nothing_behind(shell, run):
    magics = shell.magics_manager.magics
    callbacks = {name: list(cbs) for name, cbs in shell.events.callbacks.items()}
    registry = set(shell.magics_manager.registry)
    shell.extension_manager.unload_extension("jupyter_memprof")
    assert "memprofile" not in magics["line"] and "memprofile" not in magics["cell"]

    import jupyter_memprof

    jupyter_memprof.load_ipython_extension(shell)
    jupyter_memprof.load_ipython_extension(shell)  # a second load is harmless
    assert magics["cell"]["memprofile"] is not None and magics["line"]["memprofile"] is not None
    result, _ = run("%%memprofile --no-display\nx_load = torch.empty(10)")
    assert result.success and isinstance(shell.user_ns[LAST], Profile)

    jupyter_memprof.unload_ipython_extension(shell)
    assert "memprofile" not in magics["line"] and "memprofile" not in magics["cell"]
    assert LAST not in shell.user_ns
    assert set(shell.magics_manager.registry) <= registry
    assert {name: list(cbs) for name, cbs in shell.events.callbacks.items()} == callbacks
    result, out = run("%%memprofile\nx = 1")
    assert isinstance(result.error_in_exec, UsageError) and "memprofile" in out

    shell.extension_manager.load_extension("jupyter_memprof")  # back, for the other tests
    assert run("%reload_ext jupyter_memprof")[0].success
    assert run("%memprofile --no-display x_back = 1")[0].success
    assert shell.user_ns["x_back"] == 1


def test_help_lists_the_options(shell):
    doc = shell.find_cell_magic("memprofile").__doc__
    for option in ("-o VAR", "--no-display", "--no-stack", "--device DEV", "--html PATH"):
        assert option in doc
    assert "--label TEXT" in doc


# -- the cell runs as it would without the magic ------------------------------------------
def test_cell_runs_in_the_notebook_namespace_and_shows_its_value(shell, run):
    result, out = run("%%memprofile -o prof\nx = torch.empty(1000)\nx.numel()")
    assert result.success
    assert result.result == 1000  # the last expression's value, displayed as Out[N]
    assert f"Out[{result.execution_count}]: 1000" in out
    assert shell.user_ns["x"].shape == (1000,)
    prof = shell.user_ns["prof"]
    assert prof is shell.user_ns[LAST]
    assert prof.label == "prof"
    block = blocks_of(prof, 4000)
    assert len(block) == 1
    # the block is named after the notebook variable, and its callsite is the cell's line 2
    assert block["name"].iloc[0] == "x"
    op = prof.ops.set_index("op_id").loc[int(block["alloc_op_id"].iloc[0])]
    assert op["callsite"] == f"In[{result.execution_count}]:2 in <module>"
    # the summary follows the cell's own output
    assert "memory profile 'prof'" in out
    assert out.index("Out[") < out.index("memory profile")


def test_trailing_semicolon_silences_the_value(shell, run):
    result, out = run("%%memprofile -o prof_quiet\ny = torch.empty(250)\ny.numel();")
    assert result.success and result.result is None
    assert "Out[" not in out
    assert len(blocks_of(shell.user_ns["prof_quiet"], 1000)) == 1


def test_interactivity_setting_is_honoured(shell, run):
    shell.ast_node_interactivity = "all"
    try:
        result, out = run("%%memprofile --no-display\n6 * 7\n'second'")
    finally:
        shell.ast_node_interactivity = "last_expr"
    assert "42" in out and "'second'" in out


INTERACTIVE_CELLS = [
    "a = 6 * 7\na",
    "b = 6 * 7",
    "1 + 1\n'two'",
    "c: int = 3",
    "d = 1\nd += 2",
    "e = f = 5",
    "g = [1]\ng[0] = 4",
    "for i in range(2):\n    i",
    "print('p')\n3",
    "h = 7\nh;",
]


@pytest.mark.parametrize("mode", ["all", "last", "last_expr", "none", "last_expr_or_assign"])
def test_values_shown_are_the_ones_ipython_shows(shell, run, mode):
    """The magic applies ``ast_node_interactivity`` itself (see ``_interactive_plan``): what it
    displays must stay what IPython displays for the same cell without the magic."""
    out_n = re.compile(r"Out\[\d+\]")
    shell.ast_node_interactivity = mode
    try:
        for body in INTERACTIVE_CELLS:
            _, plain = run(body)
            _, magic = run("%%memprofile --no-display\n" + body)
            assert out_n.sub("Out[]", magic) == out_n.sub("Out[]", plain), (mode, body)
    finally:
        shell.ast_node_interactivity = "last_expr"


def test_ipython_syntax_works_inside(shell, run):
    result, out = run(
        "%%memprofile --no-display\n"
        "%time t_in = torch.ones(5)\n"
        "echoed = !echo hello-from-shell\n"
        "import asyncio\n"
        "await asyncio.sleep(0)\n"
        "t_in.sum().item()"
    )
    assert result.success, out
    assert shell.user_ns["t_in"].tolist() == [1.0] * 5
    assert list(shell.user_ns["echoed"]) == ["hello-from-shell"]
    assert "Wall time" in out
    assert result.result == 5.0


def test_default_label_is_the_cell_number(shell, run):
    result, out = run("%%memprofile\nz_default = torch.zeros(8)")
    prof = shell.user_ns[LAST]
    assert prof.label == f"In[{result.execution_count}]"
    assert f"memory profile 'In[{result.execution_count}]'" in out


def test_options(shell, run, tmp_path):
    result, out = run(
        "%%memprofile -o p_opts --no-display --no-stack --device cpu --device cpu,cpu "
        '--label "step 1"\n'
        "w_opts = torch.empty(1000)"
    )
    assert result.success and out == ""
    prof = shell.user_ns["p_opts"]
    assert prof.label == "step 1"
    assert prof.meta["devices"] == ["cpu"]
    assert prof.meta["with_stack"] is False
    assert prof.ops["callsite"].isna().all()
    assert len(blocks_of(prof, 4000)) == 1


def test_html_report_is_written(shell, run, tmp_path):
    path = tmp_path / "report.html"
    result, out = run(f"%%memprofile --no-display --html {path}\nh = torch.empty(1000)")
    assert result.success
    assert f"report written to {path}" in out
    assert path.read_text().lstrip().lower().startswith("<!doctype html")


def test_line_magic_profiles_one_statement(shell, run):
    result, out = run("%memprofile -o p_line s_line = 'two  spaces'; v_line = torch.empty(500)")
    assert result.success
    assert shell.user_ns["s_line"] == "two  spaces"  # the statement is kept as typed
    assert len(blocks_of(shell.user_ns["p_line"], 2000)) == 1
    assert "memory profile 'p_line'" in out
    # like %time, it returns the value of an expression
    result, _ = run("n_line = %memprofile --no-display torch.empty(10).numel()")
    assert shell.user_ns["n_line"] == 10
    result, out = run("%memprofile --no-display -- torch.ones(3).sum().item()")
    assert result.result == 3.0


def test_cell_without_torch_activity(shell, run):
    result, out = run("%%memprofile -o p_empty\nplain = sum(range(100))")
    assert result.success and shell.user_ns["plain"] == 4950
    prof = shell.user_ns["p_empty"]
    assert NO_ACTIVITY in out
    for name, schema in _schema.TABLES.items():
        assert list(getattr(prof, name).columns) == list(schema)
    assert len(prof.allocations) == 0 and len(prof.events) == 0


# -- failures ---------------------------------------------------------------------------
def test_error_in_the_cell_shows_the_users_traceback(shell, run):
    result, out = run(
        "%%memprofile -o p_err\n"
        "kept = torch.empty(1000)\n"
        "def shape_check(t):\n"
        "    raise ValueError(f'bad shape {tuple(t.shape)}')\n"
        "shape_check(kept)\n"
        "never = 1"
    )
    err = result.error_in_exec
    assert isinstance(err, ValueError) and str(err) == "bad shape (1000,)"
    # the traceback is the user's: their cell lines (numbered as in the cell), nothing of ours
    n = result.execution_count
    assert f"Cell In[{n}], line 5" in out and "----> 5 shape_check(kept)" in out
    assert f"Cell In[{n}], line 4, in shape_check" in out
    assert "ValueError: bad shape (1000,)" in out
    for ours in ("_magic.py", "jupyter_memprof", "run_cell_magic", "interactiveshell.py"):
        assert ours not in out
    # the partial profile is kept and shown before the traceback
    prof = shell.user_ns["p_err"]
    assert prof is shell.user_ns[LAST]
    assert prof.meta["error"] == "ValueError: bad shape (1000,)"
    assert len(blocks_of(prof, 4000)) == 1
    assert out.index("raised ValueError: bad shape (1000,)") < out.index("Traceback")
    assert "never" not in shell.user_ns
    assert not profiler_running()
    # and the next profile works
    assert run("%%memprofile --no-display\nafter_err = torch.empty(10)")[0].success


def test_keyboard_interrupt_keeps_the_profile_and_propagates(shell, run):
    # a real SIGINT, as Ctrl-C sends it, under Python's own handler (CI may ignore SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result, out = run(
            "%%memprofile -o p_int\n"
            "import os, signal\n"
            "before = torch.empty(1000)\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "import time; time.sleep(5)\n"
            "after_int = 1"
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "----> 4 os.kill(os.getpid(), signal.SIGINT)" in out
    assert "KeyboardInterrupt" in out and "_magic.py" not in out
    prof = shell.user_ns["p_int"]
    assert prof.meta["error"] == "KeyboardInterrupt"
    assert len(blocks_of(prof, 4000)) == 1
    assert "after_int" not in shell.user_ns
    assert not profiler_running()
    # called from code, the interrupt reaches the caller
    with pytest.raises(KeyboardInterrupt):
        shell.run_cell_magic("memprofile", "--no-display", "raise KeyboardInterrupt")
    assert not profiler_running()
    assert run("%%memprofile --no-display\nafter_int2 = torch.empty(10)")[0].success


def test_a_running_torch_profiler_is_a_usage_error(shell, run):
    result, out = run(
        "with torch.profiler.profile() as users_own:\n"
        "    torch.ones(3)\n"
        "    %memprofile inside = 1\n"
    )
    assert isinstance(result.error_in_exec, UsageError)
    assert out.strip().splitlines() == [
        "UsageError: a torch profiler is already running: finish its `with` block (or call "
        "its stop()) before profiling memory here"
    ]
    assert "inside" not in shell.user_ns
    assert not profiler_running()
    assert run("%%memprofile --no-display\nafter_busy = torch.empty(10)")[0].success


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("%%memprofile --bogus\nbad1 = 1", "UsageError: unrecognized arguments: --bogus"),
        ("%%memprofile -o 1prof\nbad2 = 1", "UsageError: -o needs a Python variable name"),
        ("%%memprofile -o class\nbad3 = 1", "UsageError: -o needs a Python variable name"),
        ("%%memprofile stray words\nbad4 = 1", "UsageError: unrecognized arguments: stray"),
        ("%%memprofile --html /no/such/dir/r.html\nbad5 = 1", "UsageError: --html: the folder"),
        ("%memprofile -o p_none", "UsageError: %memprofile needs a statement to run"),
        ("%memprofile --bogus bad6 = 1", "UsageError: unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors_are_one_line_and_run_nothing(shell, run, cell, message):
    before = shell.user_ns.get(LAST)
    result, out = run(cell)
    assert isinstance(result.error_in_exec, UsageError)
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), out
    assert not any(name in shell.user_ns for name in ("bad1", "bad2", "bad3", "bad4", "bad5"))
    assert shell.user_ns.get(LAST) is before


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_a_usage_error(shell, run):
    result, out = run("%%memprofile --device cuda\nno_gpu = 1")
    assert isinstance(result.error_in_exec, UsageError)
    assert out.strip() == (
        "UsageError: device 'cuda' asked for, but no CUDA device is available here"
    )
    assert "no_gpu" not in shell.user_ns and not profiler_running()


def test_syntax_error_starts_no_profile(shell, run):
    before = shell.user_ns.get(LAST)
    result, out = run("%%memprofile\nbroken = (")
    assert isinstance(result.error_in_exec, SyntaxError)
    assert "SyntaxError" in out
    assert shell.user_ns.get(LAST) is before and not profiler_running()


# -- progress ------------------------------------------------------------------------------
def test_progress_appears_only_after_a_second_and_goes_away():
    now = [0.0]
    progress = Progress(clock=lambda: now[0])
    progress("reading events", 0, 1)
    now[0] = 0.5
    progress("ops", 10, 100)
    assert not progress.shown
    now[0] = 1.2
    progress("ops", 50, 100)
    assert progress.shown
    assert progress._bar.value == 0.5
    assert progress._text.value.startswith("ops 50/100")
    progress.close()
    assert not progress.shown
    progress("ops", 100, 100)  # after close: nothing
    assert not progress.shown


def test_no_progress_outside_notebooks(shell, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    assert progress_for(shell) is None  # a terminal-like shell has nowhere to draw it


# -- in a real Jupyter kernel ------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel():
    from jupyter_client.manager import start_new_kernel

    env = {k: v for k, v in os.environ.items() if k != "CI"}
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def plain(text: str) -> str:
    """Text without its ANSI colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def execute(kernel, code: str, interrupt_after: float | None = None):
    """Run code in the kernel; returns (reply content, [(msg_type, content), ...])."""
    km, kc = kernel
    msg_id = kc.execute(code)
    if interrupt_after is not None:
        time.sleep(interrupt_after)
        km.interrupt_kernel()
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            break
        if kind in ("stream", "display_data", "update_display_data", "execute_result", "error"):
            outputs.append((kind, msg["content"]))
    reply = kc.get_shell_msg(timeout=60)
    # a slow kernel start leaves replies to start_new_kernel's repeated kernel_info requests
    while reply["msg_type"] == "kernel_info_reply" and reply["parent_header"]["msg_id"] != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    return reply["content"], outputs


@pytest.mark.slow
def test_in_a_kernel_summary_html_then_dashboard(kernel):
    reply, _ = execute(kernel, "%load_ext jupyter_memprof\nimport torch")
    assert reply["status"] == "ok"
    reply, outputs = execute(kernel, "%%memprofile -o prof\nx = torch.empty(1000)\nx.numel()")
    assert reply["status"] == "ok"
    kinds = [kind for kind, _ in outputs]
    assert kinds[0] == "execute_result" and outputs[0][1]["data"]["text/plain"] == "1000"
    summary = outputs[1][1]["data"]
    assert summary["text/html"].startswith('<div class="memprof-summary"')
    assert "memory profile prof" in summary["text/html"]
    assert "stream" not in kinds and "error" not in kinds  # no warnings, no noise
    # then the interactive views, as a widget
    assert any(
        "application/vnd.jupyter.widget-view+json" in content.get("data", {})
        for _, content in outputs[2:]
    )


@pytest.mark.slow
def test_in_a_kernel_errors_and_interrupts_fail_the_cell_cleanly(kernel):
    execute(kernel, "%load_ext jupyter_memprof\nimport torch")
    reply, outputs = execute(
        kernel, "%%memprofile -o p_err\nx = torch.empty(1000)\nraise ValueError('<b>bad</b>')"
    )
    assert reply["status"] == "error" and reply["ename"] == "ValueError"
    traceback = plain("\n".join(reply["traceback"]))
    assert "----> 3 raise ValueError('<b>bad</b>')" in traceback
    assert "_magic" not in traceback and "run_cell_magic" not in traceback
    summary = next(c["data"]["text/html"] for k, c in outputs if k == "display_data")
    assert "&lt;b&gt;bad&lt;/b&gt;" in summary and "<b>bad</b>" not in summary

    # a real interrupt from the frontend, during a loop of small allocations
    loop = (
        "%%memprofile -o p_int\n"
        "import time\n"
        "while True:\n"
        "    y = torch.ones(100)\n"
        "    time.sleep(0.001)"
    )
    reply, outputs = execute(kernel, loop, interrupt_after=2.0)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    traceback = plain("\n".join(reply["traceback"]))
    assert "----> 4     y = torch.ones(100)" in traceback or "----> 5     time.sleep" in traceback
    assert "_magic" not in traceback
    assert any(k == "display_data" for k, _ in outputs)  # the partial profile is shown
    check = "print(p_int.meta['error'], (p_int.allocations.size_bytes == 400).sum() > 10)"
    reply, outputs = execute(kernel, check)
    assert outputs == [("stream", {"name": "stdout", "text": "KeyboardInterrupt True\n"})]

    # top-level await cannot run while the kernel's loop runs the cell: a clear usage error
    reply, outputs = execute(kernel, "%%memprofile\nimport asyncio\nawait asyncio.sleep(0)")
    assert reply["status"] == "error" and reply["ename"] == "UsageError"
    assert "with jupyter_memprof.profile()" in outputs[0][1]["text"]


@pytest.mark.slow
def test_in_a_kernel_progress_bar_is_a_widget_removed_when_done(kernel):
    code = (
        "import os\n"
        "from jupyter_memprof._frontends.progress import Progress, progress_for\n"
        "print(type(progress_for(get_ipython())).__name__)\n"
        "os.environ['CI'] = 'true'\n"
        "print(progress_for(get_ipython()))\n"
        "del os.environ['CI']\n"
        "bar = Progress(delay=0)\n"
        "bar('ops', 1, 2)\n"
        "bar.close()"
    )
    reply, outputs = execute(kernel, code)
    assert reply["status"] == "ok"
    assert outputs[0] == ("stream", {"name": "stdout", "text": "Progress\nNone\n"})
    shown = outputs[1]
    assert shown[0] == "display_data"
    assert "application/vnd.jupyter.widget-view+json" in shown[1]["data"]
    removed = outputs[2]
    assert removed[0] == "update_display_data"
    assert removed[1]["data"] == {"text/plain": ""}
    assert removed[1]["transient"]["display_id"] == shown[1]["transient"]["display_id"]


# -- in JupyterLab, as a user sees it ----------------------------------------------------------
LAB_CELLS = [
    "import torch\n%load_ext jupyter_memprof",
    "%%memprofile -o prof\nx = torch.empty(1000)\nx.numel()",
    "from jupyter_memprof._frontends.progress import Progress\n"
    "import time\n"
    "bar = Progress(delay=0)\n"
    "bar('timeline', 3, 10)\n"
    "time.sleep(3)\n"
    "bar.close()\n"
    "print('done')",
    "%%memprofile -o bad\n"
    "kept = torch.empty(1000)\n"
    "raise ValueError('<b id=\"memprof-evil\">no</b>')",
    "print('not reached: run-all stops at the error, as without the magic')",
]


@pytest.mark.browser
@pytest.mark.slow
def test_in_jupyterlab_summary_traceback_and_progress(tmp_path):
    from _browser import chromium_page, chromium_path, screenshot
    from _jupyterlab import jupyterlab, write_notebook

    chromium_path()
    write_notebook(tmp_path / "magic.ipynb", LAB_CELLS)
    app = "window.jupyterapp"
    with jupyterlab(tmp_path) as base, chromium_page() as page:
        try:
            page.goto(f"{base}/lab/tree/magic.ipynb?reset")
            page.wait_for_function(
                f"() => {{ const s = {app}.shell.currentWidget?.sessionContext?.session;"
                " return s?.kernel?.status === 'idle'; }",
                timeout=60_000,
            )
            page.evaluate(f"() => {{ {app}.commands.execute('notebook:run-all-cells'); }}")
            cell = page.locator(".jp-Notebook .jp-Cell")

            # the progress bar shows while the work runs, then leaves no trace
            bar = cell.nth(2).locator(".widget-hprogress")
            bar.wait_for(timeout=120_000)
            assert "timeline 3/10" in cell.nth(2).locator(".jp-OutputArea").inner_text()
            cell.nth(2).locator(".jp-OutputArea-output", has_text="done").wait_for()
            assert bar.count() == 0
            assert cell.nth(2).locator(".jp-OutputArea").inner_text().strip() == "done"

            # the value of the cell, then its summary
            outputs = cell.nth(1).locator(".jp-OutputArea-output")
            assert outputs.nth(0).inner_text().strip() == "1000"
            summary = cell.nth(1).locator(".memprof-summary")
            assert summary.count() >= 1
            text = summary.first.inner_text()
            assert text.startswith("memory profile prof") and "peak 3.9 KiB on cpu" in text

            # an error: the summary says so (as text, never markup), then the user's traceback,
            # and the cell fails like any failing cell: run-all stops there
            failed = cell.nth(3)
            stderr = failed.locator("[data-mime-type='application/vnd.jupyter.stderr']").last
            stderr.wait_for(timeout=60_000)
            traceback = stderr.inner_text()
            assert "----> 3 raise ValueError" in traceback and "_magic" not in traceback
            summary = failed.locator(".memprof-summary").first.inner_text()
            assert 'raised ValueError: <b id="memprof-evil">no</b>' in summary
            assert page.locator("#memprof-evil").count() == 0
            page.wait_for_function(
                f"() => {app}.shell.currentWidget.sessionContext.session.kernel.status === 'idle'"
            )
            counts = page.evaluate(
                f"() => {app}.shell.currentWidget.content.model.sharedModel.cells"
                ".map(c => c.execution_count)"
            )
            assert counts == [1, 2, 3, 4, None]
            screenshot(page, "magic-in-jupyterlab.png")
        except Exception:
            screenshot(page, "magic-in-jupyterlab-failure.png")
            raise
