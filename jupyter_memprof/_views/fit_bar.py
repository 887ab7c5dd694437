"""Will it fit: the limit as one bar, and the verdict in words.

Will it fit, at a glance: one bar of the limit split into what fills it, and the verdict
in words (the parts: :func:`jupyter_memprof._analysis.headroom.headroom`)."""

from __future__ import annotations

import html
from typing import Any

from .._units import format_bytes
from .dashboard.columns import CATEGORY_COLORS

CACHE_COLOR = "#6a1b9a"
CONTEXT_COLOR = "#455a64"
HEADROOM_COLOR = "#c8e6c9"
OVERSHOOT_COLOR = "#d32f2f"


def verdict(fit: dict[str, Any]) -> str:
    """One line: fits or not, by how much, and what was counted."""
    limit, dev = format_bytes(fit["limit"]), fit["device"]
    parts = [f"tensors {format_bytes(fit['tensors'])}"]
    if fit["cache"]:
        parts.append(f"allocator cache and fragmentation {format_bytes(fit['cache'])}")
    if fit["context"]:
        parts.append(f"CUDA context {format_bytes(fit['context'])}")
    counted = ", ".join(parts)
    if fit["fits"]:
        return (
            f"fits in the limit of {limit} on {dev}: needs {format_bytes(fit['used'])} "
            f"({counted}), headroom {format_bytes(fit['headroom'])}"
        )
    return (
        f"does not fit in the limit of {limit} on {dev}: needs {format_bytes(fit['used'])} "
        f"({counted}), {format_bytes(-fit['headroom'])} over"
    )


def _segments(fit: dict[str, Any]) -> list[tuple[str, int, str]]:
    """The bar's parts: (label, bytes, colour), in the order drawn."""
    out = [
        (c, b, CATEGORY_COLORS.get(c, CATEGORY_COLORS["unknown"]))
        for c, b in fit["categories"].items()
    ]
    rest = fit["tensors"] - sum(fit["categories"].values())
    if rest > 0:  # tensors the category split does not cover (the request that ran out)
        out.append(("other tensors", rest, CATEGORY_COLORS["unknown"]))
    if fit["cache"]:
        out.append(("allocator cache and fragmentation", fit["cache"], CACHE_COLOR))
    if fit["context"]:
        out.append(("CUDA context", fit["context"], CONTEXT_COLOR))
    if fit["headroom"] > 0:
        out.append(("headroom", fit["headroom"], HEADROOM_COLOR))
    return out


def fit_html(fit: dict[str, Any]) -> str:
    """The bar (a flex row of coloured parts, as wide as its panel, the limit marked), its
    key and the verdict, as HTML (class ``memprof-fit``); every label is escaped."""
    e = html.escape
    scale = max(fit["limit"], fit["used"], 1)
    cells = []
    for label, nbytes, color in _segments(fit):
        share = 100 * nbytes / scale
        tip = e(f"{label} {format_bytes(nbytes)}")
        cells.append(
            f'<div class="memprof-fit-part" title="{tip}" data-bytes="{nbytes}" '
            f'style="flex:0 0 {share:.3f}%;background:{color}"></div>'
        )
    mark = 100 * fit["limit"] / scale
    over = fit["headroom"] < 0
    limit_mark = (
        f'<div class="memprof-fit-limit" style="position:absolute;top:-3px;bottom:-3px;'
        f'left:calc({mark:.3f}% - 1px);width:2px;background:{OVERSHOOT_COLOR}"></div>'
    )
    bar = (
        f'<div class="memprof-fit-bar" role="img" aria-label="{e(verdict(fit))}" '
        'style="position:relative;display:flex;height:16px;width:100%;max-width:720px;'
        f'border:1px solid #9e9e9e;box-sizing:border-box">{"".join(cells)}'
        f"{limit_mark if over else ''}</div>"
    )
    key = " ".join(
        f'<span style="white-space:nowrap"><span style="display:inline-block;width:10px;'
        f'height:10px;background:{color};margin-right:3px"></span>'
        f"{e(label)} {e(format_bytes(nbytes))}</span>"
        for label, nbytes, color in _segments(fit)
    )
    style = f"color:{OVERSHOOT_COLOR};font-weight:600" if not fit["fits"] else "font-weight:600"
    return (
        '<div class="memprof-fit" style="margin:4px 0 6px">'
        f'<div class="memprof-fit-verdict" style="{style}">{e(verdict(fit))}</div>{bar}'
        f'<div class="memprof-fit-key" style="font-size:11px;line-height:1.6">{key}</div></div>'
    )
