"""The summary's lines beyond the headline.

They say: memory from before the capture, CUDA's counters,
frees found from the allocator's totals, steps, a long run's windows, where a file came from
and what it could not record, an out-of-memory error a recorded snapshot kept.

Each phrase reads the dict :func:`.summary.summary` made and computes nothing.
"""

from __future__ import annotations

from typing import Any

from .._units import format_bytes


def baseline_phrase(device: str, b: dict[str, int]) -> str:
    """``live before the capture on cpu: 10.2 MiB, of which untouched 6.4 MiB``."""
    text = f"live before the capture on {device}: {format_bytes(b['bytes'])}"
    parts = []
    if b["untouched"]:
        parts.append(f"untouched {format_bytes(b['untouched'])}")
    if b["unreachable"]:
        parts.append(f"reachable from no name {format_bytes(b['unreachable'])}")
    return text + (f", of which {' and '.join(parts)}" if parts else "")


def cuda_phrase(device: str, c: dict[str, int | None], peak_bytes: int) -> str:
    """The caching allocator's reserved peak and the memory outside PyTorch on a device."""
    parts = []
    if c["reserved_peak"] is not None:
        cache = max(int(c["reserved_peak"]) - peak_bytes, 0)
        parts.append(
            f"reserved peak {format_bytes(c['reserved_peak'])} "
            f"({format_bytes(cache)} above the allocated peak)"
        )
    if c["outside_start"] is not None or c["outside_end"] is not None:
        ends = [
            f"{format_bytes(v)} at the {w}"
            for v, w in ((c["outside_start"], "start"), (c["outside_end"], "end"))
            if v is not None
        ]
        parts.append(f"outside PyTorch {' and '.join(ends)}")
    return f"{device}: " + "; ".join(parts)


def inferred_phrase(device: str, found: dict[str, int]) -> str:
    """One line for frees torch did not report (CUDA without Python stacks), found from the
    allocator's totals: how many blocks were ended that way, and what no block explains."""
    n = found.get("blocks", 0)
    line = (
        f"{device}: {n} block{'' if n == 1 else 's'} ended where the allocator's totals say "
        "(torch reports no free outside an op without Python stacks)"
    )
    left = found.get("unexplained_bytes", 0)
    if left:
        line += f"; {format_bytes(left)} freed matched no blocks and is still counted live"
    return line


def steps_phrase(s: dict[str, Any]) -> str | None:
    """``3 steps, then what ran after the last one`` for a capture of a loop (a long run
    says its steps in :func:`long_run_phrase`), or None for fewer than two steps."""
    steps = s.get("steps") or {}
    complete, rows = steps.get("complete", 0), steps.get("rows", 0)
    if s.get("long_run") or rows < 2:
        return None
    text = f"{complete} step{'s' if complete != 1 else ''}"
    if rows > complete:
        text += ", then what ran after the last one"
    return text


def long_run_phrase(s: dict[str, Any]) -> str | None:
    """One line for a long run: ``long run: 1000 steps in 50 windows of 20; tables of steps
    40-59 (the highest peak)``, or None."""
    run = s.get("long_run")
    if not run:
        return None
    line = (
        f"long run: {run['steps']} steps in {run['windows']} windows of {run['steps_per_window']}"
    )
    shown = run.get("tables_steps")
    if shown:
        why = " (the highest peak)" if "peak" in (run.get("kept") or {}) else ""
        line += f"; tables of steps {shown[0]}-{shown[1]}{why}"
    for gap in run.get("missing_steps") or ():
        steps = f"step {gap['first']}" if gap["first"] == gap["last"] else "steps {}-{}"
        line += f"; {steps.format(gap['first'], gap['last'])} missing: {gap['why']}"
    return line


def source_phrase(s: dict[str, Any]) -> str | None:
    """One line for a profile read from a file with no tensor ids (a Kineto trace): its
    categories follow when blocks were made and freed; and its out-of-memory events."""
    if not s.get("no_tensor_ids"):
        return None
    text = "no tensor ids in this file: categories follow when blocks were made and freed"
    n = s.get("trace_ooms") or 0
    if n:
        text += f"; {n} out-of-memory event{'s' if n != 1 else ''} recorded"
    return text


def snapshot_oom_phrase(s: dict[str, Any]) -> str | None:
    """One line from the allocator's snapshot at an out-of-memory error: what was asked,
    and how much the allocator held free in its segments, in how many pieces."""
    o = s.get("snapshot_oom")
    if not o:
        return None
    return (
        f"out of memory on {o['device']}: the request of {format_bytes(o.get('requested', 0))} "
        f"failed: {format_bytes(o.get('free_bytes', 0))} free in {o.get('segments', 0)} "
        f"segments ({o.get('free_blocks', 0)} free blocks), the largest free block "
        f"{format_bytes(o.get('largest_free', 0))}; the device had "
        f"{format_bytes(o.get('device_free', 0))} free"
    )


def not_recorded_phrase(s: dict) -> str:
    """What the profile's producer could not record, as a line (a memory snapshot: no
    tensor ids, versions or op tree; its categories come from the Python frames)."""
    what = ", ".join(s["not_recorded"])
    if s["producer"] == "snapshot":
        return (
            f"from a memory snapshot: not recorded there: {what}; categories come from "
            "its Python stacks and their order in time"
        )
    return f"not recorded by {s['producer'] or 'its producer'}: {what}"
