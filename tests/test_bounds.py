"""Bounds on every size and count, one line each, checked before anything runs, nothing left
behind (issue 37, items 3 to 7).

- sizes (``limit``, ``context``): at most 1 EiB, text at most a short size; before,
  ``limit=10**30`` was saved and then refused by ``load``, ``limit="9"*400`` made
  ``str(prof)`` raise OverflowError;
- ``world_size``: 1 to 2**20 ranks; before, 10**9 built a dict per rank until MemoryError
  and 2**31 gave pybind's TypeError; a failure leaves no process group;
- steps (``steps=``, ``--steps``, ``keep=``): ASCII digits, at most 10**9;
- allocator settings: ASCII digits below 2**64 (as torch's ``stoul``), errors quoting only a
  short prefix of the setting;
- the expandable-segments model takes blocks of 1 TiB and more;
- ``--html`` refuses a folder or no name before the cell runs.
"""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError

import jupyter_memprof
from jupyter_memprof import CaptureError, EstimateError
from jupyter_memprof._units import MAX_BYTES


def _step(model, x):
    model(x).sum().backward()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 8), torch.randn(2, 8)


def one_line(exc_info, limit: int = 300) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg and len(msg) <= limit, msg
    return msg


# -- sizes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("option", ["limit", "context"])
@pytest.mark.parametrize(
    "value",
    [10**30, "9" * 400, "9" * 30 + "GiB", "1e400", 1e300, "²", "1" * 100_000, "2EiB"],
    ids=repr,
)
def test_sizes_over_the_bound_are_one_line(model, option, value):
    kwargs = {option: value, "device": "cuda"}
    if option == "context":
        kwargs["limit"] = "1GiB"
    with pytest.raises(EstimateError) as info:
        jupyter_memprof.estimate(_step, *model, **kwargs)
    assert one_line(info).startswith(f"{option}: ")


def test_the_largest_size_saves_and_loads(model, tmp_path):
    prof = jupyter_memprof.estimate(_step, *model, device="cuda", limit=MAX_BYTES)
    assert prof.meta["limit"] == 2**60
    loaded = jupyter_memprof.load(prof.save(tmp_path / "p.memprof"))
    assert loaded.meta["limit"] == 2**60
    assert "fits in the limit of 1024.0 PiB" in str(loaded)


# -- world_size -----------------------------------------------------------------------------
@pytest.mark.parametrize("ranks", [0, -1, 10**9, 2**31, 2**63, 2**20 + 1, True, "2", 2.0])
def test_world_size_out_of_range_is_one_line(model, ranks):
    with pytest.raises(EstimateError) as info:
        jupyter_memprof.estimate(_step, *model, world_size=ranks)
    assert one_line(info).startswith("world_size must be a whole number of ranks from 1 to")
    assert not torch.distributed.is_initialized()


def test_nothing_left_behind_after_a_failure(model):
    def fails(model, x):
        _step(model, x)
        raise RuntimeError("the step's own error")

    with pytest.raises(RuntimeError):
        jupyter_memprof.estimate(fails, *model, world_size=4)
    assert not torch.distributed.is_initialized()
    prof = jupyter_memprof.estimate(_step, *model, world_size=2**20)  # the largest
    assert prof.meta["world_size"] == 2**20
    assert not torch.distributed.is_initialized()


# -- steps ----------------------------------------------------------------------------------
@pytest.mark.parametrize("steps", ["²", "١٢", 10**30, 10**9 + 1, "9" * 400, "0", -3])
def test_steps_are_ascii_digits_and_bounded(steps):
    with pytest.raises(CaptureError) as info:
        jupyter_memprof.profile(steps=steps)
    assert "steps needs the number of steps per window" in one_line(info)


@pytest.mark.parametrize("keep", ["²", "first,١", [10**30], "9" * 400])
def test_keep_is_ascii_digits_and_bounded(keep):
    with pytest.raises(CaptureError) as info:
        jupyter_memprof.profile(steps=2, keep=keep)
    assert "is not a step to keep" in one_line(info)


def test_steps_as_ascii_text_work():
    assert jupyter_memprof.profile(steps=" 12 ", keep="first, 7")._long.steps_per_window == 12


# -- allocator settings ---------------------------------------------------------------------
_SETTINGS = [
    "max_split_size_mb:²",
    "roundup_power2_divisions:[256:²]",
    "roundup_power2_divisions:[²:4]",
    "pinned_num_register_threads:²",
    "garbage_collection_threshold:٠.٥",
    f"max_split_size_mb:{2**200}",
    f"roundup_power2_divisions:{2**64}",
    "max_split_size_mb:" + "x" * 100_000,
    "x" * 100_000 + ":1",
    "expandable_segments:" + "T" * 100_000,
]


@pytest.mark.parametrize("setting", _SETTINGS, ids=lambda s: s[:40])
def test_allocator_settings_are_one_short_line(model, setting, monkeypatch):
    with pytest.raises(EstimateError) as info:
        jupyter_memprof.estimate(_step, *model, device="cuda", allocator=setting)
    msg = one_line(info, 600)  # the unknown-name line lists the known ones
    assert msg.startswith(f"allocator setting {setting[:100]!r}"), msg
    with pytest.raises(CaptureError) as info:
        jupyter_memprof.profile(allocator=setting)
    one_line(info, 600)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", setting)
    with pytest.raises(CaptureError) as info:
        jupyter_memprof.profile()
    assert one_line(info, 630).startswith("PYTORCH_CUDA_ALLOC_CONF: allocator setting")


def test_allocator_numbers_torch_takes_are_taken(model):
    big = 2**64 - 1  # stoul's largest
    prof = jupyter_memprof.estimate(
        _step,
        *model,
        device="cuda",
        allocator=f"max_split_size_mb:{big},roundup_power2_divisions:4",
    )
    assert prof.meta["allocator"].startswith("max_split_size_mb:18446744073709551615")


def test_allocator_option_of_the_magic_is_one_line(shell, run):
    result, out = run("%%memprofile --allocator max_split_size_mb:²\nnot_run_alloc = 1")
    assert isinstance(result.error_in_exec, UsageError)
    assert "max_split_size_mb takes a whole number, not '²'" in out
    assert "not_run_alloc" not in shell.user_ns


# -- the expandable-segments model ----------------------------------------------------------
def _huge(n):
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    del a, b


@pytest.mark.parametrize(
    "n,reserved",
    [
        (2**40, 2**40 + 20 * 2**20),  # the block fills a segment; the next gets its own
        (2**40 + 1, 2**40 + 24 * 2**20),  # whole 20 MiB pages, the next in what is left
        (3 * 2**40, 3 * 2**40 + 12 * 2**20),
        (2**50, 2**50 + 16 * 2**20),
    ],
)
def test_expandable_segments_take_blocks_of_a_tebibyte(n, reserved):
    """Before: KeyError in _grow_expandable for any block over 1 TiB."""
    for limit in (None, "80GiB"):
        prof = jupyter_memprof.estimate(
            _huge, n, device="cuda", allocator="expandable_segments:True", limit=limit
        )
        assert prof.meta["reserved_peak_bytes"] == {"cuda:0": reserved}
        assert int(prof.allocations["size_bytes"].max()) == -(-n // 512) * 512
    assert prof.meta["oom"]["cause"] == "tensors"


# -- --html ---------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["{folder}", "{folder}/", "''", '""'])
def test_html_target_refused_before_the_cell_runs(shell, run, tmp_path, target):
    folder = tmp_path / "reports"
    folder.mkdir()
    result, out = run(
        f"%%memprofile --html {target.format(folder=folder)}\nran_html = torch.empty(10)"
    )
    assert isinstance(result.error_in_exec, UsageError), out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("UsageError: --html"), out
    assert "ran_html" not in shell.user_ns
    assert list(folder.iterdir()) == []


def test_html_with_force_refuses_a_folder_too(shell, run, tmp_path):
    result, out = run(f"%%memprofile --force --html {tmp_path}\nran_force = 1")
    assert isinstance(result.error_in_exec, UsageError)
    assert "is a folder" in out and "ran_force" not in shell.user_ns


# -- counts and names in the result's methods -----------------------------------------------
def test_counts_and_devices_of_a_profile_are_one_short_line():
    with jupyter_memprof.profile(namespace={}) as prof:
        torch.ones(100)
    with pytest.raises(TypeError) as info:
        prof.explain_text(rows="9" * 400)
    assert "takes a whole number of rows" in one_line(info, 200)
    with pytest.raises(ValueError) as info:
        prof.peak("x" * 100_000)
    assert "no memory events on device 'xxx" in one_line(info, 200)
    assert len(prof.explain(rows=10**30)) >= 1  # more rows than groups: all of them
