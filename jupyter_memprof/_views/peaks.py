"""Each device's peak, computed once per profile for every view.

Under a ``%%memprofile`` cell the summary's text, its HTML and the dashboard each show the
peak of every device: they read it here, where it is computed the first time a view asks
(:func:`jupyter_memprof._analysis.peak.peak_point`) and kept while the profile and its
tables are the same (:class:`.memo.LastProfile`).
"""

from __future__ import annotations

from .._analysis import peak as _peak
from .memo import LastProfile

_points = LastProfile()


def peak_point(prof, device: str) -> _peak.PeakPoint:
    """The peak of ``device`` (what ``prof.peak(device)`` reports, without the blocks'
    details): :func:`jupyter_memprof._analysis.peak.peak_point` of ``prof``'s tables, once.
    What the analysis raises (no memory events on ``device``) is raised again each time."""
    points = _points.get(prof, "peaks")
    if points is None:
        points = {}
        _points.put(prof, "peaks", points)
    if device not in points:
        try:
            points[device] = _peak.peak_point(prof.tables, device)
        except Exception as err:  # kept: asking again gives the same answer
            points[device] = err
    found = points[device]
    if isinstance(found, Exception):
        raise found.with_traceback(None)
    return found


def forget(prof=None) -> None:
    """Drop the peaks kept for ``prof`` (for any profile when None)."""
    _points.forget(prof)
