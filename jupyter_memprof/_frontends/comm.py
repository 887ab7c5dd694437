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
  :func:`show_comparison`). A page without BokehJS (reloaded) asks for it
  (``{"type": "bokehjs"}``; the answer ``{"type": "bokehjs", "js": ...}`` is the script a
  dashboard's output runs, :func:`.dashboard.html.notebook_bokehjs`), so that the dashboards
  it restores from the kernel can draw.
- The kernel sends ``{"type": "list", "profiles": [...]}``, ``{"type": "added", "profile": {...}}``
  for every profile registered with :mod:`_session` (``%%memprofile`` or
  ``jupyter_memprof.profile()``) and ``{"type": "released", "sid": n}`` to every open panel.

The shapes are declared once, below (:data:`REQUESTS` and the ``TypedDict`` s), and mirrored
in ``labextension/src/link.ts``. Every request is checked against :data:`REQUESTS`; a request
that is malformed, unknown or about a profile that is not there is answered with
``{"type": "error", "message": ..., "request": type or None, "sid": n or None}`` on the comm
that sent it, and on no other.

Nothing is computed or sent while no comm is open: the registry listener is subscribed with
the first comm and unsubscribed with the last. The panel's dashboard tab runs :func:`show`
(silently, not stored in the history) and renders its outputs, so the dashboard has one
implementation, :meth:`Profile.show`.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, TypedDict

from .._version import __version__
from . import session as _session

if TYPE_CHECKING:
    from .._results.profile import Profile

TARGET = "jupyter_memprof"

log = logging.getLogger(__name__)

_comms: dict[str, Any] = {}  # comm_id -> open comm
_unsubscribe = None  # registry listener, set while at least one comm is open
_manager = None  # the kernel's comm manager while the target is registered
_infos: dict[int, ProfileInfo] = {}  # sid -> announced summary (computed once)
# The widgets show() and show_comparison() display are tracked by the session
# (session.track), which closes them on release; "hide" and stop() close them there too.


# -- the protocol ------------------------------------------------------------------------------
#: Every request the panel may send: its ``type`` -> the fields it needs and their types.
REQUESTS: dict[str, dict[str, type]] = {
    "list": {},
    "release": {"sid": int},
    "hide": {"sid": int},
    "compare": {"sids": list},  # two different ints: checked by _compare_reply
    "bokehjs": {},
}


class DevicePeak(TypedDict):
    device: str
    bytes: int | None
    text: str  # as the summary prints it


class Counts(TypedDict):
    ops: int
    allocations: int
    events: int


class ProfileInfo(TypedDict):
    """One panel entry (``IProfileInfo`` in link.ts)."""

    sid: int
    label: str
    peaks: list[DevicePeak]
    peak_bytes: int | None
    peak_text: str
    wall_s: float | None
    wall_text: str | None
    taken_ms: int | None
    counts: Counts
    memory_bytes: int | None  # what its tables hold (DataFrame.memory_usage(deep=True))
    memory_text: str
    error: str | None
    estimate: bool


class ErrorReply(TypedDict):
    """Sent to the comm whose request failed, never to the others."""

    type: str  # "error"
    message: str
    request: str | None  # the request's type, when it had a known one
    sid: int | None  # the profile it was about, when it named one


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
    _session.close_tracked()
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
    _session.track(int(sid), widget)
    display(widget)


def show_comparison(sid_a: int, sid_b: int) -> None:
    """Display the comparison of profiles ``sid_a`` and ``sid_b`` here (what the panel's
    comparison tab executes); it is closed when either profile is released."""
    from IPython.display import display

    from .._results.comparison import compare

    try:
        a, b = _session.get(int(sid_a)), _session.get(int(sid_b))
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return
    widget = compare(a, b).show()
    for sid in (int(sid_a), int(sid_b)):
        _session.track(sid, widget, "comparison")
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
    """A request from one panel: answered on ``comm`` only (errors included); only a release
    that happened is told to every panel, by the registry listener."""
    try:
        reply = _answer(msg)
    except Exception as e:  # never raise into the kernel's comm dispatch
        log.warning("the Memory profiles panel's request failed", exc_info=True)
        reply = _error(f"the request failed: {type(e).__name__}: {e}")
    if reply is None:
        return
    try:
        comm.send(reply)
    except Exception:
        log.warning("answering the Memory profiles panel failed", exc_info=True)


def _answer(msg) -> dict | None:
    content = msg.get("content") if isinstance(msg, dict) else None
    data = content.get("data") if isinstance(content, dict) else None
    if not isinstance(data, dict):
        return _error(f"a request is a JSON object, not {type(data).__name__}")
    kind = data.get("type")
    fields = REQUESTS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return _error(f"unknown request {kind!r}")
    for name, want in fields.items():
        value = data.get(name)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            return _error(
                f"{kind} needs {name!r} ({want.__name__}), got {_json_type(value)}", request=kind
            )
    if kind == "list":
        live = _session.items()
        for sid in set(_infos) - {sid for sid, _ in live}:  # released while no panel listened
            _infos.pop(sid, None)
        return {"type": "list", "profiles": [_info(sid, p) for sid, p in live]}
    if kind == "release":
        sid = data["sid"]
        if _session.release(sid):
            return None  # every panel (this one too) hears "released" from the registry
        return _error(
            f"no profile {sid} in this session (released or never captured)",
            request=kind,
            sid=sid,
        )
    if kind == "hide":  # a dashboard tab closed: a comparison tab of it stays open
        _session.close_tracked(data["sid"], "dashboard")
        return None
    if kind == "bokehjs":  # a reloaded page: the dashboards it restores need BokehJS first
        from .._views.dashboard.html import notebook_bokehjs

        return {"type": "bokehjs", "js": notebook_bokehjs()}
    return _compare_reply(data)


def _error(message: str, *, request: str | None = None, sid: int | None = None) -> ErrorReply:
    return {"type": "error", "message": message, "request": request, "sid": sid}


def _json_type(value) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


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
        return _error("compare needs two different profile ids", request="compare")
    try:
        a, b = (_session.get(s) for s in sids)
    except KeyError as e:
        return _error(str(e.args[0]), request="compare")
    try:
        from .._results.comparison import compare

        summary = compare(a, b).summary
    except Exception as e:  # a profile whose peak cannot be computed: say why, keep serving
        log.warning("comparing profiles %s failed", sids, exc_info=True)
        return _error(f"comparing failed: {type(e).__name__}: {e}", request="compare")
    return {"type": "compare", "sids": list(sids), "summary": summary}


def _on_registry(action: str, sid: int, profile: Profile | None) -> None:
    """Registry listener. It runs inside the capture's exit (or the user's ``release``), so
    a failure here is logged, never raised into the user's cell."""
    try:
        if action == "added" and profile is not None:
            message = {"type": "added", "profile": _info(sid, profile)}
        elif action == "released":  # its widgets are closed already (session.release)
            _infos.pop(sid, None)
            message = {"type": "released", "sid": sid}
        else:
            return
        for c in list(_comms.values()):
            c.send(message)
    except Exception:
        log.warning("telling the Memory profiles panel about profile %s failed", sid, exc_info=True)


# -- what the panel shows --------------------------------------------------------------------
def _info(sid: int, prof: Profile) -> ProfileInfo:
    """One panel entry: label, peak per device, timings, table sizes and the memory the tables
    hold, with the texts the summary prints for them (one formatting for the whole package).
    Computed once per profile (the peak is an analysis over the events, the memory a pass
    over every string) and cached until it is released."""
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
    memory = _memory_bytes(prof)
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
        "memory_bytes": memory,
        "memory_text": "?" if memory is None else format_bytes(memory),
        "error": meta.get("error"),
        "estimate": bool(meta.get("estimate")),
    }
    _infos[sid] = info
    return info


def _memory_bytes(prof: Profile) -> int | None:
    """Bytes the profile's tables hold (index and every value, strings included)."""
    try:
        return int(sum(int(t.memory_usage(deep=True).sum()) for t in prof.tables.values()))
    except Exception:  # the entry must still appear
        log.warning("measuring a profile's tables failed", exc_info=True)
        return None


def _float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
