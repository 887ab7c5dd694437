"""Every key of ``Profile.meta`` declared once, with its load check.

Each key is declared beside the tables (:mod:`.schema`): what it
holds and the check a saved file's value must pass.

A profile's metadata is written by the analysis (:func:`.pipeline.analyse`), the producers'
front ends (``finish``, ``estimate``, ``what_if``, a long run) and read back by the views and
:meth:`Profile.leaks`. A file is untrusted, so :func:`jupyter_memprof._results.checks.check_meta`
checks each key of :data:`META` on load: a value that passes works in every view. None, or an
absent key, always works. ``tests/test_meta_schema.py`` fails when the package writes a key
that is not declared here.

To add a key: one :class:`Key` entry in :data:`META` (a check built from the small checks
below, and a phrase saying what it holds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._devices import is_device_name
from .._vocab import Category

Check = Callable[[Any], bool]

INT64 = (-(2**63), 2**63 - 1)


# -- the small checks ---------------------------------------------------------------------
def utf8_ok(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a lone surrogate from a ``"\\ud800"`` escape does
    not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_int(v) -> bool:
    """An int that fits int64 (bool is not an int here)."""
    return type(v) is int and INT64[0] <= v <= INT64[1]


def nonneg_int(v) -> bool:
    return is_int(v) and v >= 0


def positive_int(v) -> bool:
    return is_int(v) and v >= 1


def is_num(v) -> bool:
    """An int64 or a finite-or-not float (JSON numbers)."""
    return is_int(v) or type(v) is float


def is_bool(v) -> bool:
    return type(v) is bool


def is_str(v) -> bool:
    return type(v) is str and utf8_ok(v)


def is_device(v) -> bool:
    return is_device_name(v)


def optional(check: Check) -> Check:
    """None, or what ``check`` accepts."""
    return lambda v: v is None or check(v)


def list_of(check: Check) -> Check:
    return lambda v: type(v) is list and all(check(x) for x in v)


def dict_of(check: Check, key: Check = is_str) -> Check:
    """A dict whose keys ``key`` accepts and whose values ``check`` accepts."""
    return lambda v: type(v) is dict and all(key(k) and check(x) for k, x in v.items())


def by_device(check: Check) -> Check:
    """A dict of device name -> a value ``check`` accepts."""
    return dict_of(check, key=is_device)


def pair_of_ints(v) -> bool:
    return type(v) is list and len(v) == 2 and all(is_int(x) for x in v)


def record(need: dict[str, Check], may: dict[str, Check] | None = None) -> Check:
    """A dict with every key of ``need`` (its check passed) and, where present and not None,
    the keys of ``may`` (theirs passed); other keys are kept as they are."""
    may = may or {}

    def check(v) -> bool:
        if type(v) is not dict:
            return False
        if any(k not in v or not c(v[k]) for k, c in need.items()):
            return False
        return all(v.get(k) is None or c(v[k]) for k, c in may.items())

    return check


def json_value(v, depth: int = 32) -> bool:
    """Any JSON value (nested at most ``depth`` deep, text valid UTF-8)."""
    stack = [(v, 0)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (list, dict)):
            if d >= depth or type(x) not in (list, dict):
                return False
            if type(x) is dict:
                if not all(is_str(k) for k in x):
                    return False
                stack.extend((y, d + 1) for y in x.values())
            else:
                stack.extend((y, d + 1) for y in x)
        elif not (x is None or type(x) in (bool, float) or is_int(x) or is_str(x)):
            return False
    return True


# -- the composite values -----------------------------------------------------------------
OOM = record(
    need={
        "device": is_str,
        "bytes": is_int,
        "time_ns": is_int,
        "live_by_category": dict_of(is_int),
    },
    may={
        "limit": is_int,
        "alloc_id": is_int,
        "size_bytes": is_int,
        "op_id": is_int,
        "op_name": is_str,
        "module": is_str,
        "callsite": is_str,
        "phase": is_str,
        "tensors_bytes": is_int,
        "cache_bytes": is_int,
        "context_bytes": is_int,
        "reserved_bytes": is_int,
        "cause": is_str,
        "expandable_segments": record(
            need={}, may={"fits": is_bool, "time_ns": is_int, "reserved_peak_bytes": is_int}
        ),
    },
)

#: one row of a long run's ``leaks`` (the columns of ``schema.LEAKS``)
LEAK = record(
    need={
        "category": lambda v: v in Category.values(),
        "device": is_device,
        "bytes_per_step": is_int,
        "steps": nonneg_int,
        "total_bytes": is_int,
        "alloc_ids": list_of(is_int),
    },
    may={"holder": is_str, "callsite": is_str, "why": is_str},
)

#: ``meta["long_run"]`` (``_frontends/long_run.py``, ``LongRun.run_meta``)
LONG_RUN = record(
    need={"steps_per_window": positive_int, "windows": nonneg_int, "steps": nonneg_int},
    may={
        "tables_steps": pair_of_ints,
        "kept": dict_of(pair_of_ints),
        "window_events_max": nonneg_int,
        "carried_blocks": nonneg_int,
        "window_errors": list_of(is_str),
        "missing_steps": list_of(
            record(need={"first": nonneg_int, "last": nonneg_int, "why": is_str})
        ),
        "interrupted": is_bool,
    },
)

#: ``meta["cuda_start"]`` and ``["cuda_end"]``: the CUDA totals of a device
CUDA_TOTALS = by_device(
    record(
        need={},
        may={
            k: nonneg_int for k in ("allocated", "reserved", "free", "total", "outside_torch_bytes")
        },
    )
)


def _trace_oom(v) -> bool:
    need = {"device": is_device, "bytes": is_int, "time_ns": is_int}
    return (
        type(v) is dict
        and all(k in v and type(v[k]) in (int, str) and c(v[k]) for k, c in need.items())
        and all(is_int(v.get(k, 0)) for k in ("total_allocated", "total_reserved"))
    )


def trace_fields(v) -> bool:
    """``meta["trace"]`` of a profile loaded from a Kineto trace (``load_trace``): the
    trace's own plain fields, its out-of-memory events and counts of what was left out."""
    if type(v) is not dict or not all(is_str(k) for k in v):
        return False
    ooms = v.get("oom_events", [])
    counts = ("mismatched_frees", "skipped_memory_events")
    return (
        type(ooms) is list
        and all(_trace_oom(o) for o in ooms)
        and all(nonneg_int(v.get(k, 0)) for k in counts)
        and all(
            type(x) in (int, str, bool) and (type(x) is not str or is_str(x))
            for k, x in v.items()
            if k != "oom_events"
        )
    )


def snapshot_oom(v) -> bool:
    """``meta["snapshot_oom"]``: the device and the byte counts of a failed request."""
    return (
        type(v) is dict
        and is_device(v.get("device"))
        and all(nonneg_int(v.get(k, 0)) for k in v if k != "device")
    )


def snapshot_oom_entry(o) -> bool:
    """One ``oom`` entry of a snapshot: its device, time, request and the device's free
    bytes."""
    return (
        type(o) is dict
        and is_device(o.get("device"))
        and all(is_int(o.get(k)) for k in ("time_ns", "size", "device_free", "stream"))
        and all(
            o.get(k) is None or is_int(o[k])
            for k in ("allocated_bytes", "reserved_bytes", "largest_free_bytes")
        )
    )


@dataclass(frozen=True)
class Key:
    """One meta key: the check a saved value must pass, and what it holds."""

    check: Check
    what: str


#: Every key the package writes into ``Profile.meta``, one entry each.
META: dict[str, Key] = {
    "label": Key(is_str, "the profile's name"),
    "start_ns": Key(is_int, "when the capture began"),
    "end_ns": Key(is_int, "when it ended"),
    "captured_at": Key(is_int, "wall clock at the start (ns since the epoch)"),
    "devices": Key(list_of(is_device), "the devices the capture watched"),
    "estimate": Key(is_bool, "a fake run (estimate())"),
    "simulated_cuda": Key(is_bool, "an estimate for CUDA computed on the CPU"),
    "with_stack": Key(is_bool, "Python stacks were recorded"),
    "rank": Key(nonneg_int, "torch.distributed's rank"),
    "world_size": Key(positive_int, "torch.distributed's world size"),
    "limit": Key(nonneg_int, "an estimate's memory limit in bytes"),
    "oom": Key(OOM, "where an estimate first went over its limit"),
    "error": Key(is_str, "what the profiled code raised"),
    "analysis_error": Key(is_str, "why the tables could not be built"),
    "analysis_interrupted": Key(is_bool, "the analysis was interrupted (Ctrl-C)"),
    "stop_error": Key(is_str, "why stopping the profiler failed"),
    "device": Key(is_str, "the device an estimate is for"),
    "compute_device": Key(is_str, "the device an estimate computed on"),
    "gpu": Key(is_str, "the GPU an estimate modelled"),
    "kernel_memory_not_modelled": Key(dict_of(is_str), "ops whose kernel memory is unknown"),
    "clock": Key(is_str, "what the *_ns columns count (an estimate's records)"),
    "torch_version": Key(is_str, "torch's version"),
    "wall_s": Key(is_num, "how long the code ran"),
    "capture_s": Key(is_num, "reading torch's events"),
    "analysis_s": Key(is_num, "building the tables"),
    "stop_s": Key(is_num, "stopping the profiler"),
    "finish_s": Key(is_num, "the whole wait after the code"),
    "free_s": Key(is_num, "freeing torch's raw result"),
    "context": Key(nonneg_int, "an estimate's CUDA context bytes, when given"),
    "event_count": Key(nonneg_int, "events in the trace"),
    "stage_s": Key(dict_of(is_num), "seconds per analysis stage"),
    "allocator": Key(is_str, "the caching allocator's settings"),
    "reserved_peak_bytes": Key(by_device(nonneg_int), "the allocator's reserved peak"),
    "reserved_peak_ns": Key(by_device(is_int), "when it was reached"),
    "fragmentation_bytes": Key(by_device(nonneg_int), "reserved minus allocated at the peak"),
    "reserved_model_error": Key(by_device(is_num), "the model against recorded totals"),
    "inferred_frees": Key(
        by_device(dict_of(nonneg_int)), "blocks ended from the allocator's totals"
    ),
    "baseline_bytes": Key(by_device(nonneg_int), "bytes live when the capture started"),
    "untouched_bytes": Key(by_device(nonneg_int), "of those, never used by the code"),
    "unreachable_bytes": Key(by_device(nonneg_int), "of those, reached by no name"),
    "cuda_start": Key(CUDA_TOTALS, "CUDA's totals when the capture started"),
    "cuda_end": Key(CUDA_TOTALS, "and when it ended"),
    "leaks": Key(
        list_of(LEAK),
        "a long run's leaks in files saved before the leaks table (read into it on load)",
    ),
    "long_run": Key(LONG_RUN, "a long run's windows and steps"),
    "what_if": Key(dict_of(json_value), "the changes what_if() made (empty: as is)"),
    "tensor_ids": Key(is_bool, "False: the producer gave no tensor ids (a Kineto trace)"),
    "snapshot_error": Key(is_str, "why the allocator's snapshot could not be taken or written"),
    "snapshot_path": Key(is_str, "where profile(snapshot=PATH) wrote the allocator's snapshot"),
    "snapshot_oom": Key(snapshot_oom, "the segment picture of a failed CUDA request"),
    "snapshot_segments": Key(
        by_device(nonneg_int), "segments recorded by snapshot=True: events matched per device"
    ),
    "snapshot_segments_error": Key(is_str, "why snapshot=True's segments were not used"),
    "trace": Key(trace_fields, "a Kineto trace's own fields (load_trace)"),
    "producer": Key(is_str, "what made the records (a capture, an estimate, a trace, ...)"),
    "not_recorded": Key(list_of(is_str), "what the producer could not record"),
    "compiled_as_eager": Key(list_of(is_str), "torch.compile'd code an estimate ran eagerly"),
    "data_dependent_scalars": Key(dict_of(is_str), "scalars an estimate could not know"),
    "snapshot_actions": Key(dict_of(nonneg_int), "a snapshot's entries by action"),
    "snapshot_older_blocks": Key(dict_of(nonneg_int), "blocks from before a snapshot's trace"),
    "snapshot_ooms": Key(list_of(snapshot_oom_entry), "a snapshot's out-of-memory entries"),
    "snapshot_end_allocated": Key(by_device(nonneg_int), "allocated at a snapshot's end"),
    "snapshot_end_reserved": Key(by_device(nonneg_int), "reserved at a snapshot's end"),
    "snapshot_alloc_conf": Key(is_str, "the allocator settings a snapshot recorded"),
    "snapshot_alloc_conf_error": Key(is_str, "why those settings could not be read"),
    "snapshot_cached": Key(is_bool, "a snapshot's profile came from its cache"),
    "snapshot_tags": Key(
        dict_of(dict_of(record(need={"allocs": nonneg_int, "requested_bytes": nonneg_int}))),
        "a snapshot's allocs per compile_context and user_metadata value",
    ),
    "memory_budget": Key(
        record(
            need={"exceeded": is_bool},
            may={
                "bytes": positive_int,
                "floor_bytes": nonneg_int,
                "grown_bytes": is_int,
                "reason": lambda v: v in ("budget", "machine"),
            },
        ),
        "a plain capture's memory budget, and whether the code was stopped at it",
    ),
}


def problem(meta: dict) -> str | None:
    """The first declared key of ``meta`` whose value fails its check, else None."""
    for key, entry in META.items():
        value = meta.get(key)
        if value is not None and not entry.check(value):
            return key
    return None
