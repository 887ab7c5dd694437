import json
import pathlib
import subprocess
import sys

import pytest

import jupyter_memprof

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_version_is_one_number_shared_with_the_labextension():
    package_json = json.loads((ROOT / "labextension" / "package.json").read_text())
    assert jupyter_memprof.__version__ == package_json["version"]
    major, minor, patch = (int(p) for p in jupyter_memprof.__version__.split("."))
    assert (major, minor, patch) >= (0, 1, 0)


def test_public_surface_is_small():
    assert sorted(jupyter_memprof.__all__) == sorted(
        [
            "AllocatorConfigError",
            "CaptureError",
            "Comparison",
            "DeviceError",
            "Diff",
            "EstimateError",
            "ExportError",
            "Fit",
            "Profile",
            "ProfileFileError",
            "ProfileSet",
            "ProfilerBusy",
            "__version__",
            "compare",
            "diff",
            "estimate",
            "fit",
            "load",
            "load_ipython_extension",
            "load_many",
            "load_trace",
            "load_snapshot",
            "profile",
            "release",
            "step",
            "unload_ipython_extension",
            "what_if",
            "what_if_widget",
        ]
    )
    from jupyter_memprof._errors import CaptureError, ProfileFileError
    from jupyter_memprof._frontends.capture import profile
    from jupyter_memprof._frontends.snapshot import load_snapshot
    from jupyter_memprof._frontends.traces import load_any, load_trace
    from jupyter_memprof._results.profile import Profile

    assert jupyter_memprof.profile is profile
    assert jupyter_memprof.Profile is Profile
    assert jupyter_memprof.load is load_any  # saved profiles, and traces by content
    assert jupyter_memprof.load_trace is load_trace
    assert jupyter_memprof.load_snapshot is load_snapshot
    from jupyter_memprof._frontends.whatif import what_if

    assert jupyter_memprof.what_if is what_if
    from jupyter_memprof._frontends.fit import fit

    assert jupyter_memprof.fit is fit
    assert jupyter_memprof.CaptureError is CaptureError and issubclass(CaptureError, ValueError)
    assert jupyter_memprof.ProfileFileError is ProfileFileError
    assert issubclass(ProfileFileError, ValueError)
    assert isinstance(jupyter_memprof.__version__, str)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        jupyter_memprof.nope  # noqa: B018


def test_import_is_light():
    # `import jupyter_memprof` must not drag in torch, pandas or bokeh.
    code = "import sys, jupyter_memprof; print(sorted(m for m in ('torch','pandas','bokeh') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_extension_entry_points_register_and_remove_the_magics(ipython_shell):
    shell = ipython_shell
    magics = shell.magics_manager.magics
    had = magics["cell"].get("memprofile")
    jupyter_memprof.unload_ipython_extension(shell)
    assert "memprofile" not in magics["cell"] and "memprofile" not in magics["line"]
    jupyter_memprof.load_ipython_extension(shell)
    cell, line = magics["cell"]["memprofile"], magics["line"]["memprofile"]
    assert cell.__func__.__qualname__ == "MemprofMagics.memprofile" and line == cell
    if had is None:  # leave the shell as it was
        jupyter_memprof.unload_ipython_extension(shell)


def test_every_public_name_is_listed_by_dir_and_resolves():
    names = dir(jupyter_memprof)
    for name in jupyter_memprof.__all__:
        assert name in names, name
        assert getattr(jupyter_memprof, name) is not None, name
    assert jupyter_memprof.Fit.__module__ == "jupyter_memprof._results.fit"
    assert issubclass(jupyter_memprof.ExportError, ValueError)
