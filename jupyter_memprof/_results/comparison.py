"""Two profiles compared: a result of its own, like a profile.

:class:`Comparison` holds both profiles and their diffs (one per grouping, computed once);
its views (both timelines on one axis, the diff table, the standalone page) are drawn by
:mod:`jupyter_memprof._views.compare`. :func:`compare` and :func:`jupyter_memprof.what_if`
make them.
"""

from __future__ import annotations

import os

from .._analysis.diff import diff as diff_tables
from .._views import compare as view
from .diff import Diff
from .profile import Profile, as_profile

__all__ = ["Comparison", "compare"]


class Comparison:
    """Two profiles compared: ``.diff(by)``, ``.summary``, ``.to_html(path)``, and in a
    notebook an interactive view (both timelines, the diff table; click a row to highlight
    it in both)."""

    def __init__(
        self, a: Profile, b: Profile, *, device: str | None = None, untouched: bool = False
    ):
        self.a, self.b = a, b
        self.device = device
        self.untouched = untouched  # memory neither step touched: left out unless True
        self._diffs: dict[str, Diff] = {}

    def diff(self, by: str = "category") -> Diff:
        """:func:`jupyter_memprof.diff` of the two profiles (cached)."""
        if by not in self._diffs:
            self._diffs[by] = Diff.of(
                diff_tables(
                    self.a.tables,
                    self.b.tables,
                    by,
                    device=self.device,
                    labels=(self.a.label, self.b.label),
                    untouched=self.untouched,
                )
            )
        return self._diffs[by]

    @property
    def summary(self) -> str:
        """``peak +6.1 MiB (+48%): activation +5.9 MiB, mostly model.encoder.layers.*``"""
        return str(self.diff("category").attrs["summary"])

    # -- views -------------------------------------------------------------------------------
    def build(self) -> view.Built:
        return view.build(self)

    def to_html(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write the comparison as one standalone interactive HTML file; returns the path.

        Written atomically; an existing file is replaced when it is a page this package
        wrote, or with ``overwrite=True`` (anything else raises ``FileExistsError`` before
        the view is built)."""
        return view.write_html(self, path, overwrite=overwrite)

    def show(self):
        """The comparison as a notebook widget."""
        return view.widget(self)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.show())

    def __repr__(self) -> str:
        return self.diff("category").text()


def compare(a, b, *, device: str | None = None, untouched: bool = False) -> Comparison:
    """Compare two profiles: both timelines on one time axis, and the diff of their peaks.

    The timelines are aligned at the start of the profiled code, on one byte scale (an
    estimate against a real capture gets one x axis each: records and ms); a click on a row
    of the diff highlights that category, module or op in both.

    Parameters
    ----------
    a, b : Profile or str or os.PathLike
        Two profiles, or the paths of saved ones.
    device : str, optional
        The device compared; default: each profile's device with the highest peak.
    untouched : bool, default False
        Include memory neither step touched (blocks from before the capture that no op
        read or wrote, alive at its end: an earlier cell's outputs); left out by default,
        so the headline is the step's own change.

    Returns
    -------
    Comparison
        ``.a``, ``.b``, ``.diff(by)``, ``.summary``, ``.to_html(path)``; in a notebook it
        shows as a widget.

    Raises
    ------
    TypeError
        ``a`` or ``b`` is neither a Profile nor a path.
    ProfileFileError
        A saved file that does not load.

    Examples
    --------
    >>> cmp = jupyter_memprof.compare("batch32.memprof", "batch64.memprof")  # doctest: +SKIP
    >>> cmp.summary  # doctest: +SKIP
    """
    return Comparison(as_profile(a, "a"), as_profile(b, "b"), device=device, untouched=untouched)
