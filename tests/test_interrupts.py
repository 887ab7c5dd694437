"""Ctrl-C in a long run keeps every step whose window was recorded (issue 37, item 1).

Real SIGINTs: from a timer thread at many moments of a run (the loop, the analysis of a
window inside it, the wait after it), and from the progress callback at each stage of the
analysis after the loop. Before: an interrupt during a window's analysis lost that window's
steps without a word, and one during the wait after the loop left ``prof.steps`` and
``prof.kept`` empty.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

import jupyter_memprof
from jupyter_memprof._frontends.long_run import MissingWhy

STEPS = 8


@pytest.fixture(scope="module")
def work():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, torch.randn(16, 64)


def _interrupt() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def _run(work, *, delay: float | None = None, progress=None, steps: int = STEPS):
    """A long run of ``steps`` steps in windows of 2, interrupted after ``delay`` seconds (or by
    ``progress``); returns (profile, steps the loop completed, whether Ctrl-C reached us)."""
    model, opt, x = work
    done, prof, interrupted = 0, None, False
    timer = None if delay is None else threading.Timer(delay, _interrupt)
    try:
        try:
            if timer is not None:
                timer.start()
            with jupyter_memprof.profile(
                steps=2, namespace={"model": model, "opt": opt}, progress=progress
            ) as prof:
                for _ in range(steps):
                    model(x).sum().backward()
                    opt.step()
                    opt.zero_grad()
                    done += 1
        except KeyboardInterrupt:
            interrupted = True
        if timer is not None:
            timer.join()
    except KeyboardInterrupt:  # it came after the run (the timer was late)
        interrupted = True
    return prof, done, interrupted


def _check(prof, done: int) -> list[dict]:
    """Every step the loop completed is in ``prof.steps`` or said to be missing; the summary
    and the text work and name what is missing. Returns the missing ranges."""
    assert prof is not None
    run = prof.meta["long_run"]
    missing = run.get("missing_steps") or []
    have = sorted(int(s) for s in prof.steps["step"].unique())
    lost = {s for m in missing for s in range(m["first"], m["last"] + 1)}
    assert not lost & set(have)
    assert set(range(done)) <= set(have) | lost, (done, have, missing)
    assert have == list(range(len(have))) or lost  # numbered in order, gaps only if said
    for m in missing:
        assert m["why"] in MissingWhy.values() or m["why"].startswith("its analysis failed")
    text = str(prof)
    for m in missing:
        assert m["why"] in text
    assert prof.summary()["long_run"] == run
    if done >= 2 and not missing:
        assert "first" in prof.kept and len(prof.kept["first"].steps)
    return missing


def test_interrupts_at_many_moments_keep_every_recorded_step(work):
    _run(work)  # warm up torch's profiler
    t0 = time.perf_counter()
    prof, done, _ = _run(work)
    whole = time.perf_counter() - t0
    assert done == STEPS and len(prof.steps) == STEPS
    seen_interrupted = 0
    for i in range(16):
        prof, done, interrupted = _run(work, delay=whole * (0.05 + i / 14))
        seen_interrupted += interrupted
        if prof is None:  # Ctrl-C before the capture had started: nothing ran
            assert interrupted and done == 0
            continue
        _check(prof, done)
    assert seen_interrupted >= 8  # most of them landed inside the run
    prof, done, _ = _run(work)  # nothing was left behind: the next run is whole
    assert done == STEPS and len(prof.steps) == STEPS


@pytest.mark.parametrize("at", [1, 2, 4, 6, 7])
def test_an_interrupt_in_the_wait_after_the_loop_keeps_the_windows(work, at):
    """The progress callback sends SIGINT at its ``at``-th call, after the loop has ended:
    stopping the profiler (1) or analysing the last window (step 6, the others were
    analysed inside the loop)."""
    calls = []

    def progress(stage, done, total):
        calls.append(stage)
        if len(calls) == at:
            _interrupt()

    prof, done, interrupted = _run(work, progress=progress, steps=7)
    assert done == 7
    if len(calls) < at:  # the analysis had fewer stages: nothing was interrupted
        assert not interrupted and len(prof.steps) == 7
        return
    assert interrupted
    assert prof.meta["analysis_interrupted"] is True
    missing = _check(prof, done)
    have = set(prof.steps["step"].astype(int))
    assert set(range(6)) <= have  # the three windows analysed inside the loop
    if at == 1:
        why = MissingWhy.NOT_ANALYSED.value
    else:
        why = MissingWhy.INTERRUPTED.value
    if 6 not in have:  # the last window's analysis was stopped: its step, said so
        assert missing == [{"first": 6, "last": 6, "why": why}]
        assert f"step 6 missing: {why}" in str(prof)
    assert "first" in prof.kept and "peak" in prof.kept
    assert len(prof.kept["first"].steps) == 2


def test_an_interrupt_while_the_next_window_starts_leaves_no_profiler_running(work, monkeypatch):
    """Ctrl-C inside torch's start of the next window's profiler (after torch turned it on):
    the run ends with what it has, nothing of torch's stays on, and the next capture works."""
    from jupyter_memprof._producers import windows

    made = windows._new_profiler
    starts = []

    def interrupted_start(*args, **kwargs):
        tp = made(*args, **kwargs)
        enter = tp.__enter__

        def enter_then_interrupt():
            enter()
            starts.append(torch.autograd._profiler_enabled())
            raise KeyboardInterrupt

        tp.__enter__ = enter_then_interrupt
        return tp

    monkeypatch.setattr(windows, "_new_profiler", interrupted_start)
    prof, done, interrupted = _run(work)
    assert interrupted and starts == [True] and done >= 1
    _check(prof, done)
    assert not torch.autograd._profiler_enabled()
    monkeypatch.setattr(windows, "_new_profiler", made)
    model, _, x = work
    with jupyter_memprof.profile(namespace={"model": model}) as after:
        model(x).sum().backward()
    assert len(after.allocations) > 0 and not torch.autograd._profiler_enabled()
