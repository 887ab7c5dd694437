"""Kernel side of the JupyterLab "Memory profiles" panel.

The panel (``labextension/``) and the kernel talk over comms with the target name
:data:`TARGET`. Either side may open one:

- ``start(shell)`` (called by ``%load_ext jupyter_memprof``) registers the target, so a panel can
  open a comm later (after a page reload, or when it switches to this notebook), and opens one
  itself so a panel that is already watching this kernel hears about it at once. A front end
  without the panel closes that comm straight away.
- The panel asks for the list (``{"type": "list"}``) whenever it gets a comm, asks to release a
  profile (``{"type": "release", "sid": n}``), says when a dashboard tab closes
  (``{"type": "hide", "sid": n}``) and asks to compare two profiles
  (``{"type": "compare", "sids": [a, b]}``; the kernel answers with the same message plus the
  comparison's headline ``summary``, and the panel then opens a tab running
  :func:`show_comparison`).
- The kernel sends ``{"type": "list", "profiles": [...]}``, ``{"type": "added", "profile": {...}}``
  for every profile registered with :mod:`_session` (``%%memprofile`` or
  ``jupyter_memprof.profile()``) and ``{"type": "released", "sid": n}``.

Nothing is computed or sent while no comm is open: the registry listener is subscribed with
the first comm and unsubscribed with the last. The panel's dashboard tab runs :func:`show`
(silently, not stored in the history) and renders its outputs, so the dashboard has one
implementation, :meth:`Profile.show`.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

from .._version import __version__
from . import session as _session

if TYPE_CHECKING:
    from .._profile import Profile

TARGET = "jupyter_memprof"

log = logging.getLogger(__name__)

_comms: dict[str, Any] = {}  # comm_id -> open comm
_unsubscribe = None  # registry listener, set while at least one comm is open
_manager = None  # the kernel's comm manager while the target is registered
_infos: dict[int, dict[str, Any]] = {}  # sid -> announced summary (computed once)
_shown: dict[int, list[Any]] = {}  # sid -> widgets displayed by show(), closed on release/hide


# -- lifecycle ---------------------------------------------------------------------------------
def start(shell) -> None:
    """Serve the JupyterLab panel from this kernel (idempotent; nothing outside a kernel)."""
    global _manager
    if getattr(shell, "kernel", None) is None:  # terminal IPython: no front end to talk to
        return
    import comm

    if _manager is None:
        _manager = comm.get_comm_manager()
        _manager.register_target(TARGET, _on_open)
    # Tell a panel already watching this kernel that the extension is here now.
    _adopt(comm.create_comm(target_name=TARGET, data={"type": "hello", "version": __version__}))


def stop(shell) -> None:
    """Close every panel comm, forget the target and the registry listener."""
    global _manager
    for c in list(_comms.values()):
        try:
            c.close()
        except Exception:  # a kernel shutting down may have no iopub left
            log.debug("closing a panel comm failed", exc_info=True)
    _comms.clear()
    _listen(False)
    if _manager is not None:
        _manager.unregister_target(TARGET, _on_open)
        _manager = None
    for sid in list(_shown):
        _close_shown(sid)
    _infos.clear()


def show(sid: int) -> None:
    """Display profile ``sid``'s dashboard here (what the panel's dashboard tab executes)."""
    from IPython.display import display

    try:
        prof = _session.get(int(sid))
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return
    widget = prof.show()
    _shown.setdefault(int(sid), []).append(widget)
    display(widget)


def show_comparison(sid_a: int, sid_b: int) -> None:
    """Display the comparison of profiles ``sid_a`` and ``sid_b`` here (what the panel's
    comparison tab executes); it is closed when either profile is released."""
    from IPython.display import display

    from .._views.compare import compare

    try:
        a, b = _session.get(int(sid_a)), _session.get(int(sid_b))
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return
    widget = compare(a, b).show()
    for sid in (int(sid_a), int(sid_b)):
        _shown.setdefault(sid, []).append(widget)
    display(widget)


# -- comms -------------------------------------------------------------------------------------
def _on_open(comm, open_msg) -> None:
    """A panel opened a comm to this kernel."""
    _adopt(comm)


def _adopt(comm) -> None:
    _comms[comm.comm_id] = comm
    comm.on_msg(lambda msg, c=comm: _on_msg(c, msg))
    comm.on_close(lambda msg, cid=comm.comm_id: _forget(cid))
    _listen(True)


def _forget(comm_id: str) -> None:
    _comms.pop(comm_id, None)
    if not _comms:
        _listen(False)


def _listen(on: bool) -> None:
    global _unsubscribe
    if on and _unsubscribe is None:
        _unsubscribe = _session.subscribe(_on_registry)
    elif not on and _unsubscribe is not None:
        _unsubscribe()
        _unsubscribe = None


def _on_msg(comm, msg) -> None:
    data = msg.get("content", {}).get("data") or {}
    kind = data.get("type")
    if kind == "list":
        comm.send({"type": "list", "profiles": [_info(sid, p) for sid, p in _session.items()]})
    elif kind == "release":
        sid = _sid(data)
        if sid is not None and not _session.release(sid):
            # Already gone (released elsewhere): say so, so the panel drops it too.
            _on_registry("released", sid, None)
    elif kind == "hide":
        sid = _sid(data)
        if sid is not None:
            _close_shown(sid)
    elif kind == "compare":
        comm.send(_compare_reply(data))
    else:
        comm.send({"type": "error", "message": f"unknown request {kind!r}"})


def _sid(data: dict) -> int | None:
    try:
        return int(data["sid"])
    except (KeyError, TypeError, ValueError):
        return None


def _compare_reply(data: dict) -> dict:
    """The answer to ``{"type": "compare", "sids": [a, b]}``: the request with the headline
    of the comparison, or an error naming what is wrong."""
    sids = data.get("sids")
    if (
        not isinstance(sids, list)
        or len(sids) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in sids)
        or sids[0] == sids[1]
    ):
        return {"type": "error", "message": "compare needs two different profile ids"}
    try:
        a, b = (_session.get(s) for s in sids)
    except KeyError as e:
        return {"type": "error", "message": str(e.args[0])}
    try:
        from .._views.compare import compare

        summary = compare(a, b).summary
    except Exception as e:  # a profile whose peak cannot be computed: say why, keep serving
        log.warning("comparing profiles %s failed", sids, exc_info=True)
        return {"type": "error", "message": f"comparing failed: {type(e).__name__}: {e}"}
    return {"type": "compare", "sids": list(sids), "summary": summary}


def _on_registry(action: str, sid: int, profile: Profile | None) -> None:
    """Registry listener. It runs inside the capture's exit (or the user's ``release``), so
    a failure here is logged, never raised into the user's cell."""
    try:
        if action == "added" and profile is not None:
            message = {"type": "added", "profile": _info(sid, profile)}
        elif action == "released":
            _infos.pop(sid, None)
            _close_shown(sid)
            message = {"type": "released", "sid": sid}
        else:
            return
        for c in list(_comms.values()):
            c.send(message)
    except Exception:
        log.warning("telling the Memory profiles panel about profile %s failed", sid, exc_info=True)


def _close_shown(sid: int) -> None:
    """Close the widgets :func:`show` displayed for ``sid`` (and their children): ipywidgets
    keeps every open widget in a registry, so a released profile would otherwise stay alive
    through its dashboard."""
    stack = list(_shown.pop(sid, []))
    while stack:
        w = stack.pop()
        stack.extend(getattr(w, "children", ()) or ())
        close = getattr(w, "close", None)
        if callable(close):
            close()


# -- what the panel shows --------------------------------------------------------------------
def _info(sid: int, prof: Profile) -> dict[str, Any]:
    """One panel entry: label, peak per device, timings, table sizes, with the texts the
    summary prints for them (one formatting for the whole package). Computed once per
    profile (the peak is an analysis over the events) and cached until it is released."""
    from .._units import format_bytes, format_seconds

    info = _infos.get(sid)
    if info is not None:
        return info
    meta = prof.meta
    peaks = []
    for device in prof.devices:
        try:
            peak = int(prof.peak(device).attrs["peak_bytes"])
        except Exception:  # an entry must still appear when one analysis fails
            log.warning("peak of profile %s on %s failed", sid, device, exc_info=True)
            peak = None
        text = "?" if peak is None else format_bytes(peak)
        peaks.append({"device": str(device), "bytes": peak, "text": text})
    top = max((p for p in peaks if p["bytes"] is not None), key=lambda p: p["bytes"], default=None)
    wall_s = _float(meta.get("wall_s"))
    captured_at = meta.get("captured_at")  # time.time_ns() when the capture began
    info = {
        "sid": int(sid),
        "label": prof.label,
        "peaks": peaks,
        "peak_bytes": None if top is None else top["bytes"],
        "peak_text": "no peak" if top is None else top["text"],
        "wall_s": wall_s,
        "wall_text": None if wall_s is None else format_seconds(wall_s),
        "taken_ms": int(captured_at) // 1_000_000 if captured_at else None,
        "counts": {name: len(getattr(prof, name)) for name in ("ops", "allocations", "events")},
        "error": meta.get("error"),
        "estimate": bool(meta.get("estimate")),
    }
    _infos[sid] = info
    return info


def _float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
