"""%memprofile_open PATH driven through a real IPython shell: a snapshot, a saved profile,
and every bad input as one UsageError line."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from jupyter_memprof._frontends.magic import LAST
from jupyter_memprof._results.profile import Profile


@pytest.fixture(scope="module")
def files(shell, tmp_path_factory):
    """A real CPU step's profile written as a memory snapshot and as a saved zip."""
    folder = tmp_path_factory.mktemp("open")
    shell.run_cell(
        "import jupyter_memprof\n"
        "with jupyter_memprof.profile() as _p_src:\n"
        "    _kept_open = torch.empty(1003)\n"
        "    _tmp_open = torch.ones(303) * 2\n"
        "    del _tmp_open\n",
        store_history=True,
    )
    prof = shell.user_ns.pop("_p_src")
    del shell.user_ns["_kept_open"]
    return {
        "snapshot": prof.to_snapshot(folder / "step.pickle"),
        "zip": prof.save(folder / "step.zip"),
        "folder": folder,
        "source": prof,
    }


def _cpu_blocks(prof: Profile, nbytes: int):
    """The step's own blocks of a size (not those earlier cells left alive)."""
    a = prof.allocations
    return a[(a["size_bytes"] == nbytes) & (a["device"] == "cpu") & a["alloc_ns"].notna()]


def test_a_snapshot_opens_in_one_line_into_a_variable(shell, run, files):
    result, out = run(f"%memprofile_open {files['snapshot']} -o p_snap --no-display")
    assert result.success, out
    prof = shell.user_ns["p_snap"]
    assert prof is shell.user_ns[LAST]
    assert prof.meta["producer"] == "snapshot" and prof.meta["label"] == "step.pickle"
    # the tensor kept, and torch.ones(303) and its product
    assert len(_cpu_blocks(prof, 4012)) == 1 and len(_cpu_blocks(prof, 1212)) == 2
    source = files["source"].allocations
    assert sorted(prof.allocations["size_bytes"]) == sorted(source["size_bytes"])
    assert out == ""  # --no-display: nothing shown


def test_the_summary_is_shown_as_the_cell_magic_shows_it(shell, run, files):
    result, out = run(f"%memprofile_open '{files['zip']}' --label 'saved step'")
    assert result.success, out
    prof = shell.user_ns[LAST]
    assert prof.meta["label"] == "saved step"
    assert len(_cpu_blocks(prof, 4012)) == 1
    assert "saved step" in out and "peak" in out.lower()  # the text summary (no kernel)


def test_device_is_for_a_snapshot_only(shell, run, files):
    result, out = run(f"%memprofile_open {files['snapshot']} --device cpu")
    assert isinstance(result.error_in_exec, UsageError)
    assert "UsageError: %memprofile_open: ValueError: a memory snapshot records CUDA" in out
    result, out = run(f"%memprofile_open {files['zip']} --device cuda:0")
    assert isinstance(result.error_in_exec, UsageError)
    assert "UsageError: %memprofile_open: --device is for a memory snapshot" in out


@pytest.mark.parametrize(
    "line, message",
    [
        ("", "UsageError: %memprofile_open needs a file"),
        ("no/such/file.pickle", "UsageError: %memprofile_open: no such file or folder"),
        ("{bad} -o 1x", "UsageError: -o needs a Python variable name"),
        ("{bad} --bogus", "UsageError: %memprofile_open: unrecognized arguments: --bogus"),
        ("{bad}", "UsageError: %memprofile_open: /"),  # the path, then what it is not
        (
            "{trunc}",
            "UsageError: %memprofile_open: cut.pickle: not a readable pickle (pickle data was",
        ),
    ],
)
def test_a_bad_line_or_file_is_one_usage_error_line(shell, run, files, line, message):
    bad = files["folder"] / "junk.pickle"
    bad.write_bytes(b"not a snapshot at all")
    trunc = files["folder"] / "cut.pickle"
    with open(files["snapshot"], "rb") as f:
        trunc.write_bytes(f.read()[:200])
    before = shell.user_ns.get(LAST)
    result, out = run(f"%memprofile_open {line.format(bad=bad, trunc=trunc)}")
    assert isinstance(result.error_in_exec, UsageError), out
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), out
    assert shell.user_ns.get(LAST) is before  # nothing changed


def test_unload_removes_the_open_magic(ipython_shell):
    ip = ipython_shell
    ip.run_cell("%load_ext jupyter_memprof")
    assert "memprofile_open" in ip.magics_manager.magics["line"]
    ip.run_cell("%unload_ext jupyter_memprof")
    assert "memprofile_open" not in ip.magics_manager.magics["line"]
    ip.run_cell("%load_ext jupyter_memprof")
