"""A profile as a torch memory snapshot, for memory_viz.

``Profile.to_snapshot(path)`` writes what ``torch.cuda.memory._dump_snapshot`` writes, built from
the tables of any profile (a capture on any device, an estimate, a loaded file), with the
``category`` field torch's own ``profile_plot`` puts on allocations
(``torch.cuda._memory_viz._profile_to_snapshot``), so a memory_viz user sees our categories:

- ``device_traces``: one list per device index, CUDA devices at their index and the CPU after
  the last CUDA device (torch's ``_profile_to_snapshot`` puts it at ``device_count()``); per
  memory event an ``alloc`` (with ``category``) or a ``free_requested`` and ``free_completed``
  pair, each with ``addr``, ``size``, ``stream`` (0), ``time_us`` and ``frames``. Blocks from
  before the capture are allocated at its first event, so the entries add up to the profile's
  live bytes and their highest total is its peak. An in-place write that changes a block's
  category frees it and allocates it again in the new category, as torch does.
- ``segments``: the blocks alive at the end, in address order, cut into segments where the
  gap between blocks is over :data:`SEGMENT_GAP` (or where blocks overlap, as an estimate's
  made-up addresses may); gaps are ``inactive`` blocks, so each segment's blocks fill it
  (``segsum`` checks this). These segments are drawn from the blocks, not recorded.
- ``frames``: innermost first, the allocating op and the ops around it (``filename`` ``"<op>"``),
  then the line of user code that ran it (the op's ``callsite``). Shared lists, one per op.
- ``jupyter_memprof``: what memory_viz ignores and our reader uses: the device names by
  index, the profile's label and the format version.

Plain data only (dict, list, str, int, bool, None), pickled at protocol 4, which every
memory_viz reads; written atomically (:mod:`jupyter_memprof._io`).
"""

from __future__ import annotations

import os
import pickle
import re

import pandas as pd

from .._devices import device_sort_key
from .._io import atomic_write
from .._vocab import Action, Category

__all__ = [
    "PICKLE_PROTOCOL",
    "SEGMENT_GAP",
    "looks_like_snapshot",
    "snapshot",
    "write_snapshot",
]

#: Blocks further apart than this (bytes) go into different segments.
SEGMENT_GAP = 2 * 1024 * 1024
#: The format of the ``jupyter_memprof`` key (bump when its meaning changes).
FORMAT = 1
PICKLE_PROTOCOL = 4
_CALLSITE = re.compile(r"^(?P<file>.*):(?P<line>\d+) in (?P<name>.*)$")


def device_indexes(devices: list[str]) -> dict[str, int]:
    """Each device's index in ``device_traces``: ``cuda:N`` at N, the CPU (and any other
    device) after the last CUDA index, as torch's ``_profile_to_snapshot`` places the CPU."""
    cuda = [int(d.split(":")[1]) for d in devices if re.fullmatch(r"cuda:\d+", d)]
    nxt = max(cuda) + 1 if cuda else 0
    out = {}
    for d in sorted(devices, key=device_sort_key):
        if re.fullmatch(r"cuda:\d+", d):
            out[d] = int(d.split(":")[1])
        else:
            out[d] = nxt
            nxt += 1
    return out


class _Frames:
    """The frames of each op (innermost first), built once per op and shared."""

    def __init__(self, ops: pd.DataFrame):
        self._parent = dict(
            zip(
                ops["op_id"].tolist(),
                ops["parent_id"].astype("Int64").fillna(-1).astype(int).tolist(),
            )
        )
        self._name = dict(zip(ops["op_id"].tolist(), ops["name"].astype(object).tolist()))
        calls = ops["callsite"].astype(object).where(ops["callsite"].notna(), None)
        self._callsite = dict(zip(ops["op_id"].tolist(), calls.tolist()))
        self._memo: dict[int, list[dict]] = {}
        self.none: list[dict] = []

    def of(self, op_id: int) -> list[dict]:
        if op_id < 0 or op_id not in self._name:
            return self.none
        hit = self._memo.get(op_id)
        if hit is not None:
            return hit
        chain, callsite, cur, seen = [], None, op_id, set()
        while cur >= 0 and cur in self._name and cur not in seen:
            seen.add(cur)
            chain.append({"filename": "<op>", "line": 0, "name": str(self._name[cur])})
            callsite = callsite or self._callsite.get(cur)
            cur = self._parent.get(cur, -1)
        if callsite:
            m = _CALLSITE.match(str(callsite))
            if m:
                chain.append({"filename": m["file"], "line": int(m["line"]), "name": m["name"]})
            else:
                chain.append({"filename": str(callsite), "line": 0, "name": "<callsite>"})
        self._memo[op_id] = chain
        return chain


def _category(value) -> str:
    return Category.UNKNOWN.value if value is None or value is pd.NA else str(value)


def _traces(prof, index: dict[str, int], frames: _Frames) -> tuple[list[list[dict]], dict]:
    """``device_traces`` and the blocks alive at the end: ``{alloc_id: entry}``."""
    ev = prof.events
    al = prof.allocations
    ptr = dict(zip(al["alloc_id"].tolist(), al["ptr"].tolist()))
    op_of = dict(
        zip(al["alloc_id"].tolist(), al["alloc_op_id"].astype("Int64").fillna(-1).tolist())
    )
    traces: list[list[dict]] = [[] for _ in range(max(index.values(), default=-1) + 1)]
    live: dict[int, dict] = {}
    first_us = int(ev["time_ns"].min()) // 1000 if len(ev) else 0
    cols = zip(
        ev["time_ns"].tolist(),
        ev["action"].astype(object).tolist(),
        ev["alloc_id"].tolist(),
        ev["device"].astype(object).tolist(),
        ev["size_bytes"].tolist(),
        ev["category"].astype(object).tolist(),
        ev["op_id"].astype("Int64").fillna(-1).tolist(),
    )
    for t_ns, action, aid, device, size, cat, op_id in cols:
        out = traces[index[str(device)]]
        t_us = first_us if action == Action.PREEXISTING.value else int(t_ns) // 1000
        cat = _category(cat)
        if action in (Action.CREATE.value, Action.PREEXISTING.value):
            entry = {
                "action": "alloc", "addr": int(ptr.get(aid, 0)), "size": int(size),
                "stream": 0, "time_us": t_us, "frames": frames.of(int(op_of.get(aid, -1))),
                "category": cat,
            }  # fmt: skip
            out.append(entry)
            live[aid] = entry
        elif action == Action.DESTROY.value:
            entry = live.pop(aid, None)
            if entry is not None:
                _free(out, entry, t_us)
        elif action == Action.INCREMENT_VERSION.value:
            entry = live.get(aid)
            if entry is not None and entry["category"] != cat:
                _free(out, entry, t_us)
                entry = {**entry, "time_us": t_us, "category": cat, "frames": frames.of(op_id)}
                out.append(entry)
                live[aid] = entry
    return traces, live


def _free(out: list[dict], entry: dict, t_us: int) -> None:
    for action in ("free_requested", "free_completed"):
        out.append(
            {"action": action, "addr": entry["addr"], "size": entry["size"], "stream": 0,
             "time_us": t_us, "frames": entry["frames"]}
        )  # fmt: skip


def _segments(live: dict[int, dict], device_of: dict[int, int]) -> list[dict]:
    """The blocks alive at the end as segments (see the module docstring)."""
    rows = sorted(
        ((device_of[aid], e["addr"], e["size"], e) for aid, e in live.items()),
        key=lambda r: (r[0], r[1], r[2]),
    )
    segments: list[dict] = []
    seg = None
    for dev, addr, size, entry in rows:
        end = seg["address"] + seg["total_size"] if seg is not None else 0
        if seg is None or seg["device"] != dev or addr < end or addr - end > SEGMENT_GAP:
            seg = _segment(dev, addr)
            segments.append(seg)
            end = addr
        if addr > end:
            seg["blocks"].append(
                {"address": end, "size": addr - end, "requested_size": 0, "state": "inactive",
                 "frames": []}
            )  # fmt: skip
        seg["blocks"].append(
            {"address": addr, "size": size, "requested_size": size, "state": "active_allocated",
             "frames": entry["frames"], "category": entry["category"]}
        )  # fmt: skip
        seg["total_size"] = addr + size - seg["address"]
        for key in ("allocated_size", "active_size", "requested_size"):
            seg[key] += size
    return segments


def _segment(device: int, address: int) -> dict:
    return {
        "device": device, "address": address, "total_size": 0, "allocated_size": 0,
        "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": [],
    }  # fmt: skip


def snapshot(prof) -> dict:
    """The profile as a torch memory snapshot (plain data; see the module docstring)."""
    devices = sorted(
        {*prof.devices, *(str(d) for d in prof.events["device"].dropna().unique())},
        key=device_sort_key,
    )
    index = device_indexes(devices)
    frames = _Frames(prof.ops)
    traces, live = _traces(prof, index, frames)
    dev_of_alloc = dict(
        zip(
            prof.allocations["alloc_id"].tolist(),
            prof.allocations["device"].astype(object).tolist(),
        )
    )
    device_of = {aid: index[str(dev_of_alloc.get(aid, devices[0]))] for aid in live}
    names = [None] * len(traces)
    for d, i in index.items():
        names[i] = d
    return {
        "segments": _segments(live, device_of),
        "device_traces": traces,
        "jupyter_memprof": {"format": FORMAT, "label": prof.label, "devices": names},
    }


def looks_like_snapshot(path: str) -> bool:
    """Whether an existing file is a snapshot pickle (replacing it loses nothing ours)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return False
    return head[:1] == b"\x80" and (b"segments" in head or b"device_traces" in head)


def write_snapshot(prof, path: str | os.PathLike, *, overwrite: bool = False) -> str:
    """Write ``prof`` as a snapshot pickle at ``path``; returns the absolute path. An existing
    file is replaced only when it is a snapshot, or with ``overwrite=True``."""
    path = os.fspath(path)
    data = pickle.dumps(snapshot(prof), protocol=PICKLE_PROTOCOL)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)

    return atomic_write(
        path, write, what="memory snapshot", overwrite=overwrite, is_own_kind=looks_like_snapshot
    )
