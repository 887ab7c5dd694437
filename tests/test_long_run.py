"""Long runs (``profile(steps=N)``, ``%%memprofile --steps N``): a loop recorded in windows of
N steps, with memory that follows the window, not the loop.

Every test runs a real loop under the real profiler; a long run is checked against one
capture of the same loop (the same steps, the same leaks, byte for byte).
"""

import warnings

import pandas as pd
import pytest
import torch
from IPython.core.error import UsageError

import jupyter_memprof
from jupyter_memprof._analysis import schema as S
from jupyter_memprof._analysis import windows as W
from jupyter_memprof._analysis.allocator.config import parse_config
from jupyter_memprof._analysis.steps import step_boundaries
from jupyter_memprof._frontends.finish import FinishOptions
from jupyter_memprof._producers import live
from jupyter_memprof._producers.torch_profiler import profiler_running

#: the columns of ``steps`` a long run must give exactly as one capture does
SAME = ["step", "device", "peak_bytes", "live_start_bytes", "live_end_bytes", "growth_bytes"]


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    return model, x, y


def _train(n: int, each=None, ns=None, **kwargs):
    """``n`` Adam steps of a small MLP; ``each(i, loss)`` runs in each step (the leak), ``ns``
    the notebook's other variables."""
    model, x, y = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    namespace = {**(ns or {}), "model": model, "opt": opt, "x": x, "y": y}
    with jupyter_memprof.profile(namespace=namespace, **kwargs) as prof:
        for i in range(n):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            if each is not None:
                each(i, loss)
    return prof, opt


def _distinct(prof) -> int:
    return len({id(p) for p in prof.kept.values()})


# -- the same answers as one capture -----------------------------------------------------
def test_a_long_run_gives_every_step_the_row_one_capture_gives():
    losses_a, losses_b = [], []
    one, _ = _train(10, lambda i, loss: losses_a.append(loss), {"losses": losses_a})
    run, opt = _train(10, lambda i, loss: losses_b.append(loss), {"losses": losses_b}, steps=3)
    assert list(run.steps.columns) == list(S.STEPS)
    assert run.steps[SAME].equals(one.steps[SAME])
    assert run.steps["growth_category"].astype(object).tolist() == (
        one.steps["growth_category"].astype(object).tolist()
    )
    assert run.meta["long_run"]["windows"] == 4  # 3 + 3 + 3 + 1 steps
    assert run.meta["long_run"]["steps"] == 10
    # the leak crosses every window: one row, the same as one capture finds
    leak, same = run.leaks().iloc[0], one.leaks().iloc[0]
    assert leak["holder"] == same["holder"] == "losses"
    assert leak["bytes_per_step"] == same["bytes_per_step"] == 4
    assert leak["steps"] == 10 and len(leak["alloc_ids"]) == 10
    assert leak["callsite"] == same["callsite"]
    # nothing of the run is left on: the profiler, the step listener, the optimizer's wrapper
    assert not profiler_running()
    assert "step" not in opt.__dict__ and not live.STEP_LISTENERS


def test_a_long_run_without_python_stacks_gives_the_same_steps():
    losses_a, losses_b = [], []
    one, _ = _train(
        6, lambda i, loss: losses_a.append(loss), {"losses": losses_a}, with_stack=False
    )
    run, _ = _train(
        6, lambda i, loss: losses_b.append(loss), {"losses": losses_b}, with_stack=False, steps=2
    )
    assert run.steps[SAME].equals(one.steps[SAME])
    assert run.leaks()["holder"].tolist() == ["losses"]
    assert run.kept["first"].ops["module"].notna().any()  # module annotations in every window


def test_graphs_kept_across_windows_are_found_with_their_holder_and_exact_bytes():
    model, x, y = _mlp()
    total = 0
    with jupyter_memprof.profile(steps=2) as prof:
        for _ in range(7):
            total += ((model(x) - y) ** 2).mean()
            jupyter_memprof.step()
    leak = prof.leaks().iloc[0]
    assert leak["holder"] == "total"
    assert leak["why"] == "each step's graph kept alive through `total.grad_fn`"
    # each graph saves relu's output (32 x 128 floats) and the difference (32 x 8 floats)
    assert leak["bytes_per_step"] == (32 * 128 + 32 * 8) * 4
    assert leak["steps"] >= 6
    assert prof.meta["long_run"]["windows"] == 4
    assert len(prof.steps) == 7
    assert (prof.steps["growth_bytes"].iloc[1:-1] == leak["bytes_per_step"]).all()


def test_a_cache_filled_in_every_window_is_one_leak_of_exact_bytes():
    model, x, y = _mlp()
    cache = {}
    with torch.no_grad(), jupyter_memprof.profile(steps=4) as prof:
        for i in range(12):
            cache[f"batch{i}"] = torch.ones(1000)
            model(x)
            jupyter_memprof.step()
    leaks = prof.leaks()
    assert len(leaks) == 1
    leak = leaks.iloc[0]
    assert leak["holder"] == "cache" and leak["why"] == "each step adds an entry to `cache`"
    assert leak["bytes_per_step"] == 4000 and leak["total_bytes"] == 12 * 4000
    assert leak["steps"] == 12 and len(set(leak["alloc_ids"])) == 12  # ids unique over the run
    assert leak["callsite"].startswith("test_long_run.py:")
    text = repr(prof)
    assert "memory grows 3.9 KiB per step: `cache` (test_long_run.py:" in text
    assert "long run: 12 steps in 3 windows of 4; tables of steps 8-11 (the highest peak)" in text
    assert "long run: 12 steps in 3 windows of 4" in prof._repr_html_()


def test_a_clean_long_loop_reports_no_leak():
    running = []
    prof, _ = _train(12, lambda i, loss: running.append(loss.item()), steps=4)
    assert len(prof.steps) == 12
    assert prof.leaks().empty
    assert prof.summary()["growth"] is None
    assert prof.steps["growth_category"].iloc[0] == "optimizer_state"


def test_lr_schedulers_made_before_or_during_a_long_run_keep_working():
    model, x, y = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt2 = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it thinks step() was never called
        with jupyter_memprof.profile(steps=2) as prof:
            during = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
            for _ in range(4):
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
                before.step()
                opt2.step()
                during.step()
    assert opt.param_groups[0]["lr"] == opt2.param_groups[0]["lr"] == 0.5**4
    # a step ends at each optimizer.step(): two optimizers, two steps per iteration
    assert len(prof.steps) == 8 and prof.meta["long_run"]["windows"] == 4
    assert opt.__dict__["step"] is not None and hasattr(opt.step, "_wrapped_by_lr_sched")
    opt.step()  # what the run leaves is torch's own


# -- memory that does not grow with the loop ---------------------------------------------
def test_what_a_long_run_keeps_does_not_grow_with_its_steps():
    short, _ = _train(8, steps=2)
    long, _ = _train(24, steps=2)
    a, b = short.meta["long_run"], long.meta["long_run"]
    assert (a["windows"], b["windows"]) == (4, 12)
    assert len(short.steps) == 8 and len(long.steps) == 24
    # carried between windows: the blocks alive from step to step, the same for any length
    assert a["carried_blocks"] == b["carried_blocks"]
    # at most three windows' tables (first, peak, last), each one window long
    assert _distinct(long) <= 3
    assert set(long.kept) == {"first", "peak", "last"}
    assert long.kept["last"].steps["step"].tolist() == [22, 23]
    assert long.kept["first"].steps["step"].tolist() == [0, 1]
    window_ops = max(len(p.ops) for p in short.kept.values())  # the same windows, shorter run
    for p in long.kept.values():
        assert len(p.ops) <= window_ops * 1.05
    assert b["window_events_max"] <= a["window_events_max"] * 1.2
    # the profile's own tables are the window of the highest peak
    peak_step = int(long.steps["peak_bytes"].idxmax())
    first, last = long.meta["long_run"]["tables_steps"]
    assert first <= long.steps["step"].iloc[peak_step] <= last
    assert long.peak().attrs["peak_bytes"] == long.steps["peak_bytes"].max()


def test_a_long_run_is_saved_and_shown_with_its_window(tmp_path):
    cache = []
    prof, _ = _train(9, lambda i, loss: cache.append(torch.ones(64)), {"cache": cache}, steps=3)
    back = jupyter_memprof.load(prof.save(tmp_path / "run.memprof"))
    assert back.steps[SAME].equals(prof.steps[SAME])
    assert back.leaks().equals(prof.leaks()) and back.leaks()["holder"].tolist() == ["cache"]
    assert back.meta["long_run"] == prof.meta["long_run"]
    assert list(back.kept) == list(prof.kept) and back.kept["last"].steps.equals(
        prof.kept["last"].steps
    )
    # the dashboard marks the steps inside the window it shows, not the run's others
    first, last = prof.meta["long_run"]["tables_steps"]
    marks = step_boundaries(prof.steps, "cpu", (prof.start_ns, prof.end_ns))
    assert len(marks) == last - first
    assert (marks > prof.start_ns).all() and (marks < prof.end_ns).all()
    prof.to_html(tmp_path / "run.html")


def test_keep_chooses_the_windows_whose_tables_stay():
    prof, _ = _train(9, steps=3, keep=("last", 4))
    assert set(prof.kept) == {"last", 4}
    assert prof.kept[4].steps["step"].tolist() == [3, 4, 5]
    assert prof.kept["last"].steps["step"].tolist() == [6, 7, 8]
    assert prof.meta["long_run"]["kept"] == {"last": [6, 8], "4": [3, 5]}
    assert len(prof.steps) == 9


# -- interrupted runs --------------------------------------------------------------------
@pytest.mark.parametrize("error", [RuntimeError("bad batch"), KeyboardInterrupt()])
def test_an_interrupted_long_run_keeps_its_steps_and_raises_the_users_error(error):
    model, x, y = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = jupyter_memprof.profile(steps=3)
    with pytest.raises(type(error)):
        with run as prof:
            for i in range(100):
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
                if i == 6:
                    raise error
    assert prof.steps["step"].tolist() == list(range(7))
    assert prof.meta["error"].startswith(type(error).__name__)
    assert not profiler_running() and "step" not in opt.__dict__
    with jupyter_memprof.profile() as again:  # the next capture works
        opt.step()
    assert len(again.ops)


def test_an_interrupt_between_two_windows_keeps_the_windows_before(monkeypatch):
    """Ctrl-C while a window is analysed, inside the loop: the profiler is off then; the
    run stops, and the interrupted window is analysed after the loop (before: its steps
    were lost without a word)."""
    calls = []
    real = W.survivors

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(W, "survivors", interrupted)
    model, x, y = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(KeyboardInterrupt):
        with jupyter_memprof.profile(steps=2) as prof:
            for _ in range(10):
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
    assert prof.steps["step"].tolist() == [0, 1, 2, 3]
    assert "missing_steps" not in prof.meta["long_run"]
    assert not profiler_running() and "step" not in opt.__dict__
    monkeypatch.undo()
    prof, _ = _train(2, steps=1)
    assert len(prof.steps) == 2


def test_a_window_whose_analysis_fails_is_noted_and_the_loop_goes_on(monkeypatch):
    real = W.survivors
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("broken window")
        return real(*args, **kwargs)

    monkeypatch.setattr(W, "survivors", broken)
    prof, _ = _train(6, steps=2)
    assert prof.meta["long_run"]["window_errors"] == ["ValueError: broken window"]
    assert prof.steps["step"].tolist() == [0, 1, 4, 5]  # the broken window's steps are missing
    assert prof.meta["error"] is None


# -- options -----------------------------------------------------------------------------
def test_every_window_and_the_tail_end_with_the_runs_one_set_of_options():
    """The allocator setting and the progress bar are given once: the windows analysed in
    the loop and the tail after it end with them (the progress only for the tail, the one
    wait after the loop)."""
    stages = []
    setting = "expandable_segments:True"
    prof, _ = _train(5, steps=2, allocator=setting, progress=lambda *a: stages.append(a[0]))
    assert prof.meta["long_run"]["windows"] == 3
    assert prof.meta["allocator"] == setting
    assert {p.meta["allocator"] for p in prof.kept.values()} == {setting}
    assert stages[0] == "stopping torch's profiler"
    assert stages.count("segments") == 1  # the tail's analysis only: none inside the loop
    options = FinishOptions(allocator=parse_config(setting), reading=print, analysing=print)
    inside, tail = options.part(False, False), options.part(False, True)
    assert inside.window == (False, False) and inside.reading is inside.analysing is None
    assert tail.window == (False, True) and tail.analysing is print
    assert inside.allocator is tail.allocator is options.allocator


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"steps": 0},
            "steps needs the number of steps per window, a whole number from 1 to 1,000,000,000",
        ),
        ({"steps": "ten"}, "steps needs the number of steps per window"),
        ({"steps": 2.5}, "steps needs the number of steps per window"),
        ({"keep": "peak"}, "keep needs steps"),
        ({"steps": 2, "keep": "top"}, "keep: 'top' is not a step to keep"),
    ],
)
def test_bad_long_run_options_are_one_line(kwargs, message):
    with pytest.raises(jupyter_memprof.CaptureError) as err:
        jupyter_memprof.profile(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not profiler_running()


def test_the_magic_runs_a_long_run(run, shell):
    shell.user_ns["ran"] = 0
    result, _ = run(
        "%%memprofile --steps 2 --keep first,last --no-display -o lr\n"
        "import jupyter_memprof\n"
        "cache = []\n"
        "for i in range(5):\n"
        "    cache.append(torch.ones(256))\n"
        "    ran += 1\n"
        "    jupyter_memprof.step()\n"
    )
    assert result.error_in_exec is None
    prof = shell.user_ns["lr"]
    assert shell.user_ns["ran"] == 5
    assert len(prof.steps) == 5 and set(prof.kept) == {"first", "last"}
    leak = prof.leaks().iloc[0]
    assert leak["holder"] == "cache" and leak["bytes_per_step"] == 1024


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--steps 0", "UsageError: steps needs the number of steps per window"),
        ("--steps x", "UsageError: steps needs the number of steps per window"),
        ("--keep last", "UsageError: --keep needs --steps"),
        ("--steps 2 --keep top", "UsageError: keep: 'top' is not a step to keep"),
        ("--steps 2 --estimate", "UsageError: --steps and --keep need a real run"),
    ],
)
def test_bad_magic_options_are_one_line_and_run_nothing(run, shell, line, message):
    shell.user_ns["ran"] = 0
    result, out = run(f"%%memprofile {line}\nran = 1\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert message in out
    assert len([ln for ln in out.splitlines() if ln.strip()]) == 1
    assert shell.user_ns["ran"] == 0 and not profiler_running()


# -- the window's joins, read from a real window's tables ----------------------------------
def _window_tables():
    """The tables of a real two-step capture (what a long run's window gives)."""
    prof, _ = _train(2)
    return prof, {k: getattr(prof, k) for k in ("ops", "allocations", "steps")}


def test_carried_blocks_are_forgotten_by_device_and_address():
    prof, tables = _window_tables()
    a = tables["allocations"]
    made = a[a["alloc_ns"].notna().to_numpy()]
    ptr, size = int(made["ptr"].iloc[0]), int(made["size_bytes"].iloc[0])
    carried = S.conform(
        pd.DataFrame(
            {
                "alloc_id": [0, 1, 2],
                "device": ["cpu", "cuda:0", "cpu"],
                "ptr": [ptr, ptr, 8],  # the window allocated at ptr on the CPU only
                "size_bytes": [size, size, 16],
                "alloc_ns": pd.array([1, 1, 1], dtype="Int64"),
                "step": [0, 0, 0],
                "category": [None, None, None],
                "callsite": [None, None, None],
            }
        ),
        S.CARRIED,
        name="carried",
    )
    left = W.forget_freed(carried, tables)
    # the CPU block at ptr was freed between the windows (the window made one there again);
    # the CUDA block at the same address and the CPU block the window never saw stay
    assert list(zip(left["device"].astype(str), left["ptr"])) == [("cuda:0", ptr), ("cpu", 8)]
    assert W.live_offset(carried, tables) == {"cpu": size + 16, "cuda:0": size}


def test_survivors_carry_the_callsite_of_the_op_that_made_them():
    prof, tables = _window_tables()
    new = W.survivors(tables, 5, 100)
    a = tables["allocations"]
    alive = a[a["free_ns"].isna().to_numpy() & a["alloc_ns"].notna().to_numpy()]
    assert new["alloc_id"].tolist() == (alive["alloc_id"] + 100).tolist()
    assert new["size_bytes"].tolist() == alive["size_bytes"].tolist()
    assert set(new["step"]) <= {5, 6}  # the run's steps of the window's two
    by_op = dict(zip(prof.ops["op_id"], prof.ops["callsite"].astype(object)))
    for op, site in zip(alive["alloc_op_id"].tolist(), new["callsite"].astype(object)):
        want = by_op.get(op) if op is not pd.NA else None
        assert (site if isinstance(site, str) else None) == (
            want if isinstance(want, str) else None
        )
    # Adam's state, made in the first step and kept: named at this file's optimizer line
    assert any(
        isinstance(s, str) and "test_long_run.py" in s for s in new["callsite"].astype(object)
    )
