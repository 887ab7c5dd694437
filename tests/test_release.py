"""``jupyter_memprof.release`` and the panel's Release drop every reference the package holds
to a profile (registry, ``_memprof``, dashboards and their widgets, comm caches), and the
panel's comm checks every request and answers errors to the sender only."""

from __future__ import annotations

import gc
import os
import weakref

import pytest

import jupyter_memprof
from jupyter_memprof._frontends import cell_profile as _magic
from jupyter_memprof._frontends import comm as _comm
from jupyter_memprof._frontends import session as _session

STEP = "x = torch.ones(64)\nfor _ in range({n}):\n    y = x * 2\n"


def _open_widgets() -> dict:
    """ipywidgets' registry of open widgets (``Widget.widgets``, without its deprecation)."""
    from ipywidgets.widgets import widget

    return widget._instances


def _collected(ref: weakref.ref) -> bool:
    gc.collect()
    gc.collect()
    return ref() is None


@pytest.fixture
def in_kernel(monkeypatch):
    """Let the magic display its dashboard under the cell, as it does in a kernel."""
    monkeypatch.setattr(_magic, "in_kernel", lambda shell: True)


def test_release_frees_what_the_registry_and_memprof_held(shell, run):
    result, _ = run("%%memprofile --no-display\n" + STEP.format(n=50))
    assert result.success
    prof = shell.user_ns["_memprof"]
    sid = prof.session_id
    assert _session.get(sid) is prof
    tables = weakref.ref(prof.allocations)
    del prof

    assert jupyter_memprof.release(sid) == 1
    assert "_memprof" not in shell.user_ns
    assert sid not in dict(_session.items())
    assert _collected(tables)
    with pytest.raises(KeyError, match=f"no profile {sid}"):
        jupyter_memprof.release(sid)


def test_release_closes_the_dashboards_shown_under_the_cell_and_by_show(shell, run, in_kernel):
    before = set(_open_widgets())
    result, _ = run("%%memprofile\n" + STEP.format(n=50))
    assert result.success
    prof = shell.user_ns["_memprof"]
    mine = prof.show()  # the user's own dashboard, still bound to a name after the release
    shown = set(_open_widgets()) - before
    assert len(shown) > 20  # two dashboards: their controls, layouts, styles and Bokeh views
    tables = weakref.ref(prof.allocations)

    assert jupyter_memprof.release(prof) == 1
    del prof
    assert not shown & set(_open_widgets())  # every widget of both dashboards is closed
    assert "_memprof" not in shell.user_ns
    assert mine.profile is None  # a closed dashboard lets go of its profile
    assert _collected(tables)


def test_release_none_frees_every_profile_and_every_dashboard(shell, run, in_kernel):
    before = set(_open_widgets())
    refs = []
    for _ in range(2):
        assert run("%%memprofile\n" + STEP.format(n=20))[0].success
        refs.append(weakref.ref(shell.user_ns["_memprof"].allocations))

    def shown_by_the_user(x):
        # in a function: profile() reads its caller's variables, and on Python 3.11 a frame
        # keeps the snapshot of them it made (prof included) until the frame ends
        with jupyter_memprof.profile(label="ctx") as prof:
            x * 2
        prof.show()
        return weakref.ref(prof.allocations)

    refs.append(shown_by_the_user(shell.user_ns["x"]))

    assert jupyter_memprof.release() >= 3
    assert _session.items() == []
    assert "_memprof" not in shell.user_ns
    assert not set(_open_widgets()) - before
    assert all(_collected(r) for r in refs)


def test_a_variable_deleted_after_a_capture_in_a_function_is_freed_at_once():
    """Reading a function's names must not keep its locals alive: before Python 3.13,
    ``frame.f_locals`` is a snapshot stored in the frame until the frame ends. No collection
    in between: ``del`` alone frees the tensor, as it does without the profiler."""
    import torch

    def step():
        with jupyter_memprof.profile(device="cpu") as prof:
            x = torch.ones(1000)
        ref = weakref.ref(x)
        del x
        freed = ref() is None
        y = torch.ones(10)
        names = locals()  # CPython refreshes the snapshot on demand: every name is there
        return prof, freed, sorted(names), y

    prof, freed, names, _ = step()
    assert freed
    assert names == ["freed", "prof", "ref", "torch", "y"]
    assert prof.allocations["name"].tolist() == ["x"]


def test_a_functions_own_locals_dict_is_left_as_it_is():
    """Code that keeps ``locals()`` (before 3.13, the frame's snapshot itself) still finds
    its variables in it after a capture."""
    import torch

    def step():
        x = torch.ones(10)
        env = locals()
        with jupyter_memprof.profile(device="cpu"):
            y = x * 2
        return sorted(env), y

    names, _ = step()
    assert {"x", "torch"} <= set(names)


def test_a_variable_deleted_after_an_estimate_in_a_function_is_freed_at_once():
    import torch

    def step():
        x = torch.ones(1000)
        jupyter_memprof.estimate(lambda t: t * 2, torch.ones(3))
        ref = weakref.ref(x)
        del x
        return ref() is None

    assert step()


def test_reading_names_leaves_module_and_class_namespaces_alone():
    """Where ``f_locals`` is the namespace itself (a module, a class body, ``exec`` with a
    dict), reading names changes nothing."""
    ns = {"jupyter_memprof": jupyter_memprof}
    code = (
        "import torch\n"
        "with jupyter_memprof.profile(device='cpu') as prof:\n"
        "    kept = torch.ones(4)\n"
        "class Box:\n"
        "    inside = torch.ones(2)\n"
        "    with jupyter_memprof.profile(device='cpu') as p2:\n"
        "        more = torch.ones(3)\n"
    )
    exec(code, ns)
    assert ns["kept"].tolist() == [1.0] * 4
    assert ns["Box"].inside.tolist() == [1.0, 1.0] and ns["Box"].more.tolist() == [1.0] * 3
    assert ns["prof"].allocations["name"].tolist() == ["kept"]


def test_release_takes_a_profile_an_id_or_none(mlp_adam_profile, tmp_path):
    # A profile that is not registered (loaded from a file) is still closed where shown.
    prof = jupyter_memprof.load(mlp_adam_profile[0].save(tmp_path / "p.zip"))
    dashboard = prof.show()
    assert jupyter_memprof.release(prof) == 0
    assert dashboard.profile is None
    assert prof.allocations is not None  # the user's own object is left as it was
    with pytest.raises(TypeError, match="Profile, a session id or None"):
        jupyter_memprof.release("1")
    with pytest.raises(KeyError):
        jupyter_memprof.release(10**9)
    assert "release" in jupyter_memprof.__all__


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_twenty_captures_with_release_keep_resident_memory_flat(shell, run, in_kernel):
    """Each capture's tables hold about 10 MB and its dashboard is shown under the cell:
    releasing each one keeps the process's resident memory where it was after warm-up."""
    cell = "%%memprofile\n" + STEP.format(n=4500)

    def one() -> int:
        assert run(cell)[0].success
        held = _comm._memory_bytes(shell.user_ns["_memprof"])
        jupyter_memprof.release(shell.user_ns["_memprof"])
        gc.collect()
        return held

    for _ in range(3):
        held = one()
    assert held > 8_000_000
    baseline = _rss()
    for _ in range(20):
        one()
    grown = _rss() - baseline
    assert grown < 50_000_000, f"resident memory grew {grown / 1e6:.0f} MB over 20 captures"


# -- the panel's comm ------------------------------------------------------------------------
class _Comm:
    """A comm as the kernel's comm manager hands it to the panel code: records what is sent
    on it, and ``receive`` delivers a message the way the kernel does."""

    def __init__(self, comm_id: str):
        self.comm_id = comm_id
        self.sent: list = []
        self._on_msg = None
        self._on_close = None

    def on_msg(self, fn) -> None:
        self._on_msg = fn

    def on_close(self, fn) -> None:
        self._on_close = fn

    def send(self, data) -> None:
        self.sent.append(data)

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close({})

    def receive(self, data) -> None:
        self._on_msg({"content": {"comm_id": self.comm_id, "data": data}})


@pytest.fixture
def panels():
    """Two panels with a comm open to this process's kernel side."""
    a, b = _Comm("a"), _Comm("b")
    _comm._adopt(a)
    _comm._adopt(b)
    try:
        yield a, b
    finally:
        a.close()
        b.close()
        assert _comm._unsubscribe is None


@pytest.mark.parametrize(
    "data, says",
    [
        ([1, 2], "a request is a JSON object, not list"),
        (None, "a request is a JSON object, not NoneType"),
        ("list", "a request is a JSON object, not str"),
        ({}, "unknown request None"),
        ({"type": "frobnicate"}, "unknown request 'frobnicate'"),
        ({"type": ["list"]}, "unknown request ['list']"),
        ({"type": "release"}, "release needs 'sid' (int), got null"),
        ({"type": "release", "sid": "3"}, "release needs 'sid' (int), got a string"),
        ({"type": "release", "sid": True}, "release needs 'sid' (int), got a boolean"),
        ({"type": "release", "sid": 1.5}, "release needs 'sid' (int), got a number"),
        ({"type": "hide", "sid": [1]}, "hide needs 'sid' (int), got a list"),
        ({"type": "compare", "sids": 3}, "compare needs 'sids' (list), got a number"),
        ({"type": "compare", "sids": [1, 1]}, "compare needs two different profile ids"),
    ],
)
def test_a_malformed_request_is_answered_to_its_sender_only(panels, data, says):
    a, b = panels
    a.receive(data)
    (reply,) = a.sent
    assert reply["type"] == "error" and reply["message"] == says, reply
    assert b.sent == []


def test_a_reloaded_page_gets_bokehjs_from_the_kernel_its_sender_only(panels):
    """A panel on a page without BokehJS asks for it: the answer is the script a dashboard's
    output runs (this Bokeh version's bundles), to that panel alone."""
    from bokeh import __version__ as bokeh_version

    from jupyter_memprof._views.dashboard.html import notebook_bokehjs

    a, b = panels
    a.receive({"type": "bokehjs"})
    (reply,) = a.sent
    assert reply == {"type": "bokehjs", "js": notebook_bokehjs()}
    assert "function memprof_load_bokehjs(" in reply["js"]
    assert f'memprof_load_bokehjs("{bokeh_version}", ' in reply["js"]
    assert len(reply["js"]) > 1_000_000  # BokehJS with its widgets and tables
    assert b.sent == []


def test_releasing_an_unknown_id_answers_the_sender_and_tells_nobody_else(panels):
    a, b = panels
    a.receive({"type": "release", "sid": 10**9})
    assert a.sent == [
        {
            "type": "error",
            "message": f"no profile {10**9} in this session (released or never captured)",
            "request": "release",
            "sid": 10**9,
        }
    ]
    assert b.sent == []


def test_closing_a_dashboard_tab_leaves_a_comparison_of_the_same_profile_open(
    panels, shell, run, in_kernel
):
    a, _ = panels
    assert run("%%memprofile -o p_tab_a\n" + STEP.format(n=20))[0].success
    assert run("%%memprofile -o p_tab_b\n" + STEP.format(n=30))[0].success
    sid_a, sid_b = shell.user_ns["p_tab_a"].session_id, shell.user_ns["p_tab_b"].session_id
    before = set(_open_widgets())
    _comm.show(sid_a)
    dashboard = set(_open_widgets()) - before
    _comm.show_comparison(sid_a, sid_b)
    comparison = set(_open_widgets()) - before - dashboard
    assert dashboard and comparison
    a.sent.clear()
    a.receive({"type": "hide", "sid": sid_a})  # the dashboard tab of A is closed
    assert a.sent == [] and not dashboard & set(_open_widgets())
    assert comparison <= set(_open_widgets())  # the comparison tab still works
    a.receive({"type": "release", "sid": sid_b})  # releasing B closes the comparison
    assert not comparison & set(_open_widgets())
    jupyter_memprof.release(sid_a)
    del shell.user_ns["p_tab_a"], shell.user_ns["p_tab_b"]


def test_the_panels_release_frees_the_profile_and_tells_every_panel(panels, shell, run, in_kernel):
    a, b = panels
    assert run("%%memprofile\n" + STEP.format(n=20))[0].success
    prof = shell.user_ns["_memprof"]
    sid = prof.session_id
    before = set(_open_widgets())
    _comm.show(sid)  # a panel tab, after the dashboard under the cell
    tab_widgets = set(_open_widgets()) - before
    assert tab_widgets
    a.receive({"type": "list"})
    (listed,) = [p for p in a.sent[-1]["profiles"] if p["sid"] == sid]
    # the tables' memory, measured once when the profile was listed (pandas adds a few
    # hundred bytes of caches, such as index engines, as views read the tables later)
    fresh = _comm._memory_bytes(prof)
    assert fresh > 0 and abs(listed["memory_bytes"] - fresh) <= 0.02 * fresh
    assert listed["memory_text"].endswith("B")
    tables = weakref.ref(prof.allocations)
    del prof, listed
    a.sent.clear(), b.sent.clear()

    a.receive({"type": "release", "sid": sid})
    assert a.sent == b.sent == [{"type": "released", "sid": sid}]
    assert sid not in _comm._infos and sid not in _session._tracked
    assert not tab_widgets & set(_open_widgets())
    assert "_memprof" not in shell.user_ns
    assert _collected(tables)


@pytest.mark.slow
def test_in_a_kernel_the_panels_release_frees_the_dashboard_under_the_cell(tmp_path):
    """A real ipykernel driven like JupyterLab: two panels listen, the dashboard is under the
    cell, bad requests are answered to their sender only, and Release frees the tables."""
    import uuid

    from test_labextension import _Kernel

    k = _Kernel(tmp_path)
    try:
        k.run("import gc, weakref, torch, jupyter_memprof\n%load_ext jupyter_memprof")
        a, b = uuid.uuid4().hex, uuid.uuid4().hex
        for cid in (a, b):
            k.send("comm_open", {"comm_id": cid, "target_name": "jupyter_memprof", "data": {}})
            k.send("comm_msg", {"comm_id": cid, "data": {"type": "list"}})
            k.comm_data(cid, "list")
        k.run("%%memprofile -o p\n" + STEP.format(n=20))
        (added,) = [m["content"]["data"]["profile"] for m in k.seen if _on(m, a, "added")]
        sid = added["sid"]
        assert added["memory_bytes"] > 0 and added["memory_text"]
        k.run("w = weakref.ref(p.allocations)\ndel p")

        k.seen.clear()
        for data in ([1, 2], None, {"type": "release", "sid": 10**9}):
            k.send("comm_msg", {"comm_id": a, "data": data})
        k.drain()  # (not run(): it drops what is not a child of its execution)
        assert [m["content"]["data"]["type"] for m in k.seen if _on(m, a)] == ["error"] * 3
        assert [m for m in k.seen if _on(m, b)] == []

        k.send("comm_msg", {"comm_id": a, "data": {"type": "release", "sid": sid}})
        assert k.comm_data(a, "released")["sid"] == k.comm_data(b, "released")["sid"] == sid
        assert k.run("gc.collect(); print(w() is None, '_memprof' in dir())") == "True False\n"
    finally:
        k.close()


def _on(msg: dict, comm_id: str, kind: str | None = None) -> bool:
    content = msg["content"]
    return (
        msg["msg_type"] == "comm_msg"
        and content.get("comm_id") == comm_id
        and (kind is None or content["data"].get("type") == kind)
    )
