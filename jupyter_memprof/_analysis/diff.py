"""What changed between two profiles: their peaks, subtracted.

A pure function of two profiles' tables. For a key (``category``, ``module``, ``op`` or
``name``) it takes the blocks live at each profile's own peak (:func:`.peak.peak`), sums
their bytes per key and returns one row per key: ``a``, ``b``, ``delta`` (b - a) and
``ratio`` (b / a; ``inf`` for keys only ``b`` has, 0 for keys only ``a`` has), largest
change first. Keys present in neither peak do not appear. Memory the code never touched
(left from before the capture, used by no op, alive at its end) is left out of both by
default: it is not the step's, and an earlier cell's outputs would dilute its change.

The result is an ordinary DataFrame; ``jupyter_memprof.diff`` gives it as a ``Diff``, which
prints for people (sizes with units, a headline first: :mod:`jupyter_memprof._views.text`). The headline names the change of the peak and its biggest
cause: the category that moved most in the peak's direction and, inside it, the module, or
the family of numbered modules (``model.encoder.layers.*``), that holds most of that change.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._units import format_bytes
from .peak import GROUPS, peak

BY = tuple(GROUPS)
NONE = "(none)"

#: A module (or family) is named as the main cause when it holds this share of the change.
MOSTLY = 0.5


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a > 0, b / np.where(a > 0, a, 1), np.where(b > 0, np.inf, np.nan))


def _grouped(blocks: pd.DataFrame, by: str) -> pd.Series:
    col = blocks[GROUPS[by]].astype(object)
    key = col.where(col.notna(), NONE)
    return blocks["size_bytes"].groupby(key.to_numpy()).sum()


def family(module: str) -> str:
    """``model.encoder.layers.3.linear1`` -> ``model.encoder.layers.*``: the path up to its
    first numbered part, which stands for every sibling (unchanged when nothing is numbered)."""
    parts = module.split(".")
    for i, p in enumerate(parts):
        if i and p.isdigit():
            return ".".join([*parts[:i], "*"])
    return module


def _main_module(pa: pd.DataFrame, pb: pd.DataFrame, category: str, sign: int) -> str | None:
    """The module, or family of modules, holding most of ``category``'s change at the peak."""
    sa = _grouped(pa[pa["category"].astype(object) == category], "module")
    sb = _grouped(pb[pb["category"].astype(object) == category], "module")
    d = sb.sub(sa, fill_value=0) * sign
    d = d[d > 0]
    total = d.sum()
    if total <= 0:
        return None
    top = d.idxmax()
    if d[top] >= MOSTLY * total:
        return f"mostly {top}"
    fam = d.groupby([family(str(k)) if k != NONE else NONE for k in d.index]).sum()
    top = fam.idxmax()
    return f"{'mostly' if fam[top] >= MOSTLY * total else 'most in'} {top}"


def untouched_ids(tables: dict[str, pd.DataFrame]) -> np.ndarray:
    """alloc_ids of the blocks the profiled code never touched: they existed before the
    capture (no allocation time), no op read or wrote them (no row of ``uses``) and they
    are alive at its end (memory left from before: an earlier cell's outputs)."""
    a, u = tables["allocations"], tables["uses"]
    before = a["alloc_ns"].isna().to_numpy(dtype=bool)
    kept = a["free_ns"].isna().to_numpy(dtype=bool)
    used = a["alloc_id"].isin(u["alloc_id"].dropna().astype("int64")).to_numpy(dtype=bool)
    return a["alloc_id"].to_numpy(dtype=np.int64)[before & kept & ~used]


def _touched(p: pd.DataFrame, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The peak's blocks less the untouched ones; ``attrs``: the peak's, and
    ``untouched_bytes`` (what was left out)."""
    gone = p["alloc_id"].isin(untouched_ids(tables)).to_numpy(dtype=bool)
    out = p[~gone]
    out.attrs = {**p.attrs, "untouched_bytes": int(p["size_bytes"][gone].sum())}
    return out


def summary_line(pa: pd.DataFrame, pb: pd.DataFrame) -> str:
    """``peak +6.1 MiB (+48%): activation +5.9 MiB, mostly model.encoder.layers.*``; the
    step's own change when untouched memory was left out (``attrs["untouched_bytes"]``)."""
    a, b = int(pa.attrs.get("peak_bytes") or 0), int(pb.attrs.get("peak_bytes") or 0)
    a -= int(pa.attrs.get("untouched_bytes") or 0)
    b -= int(pb.attrs.get("untouched_bytes") or 0)
    change = b - a
    if change == 0:
        line = f"peak unchanged ({format_bytes(a)})"
    else:
        pct = f" ({change / a:+.0%})" if a else ""
        line = f"peak {signed_bytes(change)}{pct}"
    sa, sb = _grouped(pa, "category"), _grouped(pb, "category")
    d = sb.sub(sa, fill_value=0)
    sign = 1 if change >= 0 else -1
    moved = d[d * sign > 0]
    if moved.empty:
        return line
    top = moved.abs().idxmax()
    cause = f"{top} {signed_bytes(int(moved[top]))}"
    where = _main_module(pa, pb, top, sign)
    return f"{line}: {cause}" + (f", {where}" if where else "")


def diff(
    tables_a: dict[str, pd.DataFrame],
    tables_b: dict[str, pd.DataFrame],
    by: str = "category",
    *,
    device: str | None = None,
    labels: tuple[str, str] = ("a", "b"),
    untouched: bool = False,
) -> pd.DataFrame:
    """Bytes live at the peak of ``a`` and of ``b``, per ``by`` key, and how they changed.

    ``device`` picks the device in both (default: each profile's device with the highest
    peak). Blocks the code never touched (:func:`untouched_ids`: memory left from before)
    are left out of both unless ``untouched``; the headline is then the step's own change
    (``attrs``: ``untouched_a``, ``untouched_b``, the bytes left out).
    """
    if by not in GROUPS:
        raise ValueError(f"diff(by={by!r}): choose one of {', '.join(BY)}")
    pa, pb = peak(tables_a, device), peak(tables_b, device)
    if not untouched:
        pa, pb = _touched(pa, tables_a), _touched(pb, tables_b)
    sa, sb = _grouped(pa, by), _grouped(pb, by)
    keys = sa.index.union(sb.index)
    a = sa.reindex(keys, fill_value=0).to_numpy(dtype=np.int64)
    b = sb.reindex(keys, fill_value=0).to_numpy(dtype=np.int64)
    out = pd.DataFrame(
        {"a": a, "b": b, "delta": b - a, "ratio": _ratio(a, b)},
        index=pd.Index([str(k) for k in keys], dtype=object, name=by),
    )
    order = np.lexsort((out.index.to_numpy(dtype=str), -np.abs(out["delta"].to_numpy())))
    out = out.iloc[order]
    out.attrs.update(
        by=by,
        peak_a=int(pa.attrs.get("peak_bytes") or 0),
        peak_b=int(pb.attrs.get("peak_bytes") or 0),
        device_a=pa.attrs.get("device"),
        device_b=pb.attrs.get("device"),
        label_a=str(labels[0]),
        label_b=str(labels[1]),
        summary=summary_line(pa, pb),
        untouched_a=int(pa.attrs.get("untouched_bytes") or 0),
        untouched_b=int(pb.attrs.get("untouched_bytes") or 0),
    )
    return out


# -- text ------------------------------------------------------------------------------------
def signed_bytes(n: int) -> str:
    """A change in bytes with its sign: ``'+5.9 MiB'``, ``'-1.0 KiB'``, ``'0 B'`` (the diff
    table, its summary line and the compare view all print deltas with it)."""
    return ("+" if n > 0 else "") + format_bytes(n) if n else "0 B"
