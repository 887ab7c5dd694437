"""A profile's files: saving, reading, older files made whole.

:meth:`Profile.save <jupyter_memprof._results.profile.Profile.save>` and
:func:`~jupyter_memprof._results.profile.load` go through here: the format (a zip of JSON,
:mod:`.storage`; a folder of Parquet, :mod:`.parquet`), a long run's kept windows
(:mod:`.kept`), and what a file saved by an earlier version lacks, made from what it holds:
``steps`` from the other tables; ``leaks`` from a long run's ``meta["leaks"]``, else found
again by the profile from its other tables.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd


def save(prof: Any, path: str, format: str = "zip", *, overwrite: bool = False) -> str:
    """:meth:`Profile.save <jupyter_memprof._results.profile.Profile.save>` of ``prof`` to
    ``path`` (``{rank}`` already expanded)."""
    if format not in ("zip", "parquet"):
        raise ValueError(f"unknown format {format!r}: use 'zip' or 'parquet'")
    from .kept import windows_of

    kept = windows_of(prof.tables, prof.kept)
    if format == "parquet":
        from .parquet import write_folder

        return write_folder(
            prof.tables, prof.meta, path, overwrite=overwrite, kept=kept, snapshot=prof.snapshot
        )
    from .storage import write

    return write(
        prof.tables, prof.meta, path, overwrite=overwrite, kept=kept, snapshot=prof.snapshot
    )


def read(path: str) -> tuple[dict[str, pd.DataFrame], dict, list[tuple[list, dict, dict]], Any]:
    """What :func:`jupyter_memprof._results.profile.load` makes a profile of: the tables,
    meta, kept windows (each: the kept steps it holds, its tables, its meta; a window that
    shares the profile's tables holds the same objects) and snapshot of the file or folder
    ``path`` (``{rank}``: this process's rank), with what a file saved before lacks made
    from what it holds (``steps``; ``leaks``, None: found by the profile)."""
    if "{rank}" in path:
        path = path.replace("{rank}", str(this_rank()))
    if os.path.isdir(path):
        from .parquet import read_folder

        tables, meta, kept, snapshot = read_folder(path)
    else:
        from .storage import read as read_zip

        tables, meta, kept, snapshot = read_zip(path)
    if tables["steps"].empty and not tables["timeline"].empty:  # saved before steps existed
        tables["steps"] = _rebuilt_steps(tables, meta)
    tables["leaks"] = _saved_leaks(tables, meta)
    windows = []
    for window in kept:  # a long run's kept windows; a shared one takes the profile's tables
        own = {**tables, **window.tables} if window.shares_tables else window.tables
        own["leaks"] = _saved_leaks(own, window.meta)
        windows.append((window.keep, own, window.meta))
    return tables, meta, windows, snapshot


def this_rank() -> int:
    """This process's ``torch.distributed`` rank, 0 outside it (what ``save`` writes for a
    profile captured here)."""
    import torch

    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _rebuilt_steps(tables: dict[str, pd.DataFrame], meta: dict) -> pd.DataFrame:
    """The ``steps`` table of a profile saved without one, from its other tables."""
    from .._analysis.steps import build_steps

    timeline = tables["timeline"]
    start = meta.get("start_ns")
    start = int(timeline["time_ns"].min()) if start is None else int(start)
    end = meta.get("end_ns")
    return build_steps(
        tables["ops"], tables["events"], timeline, start, start if end is None else int(end)
    )


def _saved_leaks(tables: dict[str, pd.DataFrame], meta: dict) -> pd.DataFrame | None:
    """The ``leaks`` table of a loaded profile: a long run saved before the table existed
    kept its rows in ``meta["leaks"]`` (moved to the table here); None where the file may
    have been saved without the table (it is empty, and not a long run's: the profile
    finds it again from its other tables, as it was found when it was saved)."""
    if "leaks" in meta:
        from .._analysis.leaks import from_meta

        return from_meta(meta.pop("leaks"))
    if tables["leaks"].empty and "long_run" not in meta:
        return None
    return tables["leaks"]
