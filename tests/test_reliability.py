"""Reliability of the capture itself (issue 13): one capture at a time per process, start and
stop that undo everything whatever fails, a profile kept when the analysis is interrupted, an
--html that never replaces someone else's file, and time zero in a fresh process.

Failures are injected into real captures (a hook registration, a handle removal, torch's
stop, the analysis raising); the profiler is never mocked. Scenarios that crashed the process
before the fix run in a subprocess, so a regression fails a test instead of killing pytest.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils.hooks import RemovableHandle

import jupyter_memprof
from jupyter_memprof import CaptureError
from jupyter_memprof._frontends import finish as finish_module
from jupyter_memprof._frontends import session
from jupyter_memprof._producers.live import ModuleHooks
from jupyter_memprof._producers.torch_profiler import profiler_running
from jupyter_memprof._views.summary import NO_ACTIVITY, summary_text


def _python(code: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _our_hooks() -> list:
    """Hooks of ours (ModuleHooks methods) still registered in torch's global hook dicts."""
    dicts = (
        nn_module._global_forward_pre_hooks,
        nn_module._global_forward_hooks,
        optim_module._global_optimizer_pre_hooks,
    )
    return [
        fn
        for d in dicts
        for fn in d.values()
        if isinstance(getattr(fn, "__self__", None), ModuleHooks)
    ]


def _registered(prof) -> bool:
    sid = getattr(prof, "session_id", None)
    return sid is not None and any(p is prof for _, p in session.items())


def _capture_works() -> None:
    gc.collect()  # no stray frees of earlier tests' tensors inside the capture
    with jupyter_memprof.profile(namespace={}) as prof:
        torch.ones(250)
    assert prof.allocations["size_bytes"].tolist() == [1000]
    assert not profiler_running() and not _our_hooks()


# -- one capture at a time per process -------------------------------------------------------
def test_a_second_capture_from_another_thread_is_refused_not_a_crash():
    """Thread A captures (blocked on an Event); a capture started in thread B is refused with
    one CaptureError line naming A. Before: B started a second torch profiler and the
    process died with a segmentation fault when A stopped."""
    out = _python(
        """
        import json, threading, torch, jupyter_memprof
        from jupyter_memprof import CaptureError

        started, go_on, errors = threading.Event(), threading.Event(), []

        def a():
            with jupyter_memprof.profile(namespace={}) as prof:
                x = torch.ones(1000)
                started.set()
                go_on.wait(60)
            errors.append(("a", len(prof.allocations)))

        def b():
            try:
                with jupyter_memprof.profile(namespace={}):
                    torch.ones(10)
            except CaptureError as err:
                errors.append(("b", str(err)))
            else:
                errors.append(("b", "not refused"))

        ta = threading.Thread(target=a, name="capture-A")
        ta.start()
        assert started.wait(60)
        tb = threading.Thread(target=b, name="capture-B")
        tb.start()
        tb.join(60)
        go_on.set()
        ta.join(60)
        assert not ta.is_alive() and not tb.is_alive()
        with jupyter_memprof.profile(namespace={}) as prof:
            torch.ones(250)
        print(json.dumps(dict(errors)))
        print("after", len(prof.allocations))
        """
    )
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-3000:])
    lines = out.stdout.splitlines()
    errors = json.loads(lines[-2])
    assert errors["a"] >= 1
    assert "\n" not in errors["b"]
    assert errors["b"].startswith("a memory capture is already running in thread 'capture-A'")
    assert "one capture or estimate at a time" in errors["b"]
    assert lines[-1] == "after 1"


def test_an_estimate_and_a_capture_never_overlap_across_threads():
    """Estimate mode installs global hooks too: while an estimate runs in one thread a
    capture in another is refused, and the other way round."""
    started, go_on = threading.Event(), threading.Event()
    done: dict = {}

    def slow_step(x):
        started.set()
        go_on.wait(60)
        return x * 2

    def run_estimate():
        done["estimate"] = jupyter_memprof.estimate(slow_step, torch.ones(64, 64))

    t = threading.Thread(target=run_estimate, name="estimating")
    t.start()
    try:
        assert started.wait(60)
        with pytest.raises(CaptureError, match="a memory estimate is already running in thread "):
            with jupyter_memprof.profile(namespace={}):
                torch.ones(10)
        assert not profiler_running()
    finally:
        go_on.set()
        t.join(60)
    assert not t.is_alive() and len(done["estimate"].allocations)

    started.clear()
    go_on.clear()

    def run_capture():
        with jupyter_memprof.profile(namespace={}) as prof:
            started.set()
            go_on.wait(60)
        done["capture"] = prof

    from jupyter_memprof._producers.fake.run import FakeRun

    copied = []
    convert = FakeRun.convert

    def counted(self, obj):
        copied.append(obj)
        return convert(self, obj)

    t = threading.Thread(target=run_capture, name="capturing")
    t.start()
    try:
        assert started.wait(60)
        FakeRun.convert = counted
        try:
            with pytest.raises(
                CaptureError, match="a memory capture is already running in thread "
            ):
                jupyter_memprof.estimate(lambda x: x * 2, torch.ones(8))
        finally:
            FakeRun.convert = convert
        assert copied == []  # refused before any argument was copied to a fake tensor
    finally:
        go_on.set()
        t.join(60)
    assert not t.is_alive() and _registered(done["capture"])
    _capture_works()


def test_a_nested_capture_in_the_same_thread_is_refused():
    with jupyter_memprof.profile(namespace={}) as outer:
        with pytest.raises(CaptureError, match="already running in this thread"):
            with jupyter_memprof.profile(namespace={}):
                pass
        torch.ones(10)
    assert _registered(outer) and not profiler_running()
    _capture_works()


# -- start and stop are exception safe --------------------------------------------------------
@pytest.mark.parametrize("failure", [RuntimeError("no more hooks"), KeyboardInterrupt()])
@pytest.mark.parametrize(
    "with_stack, owner, register",
    [
        # without stacks: the second of three global hooks (module pre, module post, optimizer)
        (False, nn_module, "register_module_forward_hook"),
        # with stacks the Python tracer sees modules: the optimizer hook is the only one
        (True, optim_module, "register_optimizer_step_pre_hook"),
    ],
)
def test_a_hook_install_failing_midway_stops_the_profiler_and_removes_the_hooks(
    monkeypatch, failure, with_stack, owner, register
):
    """A global hook cannot be registered (or Ctrl-C lands there), after the profiler
    started. Before: the profiler stayed on and the hooks registered before it stayed, so
    every later capture was refused."""
    real = getattr(owner, register)

    def fails(*args, **kwargs):
        raise failure

    monkeypatch.setattr(owner, register, fails)
    with pytest.raises(type(failure)):
        with jupyter_memprof.profile(namespace={}, with_stack=with_stack):
            pytest.fail("the block must not run")
    assert not profiler_running()
    assert not _our_hooks()
    monkeypatch.setattr(owner, register, real)
    _capture_works()


def test_module_hooks_install_and_remove_are_each_complete():
    """Unit level: a partial install keeps (and then removes) what it registered; a removal
    that raises does not stop the others."""
    hooks = ModuleHooks()
    real = optim_module.register_optimizer_step_pre_hook

    def third_fails(hook):
        raise RuntimeError("optimizer hooks are closed")

    optim_module.register_optimizer_step_pre_hook = third_fails
    try:
        with pytest.raises(RuntimeError, match="optimizer hooks are closed"):
            hooks.install()
    finally:
        optim_module.register_optimizer_step_pre_hook = real
    assert not _our_hooks() and not hooks._handles

    hooks.install()
    assert len(_our_hooks()) == 3
    first = hooks._handles[0]
    real_remove = RemovableHandle.remove

    def stuck(self):
        if self is first:
            raise RuntimeError("stuck handle")
        real_remove(self)

    RemovableHandle.remove = stuck
    try:
        with pytest.raises(RuntimeError, match="stuck handle"):
            hooks.remove()
    finally:
        RemovableHandle.remove = real_remove
    assert len(_our_hooks()) == 1  # only the stuck one
    first.remove()
    assert not _our_hooks()


def test_a_hook_removal_raising_still_removes_the_others_and_keeps_the_profile(monkeypatch):
    """Before: the first removal's error skipped the other removals and the profile was
    never registered (finish raised before it)."""
    stuck: list = []
    real_remove = RemovableHandle.remove

    def first_one_sticks(self):
        if not stuck:
            stuck.append(self)
            raise RuntimeError("stuck handle")
        real_remove(self)

    gc.collect()
    ns = {}
    with pytest.raises(RuntimeError, match="stuck handle"):
        with jupyter_memprof.profile(namespace=ns) as prof:
            keep = torch.ones(250)
            monkeypatch.setattr(RemovableHandle, "remove", first_one_sticks)
    monkeypatch.undo()
    assert len(_our_hooks()) == 1  # the stuck one; any others are gone
    real_remove(stuck[0])
    assert not _our_hooks() and not profiler_running()
    assert _registered(prof)
    assert prof.meta["stop_error"] == "RuntimeError: stuck handle"
    assert prof.allocations["size_bytes"].tolist() == [1000]  # the capture was analysed
    del keep
    _capture_works()


@pytest.mark.parametrize("when", ["before", "after"])
def test_torch_stop_raising_still_turns_the_profiler_off_and_keeps_the_profile(monkeypatch, when):
    """torch's own stop raises, before or after it turned its profiler off. Before: with
    'before' the profiler stayed on for good; in both cases nothing was registered."""
    real_exit = torch.profiler.profile.__exit__

    def broken_exit(self, *args):
        if when == "after":
            real_exit(self, *args)
        raise RuntimeError("kineto said no")

    gc.collect()
    with pytest.raises(RuntimeError, match="kineto said no"):
        with jupyter_memprof.profile(namespace={}) as prof:
            torch.ones(250)
            monkeypatch.setattr(torch.profiler.profile, "__exit__", broken_exit)
    monkeypatch.undo()
    assert not profiler_running() and not _our_hooks()
    assert _registered(prof)
    assert prof.meta["stop_error"] == "RuntimeError: kineto said no"
    if when == "after":
        assert prof.allocations["size_bytes"].tolist() == [1000]
    else:  # torch's results are lost with its stop; the failure is said, not hidden
        assert prof.meta["analysis_error"]
    _capture_works()


def test_the_users_exception_wins_over_a_failed_stop(monkeypatch):
    real_remove = RemovableHandle.remove
    stuck: list = []

    def first_one_sticks(self):
        if not stuck:
            stuck.append(self)
            raise RuntimeError("stuck handle")
        real_remove(self)

    with pytest.raises(ZeroDivisionError):
        with jupyter_memprof.profile(namespace={}) as prof:
            monkeypatch.setattr(RemovableHandle, "remove", first_one_sticks)
            1 / 0  # noqa: B018
    monkeypatch.undo()
    real_remove(stuck[0])
    assert _registered(prof) and prof.meta["error"] == "ZeroDivisionError: division by zero"
    assert prof.meta["stop_error"] == "RuntimeError: stuck handle"  # one form, raised or not
    _capture_works()


# -- an interrupt during the analysis keeps the profile ---------------------------------------
def _interrupting_analysis(*args, **kwargs):
    raise KeyboardInterrupt


def test_an_interrupted_analysis_keeps_the_profile_in_the_api(monkeypatch):
    monkeypatch.setattr(finish_module, "analyse", _interrupting_analysis)
    with pytest.raises(KeyboardInterrupt):
        with jupyter_memprof.profile(namespace={}) as prof:
            torch.ones(250)
    assert _registered(prof)
    assert prof.meta["analysis_interrupted"] is True
    assert prof.meta["analysis_error"] == "KeyboardInterrupt"
    text = summary_text(prof)
    assert "the analysis was interrupted (KeyboardInterrupt)" in text
    assert NO_ACTIVITY not in text
    # the user's own exception is the one that propagates
    with pytest.raises(ValueError, match="mine"):
        with jupyter_memprof.profile(namespace={}) as prof2:
            raise ValueError("mine")
    assert _registered(prof2) and prof2.meta["analysis_interrupted"] is True
    assert prof2.meta["error"] == "ValueError: mine"
    monkeypatch.undo()
    _capture_works()


def test_an_interrupted_analysis_in_the_magic(shell, run, monkeypatch):
    """Before: the profile was not registered, its summary said nothing was recorded, and
    the interrupt replaced the cell's own exception."""
    from jupyter_memprof._frontends.magic import LAST

    monkeypatch.setattr(finish_module, "analyse", _interrupting_analysis)
    result, out = run("%%memprofile -o p_ki\nkept_ki = torch.empty(1000)\nkept_ki.numel()")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert shell.user_ns["kept_ki"].shape == (1000,)
    prof = shell.user_ns["p_ki"]
    assert prof is shell.user_ns[LAST] and _registered(prof)
    assert prof.meta["analysis_interrupted"] is True and prof.meta.get("error") is None
    assert (
        "%%memprofile: the analysis was interrupted (KeyboardInterrupt); _memprof holds the "
        "profile without its tables"
    ) in out
    assert "the analysis was interrupted" in summary_text(prof)
    assert NO_ACTIVITY not in summary_text(prof)

    result, out = run("%%memprofile -o p_ki2\nkept_ki2 = torch.empty(10)\nraise KeyError('mine')")
    assert isinstance(result.error_in_exec, KeyError)
    assert "KeyError: 'mine'" in out
    prof = shell.user_ns["p_ki2"]
    assert _registered(prof) and prof.meta["error"] == "KeyError: 'mine'"
    assert prof.meta["analysis_interrupted"] is True
    assert not profiler_running()
    monkeypatch.undo()
    assert run("%%memprofile --no-display\nafter_ki = torch.empty(10)")[0].success


# -- --html never replaces someone else's file ------------------------------------------------
def test_html_refuses_another_kind_of_file_before_the_cell_runs(shell, run, tmp_path):
    from IPython.core.error import UsageError

    from jupyter_memprof._frontends.magic import LAST

    notes = tmp_path / "notes.ipynb"
    notes.write_text('{"cells": []}')
    before = shell.user_ns.get(LAST)
    result, out = run(f"%%memprofile --html {notes}\nhtml_ran = 1")
    assert isinstance(result.error_in_exec, UsageError)
    assert out.strip().splitlines() == [
        f"UsageError: --html: {str(notes)!r} exists and is not a jupyter_memprof HTML report; "
        "add --force to replace it"
    ]
    assert "html_ran" not in shell.user_ns and shell.user_ns.get(LAST) is before
    assert notes.read_text() == '{"cells": []}'

    result, out = run(f"%%memprofile --no-display --force --html {notes}\nhtml_forced = 2")
    assert result.success and shell.user_ns["html_forced"] == 2
    assert "memprof-status" in notes.read_text()  # now a report
    # an earlier report is replaced without --force
    result, out = run(f"%%memprofile --no-display --html {notes}\nhtml_again = 3")
    assert result.success and f"report written to {notes}" in out

    result, out = run("%%memprofile --force\nhtml_bad = 1")
    assert isinstance(result.error_in_exec, UsageError) and "--force needs --html" in out


def test_html_written_during_the_cell_is_left_alone_and_the_result_kept(shell, run, tmp_path):
    from jupyter_memprof._frontends.magic import LAST

    target = tmp_path / "mine.txt"
    result, out = run(
        f"%%memprofile --no-display -o p_race --html {target}\n"
        f"open({str(target)!r}, 'w').write('mine')\n"
        "race_value = 41 + 1\nrace_value"
    )
    assert result.success and result.result == 42
    assert target.read_text() == "mine"
    assert (
        f"%%memprofile: --html: {str(target)!r} exists and is not a jupyter_memprof HTML "
        "report; add --force to replace it; _memprof holds the profile"
    ) in out
    assert shell.user_ns["p_race"] is shell.user_ns[LAST]


def test_to_html_overwrite(mlp_adam_profile, tmp_path):
    prof, _ = mlp_adam_profile
    notes = tmp_path / "notes.ipynb"
    notes.write_text("{}")
    with pytest.raises(FileExistsError, match="refusing to replace"):
        prof.to_html(notes)
    assert notes.read_text() == "{}"
    assert prof.to_html(notes, overwrite=True) == str(notes)
    assert "memprof-status" in notes.read_text()


# -- time zero in a fresh process -------------------------------------------------------------
def test_time_zero_of_the_first_capture_in_a_fresh_process():
    """The first capture of a process pays torch's profiler start-up (tens of ms); time zero
    must still be when the profiled code starts, not when torch's trace starts."""
    out = _python(
        """
        import json, time, torch, jupyter_memprof
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10))
        opt = torch.optim.Adam(model.parameters())
        x = torch.randn(32, 64)
        with jupyter_memprof.profile() as prof:
            code_start = time.time_ns()
            model(x).sum().backward()
            opt.step()
        start = prof.start_ns
        print(json.dumps({
            "code": code_start - start,
            "op": int(prof.ops["start_ns"].min()) - start,
            "alloc": int(prof.allocations["alloc_ns"].dropna().min()) - start,
            "end": prof.end_ns - start,
        }))
        """
    )
    assert out.returncode == 0, out.stderr[-3000:]
    t = json.loads(out.stdout.splitlines()[-1])
    ms = 1_000_000
    assert 0 <= t["code"] < 2 * ms
    assert 0 <= t["op"] < 5 * ms
    assert 0 <= t["alloc"] < 5 * ms
    assert t["end"] > t["op"]


# -- the garbage collector -----------------------------------------------------------------
def test_a_capture_leaves_the_collector_as_it_found_it_with_nothing_young_left_to_scan():
    """The analysis pauses the collector; afterwards it is back on, the user's frozen
    objects stay frozen, and what the analysis allocated is not waiting in the youngest
    generation for the next allocation to traverse."""
    from jupyter_memprof._analysis.pipeline import paused_gc

    assert gc.isenabled()
    with paused_gc():
        kept = [[i] for i in range(50_000)]
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_count()[0] < 1_000
    assert gc.is_tracked(kept[0]) and len(gc.get_objects(generation=0)) < 1_000

    frozen = [[i] for i in range(10)]
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with paused_gc():
            young = [[i] for i in range(5_000)]
        assert gc.get_freeze_count() == before  # the user's freeze is left alone
    finally:
        gc.unfreeze()
    del kept, frozen, young


class _Cycle:
    pass


def test_a_garbage_cycle_from_the_profiled_code_is_freed_by_the_end_of_the_capture():
    """What the analysis allocated goes to the oldest generation without a collection; the
    user's garbage cycles must not go with it, to wait there for a full collection."""
    import weakref

    with jupyter_memprof.profile(namespace={}) as prof:
        held = _Cycle()
        held.itself, held.tensor = held, torch.ones(100)
        gone = weakref.ref(held.tensor)
        del held
    assert gone() is None
    assert gc.isenabled() and gc.get_count()[0] < 1_000 and len(prof.allocations)


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message for you")


def test_an_exception_that_cannot_be_printed_still_reaches_the_user_with_its_profile():
    with pytest.raises(_Unprintable):
        with jupyter_memprof.profile(namespace={}) as prof:
            torch.ones(100)
            raise _Unprintable()
    assert _registered(prof) and prof.meta["error"] == "_Unprintable"
    assert len(prof.allocations) and not profiler_running()


def test_a_progress_callable_that_raises_still_stops_the_profiler_and_keeps_the_profile():
    """The first report comes just before torch's stop: a callable that raises there must
    not leave the profiler running."""

    def broken(stage, done, total):
        raise ValueError(f"no progress for {stage}")

    with pytest.raises(ValueError, match="no progress for stopping torch's profiler"):
        with jupyter_memprof.profile(namespace={}, progress=broken) as prof:
            torch.ones(250)
    assert not profiler_running() and not _our_hooks() and _registered(prof)
    assert prof.meta["stop_error"] == "ValueError: no progress for stopping torch's profiler"
    assert prof.meta["analysis_error"] == "ValueError: no progress for ops"
    _capture_works()


# -- other threads -----------------------------------------------------------------------------
class _Waiter(torch.nn.Module):
    """A module whose forward waits (without the GIL) until told to go on."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.go_on = threading.Event(), threading.Event()

    def forward(self, x):
        self.inside.set()
        self.go_on.wait(60)
        return x


def test_a_module_call_of_another_thread_torch_cannot_name_is_kept_with_a_thread_id_that_fits():
    """A module call running in another thread when the capture starts: torch's Python
    tracer replays that thread's frames with thread id 2**64-1 (every time). Before, the
    analysis raised OverflowError out of the `with` block and the profile had no tables."""
    waiter = _Waiter()
    t = threading.Thread(target=waiter, args=(torch.ones(3),), name="waiting")
    t.start()
    try:
        assert waiter.inside.wait(60)
        gc.collect()
        with jupyter_memprof.profile(namespace={"waiter": waiter}) as prof:
            torch.ones(250)
    finally:
        waiter.go_on.set()
        t.join(60)
    assert _registered(prof) and prof.meta.get("analysis_error") is None
    assert prof.allocations["size_bytes"].tolist() == [1000]
    names = prof.ops.set_index("op_id")["name"].astype(str)
    assert [names[i] for i in prof.allocations["alloc_op_id"]] == ["aten::empty"]
    theirs = prof.ops[prof.ops["module"].astype(object) == "waiter"]
    assert theirs["kind"].astype(str).tolist() == ["module"]
    assert theirs["thread"].tolist() == [-1]  # 2**64-1 as the int64 of the same bits
    ours = prof.ops[prof.ops["name"].astype(str) == "aten::ones"]
    assert len(ours) == 1 and ours["thread"].iloc[0] > 0
    assert prof.ops["thread"].dtype == "int64"


def test_module_calls_of_another_thread_looping_during_a_capture_never_break_it():
    """Another thread calls a module over and over while the capture (with Python stacks)
    runs; torch records that thread's module calls, with a small id or with 2**64-1. Either
    way the capture keeps its tables, and only this thread's ops and blocks (torch records
    ops and memory of the profiling thread only)."""
    other = torch.nn.Linear(4, 4)
    stop, running = threading.Event(), threading.Event()

    def loop():
        x = torch.ones(2, 4)
        while not stop.is_set():
            other(x)
            running.set()

    for _ in range(3):
        running.clear()
        t = threading.Thread(target=loop, name="looping")
        t.start()
        try:
            assert running.wait(60)
            gc.collect()
            with jupyter_memprof.profile(namespace={"other": other}) as prof:
                torch.ones(250)
        finally:
            stop.set()
            t.join(60)
        stop.clear()
        assert _registered(prof) and prof.meta.get("analysis_error") is None
        a = prof.allocations
        assert a.loc[a["alloc_ns"].notna(), "size_bytes"].tolist() == [1000]
        assert sorted(a.loc[a["alloc_ns"].isna(), "size_bytes"]) == [16, 64]  # other's, before
        kinds = prof.ops.groupby("thread", observed=True)["kind"].agg(lambda k: set(k.astype(str)))
        here = prof.ops.loc[prof.ops["name"].astype(str) == "aten::ones", "thread"].iloc[0]
        assert kinds[here] >= {"op"}
        assert all(k == {"module"} for thread, k in kinds.items() if thread != here)


@pytest.mark.parametrize("kind", ["torch.profiler.profile", "torch.autograd.profiler.profile"])
def test_a_torch_profiler_in_another_thread_is_refused_not_a_crash(kind):
    """torch's profiler runs in thread A (blocked on an Event); a capture in the main thread
    is refused with one CaptureError line, and works once A has stopped. Before: the
    capture started a second profiler (torch's "profiler enabled" is per thread) and the
    process died with a segmentation fault (exit 139) when one of them stopped."""
    out = _python(
        f"""
        import threading, torch, jupyter_memprof
        from jupyter_memprof import CaptureError

        started, go_on = threading.Event(), threading.Event()

        def a():
            with {kind}():
                torch.ones(10)
                started.set()
                go_on.wait(60)

        ta = threading.Thread(target=a, name="torch-profiling")
        ta.start()
        assert started.wait(60)
        try:
            with jupyter_memprof.profile(namespace={{}}):
                torch.ones(10)
        except CaptureError as err:
            print("refused:", err)
        else:
            print("not refused")
        go_on.set()
        ta.join(60)
        with jupyter_memprof.profile(namespace={{}}) as prof:
            torch.ones(250)
        print("after", prof.allocations["size_bytes"].tolist())
        """
    )
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-3000:])
    assert out.stdout.splitlines()[-2:] == [
        "refused: a torch profiler is already running in another thread: torch runs one "
        "profiler per process (a second one crashes it); profile memory after that one has "
        "stopped",
        "after [1000]",
    ]


@pytest.mark.parametrize("steps", [None, 2])
def test_a_torch_profiler_started_in_another_thread_during_a_capture_is_refused(steps):
    """A capture runs in the main thread (a plain one, or a long run between its windows);
    another thread starts torch's profiler (both of torch's Python APIs). Before: no error,
    then a segmentation fault (exit 139) when the capture stopped, since torch keeps its
    "profiler enabled" state per thread. Now the other thread's start raises ProfilerBusy
    before torch changes anything; the capture finishes with what it recorded, and once it
    has, the other thread's profiler works and torch's functions are torch's own again."""
    out = _python(
        f"""
        import threading, torch, jupyter_memprof
        import torch.autograd.profiler as tap
        from jupyter_memprof._producers.profiler_guard import GUARDED

        own = {{name: getattr(tap, name) for name in GUARDED}}
        kinds = {{"new": torch.profiler.profile, "autograd": torch.autograd.profiler.profile}}

        def other(kind, result):
            try:
                with kinds[kind]() as p:
                    torch.ones(10) * 2
                result.append("ran")
            except RuntimeError as err:
                result.append(f"{{type(err).__name__}}: {{err}}")

        def in_thread(kind):
            result = []
            t = threading.Thread(target=other, args=(kind, result))
            t.start()
            t.join(60)
            return result[0]

        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with jupyter_memprof.profile(namespace={{}}, steps={steps}) as prof:
            for i, kind in enumerate(["new", "autograd", "new"]):
                print(kind, "during:", in_thread(kind), flush=True)
                model(torch.ones(4, 8)).sum().backward()
                opt.step()
            torch.ones(250)
        print("capture", 1000 in prof.allocations["size_bytes"].tolist(), len(prof.steps))
        print("restored", all(getattr(tap, n) is f for n, f in own.items()))
        for kind in kinds:
            print(kind, "after:", in_thread(kind))
        """
    )
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-3000:])
    busy = (
        "ProfilerBusy: jupyter_memprof: a memory capture is running in thread 'MainThread'; "
        "torch runs one profiler per process (a second one would crash it): start this "
        "profiler after the capture has finished"
    )
    assert out.stdout.splitlines() == [
        f"new during: {busy}",
        f"autograd during: {busy}",
        f"new during: {busy}",
        "capture True 4",  # three steps and the stretch after them
        "restored True",
        "new after: ran",
        "autograd after: ran",
    ]


@pytest.mark.parametrize("kind", [torch.profiler.profile, torch.autograd.profiler.profile])
@pytest.mark.parametrize("steps", [None, 1])
def test_a_torch_profiler_started_inside_a_capture_is_refused_and_the_capture_keeps_its_data(
    kind, steps
):
    """Before: torch's profiler started in the captured code itself took the recording
    over, and the capture came back with no blocks at all, without a word. Now its start
    raises ProfilerBusy (the user's code sees it, as any error of its own), the capture
    keeps what it recorded, and torch's profiler works again once the capture is over."""
    from jupyter_memprof import ProfilerBusy

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with jupyter_memprof.profile(namespace={"opt": opt}, steps=steps) as prof:
        torch.ones(1000)
        model(torch.ones(4, 8)).sum().backward()
        opt.step()  # with steps=1: the next window starts here, as the capture's own
        with pytest.raises(ProfilerBusy, match="a memory capture is running in this thread"):
            with kind():
                torch.ones(2000)
        torch.ones(3000)
    windows = [prof, *prof.kept.values()]
    sizes = {z for p in windows for z in p.allocations["size_bytes"].tolist()}
    assert {4000, 12000} <= sizes and 8000 not in sizes
    if steps:
        assert prof.meta["long_run"]["windows"] == 2
    with kind() as p:
        torch.ones(10)
    assert p is not None


def test_a_legacy_torch_profiler_in_another_thread_does_not_crash_a_capture():
    """The legacy profiler keeps no process-wide state: it cannot be seen from another
    thread, and a capture beside it works, whichever starts first."""
    out = _python(
        """
        import gc, threading, torch, jupyter_memprof

        def legacy():
            return torch.autograd.profiler_legacy.profile()

        def capture():
            return jupyter_memprof.profile(namespace={})

        for first, second in ((legacy, capture), (capture, legacy)):
            started, go_on, held = threading.Event(), threading.Event(), []

            def hold():
                with first() as p:
                    torch.ones(250)
                    started.set()
                    go_on.wait(60)
                held.append(p)

            gc.collect()
            t = threading.Thread(target=hold)
            t.start()
            assert started.wait(60)
            with second() as q:
                torch.ones(250)
            go_on.set()
            t.join(60)
            prof = q if second is capture else held[0]
            print(first.__name__, "first:", prof.allocations["size_bytes"].tolist(), flush=True)
        """
    )
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-3000:])
    assert out.stdout.splitlines() == ["legacy first: [1000]", "capture first: [1000]"]


@pytest.mark.parametrize("with_stack", [True, False])
def test_a_capture_whose_thread_ended_unfinished_frees_the_slot_for_the_next(with_stack):
    """A thread starts a capture and ends without finishing it. Before, every later capture
    and estimate of the process was refused ("already running in thread ..."), and
    release() did not help. Now the next capture, estimate or release() takes the slot
    over: the abandoned capture's hooks are removed and torch's profiler is put back in
    order (torch stops the thread's profiler as the thread ends, but leaves its "a
    profiler runs" flag set, and the process then crashed at exit: plain torch too)."""
    out = _python(
        f"""
        import gc, threading, torch, jupyter_memprof
        import torch.autograd.profiler as torch_profiler
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module
        from jupyter_memprof._producers.slot import SLOT

        def hooks():
            return sum(
                len(d) for d in (
                    nn_module._global_forward_pre_hooks,
                    nn_module._global_forward_hooks,
                    optim_module._global_optimizer_pre_hooks,
                )
            )

        def abandon():
            jupyter_memprof.profile(namespace={{}}, with_stack={with_stack}).start()
            torch.ones(10)

        for way in ("next capture", "release()", "estimate"):
            t = threading.Thread(target=abandon, name="gone")
            t.start()
            t.join(60)
            print(way, "left behind:", hooks() > 0, torch_profiler._is_profiler_enabled)
            if way == "release()":
                jupyter_memprof.release()
                print(way, "freed:", not SLOT._lock.locked(), hooks(), flush=True)
            elif way == "estimate":
                est = jupyter_memprof.estimate(lambda x: x * 2, torch.ones(250))
                print(way, "works:", est.allocations["size_bytes"].tolist(), hooks(), flush=True)
                continue
            gc.collect()
            with jupyter_memprof.profile(namespace={{}}) as prof:
                torch.ones(250)
            print(way, "works:", prof.allocations["size_bytes"].tolist(), hooks(), flush=True)
        print("flag", torch_profiler._is_profiler_enabled)
        """
    )
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-3000:])
    assert out.stdout.splitlines() == [
        "next capture left behind: True True",  # the optimizer hook is there with stacks too
        "next capture works: [1000] 0",
        "release() left behind: True True",
        "release() freed: True 0",
        "release() works: [1000] 0",
        "estimate left behind: True True",
        "estimate works: [1000, 1000] 0",  # its argument and its result
        "flag False",
    ]


# -- Ctrl-C late in finish() -------------------------------------------------------------------
def _interrupt() -> None:
    """A real Ctrl-C: SIGINT to this process, handled at the next bytecode."""
    import signal

    signal.raise_signal(signal.SIGINT)


def test_an_interrupt_while_the_profile_is_registered_still_registers_it(monkeypatch):
    """Ctrl-C after the analysis, while the profile is registered (here: as torch's raw
    result is let go, the step before). Before: the profile was never registered, so the
    panel never listed it (about 1 interrupt in 100 landed there)."""
    from jupyter_memprof._producers.recorder import Recorder

    release = Recorder.release

    def release_then_interrupt(self):
        release(self)
        _interrupt()

    monkeypatch.setattr(Recorder, "release", release_then_interrupt)
    heard = []
    unsubscribe = session.subscribe(lambda action, sid, p: heard.append((action, p)))
    try:
        with pytest.raises(KeyboardInterrupt):
            with jupyter_memprof.profile(namespace={}, label="late") as prof:
                torch.ones(250)
    finally:
        unsubscribe()
    assert _registered(prof) and heard == [("added", prof)]
    assert prof.meta["label"] == "late" and len(prof.allocations) >= 1
    assert not profiler_running()


def test_an_interrupt_in_a_session_listener_still_tells_the_others():
    """Ctrl-C while the first listener hears of the new profile: the panel's listener (the
    second) still hears of it; the interrupt comes once all have."""
    heard = []
    first = session.subscribe(lambda action, sid, p: _interrupt())
    second = session.subscribe(lambda action, sid, p: heard.append((action, p)))
    try:
        with pytest.raises(KeyboardInterrupt):
            with jupyter_memprof.profile(namespace={}) as prof:
                torch.ones(250)
    finally:
        first()
        second()
    assert _registered(prof) and heard == [("added", prof)]
