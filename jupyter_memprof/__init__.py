"""jupyter_memprof: where did my PyTorch memory go?

Load it in IPython or Jupyter with ``%load_ext jupyter_memprof`` and put ``%%memprofile`` on
top of a cell, or use :func:`profile` as a context manager anywhere.
"""

from ._version import __version__

__all__ = [
    "CaptureError",
    "Profile",
    "ProfileFileError",
    "ProfilerBusy",
    "EstimateError",
    "ProfileSet",
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


def __getattr__(name: str):
    # Keep `import jupyter_memprof` light: torch, pandas and bokeh load on first use.
    if name in ("profile", "step"):
        from ._frontends import capture

        return getattr(capture, name)
    if name == "Profile":
        from ._results.profile import Profile

        return Profile
    if name == "estimate":
        from ._frontends.estimate import estimate

        return estimate
    if name in ("CaptureError", "EstimateError", "ProfileFileError", "ProfilerBusy"):
        from . import _errors

        return getattr(_errors, name)
    if name == "load":
        from ._frontends.traces import load_any as load

        return load
    if name == "load_trace":
        from ._frontends.traces import load_trace

        return load_trace
    if name == "load_snapshot":
        from ._frontends.snapshot import load_snapshot

        return load_snapshot
    if name == "load_many":
        from ._frontends.ranks import load_many

        return load_many
    if name == "ProfileSet":
        from ._results.profile_set import ProfileSet

        return ProfileSet
    if name == "diff":
        from ._results.profile import diff

        return diff
    if name == "release":
        from ._frontends.session import release_profile as release

        return release
    if name == "fit":
        from ._frontends.fit import fit

        return fit
    if name == "what_if_widget":
        from ._frontends.whatif_widget import what_if_widget

        return what_if_widget
    if name == "what_if":
        from ._frontends.whatif import what_if

        return what_if
    if name == "compare":
        from ._results.comparison import compare

        return compare
    raise AttributeError(f"module 'jupyter_memprof' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """Register ``%%memprofile`` / ``%memprofile`` (called by ``%load_ext jupyter_memprof``)."""
    from ._frontends.magic import load_extension

    load_extension(ipython)


def unload_ipython_extension(ipython) -> None:
    """Remove the magics and every trace of the extension (``%unload_ext jupyter_memprof``)."""
    from ._frontends.magic import unload_extension

    unload_extension(ipython)
