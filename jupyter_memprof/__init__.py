"""jupyter_memprof: where did my PyTorch memory go?

Load it in IPython or Jupyter with ``%load_ext jupyter_memprof`` and put ``%%memprofile`` on
top of a cell, or use :func:`profile` as a context manager anywhere.
"""

from ._version import __version__ as __version__

#: Each public name but the two extension hooks: the module it lives in and its name there,
#: imported on first use so that ``import jupyter_memprof`` stays light (torch, pandas and
#: bokeh load when a name that needs them is first read).
_LAZY: dict[str, tuple[str, str]] = {
    # capturing, estimating, opening files
    "profile": ("._frontends.capture", "profile"),
    "step": ("._frontends.capture", "step"),
    "estimate": ("._frontends.estimate", "estimate"),
    "what_if": ("._frontends.whatif", "what_if"),
    "what_if_widget": ("._frontends.whatif_widget", "what_if_widget"),
    "fit": ("._frontends.fit", "fit"),
    "load": ("._frontends.traces", "load_any"),
    "load_trace": ("._frontends.traces", "load_trace"),
    "load_snapshot": ("._frontends.snapshot", "load_snapshot"),
    "load_many": ("._frontends.ranks", "load_many"),
    "release": ("._frontends.session", "release_profile"),
    "compare": ("._results.comparison", "compare"),
    "diff": ("._results.diff", "diff"),
    # what they return
    "Profile": ("._results.profile", "Profile"),
    "ProfileSet": ("._results.profile_set", "ProfileSet"),
    "Comparison": ("._results.comparison", "Comparison"),
    "Diff": ("._results.diff", "Diff"),
    "Fit": ("._results.fit", "Fit"),
    # the errors users meet
    "CaptureError": ("._errors", "CaptureError"),
    "EstimateError": ("._errors", "EstimateError"),
    "ProfileFileError": ("._errors", "ProfileFileError"),
    "ProfilerBusy": ("._errors", "ProfilerBusy"),
    "ExportError": ("._errors", "ExportError"),
    "DeviceError": ("._errors", "DeviceError"),
    "AllocatorConfigError": ("._errors", "AllocatorConfigError"),
}

__all__ = sorted([*_LAZY, "__version__", "load_ipython_extension", "unload_ipython_extension"])


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'jupyter_memprof' has no attribute {name!r}") from None
    from importlib import import_module

    return getattr(import_module(module, __name__), attr)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def load_ipython_extension(ipython) -> None:
    """Register ``%%memprofile`` / ``%memprofile`` (called by ``%load_ext jupyter_memprof``)."""
    from ._frontends.magic import load_extension

    load_extension(ipython)


def unload_ipython_extension(ipython) -> None:
    """Remove the magics and every trace of the extension (``%unload_ext jupyter_memprof``)."""
    from ._frontends.magic import unload_extension

    unload_extension(ipython)
