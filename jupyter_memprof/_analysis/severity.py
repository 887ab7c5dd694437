"""How much a leak matters, judged against the step and device.

A block kept every step is a leak whatever its size, but 4 B per step (a list of loss
scalars) is not 40 MiB per step. Two measures, each a named rule below:

- its **share** of the step's peak (bytes added per step / the highest peak of a step on
  that device): how fast it changes what a step needs;
- the **steps to fill** the device: the room left above the step's peak (the capacity: a
  limit when the profile has one, else the CUDA device's total memory as the driver
  reported it, else unknown: the CPU) divided by the bytes per step.

The severity is the worst of the two rules' verdicts: an ``alarm`` (the run will fail, or
soon needs much more), a ``warning``, or a ``note`` (worth knowing, harmless at this rate).
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

import pandas as pd

#: share of the step's peak per step from which a leak is a warning, an alarm
SHARE_WARNING = 0.001
SHARE_ALARM = 0.01
#: steps to fill the device under which a leak is a warning, an alarm
STEPS_WARNING = 1_000_000
STEPS_ALARM = 10_000


class Severity(str, Enum):
    """How much memory that grows with every step matters (least first)."""

    NOTE = "note"
    WARNING = "warning"
    ALARM = "alarm"


_ORDER = list(Severity)


def by_share(share: float) -> Severity:
    """The share of the step's peak added per step: 1% an alarm, 0.1% a warning."""
    if share >= SHARE_ALARM:
        return Severity.ALARM
    return Severity.WARNING if share >= SHARE_WARNING else Severity.NOTE


def by_steps_to_fill(steps: float | None) -> Severity:
    """The steps until the device is full: under 10,000 an alarm, under a million a
    warning; unknown (no capacity known) says nothing."""
    if steps is None:
        return Severity.NOTE
    if steps < STEPS_ALARM:
        return Severity.ALARM
    return Severity.WARNING if steps < STEPS_WARNING else Severity.NOTE


def capacity(meta: dict[str, Any], device: str) -> int | None:
    """The bytes ``device`` can hold: the profile's limit (on its device), else a CUDA
    device's total memory as the driver reported it at the capture's start; else None."""
    limit = meta.get("limit")
    if limit is not None and meta.get("device") in (None, device):
        return int(limit)
    total = ((meta.get("cuda_start") or {}).get(device) or {}).get("total")
    return int(total) if total else None


def leak_severity(
    bytes_per_step: int, steps: pd.DataFrame, meta: dict[str, Any], device: str
) -> dict[str, Any]:
    """The severity of ``bytes_per_step`` growing on ``device`` (``steps``: the profile's
    steps table). Keys: ``severity`` (a :class:`Severity` value), ``share`` (of the step's
    peak), ``step_peak`` (bytes), ``capacity`` and ``steps_to_fill`` (None when unknown)."""
    mine = steps[(steps["device"].astype(object) == device).to_numpy()] if len(steps) else steps
    step_peak = int(mine["peak_bytes"].max()) if len(mine) else 0
    share = bytes_per_step / step_peak if step_peak > 0 else math.inf
    cap = capacity(meta, device)
    to_fill = None
    if cap is not None and bytes_per_step > 0:
        to_fill = max(cap - step_peak, 0) / bytes_per_step
    worst = max(by_share(share), by_steps_to_fill(to_fill), key=_ORDER.index)
    return {
        "severity": worst.value,
        "share": share,
        "step_peak": step_peak,
        "capacity": cap,
        "steps_to_fill": to_fill,
    }
