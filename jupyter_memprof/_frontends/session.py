"""This process's profiles, newest last, for the JupyterLab panel.

Capture code calls :func:`add` with every finished profile; listeners (the comm that
talks to the JupyterLab extension) subscribe with :func:`subscribe` and hear about
additions and releases. The registry holds profiles strongly until released, so the panel
can reopen any of them.

:func:`release` (``jupyter_memprof.release``) drops every reference the package holds to a
profile: its registry entry, every open dashboard of it (under a ``%%memprofile`` cell, from
``prof.show()``, in a panel tab: found through the views' weak registry), the widgets front
ends showed for it (:func:`track`), ``_memprof`` in the IPython namespace when it is that
profile, and (through the listeners) the panel comm's caches. The profile object itself is
left as it is: a name the user holds still works, and the tables go when it goes.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._results.profile import Profile

log = logging.getLogger(__name__)

_lock = threading.Lock()
_ids = itertools.count(1)
_profiles: dict[int, Profile] = {}
_listeners: list[Callable[[str, int, Profile | None], Any]] = []
# sid -> {widget: kind} a front end displayed for that profile ("dashboard", or "comparison":
# one comparison is tracked under both its profiles), closed on release. Weak: an open
# widget is kept alive by ipywidgets until it is closed.
_tracked: dict[int, weakref.WeakKeyDictionary] = {}

#: The user-namespace variable the magic keeps the latest profile in.
LAST = "_memprof"


def add(profile: Profile) -> int:
    """Register a finished profile; returns its session id (also set as ``profile.session_id``)."""
    with _lock:
        sid = next(_ids)
        _profiles[sid] = profile
        listeners = list(_listeners)
    profile.session_id = sid
    for fn in listeners:
        fn("added", sid, profile)
    return sid


def get(sid: int) -> Profile:
    try:
        return _profiles[sid]
    except KeyError:
        raise KeyError(f"no profile {sid} in this session (released or never captured)") from None


def items() -> list[tuple[int, Profile]]:
    with _lock:
        return list(_profiles.items())


def track(sid: int, widget: Any, kind: str = "dashboard") -> None:
    """Close ``widget`` when profile ``sid`` is released (held weakly); ``kind`` is
    ``"dashboard"`` or ``"comparison"`` (see :func:`close_tracked`)."""
    with _lock:
        _tracked.setdefault(int(sid), weakref.WeakKeyDictionary())[widget] = kind


def close_tracked(sid: int | None = None, kind: str | None = None) -> None:
    """Close the widgets tracked for profile ``sid`` (for every profile when None), only
    those of ``kind`` when given, with everything under them, and stop tracking them; the
    profile itself stays. The panel closes a dashboard tab's widgets this way, leaving a
    comparison of the same profile open in another tab."""
    widgets = []
    with _lock:
        for s in list(_tracked) if sid is None else [int(sid)]:
            group = _tracked.get(s)
            if group is None:
                continue
            for w, k in list(group.items()):
                if kind is None or k == kind:
                    widgets.append(w)
                    del group[w]
            if not group:
                del _tracked[s]
    _close(widgets)


def release(sid: int) -> bool:
    """Forget profile ``sid`` and drop every reference the package holds to it (see the
    module's docstring); True when it was registered. Listeners hear ``"released"`` only
    then: releasing an unknown id tells nobody anything."""
    close_tracked(sid)
    with _lock:
        profile = _profiles.pop(sid, None)
        listeners = list(_listeners)
    if profile is None:
        return False
    _forget(profile)
    for fn in listeners:
        try:
            fn("released", sid, None)
        except Exception:  # a listener must not keep the others from hearing it
            log.warning("a release listener failed for profile %s", sid, exc_info=True)
    return True


def release_profile(prof: Profile | int | None = None) -> int:
    """Drop every reference jupyter_memprof holds to a profile (``jupyter_memprof.release``).

    That is the session's registry and the panel's list, every open dashboard of it (closed:
    under the cell, from ``prof.show()``, in panel tabs) and ``_memprof`` when it holds that
    profile. Names you bound yourself (``prof``, ``-o name``) still hold it; once they are
    gone its tables are freed.

    Parameters
    ----------
    prof : Profile or int, optional
        The profile or its ``session_id``; None: every profile of the session. A Profile
        that is not registered (loaded from a file, released before) is still closed
        everywhere it is shown.

    Returns
    -------
    int
        How many registered profiles were released.

    Raises
    ------
    KeyError
        An id that is not registered.
    """
    from .._producers.recorder import LATER
    from .._producers.slot import SLOT
    from .._results.profile import Profile

    LATER.free()  # torch's raw results not freed yet (they belong to no profile)
    SLOT.free_abandoned()  # a capture whose thread ended without finishing it
    if prof is None:
        n = sum(release(sid) for sid, _ in items())
        _forget(None)
        return n
    if isinstance(prof, Profile):
        sids = [sid for sid, p in items() if p is prof]
        n = sum(release(sid) for sid in sids)
        if not sids:
            _forget(prof)
        return n
    if isinstance(prof, int) and not isinstance(prof, bool):
        if not release(prof):
            raise KeyError(f"no profile {prof} in this session (released or never captured)")
        return 1
    raise TypeError(f"release() takes a Profile, a session id or None, not {type(prof).__name__}")


def clear() -> None:
    for sid, _ in items():
        release(sid)


def _forget(profile: Profile | None) -> None:
    """Close the open dashboards of ``profile`` (all of them when None) and drop ``_memprof``
    when it holds that profile (any profile when None)."""
    # Only if the views were ever imported: no dashboard exists otherwise (and importing
    # them would load Bokeh and ipywidgets for nothing).
    views = f"{__package__.rsplit('.', 1)[0]}._views"
    if f"{views}.dashboard.widget" in sys.modules:
        from .._views.dashboard.widget import close_dashboards

        try:
            close_dashboards(profile)
        except Exception:
            log.warning("closing the dashboards of a released profile failed", exc_info=True)
    if f"{views}.dashboard" in sys.modules:  # its reused selection (e.g. after to_html)
        from .._views.dashboard.page import forget

        forget(profile)
    if profile is None:
        close_tracked()
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover (IPython is a dependency)
        return
    shell = get_ipython()
    ns = getattr(shell, "user_ns", None)
    if ns is None:
        return
    last = ns.get(LAST)
    if last is not None and (last is profile or (profile is None and _is_profile(last))):
        del ns[LAST]


def _is_profile(obj: Any) -> bool:
    from .._results.profile import Profile

    return isinstance(obj, Profile)


def _close(widgets: list) -> None:
    """Close each widget and every widget under it: ipywidgets keeps every open widget (each
    layout and style too) in a registry, so a released profile would otherwise stay alive
    through its dashboard."""
    if not widgets:
        return
    # the widgets are our views': their module is loaded already
    from .._views.dashboard.widget import close_tree

    for w in widgets:
        try:
            close_tree(w)
        except Exception:
            log.debug("closing a widget of a released profile failed", exc_info=True)


def subscribe(fn: Callable[[str, int, Profile | None], Any]) -> Callable[[], None]:
    """Call ``fn(action, sid, profile)`` on every add/release; returns an unsubscribe function."""
    with _lock:
        _listeners.append(fn)

    def unsubscribe() -> None:
        with _lock:
            if fn in _listeners:
                _listeners.remove(fn)

    return unsubscribe
