"""%%memprofile / %memprofile driven through a real IPython shell (and a real kernel)."""

from __future__ import annotations

import ast
import os
import re
import signal
import types

import pytest
import torch
from IPython.core.error import UsageError

from jupyter_memprof._analysis import schema as _schema
from jupyter_memprof._frontends.magic import LAST
from jupyter_memprof._frontends.progress import Progress, progress_for
from jupyter_memprof._producers.torch_profiler import profiler_running
from jupyter_memprof._results.profile import Profile
from jupyter_memprof._views.summary import NO_ACTIVITY


def blocks_of(prof: Profile, nbytes: int):
    """The cell's own blocks of a size (not the ones earlier cells left in the namespace)."""
    a = prof.allocations
    return a[(a["size_bytes"] == nbytes) & (a["device"] == "cpu") & a["alloc_ns"].notna()]


# -- loading -------------------------------------------------------------------------------
def test_torchs_raw_result_is_freed_after_the_cell_not_before(shell, run):
    """The raw result's destructor holds the GIL, and so does freeing the records read from
    it: the cell's tables come first, the frees after the cell (post_run_cell), for the
    magic and for profile() in a cell alike."""
    from jupyter_memprof._producers.recorder import LATER

    cell = (
        "import weakref, jupyter_memprof\n"
        "from jupyter_memprof._producers.recorder import LATER\n"
        "with jupyter_memprof.profile() as p_later:\n"
        "    torch.ones(300)\n"
        "held_later = [type(x).__name__ for x in LATER._items]\n"
        "raw_later = weakref.ref(LATER._items[-1])\n"
    )
    result, _ = run(cell)
    assert result.success and shell.user_ns["held_later"] == ["Capture", "profile"]
    assert shell.user_ns["raw_later"]() is None and len(LATER) == 0  # freed after the cell
    assert len(blocks_of(shell.user_ns["p_later"], 1200)) == 1
    result, _ = run("%%memprofile --no-display -o m_later\nx_later = torch.ones(400)")
    assert result.success and len(LATER) == 0
    assert len(blocks_of(shell.user_ns["m_later"], 1600)) == 1
    del shell.user_ns["raw_later"], shell.user_ns["p_later"], shell.user_ns["m_later"]


def test_load_twice_unload_leaves_nothing_behind(shell, run):
    magics = shell.magics_manager.magics
    from jupyter_memprof._producers.recorder import LATER

    # the shell's callbacks without ours (the extension frees torch's raw results after cells)
    callbacks = {
        name: [cb for cb in cbs if cb != LATER.free] for name, cbs in shell.events.callbacks.items()
    }
    assert LATER.free in shell.events.callbacks["post_run_cell"] and LATER.enabled
    registry = set(shell.magics_manager.registry)
    shell.extension_manager.unload_extension("jupyter_memprof")
    assert "memprofile" not in magics["line"] and "memprofile" not in magics["cell"]

    import jupyter_memprof

    jupyter_memprof.load_ipython_extension(shell)
    jupyter_memprof.load_ipython_extension(shell)  # a second load is harmless
    ours = magics["cell"]["memprofile"]
    assert type(ours.__self__).__name__ == "MemprofMagics"
    assert magics["line"]["memprofile"] == ours  # one method serves both forms
    result, _ = run("%%memprofile --no-display\nx_load = torch.empty(10)")
    assert result.success and result.result is None
    assert isinstance(shell.user_ns[LAST], Profile)
    assert len(blocks_of(shell.user_ns[LAST], 40)) == 1

    jupyter_memprof.unload_ipython_extension(shell)
    assert "memprofile" not in magics["line"] and "memprofile" not in magics["cell"]
    assert LAST not in shell.user_ns
    assert set(shell.magics_manager.registry) <= registry
    assert {name: list(cbs) for name, cbs in shell.events.callbacks.items()} == callbacks
    assert not LATER.enabled and len(LATER) == 0
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


def _prompts(text: str) -> str:
    """Output with the prompt numbers taken out: ``Out[12]: 42`` -> ``Out[#]: 42``."""
    return re.sub(r"Out\[\d+\]", "Out[#]", text)


DISPLAY_CELLS = [
    "6 * 7\n'second'",
    "v_disp = 6 * 7\nv_disp + 1\nw_disp = v_disp * 2",
    "d_disp = {'a': 1}\nd_disp['b'] = 2",
    "n_disp = 3\nn_disp += 4",
    "m_disp: int = 5",
    "for i_disp in range(2):\n    i_disp * 10\ni_disp",
]

EXPECTED_DISPLAY = {  # what IPython itself shows for each cell above, mode by mode
    "last_expr": ["Out[#]: 'second'", "", "", "", "", "Out[#]: 1"],
    "last_expr_or_assign": [
        "Out[#]: 'second'",
        "Out[#]: 84",
        "",
        "Out[#]: 7",
        "Out[#]: 5",
        "Out[#]: 1",
    ],
    "last": ["Out[#]: 'second'", "", "", "", "", "Out[#]: 1"],
    "all": [
        "Out[#]: 42\nOut[#]: 'second'",
        "Out[#]: 43",
        "",
        "",
        "",
        "Out[#]: 0\nOut[#]: 10\nOut[#]: 1",  # 'single' mode shows loop bodies' values too
    ],
    "none": ["", "", "", "", "", ""],
}


@pytest.mark.parametrize("mode", list(EXPECTED_DISPLAY))
def test_every_display_mode_shows_what_the_cell_shows_without_the_magic(shell, run, mode):
    shell.ast_node_interactivity = mode
    try:
        for cell, expected in zip(DISPLAY_CELLS, EXPECTED_DISPLAY[mode], strict=True):
            plain_result, plain_out = run(cell)
            result, out = run("%%memprofile --no-display\n" + cell)
            assert result.success, out
            assert _prompts(plain_out).strip() == expected, (cell, plain_out)
            assert _prompts(out).strip() == expected, (cell, out)
            assert result.result == plain_result.result, cell
    finally:
        shell.ast_node_interactivity = "last_expr"


def test_ast_transformers_apply_to_the_cell(shell, run):
    class DoubleInts(ast.NodeTransformer):
        def visit_Constant(self, node):
            if type(node.value) is int:
                return ast.copy_location(ast.Constant(node.value * 2), node)
            return node

    shell.ast_transformers.append(DoubleInts())
    try:
        result, out = run("%%memprofile -o p_ast --no-display\nt_ast = torch.empty(500)\n21")
    finally:
        shell.ast_transformers.pop()
    assert result.success and result.result == 42
    assert shell.user_ns["t_ast"].shape == (1000,)  # 500 became 1000 before it ran
    assert len(blocks_of(shell.user_ns["p_ast"], 4000)) == 1
    assert len(blocks_of(shell.user_ns["p_ast"], 2000)) == 0


def test_line_magic_inside_a_function_sees_its_locals(shell, run):
    result, out = run(
        "def f_line(n):\n"
        "    t_fn = torch.ones(n)\n"
        "    got = %memprofile -o p_fn --no-display (t_fn * 4).sum().item()\n"
        "    return got\n"
        "r_fn = f_line(250)"
    )
    assert result.success, out
    assert shell.user_ns["r_fn"] == 1000.0
    assert "t_fn" not in shell.user_ns
    prof = shell.user_ns["p_fn"]
    made = blocks_of(prof, 1000).dropna(subset=["alloc_ns"])
    assert len(made) == 1  # t_fn * 4: 250 floats, made by the profiled statement
    mul = prof.ops[prof.ops["name"] == "aten::mul"]
    assert len(mul) == 1 and mul["input_shapes"].iloc[0][0] == [250]


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


def test_a_relative_html_path_is_where_the_cell_started(shell, run, tmp_path, monkeypatch):
    """Before: the report went to the folder the cell had changed to."""
    moved = tmp_path / "moved"
    moved.mkdir()
    monkeypatch.chdir(tmp_path)
    result, out = run(
        "%%memprofile --no-display --html rel.html\n"
        f"import os; os.chdir({str(moved)!r}); h_rel = torch.empty(1000)"
    )
    assert result.success and os.getcwd() == str(moved)
    assert f"report written to {tmp_path / 'rel.html'}" in out
    assert (tmp_path / "rel.html").is_file() and list(moved.iterdir()) == []


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


def test_ops_on_the_cells_top_level_get_the_cells_lines(shell, run):
    result, out = run(
        "%%memprofile -o p_top --no-display\n"
        "a = torch.ones(64, 64)\n"
        "b = a @ a\n"
        "for _ in range(2):\n"
        "    c = b * 2\n"
    )
    n = result.execution_count
    ops = shell.user_ns["p_top"].ops
    first = ops[ops["kind"] == "op"].drop_duplicates("name").set_index("name")["callsite"]
    assert first["aten::ones"] == f"In[{n}]:2 in <module>"
    assert first["aten::matmul"] == f"In[{n}]:3 in <module>"  # no Python call on this line
    assert first["aten::mul"] == f"In[{n}]:4 in <module>"  # the statement's first line
    assert not ops["callsite"].astype(object).dropna().str.contains("magic.py").any()


def test_comment_only_cell_is_one_summary_line(shell, run):
    result, out = run("%%memprofile -o p_comment\n# nothing to run yet")
    assert result.success
    line, *before = out.strip().splitlines()
    assert line.startswith(f"memory profile 'p_comment': {NO_ACTIVITY} (ran ")
    # then only what earlier cells left live, if anything
    assert all(b.startswith("  live before the capture on ") for b in before)


def test_cell_without_torch_activity(shell, run):
    result, out = run("%%memprofile -o p_empty\nplain = sum(range(100))")
    assert result.success and shell.user_ns["plain"] == 4950
    prof = shell.user_ns["p_empty"]
    assert NO_ACTIVITY in out
    for name, schema in _schema.TABLES.items():
        assert list(prof.tables[name].columns) == list(schema)
    # only what earlier cells left in the namespace, live before this one and untouched
    a, ev = prof.allocations, prof.events
    assert a["alloc_ns"].isna().all() and (ev["action"] == "preexisting").all()
    assert all(r.endswith("existed before the capture, untouched") for r in a["reason"])
    assert ("live before the capture on cpu" in out) == (len(a) > 0) and "peak" not in out


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
    # said at once, before the partial capture is read and summarised
    said = "%%memprofile: interrupted; reading the partial capture…\n"
    assert said in out and out.index(said) < out.index("memory profile 'p_int'")
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
        # names IPython or Python use themselves (before: -o get_ipython broke the session)
        *(
            (f"%%memprofile -o {n}\nbad7 = 1", f"UsageError: -o {n}: {n!r} is a name Python")
            for n in ("get_ipython", "In", "Out", "print", "len", "exit", "_", "_i3", "_7")
        ),
        ("%%memprofile -o __name__\nbad7 = 1", "UsageError: -o __name__: '__name__' is a name"),
        # a stray quote (before: a 28-line ValueError traceback)
        (
            '%%memprofile --label "step 1\nbad8 = 1',
            "UsageError: %%memprofile: cannot read the options '--label \"step 1' (No closing "
            "quotation)",
        ),
        (
            "%memprofile --label 'step bad9 = 1",
            "UsageError: %memprofile: cannot read the options",
        ),
    ],
)
def test_usage_errors_are_one_line_and_run_nothing(shell, run, cell, message):
    before = shell.user_ns.get(LAST)
    result, out = run(cell)
    assert isinstance(result.error_in_exec, UsageError)
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), out
    assert not any(f"bad{i}" in shell.user_ns for i in range(1, 10))
    assert shell.user_ns.get(LAST) is before


def test_device_errors_are_usage_errors(shell, run):
    # a CUDA device that does not exist: here one past the last visible GPU (any on a
    # machine without CUDA)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = f"cuda:{count}"
    if count:
        message = f"device {missing!r} does not exist: {count} CUDA device(s) visible"
    else:
        message = f"device {missing!r} asked for, but no CUDA device is available here"
    cases = [
        (f"%%memprofile --device {missing}\ndev1 = 1", message),
        (f"%%memprofile --device cpu,{missing}\ndev2 = 1", message),
        ("%%memprofile --device ,\ndev3 = 1", "no device given: use 'cpu', 'cuda' or 'cuda:N'"),
        ("%%memprofile --device meta\ndev4 = 1", "device 'meta' is not supported"),
        ("%%memprofile --device tpu\ndev7 = 1", "unknown device 'tpu'"),
        ("%%memprofile --device bogus:x\ndev5 = 1", "unknown device 'bogus:x'"),
        (f"%memprofile --device {missing} dev6 = 1", message),
    ]
    for cell, text in cases:
        before = shell.user_ns.get(LAST)
        result, out = run(cell)
        assert isinstance(result.error_in_exec, UsageError), cell
        lines = out.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"UsageError: {text}"), (cell, out)
        assert shell.user_ns.get(LAST) is before
        assert not profiler_running()
    assert not any(f"dev{i}" in shell.user_ns for i in range(1, 8))


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


# -- when our own part fails, the cell's work is kept -------------------------------------------
def test_analysis_failure_keeps_the_cells_result(shell, run, monkeypatch):
    from jupyter_memprof._frontends import finish

    def broken(*args, **kwargs):
        raise RuntimeError("tables out of order")

    monkeypatch.setattr(finish, "analyse", broken)
    result, out = run("%%memprofile -o p_nota\nkept_nota = torch.empty(1000)\nkept_nota.numel()")
    assert result.success and result.result == 1000
    assert shell.user_ns["kept_nota"].shape == (1000,)
    n = result.execution_count
    assert out.splitlines() == [
        f"Out[{n}]: 1000",
        "%%memprofile: the code ran, but building its memory tables failed "
        "(RuntimeError: tables out of order); _memprof holds what was built",
    ]
    prof = shell.user_ns["p_nota"]
    assert prof is shell.user_ns[LAST]
    assert prof.meta["analysis_error"] == "RuntimeError: tables out of order"
    assert prof.meta.get("error") is None and not profiler_running()
    # the cell's own error still wins over ours
    result, out = run("%%memprofile -o p_nota2\nraise KeyError('mine')")
    assert isinstance(result.error_in_exec, KeyError)
    assert shell.user_ns["p_nota2"].meta["analysis_error"] == "RuntimeError: tables out of order"
    assert out.splitlines()[0] == (
        "memory profile 'p_nota2': the memory tables could not be built "
        "(RuntimeError: tables out of order)"
    )
    assert out.rstrip().endswith("KeyError: 'mine'")
    monkeypatch.undo()
    assert run("%%memprofile --no-display\nafter_nota = torch.empty(10)")[0].success


def test_html_that_cannot_be_written_keeps_the_profile_and_summary(shell, run, tmp_path):
    target = tmp_path / "taken.html"
    # the cell itself puts a folder where the file should go (one there before is refused
    # before the cell runs: tests/test_bounds.py)
    result, out = run(
        f"%%memprofile -o p_nohtml --html {target}\n"
        f"import os; os.mkdir({str(target)!r}); h_nohtml = torch.empty(1000)"
    )
    assert result.success
    lines = out.splitlines()
    assert lines[0] == "memory profile 'p_nohtml'"  # the summary is still shown
    assert lines[-1] == (
        f"%%memprofile: could not write the report to {str(target)!r}: "
        f"IsADirectoryError: cannot write {target}: it is a folder"
    ), out
    assert "report written" not in out
    assert len(blocks_of(shell.user_ns["p_nohtml"], 4000)) == 1
    assert target.is_dir() and list(target.iterdir()) == []  # nothing half-written
    assert [p.name for p in tmp_path.iterdir()] == ["taken.html"]


# -- progress ------------------------------------------------------------------------------
def test_progress_appears_only_after_a_second_and_goes_away():
    now = [0.0]
    progress = Progress(clock=lambda: now[0])
    progress("stopping torch's profiler", 0, 1000)
    now[0] = 0.5
    progress("reading events", 100, 1000)
    assert not progress.shown
    now[0] = 1.2
    progress("ops", 500, 1000)
    assert progress.shown
    assert progress._bar.value == 0.5
    assert progress._text.value == "ops (1 s)"
    progress.close()
    assert not progress.shown
    progress("ops", 100, 100)  # after close: nothing
    assert not progress.shown


def test_a_capture_reports_its_stop_its_reading_and_its_analysis_on_one_bar(monkeypatch):
    """Torch's stop is the first report (the bar's clock starts with it, so a long stop
    shows the bar as soon as reading begins), then reading in fractions of the capture's
    time, then the analysis stages, every report ``done`` out of the same total."""
    import jupyter_memprof
    from jupyter_memprof._producers import torch_profiler

    monkeypatch.setattr(torch_profiler, "_PROGRESS_EVERY", 64)
    reports = []
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(8)])
    with jupyter_memprof.profile(namespace={}, progress=lambda *r: reports.append(r)) as prof:
        model(torch.ones(4, 8)).sum().backward()
    stages = [stage for stage, _, _ in reports]
    assert stages[0] == "stopping torch's profiler" and reports[0][1] == 0
    reading = [done for stage, done, _ in reports if stage == "reading events"]
    assert len(reading) >= 3 and reading == sorted(reading) and reading[-1] <= 750
    assert stages[len(reading) + 1 :] == [
        "ops",
        "allocations",
        "versions",
        "categories",
        "timeline",
        "segments",
    ]
    done = [d for _, d, _ in reports]
    assert done == sorted(done) and done[-1] == 1000
    assert {total for _, _, total in reports} == {1000}
    assert prof.meta["event_count"] >= 64 * len(reading)


def test_no_progress_outside_notebooks(shell, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    assert progress_for(shell) is None  # a terminal-like shell has nowhere to draw it


@pytest.mark.parametrize("ci", [None, "true", "1"])
def test_progress_in_a_kernel_whatever_the_ci_variable_says(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    in_a_kernel = types.SimpleNamespace(kernel=object())
    progress = progress_for(in_a_kernel)
    assert isinstance(progress, Progress) and progress.delay == 1.0
    # and it follows the clock it is given: hidden for a second, then shown and updated
    now = [100.0]
    progress._clock = lambda: now[0]
    progress("ops", 0, 10)
    now[0] = 100.99
    progress("ops", 5, 10)
    assert not progress.shown
    now[0] = 101.0
    progress("timeline", 7, 10)
    assert progress.shown and progress._bar.value == 0.7
    assert progress._text.value == "timeline (1 s)"
    now[0] = 104.6
    progress("timeline", 10, 10)
    assert progress._text.value == "timeline (5 s)"
    progress.close()
    assert not progress.shown


# -- in a real Jupyter kernel ------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel():
    from jupyter_client.manager import start_new_kernel

    # CI set on purpose: what the kernel shows must not depend on it
    env = dict(os.environ, CI="true")
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def plain(text: str) -> str:
    """Text without its ANSI colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def progress_bars(outputs) -> set[str]:
    """Display ids of the progress bars among ``outputs``: widget views with no text form,
    that are later replaced by nothing."""
    shown = {
        c["transient"]["display_id"]
        for k, c in outputs
        if k == "display_data"
        and list(c["data"]) == ["application/vnd.jupyter.widget-view+json"]
        and "display_id" in c.get("transient", {})
    }
    return {
        c["transient"]["display_id"]
        for k, c in outputs
        if k == "update_display_data"
        and c["transient"].get("display_id") in shown
        and c["data"] == {"text/plain": ""}
    }


def execute(kernel, code: str, interrupt_on: str | None = None, with_progress: bool = False):
    """Run code in the kernel; returns (reply content, [(msg_type, content), ...]).
    With ``interrupt_on``, interrupt the kernel as soon as the code prints that text. Progress
    bars (shown when an analysis takes more than a second) are left out of the outputs unless
    ``with_progress``."""
    km, kc = kernel
    msg_id = kc.execute(code)
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
        if interrupt_on and kind == "stream" and interrupt_on in msg["content"]["text"]:
            km.interrupt_kernel()
            interrupt_on = None
    reply = kc.get_shell_msg(timeout=60)
    # a slow kernel start leaves replies to start_new_kernel's repeated kernel_info requests
    while reply["msg_type"] == "kernel_info_reply" and reply["parent_header"]["msg_id"] != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    if not with_progress:
        bars = progress_bars(outputs)
        outputs = [
            (k, c) for k, c in outputs if c.get("transient", {}).get("display_id") not in bars
        ]
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
    # then the interactive views, as a widget, marked for the JupyterLab extension
    views = [
        content
        for _, content in outputs[2:]
        if "application/vnd.jupyter.widget-view+json" in content.get("data", {})
    ]
    assert len(views) == 1
    assert views[0]["metadata"] == {"jupyter_memprof": "dashboard"}
    assert views[0]["data"]["text/plain"] == ""


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

    # a real interrupt from the frontend, once the loop of small allocations has run 20 times
    loop = (
        "%%memprofile -o p_int\n"
        "import itertools, time\n"
        "for i in itertools.count():\n"
        "    y = torch.ones(100)\n"
        "    if i == 20:\n"
        "        print('looping', flush=True)\n"
        "    time.sleep(0.001)"
    )
    reply, outputs = execute(kernel, loop, interrupt_on="looping")
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    traceback = plain("\n".join(reply["traceback"]))
    lines = dict(enumerate(loop.splitlines(), start=1))
    arrow = re.search(r"----> (\d+) (.*)", traceback)
    assert arrow and 3 <= int(arrow[1]) <= 7, traceback
    assert (
        lines[int(arrow[1])].startswith(arrow[2].strip()[:3])
        or arrow[2].strip() in lines[int(arrow[1])]
    ), traceback
    assert "_magic" not in traceback
    summary = [c for k, c in outputs if k == "display_data" and "text/html" in c["data"]]
    assert len(summary) == 1  # the partial profile is shown
    assert "raised KeyboardInterrupt" in summary[0]["data"]["text/plain"]
    check = "print(p_int.meta['error'], (p_int.allocations.size_bytes == 400).sum() >= 21)"
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
        "print(os.environ['CI'], type(progress_for(get_ipython())).__name__)\n"
        "bar = Progress(delay=0)\n"
        "bar('ops', 1, 2)\n"
        "bar.close()"
    )
    reply, outputs = execute(kernel, code, with_progress=True)
    assert reply["status"] == "ok"
    assert outputs[0] == ("stream", {"name": "stdout", "text": "true Progress\n"})
    shown = outputs[1]
    assert shown[0] == "display_data"
    # the widget's view only: no text form to linger where widgets are not drawn
    assert list(shown[1]["data"]) == ["application/vnd.jupyter.widget-view+json"]
    removed = outputs[2]
    assert removed[0] == "update_display_data"
    assert removed[1]["data"] == {"text/plain": ""}
    assert removed[1]["transient"]["display_id"] == shown[1]["transient"]["display_id"]
    assert len(outputs) == 3


@pytest.mark.slow
def test_in_a_kernel_the_magic_shows_progress_while_it_analyses(kernel):
    # no delay, so the bar shows on the first report of this quick analysis (CI is set)
    execute(
        kernel,
        "%load_ext jupyter_memprof\nimport torch\nimport jupyter_memprof._frontends.progress as pr",
    )
    execute(kernel, "pr.DELAY_S = 0")
    try:
        reply, outputs = execute(
            kernel, "%%memprofile -o p_prog\nxp = torch.empty(1000)", with_progress=True
        )
    finally:
        execute(kernel, "pr.DELAY_S = 1.0")
    assert reply["status"] == "ok"
    kinds = [kind for kind, _ in outputs]
    assert kinds[:3] == ["display_data", "update_display_data", "display_data"], kinds
    bar, removed, summary = (content for _, content in outputs[:3])
    assert list(bar["data"]) == ["application/vnd.jupyter.widget-view+json"]
    assert removed["transient"]["display_id"] == bar["transient"]["display_id"]
    assert removed["data"] == {"text/plain": ""}
    assert summary["data"]["text/plain"].startswith("memory profile 'p_prog'")
    assert "stream" not in kinds


@pytest.mark.slow
def test_in_a_kernel_a_dashboard_failure_leaves_the_summary(kernel):
    execute(kernel, "%load_ext jupyter_memprof\nimport torch, jupyter_memprof")
    reply, _ = execute(
        kernel,
        "_show = jupyter_memprof.Profile.show\n"
        "def _broken(self, **kwargs):\n"
        "    raise RuntimeError('no views today')\n"
        "jupyter_memprof.Profile.show = _broken",
    )
    assert reply["status"] == "ok"
    try:
        reply, outputs = execute(kernel, "%%memprofile -o p_nodash\nxd = torch.empty(1000)\n7")
    finally:
        execute(kernel, "jupyter_memprof.Profile.show = _show")
    assert reply["status"] == "ok"
    assert [k for k, _ in outputs] == ["execute_result", "display_data", "stream"]
    assert outputs[1][1]["data"]["text/plain"].startswith("memory profile 'p_nodash'")
    assert outputs[2][1] == {
        "name": "stderr",
        "text": "%%memprofile: interactive view unavailable: RuntimeError: no views today\n",
    }
    reply, outputs = execute(
        kernel, "print(p_nodash.allocations['alloc_ns'].notna().sum(), xd.numel())"
    )
    assert outputs == [("stream", {"name": "stdout", "text": "1 1000\n"})]


# -- in JupyterLab, as a user sees it ----------------------------------------------------------
LAB_CELLS = [
    "import torch\n%load_ext jupyter_memprof",
    "%%memprofile -o prof\nx = torch.empty(1000)\nx.numel()",
    "from jupyter_memprof._frontends.progress import Progress\n"
    "import os, time\n"
    "bar = Progress(delay=0)\n"
    "bar('timeline', 3, 10)\n"
    "deadline = time.monotonic() + 120  # until the test has seen the bar\n"
    "while not os.path.exists('progress-seen') and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
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
            page.goto(base.url("/lab/tree/magic.ipynb?reset"))
            page.wait_for_function(
                f"() => {{ const s = {app}?.shell.currentWidget?.sessionContext?.session;"
                " return s?.kernel?.status === 'idle'; }",
                timeout=60_000,
            )
            page.evaluate(f"() => {{ {app}.commands.execute('notebook:run-all-cells'); }}")
            cell = page.locator(".jp-Notebook .jp-Cell")

            # the progress bar shows while the work runs, then leaves no trace
            bar = cell.nth(2).locator(".widget-hprogress")
            bar.wait_for(timeout=120_000)
            # its label arrives with it (a widget's state can trail its view by a message)
            cell.nth(2).locator(".jp-OutputArea", has_text="timeline (").wait_for(timeout=30_000)
            (tmp_path / "progress-seen").touch()
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
            # its text, rendered or not (JupyterLab skips rendering cells out of view, whose
            # inner text is then empty)
            traceback = stderr.text_content()
            assert "----> 3 raise ValueError" in traceback and "_magic" not in traceback
            summary = failed.locator(".memprof-summary").first.text_content()
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
