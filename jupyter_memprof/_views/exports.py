"""Standard exports of a profile, chosen by the file's name.

- ``*.raw.json.gz``: torch's raw memory-timeline events, the layout that
  ``torch.profiler.profile.export_memory_timeline`` writes for that suffix
  (``torch/profiler/_memory_profiler.py``, ``export_memory_timeline_raw``): a JSON list of
  ``[time_ns, action, bytes, category]`` for one device, gzip-compressed. ``action`` is torch's
  ``Action`` value (1 preexisting, 2 create, 3 increment_version, 4 destroy); ``category`` is
  torch's index (0 parameter, 1 optimizer_state, 2 input, 3 temporary, 4 activation,
  5 gradient, 6 autograd_detail, 7 uncategorised, which is our ``unknown``). Blocks from
  before the capture have time ``-1``; an in-place write is two rows, minus the bytes in the
  old version's category and plus them in the new one's; destroys carry negative bytes.
- ``*.json`` (and ``*.json.gz``): torch's plain memory timeline ``[times, sizes]``: times in
  integer microseconds (``int(t / 1000)``, torch's own rounding), one row of sizes per
  distinct time, ``[0, parameter, optimizer_state, ..., autograd_detail, unknown]`` (torch
  leaves slot 0 empty), the live bytes per category after the last event at that time;
  blocks from before the capture count from the first time.
- ``*.trace.json`` / ``*.trace.json.gz``: Chrome trace events (Perfetto, chrome://tracing):
  one complete slice (``ph: X``) per op on its thread, with kind, phase, module, callsite and
  shapes as arguments; one counter track (``ph: C``) per device with the live bytes of every
  category after each event; flow arrows (``ph: s``/``f``, bound to the enclosing slice as
  kineto binds its own forward-backward flows) from each forward op to its backward op.
  Times are microseconds since the capture started (:attr:`Profile.start_ns`), so nanoseconds
  survive JSON's floats.
- ``*.html``: the dashboard, as :meth:`Profile.to_html`.

The torch formats are per device: with ``device=None`` a profile of one device writes
``path``; with several, ``{device}`` in the path (``cuda:1`` spelled ``cuda1``) names one file
per device, else the device is put in front of the suffix (``step.cuda0.raw.json.gz``).
Every file is written atomically (:mod:`jupyter_memprof._io`).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable

import numpy as np
import pandas as pd

from .._devices import device_sort_key
from .._errors import ExportError
from .._io import atomic_write, check_target, json_default
from .._vocab import Action, Category

__all__ = ["ExportError", "SUFFIXES", "export", "export_format"]


#: torch's ``_ACTION_TO_INDEX`` (``Action`` enum values, from 1)
TORCH_ACTION = {
    Action.PREEXISTING.value: 1,
    Action.CREATE.value: 2,
    Action.INCREMENT_VERSION.value: 3,
    Action.DESTROY.value: 4,
}
#: torch's ``_CATEGORY_TO_INDEX``; its ``None`` (no category) is our ``unknown``
TORCH_CATEGORY = {c.value: i for i, c in enumerate(Category)}
_CATEGORY_NAMES = Category.values()

# longest suffixes first: "x.trace.json" is a trace, not a plain timeline
SUFFIXES = (
    (".raw.json.gz", "raw"),
    (".trace.json.gz", "trace"),
    (".trace.json", "trace"),
    (".json.gz", "timeline"),
    (".json", "timeline"),
    (".html", "html"),
)


def export_format(path: str | os.PathLike) -> str:
    """The format ``path``'s suffix asks for: ``raw``, ``timeline``, ``trace`` or ``html``."""
    name = os.path.basename(os.fspath(path)).lower()
    for suffix, fmt in SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return fmt
    known = ", ".join(s for s, _ in SUFFIXES)
    raise ExportError(f"cannot export to {os.fspath(path)!r}: the name must end in one of {known}")


def _device_tag(device: str) -> str:
    return device.replace(":", "")


# -- torch's memory timeline -----------------------------------------------------------------
def raw_events(tables: dict[str, pd.DataFrame], device: str) -> list[list[int]]:
    """torch's raw memory-timeline rows ``[time_ns, action, bytes, category]`` for ``device``."""
    ev = tables["events"]
    ev = ev[ev["device"].astype(object).to_numpy() == device]
    if ev.empty:
        return []
    act = ev["action"].astype(object).to_numpy()
    size = ev["size_bytes"].to_numpy(dtype=np.int64)
    cat = ev["category"].astype(object).to_numpy()
    time = np.where(act == Action.PREEXISTING.value, -1, ev["time_ns"].to_numpy(np.int64))
    code = np.array([TORCH_ACTION[a] for a in act], dtype=np.int64)
    cidx = np.array([TORCH_CATEGORY[c] for c in cat], dtype=np.int64)
    sign = np.where(act == Action.DESTROY.value, -1, 1)
    rows = np.stack([time, code, sign * size, cidx], axis=1)
    bump = np.flatnonzero(act == Action.INCREMENT_VERSION.value)
    if len(bump):
        # the version before the write loses the bytes, the new version gains them
        key = tables["versions"].set_index(["alloc_id", "version"])["category"]
        prev = key.reindex(
            pd.MultiIndex.from_arrays(
                [
                    ev["alloc_id"].to_numpy()[bump],
                    ev["version"].to_numpy(dtype=np.int64, na_value=0)[bump] - 1,
                ]
            )
        )
        prev = prev.astype(object).fillna(Category.UNKNOWN.value).to_numpy()
        minus = rows[bump].copy()
        minus[:, 2] = -minus[:, 2]
        minus[:, 3] = [TORCH_CATEGORY[c] for c in prev]
        # each minus row goes right before its plus row
        rows = np.insert(rows, bump, minus, axis=0)
    # torch sorts by (time, action); keep event order among equals (a stable sort)
    order = np.lexsort((rows[:, 1], rows[:, 0]))
    return rows[order].tolist()


def coalesce(raw: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """torch's plain memory timeline from raw rows: ``(times_us, sizes)`` exactly as
    ``MemoryProfileTimeline._coalesce_timeline`` computes them (times ``int(t / 1000)``,
    consecutive rows at the same microsecond merged, slot 0 unused)."""
    if not raw:
        return [], []
    arr = np.asarray(raw, dtype=np.int64)
    t_ns = arr[:, 0]
    uniq, inverse = np.unique(t_ns, return_inverse=True)
    # torch's own rounding: Python's true division, then truncation
    us = np.array([t if t == -1 else int(t / 1000) for t in uniq.tolist()], dtype=np.int64)
    t_us = us[inverse]
    deltas = np.zeros((len(arr), len(_CATEGORY_NAMES) + 1), dtype=np.int64)
    np.add.at(deltas, (np.arange(len(arr)), arr[:, 3] + 1), arr[:, 2])
    live = np.cumsum(deltas, axis=0)
    last = np.append(t_us[1:] != t_us[:-1], True)  # the last row of each run of equal times
    times = t_us[last]
    # blocks from before the capture (time -1) count from torch's t_min: the first time
    positive = t_us[t_us > 0]
    t_min = int(positive.min()) if len(positive) else -1
    times = np.where(times < 0, t_min, times)
    return times.tolist(), live[last].tolist()


# -- Chrome trace events ---------------------------------------------------------------------
def _us(t_ns: np.ndarray, start_ns: int) -> list[float]:
    return ((t_ns.astype(np.int64) - start_ns) / 1000.0).tolist()


def _optional(values) -> list:
    return [None if v is pd.NA or v is None else v for v in values]


def trace_events(prof) -> dict:
    """The profile as a Chrome trace (a JSON object with ``traceEvents``)."""
    ops = prof.ops
    meta = prof.meta
    start_ns = prof.start_ns or 0
    pid = int(meta.get("rank") or 0)
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
         "args": {"name": f"jupyter_memprof: {prof.label}"}},
    ]  # fmt: skip
    threads = sorted(int(t) for t in ops["thread"].unique())
    for tid in threads:
        events.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
             "args": {"name": f"thread {tid}"}}
        )  # fmt: skip
    starts = _us(ops["start_ns"].to_numpy(), start_ns)
    durs = ((ops["end_ns"].to_numpy() - ops["start_ns"].to_numpy()).clip(0) / 1000.0).tolist()
    cols = zip(
        ops["op_id"].tolist(),
        ops["name"].astype(object).tolist(),
        ops["kind"].astype(object).tolist(),
        ops["phase"].astype(object).tolist(),
        ops["thread"].tolist(),
        starts,
        durs,
        _optional(ops["module"].astype(object)),
        _optional(ops["callsite"].astype(object)),
        _optional(ops["seq_nr"].astype(object)),
        ops["self_alloc_bytes"].tolist(),
        ops["input_shapes"].tolist(),
    )
    for op_id, name, kind, phase, tid, ts, dur, module, callsite, seq, alloc, shapes in cols:
        args = {"op_id": op_id, "kind": kind, "phase": phase}
        if module is not None:
            args["module"] = module
        if callsite is not None:
            args["callsite"] = callsite
        if seq is not None:
            args["seq_nr"] = seq
        if alloc:
            args["self_alloc_bytes"] = alloc
        if shapes:
            args["input_shapes"] = shapes
        events.append(
            {"ph": "X", "name": name, "cat": phase, "pid": pid, "tid": tid, "ts": ts,
             "dur": dur, "args": args}
        )  # fmt: skip
    events.extend(_counter_events(prof.timeline, prof.devices, start_ns, pid))
    events.extend(_flow_events(prof.flows, ops, start_ns, pid))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "generator": "jupyter_memprof",
            "label": prof.label,
            "start_ns": start_ns,
            **{k: meta[k] for k in ("rank", "world_size", "torch_version") if k in meta},
        },
    }


def _counter_events(
    timeline: pd.DataFrame, devices: list[str], start_ns: int, pid: int
) -> list[dict]:
    """One counter per device (``devices``, in their order): after each distinct time, the
    live bytes of every category that device has had (a category absent so far counts 0)."""
    out = []
    for device in devices:
        tl = timeline[timeline["device"].astype(object).to_numpy() == device]
        if tl.empty:
            continue
        wide = tl.pivot_table(
            index="time_ns", columns="category", values="bytes", aggfunc="last", observed=True
        )
        wide = wide.ffill().fillna(0).astype(np.int64)
        cats = [c for c in _CATEGORY_NAMES if c in wide.columns]
        ts = _us(wide.index.to_numpy(), start_ns)
        values = wide[cats].to_numpy().tolist()
        name = f"live bytes {device}"
        for t, row in zip(ts, values):
            out.append(
                {"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": t,
                 "args": dict(zip(cats, row))}
            )  # fmt: skip
    return out


def _flow_events(flows: pd.DataFrame, ops: pd.DataFrame, start_ns: int, pid: int) -> list[dict]:
    if flows.empty:
        return []
    by_id = ops.set_index("op_id")[["start_ns", "thread"]]
    fwd = by_id.reindex(flows["forward_op_id"].to_numpy())
    bwd = by_id.reindex(flows["backward_op_id"].to_numpy())
    out = []
    rows = zip(
        range(len(flows)),
        _us(fwd["start_ns"].to_numpy(), start_ns),
        fwd["thread"].tolist(),
        _us(bwd["start_ns"].to_numpy(), start_ns),
        bwd["thread"].tolist(),
        flows["seq_nr"].tolist(),
    )
    for i, fts, ftid, bts, btid, seq in rows:
        common = {"name": "forward -> backward", "cat": "autograd", "id": i + 1, "pid": pid}
        out.append({**common, "ph": "s", "tid": ftid, "ts": fts, "args": {"seq_nr": seq}})
        out.append({**common, "ph": "f", "bp": "e", "tid": btid, "ts": bts})
    return out


# -- writing ---------------------------------------------------------------------------------
def _json_writer(doc, gz: bool) -> Callable[[str], None]:
    def write(tmp: str) -> None:
        text = json.dumps(doc, separators=(",", ":"), default=json_default)
        if gz:
            with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as fh:
                fh.write(text)
        else:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)

    return write


def _devices(prof) -> list[str]:
    """:attr:`Profile.devices` (those with memory activity) and the devices the capture was
    asked to record but saw nothing on (each gets its empty file), in device order."""
    seen = prof.devices
    asked = [d for d in prof.meta.get("devices") or [] if d not in seen]
    return sorted([*seen, *asked], key=device_sort_key)


def _targets(prof, path: str, device: str | None) -> list[tuple[str, str]]:
    devices = _devices(prof)
    if device is not None:
        if device not in devices:
            have = ", ".join(devices) or "none"
            raise ExportError(f"this profile has no device {device!r} (it has: {have})")
        devices = [device]
    if not devices:
        raise ExportError("this profile recorded no device memory to export")
    if "{device}" in path:
        return [(d, path.replace("{device}", _device_tag(d))) for d in devices]
    if len(devices) == 1:
        return [(devices[0], path)]
    suffix = next(s for s, _ in SUFFIXES if path.lower().endswith(s))
    stem = path[: len(path) - len(suffix)]
    return [(d, f"{stem}.{_device_tag(d)}{suffix}") for d in devices]


def export(
    prof, path: str | os.PathLike, *, device: str | None = None, overwrite: bool = False
) -> str | list[str]:
    """Write ``prof`` to ``path`` in the format its suffix names (see the module docstring).

    Returns the absolute path written, or the list of paths when a torch format wrote one
    file per device. An existing file is replaced only when it has the same suffix (another
    export) or with ``overwrite=True``.
    """
    path = os.fspath(path)
    fmt = export_format(path)
    if fmt == "html":
        if device is not None:
            raise ExportError("device= applies to the torch memory-timeline formats only")
        from .dashboard.html import write_html

        return write_html(prof, path, overwrite=overwrite)
    gz = path.lower().endswith(".gz")
    if fmt == "trace":
        if device is not None:
            raise ExportError("device= applies to the torch memory-timeline formats only")
        jobs = [(path, trace_events(prof))]
    else:
        jobs = []
        for dev, target in _targets(prof, path, device):
            raw = raw_events(prof.tables, dev)
            jobs.append((target, raw if fmt == "raw" else list(coalesce(raw))))
    suffix = next(s for s, _ in SUFFIXES if path.lower().endswith(s))

    def own_kind(target: str) -> bool:
        return target.lower().endswith(suffix) and _looks_like(target, fmt, gz)

    for target, _ in jobs:  # refuse before writing anything
        check_target(target, what=f"{suffix} export", overwrite=overwrite, is_own_kind=own_kind)
    written = [
        atomic_write(
            target,
            _json_writer(doc, gz),
            what=f"{suffix} export",
            overwrite=overwrite,
            is_own_kind=own_kind,
        )
        for target, doc in jobs
    ]
    return written[0] if len(written) == 1 else written


def _looks_like(path: str, fmt: str, gz: bool) -> bool:
    """Whether an existing file starts as an export of this format would (so that replacing
    it loses nothing the user wrote): torch's lists, or our trace object."""
    try:
        opener = gzip.open if gz else open
        with opener(path, "rb") as fh:
            head = fh.read(64).lstrip()
    except (OSError, EOFError):
        return False
    if fmt == "trace":
        return head.startswith(b'{"traceEvents"')
    return head.startswith((b"[[", b"[]"))
