"""From records to the finished tables: the pipeline, in order.

:func:`analyse` is the one analysis every producer feeds: it takes a
:class:`~jupyter_memprof._records.Capture` and returns every table plus timing meta.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator

import pandas as pd

from .._records import Capture
from . import blocks as B
from . import tables as T
from .allocator.config import AllocatorConfig
from .allocator.model import model_profile
from .categories import categorise
from .distributed import end_unseen_frees
from .frame_rules import categorise_by_frames
from .leaks import leaks
from .recorded_segments import recorded_peak_meta, recorded_segments
from .steps import build_steps
from .timeline import build_events, build_timeline, with_reserved

Progress = Callable[[str, int, int], object]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while records and tables are built.

    The records are millions of small acyclic tuples, and collections triggered by their
    allocation would otherwise cost as much as the analysis itself.

    A pause alone only moves that cost: every object allocated during it is still in the
    youngest generation afterwards, and the first allocation after the collector is back
    traverses them all (about 30 ms after one training step of the benchmark MLP, 0.6 s
    after a million events). So the pause starts with a gen-1 collection (the collections an
    unpaused analysis triggers would make the same: it frees the young garbage and moves
    the rest on; about 1 ms after a training step), and on the way out what the pause
    allocated, the only objects then in the younger generations, is handed straight to the
    oldest one (``gc.freeze()`` then ``gc.unfreeze()``: two list splices, no traversal),
    where it would have ended anyway had it survived two collections. When the user has
    frozen objects, the thaw would release them: nothing moves then.
    """
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()


class _Stages:
    """Each stage's seconds (``timings``), and ``progress(stage, done, total)`` after each."""

    NAMES = ("ops", "allocations", "versions", "categories", "timeline", "segments")

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress or (lambda *a: None)
        self.timings: dict[str, float] = {}
        self._t = time.perf_counter()

    def done(self, i: int) -> None:
        now = time.perf_counter()
        self.timings[self.NAMES[i]] = now - self._t
        self._t = now
        self.progress(self.NAMES[i], i + 1, len(self.NAMES))


def analyse(
    capture: Capture,
    *,
    progress: Progress | None = None,
    allocator: AllocatorConfig | None = None,
    window: tuple[bool, bool] = (True, True),
) -> tuple[dict[str, pd.DataFrame], dict]:
    """Every table of ``capture``, and meta: its start and end, each stage's seconds, what
    was live at the start (:func:`baseline_meta`), and what the model of CUDA's caching
    allocator (with the settings ``allocator``, default torch's) gives for the CUDA blocks
    (``segments``; meta ``reserved_peak_bytes`` etc., see :func:`.allocator.model_profile`;
    a recorded reserved peak is kept over the modelled one). ``window``: for a window of a
    long run, whether it is the run's first and its last (how its ends split steps:
    :func:`.steps.step_bounds`)."""
    stages = _Stages(progress)
    inferred: dict = {}  # frees torch did not report, found from the allocator's totals
    tables, mem = _record_tables(capture, stages, inferred)
    allocations, versions = categorise(tables)
    allocations = end_unseen_frees(allocations, tables["ops"])  # FSDP's, on gloo's threads
    allocations = categorise_by_frames(allocations, mem, capture)  # a snapshot's stacks
    allocations = B.callsites_from_ops(allocations, tables["ops"])
    tables.update(allocations=allocations, versions=versions)
    stages.done(3)
    start_ns = _start_ns(capture.start_ns, tables["ops"], mem)
    end_ns = _time_tables(tables, mem, capture, start_ns, window)
    tables["leaks"] = leaks(tables)
    stages.done(4)
    segments, allocator_meta = model_profile(tables, allocator)
    if capture.segments is not None:  # the allocator's own record
        segments = recorded_segments(capture.segments, start_ns)
        for key, recorded in recorded_peak_meta(tables["events"]).items():
            allocator_meta[key] = {**allocator_meta.get(key, {}), **recorded}
    tables["segments"] = segments
    stages.done(5)
    totals_start = capture.totals_start or {}
    baseline = baseline_meta(
        allocations, tables["events"], capture, B.allocated_at_start(mem, totals_start)
    )
    reserved = {  # recorded where torch recorded it, else modelled
        **allocator_meta.get("reserved_peak_bytes", {}),
        **baseline.get("reserved_peak_bytes", {}),
    }
    order = ("ops", "allocations", "versions", "events", "timeline", "flows", "uses", "names")
    ordered = {k: tables[k] for k in (*order, "steps", "segments", "leaks")}
    return ordered, {
        "start_ns": start_ns,
        "end_ns": end_ns,
        "stage_s": stages.timings,
        **allocator_meta,
        **baseline,
        **({"reserved_peak_bytes": reserved} if reserved else {}),
        **({"inferred_frees": inferred} if inferred else {}),
    }


def _record_tables(
    capture: Capture, stages: _Stages, inferred: dict
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """The tables the records give (ops, flows, allocations, names, uses, versions; no
    categories yet), and the allocator events; ``inferred`` gets what
    :func:`.lost_frees.frees_from_totals` did."""
    trace, devices = capture.trace, capture.devices
    ops = T.build_ops(trace, capture.module_paths, capture.module_classes)
    flows = T.build_flows(ops)
    stages.done(0)
    mem = T.memory_table(trace, devices)
    if capture.stacks is not None:  # a snapshot's records (millions), all in ``mem`` now:
        trace.memory.clear()  # let go before the tables are made of them
    refs = T.refs_table(trace)
    names_df = T.names_table(capture.names)
    allocations = B.build_allocations(
        mem,
        T.untracked_table(trace),
        names_df,
        devices,
        totals_start=capture.totals_start,
        watched_frees=capture.watched_frees,
        totals_end=capture.totals_end,
        inferred=inferred,
        older=capture.older,
        unnamed=capture.unnamed,
    )
    names_df = T.match_names(names_df, allocations)
    ops = T.finish_ops(ops, flows, allocations)
    stages.done(1)
    uses = T.build_uses(ops, refs, allocations)
    versions = T.build_versions(allocations, uses, ops)
    stages.done(2)
    tables = {
        "ops": ops,
        "allocations": allocations,
        "versions": versions,
        "uses": uses,
        "names": names_df,
        "flows": flows,
    }
    return tables, mem


def _start_ns(start_ns: int | None, ops: pd.DataFrame, mem: pd.DataFrame) -> int:
    """When the capture began: as recorded, else its first op or allocator event."""
    if start_ns is not None:
        return start_ns
    firsts = [
        x
        for x in (
            ops["start_ns"].min() if len(ops) else None,
            mem["time_ns"].min() if len(mem) else None,
        )
        if x is not None
    ]
    return int(min(firsts)) if firsts else 0


def _time_tables(
    tables: dict,
    mem: pd.DataFrame,
    capture: Capture,
    start_ns: int,
    window: tuple[bool, bool] = (True, True),
) -> int:
    """Add ``events`` (with the reserved totals), ``timeline`` and ``steps`` to ``tables``;
    returns the capture's end."""
    ops = tables["ops"]
    events = build_events(tables["allocations"], tables["versions"], ops, start_ns)
    totals_start = capture.totals_start or {}
    events = with_reserved(events, mem, {d: t.reserved for d, t in totals_start.items()})
    timeline = build_timeline(events, tables["versions"])
    end_ns = int(max(ops["end_ns"].max() if len(ops) else start_ns, start_ns))
    tables.update(
        events=events,
        timeline=timeline,
        steps=build_steps(ops, events, timeline, start_ns, end_ns, first=window[0], last=window[1]),
    )
    return end_ns


def baseline_meta(allocations, events, capture: Capture, allocated_start: dict) -> dict:
    """What was live when the capture started, per device, and on CUDA the allocator's and
    the driver's view (see docs/tables.md, "The baseline"):

    - ``baseline_bytes``: bytes of the blocks live at the start; ``untouched_bytes``: those
      the captured code never used; ``unreachable_bytes``: what nothing the session knows
      reaches (CUDA's remainder; on the CPU the storages of unnamed tensors);
    - ``reserved_peak_bytes``: the caching allocator's largest reserved total (recorded);
    - ``cuda_start`` / ``cuda_end``: ``allocated``, ``reserved``, ``free`` and ``total``
      bytes and ``outside_torch_bytes`` (the device's used memory that PyTorch's allocator
      does not hold: the CUDA context, NCCL, cuBLAS's own, other processes).
    """
    a = allocations
    pre = a["alloc_ns"].isna().to_numpy()
    dev = a["device"].astype(object).to_numpy()
    size = a["size_bytes"].to_numpy()
    untouched = a["reason"].str.endswith("untouched").fillna(False).to_numpy(dtype=bool)
    unreachable = pre & (a["ptr"].to_numpy() == 0) & a["tensor_id"].isna().to_numpy()
    out: dict = {"baseline_bytes": {}, "untouched_bytes": {}, "unreachable_bytes": {}}
    for d in sorted(set(dev[pre].tolist())):
        on = pre & (dev == d)
        out["baseline_bytes"][d] = int(size[on].sum())
        out["untouched_bytes"][d] = int(size[on & untouched].sum())
        if (on & unreachable).any():
            out["unreachable_bytes"][d] = int(size[on & unreachable].sum())
    reserved = events["reserved_bytes"] if "reserved_bytes" in events else None
    peaks: dict = {}
    if reserved is not None and reserved.notna().any():
        have = events[reserved.notna()]
        for d, v in have.groupby(have["device"].astype(object), sort=True)["reserved_bytes"]:
            peaks[str(d)] = int(v.max())
    used = set(dev.tolist()) | set(events["device"].astype(object).tolist())
    for d, t in (capture.totals_start or {}).items():
        if d in used:  # a device the capture did not use has no profile to speak of
            peaks[d] = max(peaks.get(d, 0), int(t.reserved))
    if peaks:
        out["reserved_peak_bytes"] = peaks
    for key, totals in (("cuda_start", capture.totals_start), ("cuda_end", capture.totals_end)):
        if totals:
            out[key] = {
                d: {
                    "allocated": int(allocated_start.get(d, t.allocated))
                    if key == "cuda_start"
                    else int(t.allocated),
                    "reserved": int(t.reserved),
                    "free": int(t.free),
                    "total": int(t.total),
                    "outside_torch_bytes": max(int(t.total - t.free - t.reserved), 0),
                }
                for d, t in totals.items()
            }
    return out
