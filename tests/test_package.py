import json
import pathlib
import subprocess
import sys

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
            "CaptureError",
            "EstimateError",
            "Profile",
            "ProfileFileError",
            "__version__",
            "estimate",
            "load",
            "load_ipython_extension",
            "profile",
            "unload_ipython_extension",
        ]
    )
    for name in jupyter_memprof.__all__:
        assert getattr(jupyter_memprof, name) is not None


def test_import_is_light():
    # `import jupyter_memprof` must not drag in torch, pandas or bokeh.
    code = "import sys, jupyter_memprof; print(sorted(m for m in ('torch','pandas','bokeh') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_extension_entry_points_exist():
    assert callable(jupyter_memprof.load_ipython_extension)
    assert callable(jupyter_memprof.unload_ipython_extension)
