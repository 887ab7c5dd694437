"""A long run's kept windows (``prof.kept``) in a saved file.

A long run keeps the full tables of the windows that hold the steps asked for (``keep=``:
"first", "peak", "last", step numbers), each a profile of its own in ``prof.kept``; several
kept steps may share one window. A saved profile stores each distinct window once, as a
profile of its own under ``kept/<i>/`` (the zip's member names, or the Parquet folder's
subfolders), and lists them in its main document::

    "kept_windows": [{"keep": ["first", "peak"], "shares_tables": true},
                     {"keep": ["last"], "shares_tables": false}]

A window that ``shares_tables`` is the one whose tables are the profile's own (the peak's,
usually): only its ``steps`` and ``leaks`` (its own, not the run's) and its metadata are
stored, and on load it shares the profile's other tables (a window saved before ``leaks``
was a table finds its own from them). Files saved before kept windows were
saved, and profiles that are not long runs, have no ``kept_windows``: ``prof.kept`` is
empty. Readers that do not know the key ignore it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from .._analysis import schema as S
from .checks import Bad, describe

#: the key of the main document that lists the kept windows
KEY = "kept_windows"
#: the kept windows a saved profile may hold (each up to a member per table and its meta)
MAX_WINDOWS = 64
#: the tables a window that shares the profile's tables stores (its own steps and leaks)
OWN_TABLES = ("steps", "leaks")
#: what ``keep=`` names besides step numbers (``long_run.KeptStep``)
_NAMED = ("first", "peak", "last")


@dataclass
class Window:
    """One kept window as saved: the kept steps it holds, its metadata, its tables (only
    :data:`OWN_TABLES` when it shares the profile's), and whether it shares them."""

    keep: list[str | int]
    meta: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    shares_tables: bool


def prefix(i: int) -> str:
    """Where window ``i`` is stored: a member-name prefix, or a subfolder."""
    return f"kept/{i}/"


def windows_of(tables: dict[str, pd.DataFrame], kept: dict[Any, Any]) -> list[Window]:
    """The distinct windows of ``prof.kept`` (kept step -> profile; ``tables``: the
    profile's own), in order."""
    out: list[Window] = []
    seen: dict[int, Window] = {}
    for what, p in kept.items():
        if id(p) in seen:
            seen[id(p)].keep.append(what)
            continue
        own = p.tables
        shares = all(own[n] is tables[n] for n in S.TABLES if n not in OWN_TABLES)
        window = Window(
            [what],
            dict(p.meta),
            {n: own[n] for n in OWN_TABLES} if shares else own,
            shares,
        )
        seen[id(p)] = window
        out.append(window)
    if len(out) > MAX_WINDOWS:
        raise ValueError(
            f"a saved profile holds at most {MAX_WINDOWS} kept windows, and this long run "
            f"keeps {len(out)}; keep fewer steps (keep=)"
        )
    return out


def to_doc(windows: list[Window]) -> list[dict]:
    """The main document's :data:`KEY` entry."""
    return [{"keep": list(w.keep), "shares_tables": w.shares_tables} for w in windows]


def _keep_ok(value) -> bool:
    if type(value) is str:
        return value in _NAMED
    return type(value) is int and value >= 0


def from_doc(value) -> list[tuple[list[str | int], bool]]:
    """The kept windows a main document lists: (kept steps, shares the profile's tables)
    each; raises Bad for anything else (absent: none)."""
    if value is None:
        return []
    if type(value) is not list:
        raise Bad(f"lists its kept windows as {describe(value)}, not a list")
    if len(value) > MAX_WINDOWS:
        raise Bad(f"lists {len(value)} kept windows, over {MAX_WINDOWS}")
    out: list[tuple[list[str | int], bool]] = []
    seen: set = set()
    for i, entry in enumerate(value):
        if type(entry) is not dict:
            raise Bad(f"kept window {i} is {describe(entry)}, not an object")
        keep, shares = entry.get("keep"), entry.get("shares_tables")
        if type(keep) is not list or not keep or not all(_keep_ok(k) for k in keep):
            raise Bad(
                f"kept window {i} names its steps as {describe(keep)}, not first, peak, "
                "last or step numbers"
            )
        if type(shares) is not bool:
            raise Bad(
                f"kept window {i} says shares_tables is {describe(shares)}, not true or false"
            )
        if seen.intersection(keep):
            raise Bad(f"kept window {i} names a step another window names")
        seen.update(keep)
        out.append((list(keep), shares))
    return out
