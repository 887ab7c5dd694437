"""Memory snapshots made from real CPU runs, for tests without a GPU.

:func:`record` runs a function under ``torch.profiler`` with ``profile_memory=True`` and
``with_stack=True``, which gives every allocation and free its address, size, time and
Python stack, and writes them in the format ``torch.cuda.memory._dump_snapshot`` does:
``device_traces[0]`` (``alloc``, ``free_requested``, ``free_completed``; each entry's
frames innermost first, equal stacks one shared list as torch's memo makes them), the final
``segments`` (one segment per live block, with its frames), and ``external_annotations``
for ``record_function`` ranges and ``ProfilerStep#N``. Frames get the absolute paths a real
installation has; addresses are scaled by :data:`SCALE` so that blocks, rounded as CUDA's
allocator rounds them, never overlap (malloc's blocks touch); frees the CPU profiler missed
(a block allocated over a live one) are put back.

The function calls ``mark(label, truth)`` at the phase boundaries it wants checked:
``truth`` maps a tensor to its category, read from the Python objects; the mark's time
(a ``record_function`` range of its own, left out of the snapshot) says when.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

SITE = "/usr/lib/python3.11/site-packages/"
HOME = "/home/user/"
_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")
_MARK = "memprof.test.mark#"
#: CPU addresses are dense (malloc's blocks touch): scaled by this, blocks rounded up to
#: 512 bytes as CUDA's are never overlap, as CUDA's never do
SCALE = 512


class Marks:
    """What ``mark`` recorded: label -> {(address, bytes): category}; times come after."""

    def __init__(self) -> None:
        self.truth: dict[str, dict[int, tuple[int, str]]] = {}
        self.time_us: dict[str, float] = {}

    def __call__(self, label: str, truth: dict[torch.Tensor, str]) -> None:
        seen: dict[int, tuple[int, str]] = {}
        for t, cat in truth.items():
            if t is None:
                continue
            st = t.untyped_storage()
            seen.setdefault(st.data_ptr() * SCALE, (st.nbytes(), cat))
        self.truth[label] = seen
        with record_function(_MARK + label):
            pass


def _path(file: str) -> str:
    if file.startswith(("torch/", "transformers/")):
        return SITE + file
    return file if file.startswith("/") else HOME + file


def _frames(stack: list, cache: dict) -> list:
    key = tuple(stack)
    got = cache.get(key)
    if got is None:
        got = cache[key] = []
        for name in reversed(stack):  # innermost first
            m = _FRAME.match(name)
            if m:
                got.append({"filename": _path(m[1]), "line": int(m[2]), "name": m[3]})
    return got


def block(size: int) -> int:
    """The block CUDA's allocator gives a request of ``size`` bytes (rounded to 512)."""
    return max(512, -(-size // 512) * 512)


def _name(e) -> str:
    try:
        return e.name
    except UnicodeDecodeError:  # seen once in a while on torch 2.13's Python tracer
        return ""


def record(fn: Callable[[Marks], object], *, drop_first: int = 0) -> tuple[dict, Marks]:
    """The snapshot of ``fn(mark)`` run on the CPU (recorded as ``cuda:0``) and its marks.
    ``drop_first``: entries lost from the front of the trace (a wrapped ring buffer)."""
    marks = Marks()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as p:
        kept = fn(marks)  # alive when the snapshot is taken, as in a real job
    tree = p.profiler.kineto_results.experimental_event_tree()
    entries: list = []
    annotations: list = []
    cache: dict = {}

    def walk(e, stack: list) -> None:
        kind = e.typed[0]
        if kind == _EventType.Allocation:
            f = e.typed[1]
            if str(f.device) == "cpu":
                frames = _frames(stack, cache)
                t = e.start_time_ns / 1000
                size = int(f.alloc_size)
                addr = int(f.ptr) * SCALE
                base = {"addr": addr, "size": abs(size), "stream": 0, "frames": frames}
                if size > 0:
                    entries.append({"action": "alloc", "time_us": t, **base})
                else:
                    entries.append({"action": "free_requested", "time_us": t, **base})
                    entries.append({"action": "free_completed", "time_us": t, **base})
            return
        if kind == _EventType.TorchOp:
            name = e.name
            if name.startswith(_MARK):
                marks.time_us[name[len(_MARK) :]] = e.start_time_ns / 1000
            elif name.startswith(("ProfilerStep#", "phase:")) or name.startswith("Optimizer."):
                for stage, t in (("START", e.start_time_ns), ("END", e.end_time_ns)):
                    annotations.append(
                        {"name": name, "stage": stage, "time_us": t / 1000, "device": 0}
                    )
        names = stack + [_name(e)] if kind == _EventType.PyCall else stack
        for c in e.children:
            walk(c, names)

    for root in tree:
        walk(root, [])
    entries.sort(key=lambda x: x["time_us"])  # stable: a free's two entries stay in order
    entries = _consistent(entries)
    annotations.sort(key=lambda a: a["time_us"])
    live: dict = {}
    for x in entries:
        if x["action"] == "alloc":
            live[x["addr"]] = x
        elif x["action"] == "free_completed":
            live.pop(x["addr"], None)
    segments = [
        {
            "device": 0, "address": a, "total_size": block(x["size"]),
            "allocated_size": block(x["size"]), "active_size": block(x["size"]),
            "requested_size": x["size"], "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": x["frames"],
            "blocks": [{"address": a, "size": block(x["size"]), "requested_size": x["size"],
                        "state": "active_allocated", "frames": x["frames"]}],
        }
        for a, x in sorted(live.items())
    ]  # fmt: skip
    snap = {
        "segments": segments,
        "device_traces": [entries[drop_first:]],
        "external_annotations": annotations,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
    }
    del kept
    return snap, marks


def _consistent(entries: list) -> list:
    """The trace with the frees torch's CPU profiler missed put back: a block still alive
    where a new one is allocated over it was freed before (a CUDA trace never overlaps)."""
    out: list = []
    live: dict = {}
    for x in entries:
        if x["action"] == "alloc":
            lo, hi = x["addr"], x["addr"] + x["size"] * SCALE
            for a, y in list(live.items()):
                if a < hi and lo < a + y["size"] * SCALE:
                    del live[a]
                    out.append({**y, "action": "free_completed", "time_us": x["time_us"]})
            live[x["addr"]] = x
        elif x["addr"] not in live:  # a free put back already, or of a block from before
            continue
        elif x["action"] == "free_completed":
            del live[x["addr"]]
        out.append(x)
    return out


def scores(prof, marks: Marks, default: dict[str, str] | None = None) -> dict[str, float]:
    """Per mark: the share of the bytes live then (by the profile) whose category is the
    truth's; blocks the truth does not name count when their category is ``default[label]``
    (e.g. ``activation`` after the forward) and are left out where it has none."""
    a = prof.allocations
    out = {}
    for label, truth in marks.truth.items():
        t = int(marks.time_us[label] * 1000)
        alive = a[(a["alloc_ns"].fillna(-1) <= t) & ((a["free_ns"].isna()) | (a["free_ns"] > t))]
        right = total = 0
        for ptr, size, cat in zip(alive["ptr"], alive["size_bytes"], alive["category"]):
            want = truth.get(int(ptr), (0, (default or {}).get(label)))[1]
            if want is None:
                continue
            total += int(size)
            right += int(size) * (str(cat) == want)
        out[label] = right / total if total else 1.0
    return out
