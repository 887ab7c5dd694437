"""A profile's headline numbers: a dict, text and escaped HTML.

The summary reads the tables and the peak of each device (:mod:`.peaks`: what
:meth:`Profile.peak` reports, computed once for the summary's text, its HTML and the dashboard);
it computes nothing of its own beyond sums and counts. For every device with memory activity it gives the peak (bytes, when it
happened, measured from the start of the capture) and the categories of the blocks live at
that peak, largest first.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import pandas as pd

from .._analysis.peak import member
from .._units import format_bytes, format_seconds
from .budget import budget_phrase
from .fit_bar import fit_html
from .peaks import peak_point
from .summary_phrases import (
    baseline_phrase,
    cuda_phrase,
    inferred_phrase,
    long_run_phrase,
    not_recorded_phrase,
    snapshot_oom_phrase,
    source_phrase,
    steps_phrase,
)
from .summary_warnings import growth_phrase, oom_phrase

if TYPE_CHECKING:
    from .protocols import ProfileLike

#: The sentence shown for a capture that saw no PyTorch memory activity.
NO_ACTIVITY = "no PyTorch memory activity was recorded"

#: How many categories the text and HTML headers name per device.
TOP = 3


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def summary(prof: ProfileLike) -> dict[str, Any]:
    """The headline numbers of ``prof``.

    Keys:

    - ``label``;
    - ``error``: ``"ExcType: message"`` when the profiled code raised, else None;
    - ``analysis_error``: why the tables could not be built, else None;
      ``analysis_interrupted``: True when that was an interrupt (Ctrl-C) during the analysis;
    - ``empty``: True when no memory activity was recorded (what was live before the
      capture is no activity);
    - ``peaks``: for each device with activity, ``{"bytes", "time_ns", "offset_s",
      "top_categories"}``, where ``offset_s`` is the peak's time from the start of the
      capture and ``top_categories`` maps category -> bytes live at the peak, largest first
      (categories with no bytes left out); on CUDA devices also ``reserved_bytes`` (the
      caching allocator's reserved peak), ``reserved_source`` (``recorded`` or
      ``modelled``) and ``fragmentation_bytes`` (reserved minus allocated: at the recorded
      reserved peak where the allocator's segments were recorded, a memory snapshot; else
      the model's, at the allocated peak);
    - ``ops``, ``blocks``, ``events``: row counts of those tables;
    - ``wall_s`` (how long the code ran), ``capture_s`` (reading torch's events) and
      ``analysis_s`` (building the tables), each None when unknown; ``finish_s``: how long
      leaving the capture took, of which ``stop_s`` stopping torch's profiler (torch's
      own work on its events) and ``free_s`` freeing torch's raw result (0 when a shell
      frees it after the cell); the rest is reading and analysis;
    - ``baseline``: per device, ``{"bytes", "untouched", "unreachable"}``: bytes live when
      the capture started, those the code never used, and (CUDA) those nothing names;
    - ``cuda``: per CUDA device with recorded counters, ``{"reserved_peak",
      "outside_start", "outside_end"}`` (bytes; None where unknown): the caching allocator's
      largest reserved total and the device memory outside PyTorch's allocator;
    - ``steps``: ``{"complete", "rows"}``, the complete steps of ``prof.steps`` and its
      steps (a tail after the last step's end is a step not complete);
    - ``growth``: when memory grows with every step (:meth:`Profile.leaks`),
      ``{"bytes_per_step", "device", "holder", "callsite", "why", "leaks"}``, else None;
    - ``estimate``: True for a fake run (:func:`jupyter_memprof.estimate`), whose peaks have
      a ``position`` (records into the run) instead of an ``offset_s``; ``limit`` (bytes or
      None) and ``oom``: where the estimated step first went over the limit, else None;
      ``note``: how the estimate was computed (None for a real capture).
    """
    meta = prof.meta
    peaks = _question_first(_peaks(prof), meta)
    return {
        "label": prof.label,
        "fit": _fit(prof),
        "baseline": _baseline(meta),
        "cuda": _cuda(meta, peaks),
        "error": meta.get("error") or None,
        "analysis_error": meta.get("analysis_error") or None,
        "analysis_interrupted": bool(meta.get("analysis_interrupted")),
        "empty": not peaks,
        "peaks": peaks,
        "ops": len(prof.ops),
        "blocks": len(prof.allocations),
        "events": len(prof.events),
        "wall_s": _float(meta.get("wall_s")),
        # the time spent reading torch's events into records
        "capture_s": _float(meta.get("capture_s")),
        "analysis_s": _float(meta.get("analysis_s")),
        # the wait after the code (``finish_s``) and the parts besides reading and analysis
        "finish_s": _float(meta.get("finish_s")),
        "stop_s": _float(meta.get("stop_s")),
        "free_s": _float(meta.get("free_s")),
        "estimate": bool(meta.get("estimate")),
        "limit": meta.get("limit"),
        "oom": meta.get("oom") or None,
        "note": _estimate_note(meta),
        "growth": _growth(prof),
        "long_run": meta.get("long_run") or None,
        "inferred_frees": meta.get("inferred_frees") or {},
        "no_tensor_ids": meta.get("tensor_ids") is False,
        "snapshot_oom": meta.get("snapshot_oom") or None,
        "trace_ooms": len((meta.get("trace") or {}).get("oom_events") or []),
        "steps": _steps(prof.steps),
        "producer": meta.get("producer") or None,
        "not_recorded": list(meta.get("not_recorded") or []),
        "memory_budget": meta.get("memory_budget") or None,
    }


def _peaks(prof: ProfileLike) -> dict[str, dict[str, Any]]:
    """Each device with activity: its peak, when, what filled it and (CUDA) reserved."""
    meta = prof.meta
    start_ns = prof.start_ns
    peaks: dict[str, dict[str, Any]] = {}
    ev = prof.events
    moved = (ev["action"] != "preexisting").to_numpy(dtype=bool)
    active = {str(d) for d in pd.unique(ev["device"][moved]) if not pd.isna(d)}
    for device in prof.devices:
        if device not in active:  # only what was live before: no activity to show
            continue
        point = peak_point(prof, device)  # computed once for every view of the profile
        peak_ns = point.peak_ns
        offset = None
        if peak_ns is not None and start_ns is not None:
            offset = max(int(peak_ns) - start_ns, 0) / 1e9
        peaks[device] = {
            "bytes": int(point.peak_bytes or 0),
            "time_ns": None if peak_ns is None else int(peak_ns),
            "offset_s": None if meta.get("estimate") else offset,
            "top_categories": _top_categories(prof.allocations, point.alloc_ids),
        }
        if meta.get("estimate") and offset is not None:
            peaks[device]["position"] = round(offset * 1e3)  # the fake clock: 1 ms per record
        reserved = (meta.get("reserved_peak_bytes") or {}).get(device)
        if reserved is not None:
            peaks[device]["reserved_bytes"] = int(reserved)
            peaks[device]["fragmentation_bytes"] = (meta.get("fragmentation_bytes") or {}).get(
                device
            )
            recorded = device in (meta.get("reserved_model_error") or {})
            peaks[device]["reserved_source"] = "recorded" if recorded else "modelled"
    return peaks


def _question_first(peaks: dict[str, Any], meta: dict) -> dict[str, Any]:
    """The peaks with the device the question is about first (an estimate's device, the
    limit's), then the others in device order: a 220 B CPU peak is not the headline of a
    cuda:0 estimate."""
    first = (meta.get("oom") or {}).get("device") or meta.get("device")
    if first not in peaks:
        return peaks
    return {first: peaks[first], **{d: p for d, p in peaks.items() if d != first}}


def _fit(prof: ProfileLike) -> dict[str, Any] | None:
    """The limit split into what fills it (:func:`.._analysis.headroom.headroom`), or None
    without a limit (or where the tables cannot say)."""
    if prof.meta.get("limit") is None:
        return None
    from .._analysis.headroom import headroom

    try:
        return headroom(prof.tables, prof.meta)
    except (KeyError, ValueError):  # no memory events on the limit's device
        return None


def _steps(steps: pd.DataFrame) -> dict[str, int]:
    """``{"complete", "rows"}``: the steps that end at a step boundary, and the steps
    table's rows (one per step; the tail after the last boundary is one not complete)."""
    one = steps.drop_duplicates("step")
    return {"complete": int(one["complete"].sum()), "rows": len(one)}


def _top_categories(allocations: pd.DataFrame, alloc_ids) -> dict[str, int]:
    """Bytes of the blocks ``alloc_ids`` (those live at a peak) per category, largest first,
    categories with no bytes left out."""
    blocks = allocations[member(allocations["alloc_id"].to_numpy(), alloc_ids)]
    by_category = blocks.groupby("category", observed=True)["size_bytes"].sum()
    ordered = by_category.sort_values(ascending=False, kind="stable")
    return {str(cat): int(nbytes) for cat, nbytes in ordered.items() if nbytes > 0}


def _baseline(meta: dict) -> dict[str, dict[str, int]]:
    out = {}
    for device, nbytes in (meta.get("baseline_bytes") or {}).items():
        if nbytes:
            out[device] = {
                "bytes": int(nbytes),
                "untouched": int((meta.get("untouched_bytes") or {}).get(device, 0)),
                "unreachable": int((meta.get("unreachable_bytes") or {}).get(device, 0)),
            }
    return out


def _cuda(meta: dict, peaks: dict) -> dict[str, dict[str, int | None]]:
    reserved = meta.get("reserved_peak_bytes") or {}
    start, end = meta.get("cuda_start") or {}, meta.get("cuda_end") or {}
    out: dict[str, dict[str, int | None]] = {}
    for device in sorted(set(reserved) | set(start) | set(end)):
        if meta.get("estimate") or device not in peaks:
            continue
        out[device] = {
            "reserved_peak": reserved.get(device),
            "outside_start": (start.get(device) or {}).get("outside_torch_bytes"),
            "outside_end": (end.get(device) or {}).get("outside_torch_bytes"),
        }
    return out


def _growth(prof: ProfileLike) -> dict[str, Any] | None:
    """What grows with every step (from :meth:`Profile.leaks`): the bytes all leaks on the
    largest one's device add per step, and the largest leak's holder, callsite and why."""
    leaks = prof.leaks()
    if leaks.empty:
        return None
    first = leaks.iloc[0]
    device = str(first["device"])
    same = leaks[(leaks["device"].astype(object) == device).to_numpy()]

    def text(value) -> str | None:
        return None if pd.isna(value) else str(value)

    from .._analysis.severity import leak_severity

    per_step = int(same["bytes_per_step"].sum())
    return {
        **leak_severity(per_step, prof.steps, prof.meta, device),
        "bytes_per_step": per_step,
        "device": device,
        "holder": text(first["holder"]),
        "callsite": text(first["callsite"]),
        "why": text(first["why"]),
        "leaks": len(leaks),
    }


def _estimate_note(meta: dict) -> str | None:
    if not meta.get("estimate"):
        return None
    missing = meta.get("kernel_memory_not_modelled") or {}
    if meta.get("simulated_cuda"):
        gpu = f" on an {meta['gpu']}" if meta.get("gpu") else ""
        tail = f"; kernel memory not modelled in {', '.join(missing)}" if missing else ""
        line = (
            f"an estimate for {meta.get('device')} without running it; computed on the CPU "
            f"path (no CUDA here) with CUDA's kernels{gpu} where they change the memory{tail}"
        )
    else:
        where = meta.get("device") or "the devices the tensors live on"
        line = f"an estimate for {where} without running it (fake tensors)"
        if missing:
            line += f"; kernel memory not modelled in {', '.join(missing)}"
    compiled = meta.get("compiled_as_eager") or []
    if compiled:
        line += (
            f"; the eager peak of torch.compile'd {', '.join(compiled)} was estimated "
            "(compiled code frees and fuses differently)"
        )
    scalars = meta.get("data_dependent_scalars") or {}
    if scalars:
        line += f"; {len(scalars)} computed scalar(s) read as 0 (optimizer, GradScaler)"
    return line


# -- text ---------------------------------------------------------------------------------
def _when(peak: dict[str, Any]) -> str:
    if peak.get("position") is not None:
        return f" at record #{peak['position']:,}"
    return f" at {format_seconds(peak['offset_s'])}" if peak["offset_s"] is not None else ""


def _peak_phrase(device: str, peak: dict[str, Any]) -> str:
    when = _when(peak)
    return f"peak {format_bytes(peak['bytes'])} on {device}{when}"


def reserved_phrase(device: str, peak: dict[str, Any]) -> str | None:
    """The caching allocator's reserved peak on ``device`` and the fragmentation at the
    peak, or None off CUDA."""
    if peak.get("reserved_bytes") is None:
        return None
    line = (
        f"reserved peak {format_bytes(peak['reserved_bytes'])} on {device} "
        f"(caching allocator, {peak.get('reserved_source', 'modelled')})"
    )
    frag = peak.get("fragmentation_bytes")
    if frag is not None:
        line += f"; fragmentation at the peak {format_bytes(frag)}"
    return line


def _categories_phrase(peak: dict[str, Any]) -> str:
    items = list(peak["top_categories"].items())
    parts = [f"{cat} {format_bytes(b)}" for cat, b in items[:TOP]]
    if len(items) > TOP:
        parts.append(f"{len(items) - TOP} more")
    return ", ".join(parts)


def _counts_phrase(s: dict[str, Any]) -> str:
    return f"{s['ops']:,} ops, {s['blocks']:,} blocks, {s['events']:,} events"


def _timing_phrase(s: dict[str, Any]) -> str:
    parts = []
    if s["wall_s"] is not None:  # an estimate ran nothing: it took that long to compute
        verb = "estimated in" if s["estimate"] else "ran"
        parts.append(f"{verb} {format_seconds(s['wall_s'])}")
    if s.get("finish_s") is not None:
        return ", ".join([*parts, _wait_phrase(s)])
    if s["capture_s"] is not None:
        parts.append(f"capture {format_seconds(s['capture_s'])}")
    if s["analysis_s"] is not None:
        parts.append(f"analysis {format_seconds(s['analysis_s'])}")
    return ", ".join(parts)


#: the parts of the wait after the code, in the order they happen
_WAIT_PARTS = (
    ("stop_s", "stopping torch's profiler"),
    ("capture_s", "capture"),
    ("analysis_s", "analysis"),
    ("free_s", "freeing torch's events"),
)


def _wait_phrase(s: dict[str, Any]) -> str:
    """``then 1.16 s: stopping torch's profiler 478 ms, capture 328 ms, analysis 196 ms,
    freeing torch's events 140 ms``: what leaving the capture took and where it went, the
    parts adding up to it (the rest, when over a tenth of it, as ``other``)."""
    total = s["finish_s"]
    parts, known = [], 0.0
    for key, words in _WAIT_PARTS:
        value = s.get(key)
        if value is not None and (value >= 0.0005 or key in ("capture_s", "analysis_s")):
            parts.append(f"{words} {format_seconds(value)}")
            known += value
    rest = total - known
    if rest > max(0.1 * total, 0.001):
        parts.append(f"other {format_seconds(rest)}")
    return f"then {format_seconds(total)}: " + ", ".join(parts)


def _one_line(s: dict[str, Any]) -> bool:
    """Nothing ran through torch and nothing failed (a comment-only cell): one line says it
    (followed only by what was live before the capture, if anything was)."""
    return s["empty"] and not s["ops"] and not (s["error"] or s["analysis_error"] or s["note"])


def _empty_note(s: dict[str, Any]) -> str:
    if s["analysis_interrupted"]:
        return f"the analysis was interrupted ({s['analysis_error']}): no tables were built"
    if s["analysis_error"]:
        return f"the memory tables could not be built ({s['analysis_error']})"
    return NO_ACTIVITY


def _title(s: dict[str, Any], quote=repr) -> str:
    """``memory profile 'bs32'``, ``memory estimate 'bs32'``, and ``memory estimate of
    step(64x512)`` for an estimate's own label (never "estimate estimate of")."""
    label = s["label"]
    if s["estimate"]:  # the magic's label says "(estimate)" already: said once
        label = label.removesuffix(" (estimate)")
    if s["estimate"] and label.startswith("estimate of "):
        return f"memory {label}"
    kind = "memory estimate" if s["estimate"] else "memory profile"
    return f"{kind} {quote(label)}"


def summary_text(prof: ProfileLike) -> str:
    """A few lines for a terminal: the peak per device and what filled it, counts, timings."""
    s = summary(prof)
    lines = [_title(s)]
    if s["empty"]:
        lines[0] += f": {_empty_note(s)}"
        if _one_line(s):  # the timing in the same line; what was live before, if anything
            if s["wall_s"] is not None:
                lines[0] += f" ({_timing_phrase(s)})"
            lines += [f"  {baseline_phrase(d, b)}" for d, b in s["baseline"].items()]
            return "\n".join(lines)
    oom = oom_phrase(s)
    if oom:
        lines.append(f"  {oom}")
    for device, peak in s["peaks"].items():
        line = f"  {_peak_phrase(device, peak)}"
        if peak["top_categories"]:
            line += f": {_categories_phrase(peak)}"
        lines.append(line)
        reserved = None if device in s["cuda"] else reserved_phrase(device, peak)
        if reserved:
            lines.append(f"  {reserved}")
    lines += [f"  {text}" for _, _, text in _detail_rows(s)]
    tail = ", ".join(p for p in (_counts_phrase(s), _timing_phrase(s)) if p)
    lines.append(f"  {tail}")
    if s["error"]:
        lines.append(f"  the profiled code raised {s['error']} (profile up to that point)")
    if s["note"]:
        lines.append(f"  {s['note']}")
    return "\n".join(lines)


# -- HTML ---------------------------------------------------------------------------------
_STYLE = (
    "font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: 13px; "
    "line-height: 1.5; margin: 2px 0; padding: 4px 8px; "
    "border-left: 3px solid var(--jp-brand-color1, #1976d2);"
)
_ERROR_STYLE = "color: var(--jp-error-color1, #d32f2f);"
_MUTED_STYLE = "color: var(--jp-ui-font-color2, #616161);"
#: memory that grows with every step, by severity (an alarm is red; a note is not)
_SEVERITY_STYLE = {
    "alarm": _ERROR_STYLE,
    "warning": "color: var(--jp-warn-color1, #b26a00);",
    "note": _MUTED_STYLE,
}


def _detail_rows(s: dict) -> list[tuple[str, str, str]]:
    """The lines between the peaks and the counts, as ``(kind, HTML style, text)``: what was
    live before the capture, CUDA's own view, frees found from the allocator's totals,
    memory that grows with every step, a long run's windows."""
    rows = [("baseline", _MUTED_STYLE, baseline_phrase(d, b)) for d, b in s["baseline"].items()]
    rows += [
        ("cuda", _MUTED_STYLE, cuda_phrase(d, c, s["peaks"][d]["bytes"]))
        for d, c in s["cuda"].items()
    ]
    rows += [
        ("inferred", _MUTED_STYLE, inferred_phrase(d, found))
        for d, found in s["inferred_frees"].items()
    ]
    source, oom = source_phrase(s), snapshot_oom_phrase(s)
    if oom:
        rows.append(("snapshot-oom", _ERROR_STYLE, oom))
    if source:
        rows.append(("source", _MUTED_STYLE, source))
    if s["not_recorded"]:
        rows.append(("not-recorded", _MUTED_STYLE, not_recorded_phrase(s)))
    budget = budget_phrase(s)
    if budget:
        rows.append(("budget", _ERROR_STYLE, budget))
    growth, long_run, steps = growth_phrase(s), long_run_phrase(s), steps_phrase(s)
    if steps:
        rows.append(("steps", _MUTED_STYLE, steps))
    if growth:
        severity = (s.get("growth") or {}).get("severity", "alarm")
        rows.append(("growth", _SEVERITY_STYLE.get(severity, _ERROR_STYLE), growth))
    if long_run:
        rows.append(("long-run", _MUTED_STYLE, long_run))
    return rows


def summary_html(prof: ProfileLike) -> str:
    """The summary as a compact HTML block (class ``memprof-summary``); every string that
    comes from the profile (label, devices, categories, error) is escaped."""
    e = html.escape
    s = summary(prof)
    rows = []
    head = f"<b>{e(_title(s, quote=str))}</b>"
    if s["empty"]:
        head += f": {e(_empty_note(s))}"
    if _one_line(s) and s["wall_s"] is not None:
        head += f' <span style="{_MUTED_STYLE}">({e(_timing_phrase(s))})</span>'
    rows.append(f'<div class="memprof-summary-head">{head}</div>')
    if _one_line(s):
        rows += [
            f'<div class="memprof-summary-baseline" style="{_MUTED_STYLE}">'
            f"{e(baseline_phrase(d, b))}</div>"
            for d, b in s["baseline"].items()
        ]
        return f'<div class="memprof-summary" style="{_STYLE}">{"".join(rows)}</div>'

    oom = oom_phrase(s)
    if s.get("fit"):  # the bar and the verdict in words
        rows.append(fit_html(s["fit"]))
    if oom and (s["oom"] or not s.get("fit")):
        style = _ERROR_STYLE if s["oom"] else _MUTED_STYLE
        rows.append(f'<div class="memprof-summary-oom" style="{style}">{e(oom)}</div>')
    for device, peak in s["peaks"].items():
        when = e(_when(peak))
        line = f"peak <b>{e(format_bytes(peak['bytes']))}</b> on {e(device)}{when}"
        if peak["top_categories"]:
            line += f": {e(_categories_phrase(peak))}"
        rows.append(f'<div class="memprof-summary-peak">{line}</div>')
        reserved = None if device in s["cuda"] else reserved_phrase(device, peak)
        if reserved:
            rows.append(f'<div class="memprof-summary-reserved">{e(reserved)}</div>')
    rows += [
        f'<div class="memprof-summary-{kind}" style="{style}">{e(text)}</div>'
        for kind, style, text in _detail_rows(s)
    ]
    tail = ", ".join(p for p in (_counts_phrase(s), _timing_phrase(s)) if p)
    rows.append(f'<div class="memprof-summary-counts" style="{_MUTED_STYLE}">{e(tail)}</div>')
    if s["error"]:
        rows.append(
            f'<div class="memprof-summary-error" style="{_ERROR_STYLE}">the profiled code '
            f"raised {e(s['error'])} (profile up to that point)</div>"
        )
    if s["note"]:
        rows.append(
            f'<div class="memprof-summary-note" style="{_MUTED_STYLE}">{e(s["note"])}</div>'
        )
    return f'<div class="memprof-summary" style="{_STYLE}">{"".join(rows)}</div>'
