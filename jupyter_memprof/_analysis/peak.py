"""The peak: when live memory was highest on a device, and which blocks made it up."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._devices import device_sort_key
from . import schema as S
from .schema import Action
from .tables import op_context
from .timeline import totals

PEAK_COLUMNS = {
    **S.ALLOCATIONS,
    "op_name": S.OPEN_CATEGORY,
    "callsite": S.STRING,
    "phase": S.PHASE_DTYPE,
}


def peak_per_device(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per device (in :func:`~jupyter_memprof._devices.device_sort_key` order):
    peak_bytes, peak_ns and the event position of the peak."""
    t = totals(tables["events"], tables["versions"])
    if t.empty:
        return pd.DataFrame({"device": [], "peak_bytes": [], "peak_ns": [], "event": []})
    idx = t.groupby("device")["bytes"].idxmax()
    idx = idx[sorted(idx.index, key=device_sort_key)]
    p = t.loc[idx.to_numpy()].rename(columns={"bytes": "peak_bytes", "time_ns": "peak_ns"})
    return p[["device", "peak_bytes", "peak_ns", "event"]].reset_index(drop=True)


def live_after(tables: dict[str, pd.DataFrame], event: int) -> np.ndarray:
    """alloc_ids of the blocks alive right after event number ``event``."""
    ev = tables["events"].reset_index(drop=True)
    act = ev["action"].astype(object).to_numpy()
    pos = np.arange(len(ev))
    born = ev.loc[
        (act != Action.DESTROY.value) & (act != Action.INCREMENT_VERSION.value) & (pos <= event),
        "alloc_id",
    ]
    dead = ev.loc[(act == Action.DESTROY.value) & (pos <= event), "alloc_id"]
    return np.setdiff1d(born.to_numpy(), dead.to_numpy())


def with_op_context(tables: dict[str, pd.DataFrame], blocks: pd.DataFrame) -> pd.DataFrame:
    """Add the allocating op's name, callsite and phase to allocation rows (their ``module``
    is the block's own: see :mod:`.categories`)."""
    out = blocks.copy()
    for col, values in op_context(tables["ops"], blocks["alloc_op_id"]).items():
        if col in PEAK_COLUMNS and col not in S.ALLOCATIONS:
            out[col] = values
    return S.conform(out, PEAK_COLUMNS, name="peak")


def peak(tables: dict[str, pd.DataFrame], device: str | None = None) -> pd.DataFrame:
    """The blocks live at the peak of ``device`` (default: the device with the highest peak),
    largest first, with the module they belong to and the op and callsite that allocated
    them.

    ``.attrs``: ``peak_bytes``, ``peak_ns`` and ``device``. With no memory events the table is
    empty and ``peak_bytes`` is 0.
    """
    per = peak_per_device(tables)
    if device is not None:
        device = str(device)
        sel = per[per["device"] == device]
    else:
        sel = per.sort_values("peak_bytes", ascending=False).head(1)
    if sel.empty:
        if device is not None and not per.empty:
            raise ValueError(
                f"no memory events on device {device!r}; devices seen: {sorted(per['device'], key=device_sort_key)}"
            )
        out = S.empty(PEAK_COLUMNS)
        out.attrs.update(peak_bytes=0, peak_ns=None, device=device)
        return out
    row = sel.iloc[0]
    alive = live_after(tables, int(row["event"]))
    a = tables["allocations"]
    blocks = a[a["alloc_id"].isin(alive) & (a["device"].astype(object) == row["device"])]
    out = (
        with_op_context(tables, blocks)
        .sort_values(["size_bytes", "alloc_id"], ascending=[False, True])
        .reset_index(drop=True)
    )
    out.attrs.update(
        peak_bytes=int(row["peak_bytes"]), peak_ns=int(row["peak_ns"]), device=str(row["device"])
    )
    return out


GROUPS = {"category": "category", "module": "module", "op": "op_name", "name": "name"}


def peak_by(
    tables: dict[str, pd.DataFrame], by: str = "category", device: str | None = None
) -> pd.Series:
    """Bytes live at the peak, grouped; blocks with no value for ``by`` count under "(none)"."""
    if by not in GROUPS:
        raise ValueError(f"peak_by(by={by!r}): choose one of {sorted(GROUPS)}")
    p = peak(tables, device)
    key = p[GROUPS[by]].astype(object).where(p[GROUPS[by]].notna(), "(none)")
    out = p["size_bytes"].groupby(key.to_numpy()).sum().sort_values(ascending=False)
    out.name = "size_bytes"
    out.index.name = by
    out.attrs.update(p.attrs)
    return out
