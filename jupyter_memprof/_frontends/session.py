"""Profiles captured in this Python process, newest last, for the JupyterLab panel.

Capture code calls :func:`add` with every finished profile; listeners (the comm that
talks to the JupyterLab extension) subscribe with :func:`subscribe` and hear about
additions and releases. The registry holds profiles strongly until released, so the panel
can reopen any of them; :func:`release` drops one and frees its tables.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._profile import Profile

_lock = threading.Lock()
_ids = itertools.count(1)
_profiles: dict[int, Profile] = {}
_listeners: list[Callable[[str, int, Profile | None], Any]] = []


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


def release(sid: int) -> bool:
    """Forget profile ``sid``; True when it was there."""
    with _lock:
        profile = _profiles.pop(sid, None)
        listeners = list(_listeners)
    if profile is None:
        return False
    for fn in listeners:
        fn("released", sid, None)
    return True


def clear() -> None:
    for sid, _ in items():
        release(sid)


def subscribe(fn: Callable[[str, int, Profile | None], Any]) -> Callable[[], None]:
    """Call ``fn(action, sid, profile)`` on every add/release; returns an unsubscribe function."""
    with _lock:
        _listeners.append(fn)

    def unsubscribe() -> None:
        with _lock:
            if fn in _listeners:
                _listeners.remove(fn)

    return unsubscribe
