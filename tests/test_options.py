"""Options are checked once per entry point into frozen objects, and a bad value of a shared
option is the same line everywhere: ``profile()``, ``estimate()``, ``what_if()``, ``fit()``,
``%%memprofile`` (a real run and ``--estimate``), the command line and ``memory_limit``
marks."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

import jupyter_memprof
from jupyter_memprof._cli.budget import Budget, BudgetError
from jupyter_memprof._cli.main import PROG, main
from jupyter_memprof._errors import CaptureError, EstimateError
from jupyter_memprof._frontends import options as O
from jupyter_memprof._frontends.magic_options import Options
from jupyter_memprof._producers.torch_profiler import profiler_running


def _step():
    torch.ones(8)


#: (option, the value given to the Python API, the text typed in the magic and the CLI)
CASES = [
    ("allocator", "expandable_segments:maybe", "expandable_segments:maybe"),
    ("allocator", "max_split_size_mb:5", "max_split_size_mb:5"),
    ("limit", "lots", "lots"),
    ("limit", "0", "0"),
    ("device", "tpu", "tpu"),
    ("device", "meta", "meta"),
    ("steps", 0, "0"),
    ("steps", "ten", "ten"),
    ("context", "huge", "huge"),
    ("world_size", 0, "0"),
    ("world_size", "two", "two"),
]

#: the Python entry points and the options each takes
PYTHON = {
    "profile()": (
        CaptureError,
        {"allocator", "device", "steps"},
        lambda **kw: jupyter_memprof.profile(namespace={}, **kw),
    ),
    "estimate()": (
        EstimateError,
        {"allocator", "limit", "device", "context", "world_size"},
        lambda **kw: jupyter_memprof.estimate(_step, **kw),
    ),
    "what_if()": (EstimateError, {"device"}, lambda **kw: jupyter_memprof.what_if(_step, **kw)),
    "fit()": (
        EstimateError,
        {"allocator", "limit", "device", "context", "world_size"},
        lambda **kw: jupyter_memprof.fit(lambda batch: _step(), **{"limit": "1GiB", **kw}),
    ),
}

#: the options each form of the magic and each command takes
MAGIC_REAL = {"allocator", "device", "steps"}
MAGIC_ESTIMATE = {"allocator", "limit", "device", "context", "world_size"}
CLI = {
    "estimate": {"allocator", "limit", "device", "context", "world_size"},
    "fit": {"allocator", "limit", "device", "context", "world_size"},
    "summary": {"limit"},
}
MARK = {"allocator", "limit", "device", "world_size"}


def _expected(option: str, value) -> str:
    """The one line of the option's validator."""
    check = getattr(O, f"check_{option}")
    with pytest.raises(O.OptionError) as info:
        check(value)
    return str(info.value)


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _python_lines(option: str, value) -> dict[str, str]:
    lines = {}
    for name, (error, takes, call) in PYTHON.items():
        if option in takes:
            with pytest.raises(error) as info:
                call(**{option: value})
            lines[name] = str(info.value)
    return lines


def _magic_lines(run, shell, option: str, text: str) -> dict[str, str]:
    lines = {}
    for name, head, takes in (
        ("%%memprofile", "%%memprofile --no-display", MAGIC_REAL),
        ("%%memprofile --estimate", "%%memprofile --estimate --no-display", MAGIC_ESTIMATE),
    ):
        if option not in takes:
            continue
        result, out = run(f"{head} {_flag(option)} {text}\nopt_ran = 1")
        assert result.error_in_exec is not None and "opt_ran" not in shell.user_ns
        (line,) = [ln for ln in out.splitlines() if ln.strip()]
        assert line.startswith("UsageError: "), line
        lines[name] = line.removeprefix("UsageError: ")
    return lines


def _cli_lines(capsys, option: str, text: str) -> dict[str, str]:
    """The command's error line; the options are checked before the target is imported or
    the file read (neither exists)."""
    lines = {}
    for command, takes in CLI.items():
        if option not in takes:
            continue
        where = ["no_such.profile"] if command == "summary" else ["no_such_module:step"]
        limit = [] if option == "limit" or command != "fit" else ["--limit", "1GiB"]
        capsys.readouterr()
        assert main([command, *where, *limit, _flag(option), text]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"{PROG}: error: "), line
        lines[f"{PROG} {command}"] = line.removeprefix(f"{PROG}: error: ")
    return lines


def _mark_line(option: str, value) -> dict[str, str]:
    if option not in MARK:
        return {}
    kwargs = {option: value} if option != "limit" else {}
    mark = types.SimpleNamespace(args=(value if option == "limit" else "1GiB",), kwargs=kwargs)
    with pytest.raises(BudgetError) as info:
        Budget.of(mark)
    return {"memory_limit": str(info.value).removeprefix("memory_limit: ")}


@pytest.mark.parametrize(("option", "value", "text"), CASES, ids=[f"{c[0]}={c[2]}" for c in CASES])
def test_a_bad_value_is_the_same_line_at_every_entry_point(option, value, text, run, shell, capsys):
    expected = _expected(option, value)
    assert "\n" not in expected and option.split("_")[0] in expected
    lines = {
        **_python_lines(option, value),
        **_magic_lines(run, shell, option, text),
        **_cli_lines(capsys, option, text),
        **_mark_line(option, value),
    }
    assert len(lines) >= 2, lines  # steps: profile() and the magic; the others more

    assert {name: expected for name in lines} == lines
    assert not profiler_running()


def test_the_capture_devices_and_the_estimate_device_say_the_same():
    """A capture's devices must exist, an estimate's need not; a name that is no device is
    the same line for both."""
    for bad in ("tpu", "cuda:x", "meta", "cuda:-1"):
        with pytest.raises(O.OptionError) as one:
            O.check_device(bad)
        with pytest.raises(O.OptionError) as many:
            O.check_devices(bad)
        assert str(one.value) == str(many.value)


def test_options_are_frozen():
    capture = O.CaptureOptions.from_kwargs(device="cpu", steps="3", keep="first, 2")
    assert capture.devices == ("cpu",) and capture.steps == 3 and capture.keep == ("first", 2)
    assert capture.memory_budget is False  # a long run's windows bound its memory
    estimate = O.EstimateOptions.parse(device="cuda", limit="1GiB", world_size="4")
    assert (estimate.device, estimate.limit, estimate.world_size) == ("cuda:0", 2**30, 4)
    assert estimate.gpu.name == "H100" and estimate.context is None
    magic = Options(name="%%memprofile", output=None, label=None, html=None, force=False,
                    no_display=True, estimate=estimate)  # fmt: skip
    for obj, field in ((capture, "steps"), (estimate, "limit"), (magic, "estimate")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)


def test_a_profile_keeps_its_checked_options():
    """``profile()`` checks once: what it runs with is its options object, and a capture
    made from one (the magic's way) checks nothing again."""
    capture = jupyter_memprof.profile(device="cpu", namespace={}, steps=2)
    assert capture.options == O.CaptureOptions.from_kwargs(device="cpu", steps=2)
    again = jupyter_memprof.profile.from_options(capture.options, namespace={})
    assert again.options is capture.options and again.devices == ["cpu"]
    assert again._long.steps_per_window == 2 and again._budget is False


def test_text_numbers_only_where_text_is_typed():
    """The magic and the command line type numbers as text; ``estimate()`` takes ints."""
    assert O.EstimateOptions.parse(world_size=" 8 ").world_size == 8
    with pytest.raises(O.OptionError, match="not '8'"):
        O.EstimateOptions.from_kwargs(world_size="8")


def test_the_magic_checks_once(shell, run, monkeypatch):
    """The magic's options reach the capture as they were read: ``--steps`` and
    ``--allocator`` are parsed once."""
    calls = []
    real = O.check_steps

    def counted(value):
        calls.append(value)
        return real(value)

    monkeypatch.setattr(O, "check_steps", counted)
    result, _ = run("%%memprofile --no-display --steps 2 -o opt_lr\nopt_x = torch.ones(4)")
    assert result.error_in_exec is None and calls == ["2"]
    assert shell.user_ns["opt_lr"].meta["long_run"]["steps_per_window"] == 2
