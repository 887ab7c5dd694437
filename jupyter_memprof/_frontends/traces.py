"""``load_trace()``: a trace torch's profiler wrote, as a Profile.

The Kineto producer (:mod:`jupyter_memprof._producers.kineto`) reads the file into records,
and the run ends as every run does (:func:`.finish.fill`): the same analysis, tables and
views as a capture. ``load`` and ``load_many`` recognise traces by their content
(:func:`load_any`).
"""

from __future__ import annotations

import os
import re
import zipfile

from .._errors import ProfileFileError
from .._results.profile import Profile, fs_path
from .._results.profile import load as load_saved

__all__ = ["load_any", "load_trace", "trace_files"]

#: a rank in a file name: ``rank1``, ``rank_1``, ``rank-1``
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def load_trace(path: str | os.PathLike, *, label: str | None = None) -> Profile:
    """Load a trace torch's profiler wrote with ``profile_memory=True`` as a profile.

    ``prof.export_chrome_trace(...)`` and ``tensorboard_trace_handler`` write them (plain JSON
    or ``.gz``). Blocks are paired from the ``[memory]`` events by address, each with the op
    and callsite around it; phases come from the autograd and optimizer events, steps from
    ``ProfilerStep#N``. A trace has no tensor ids, so categories follow when blocks were made
    and freed (``meta["tensor_ids"]`` is False; see docs/traces.md).

    Parameters
    ----------
    path : str or os.PathLike
        The trace file (``*.pt.trace.json``, ``*.json.gz``, any name).
    label : str, optional
        The profile's name in summaries; default: the file's name without its suffixes.

    Returns
    -------
    Profile
        ``meta["trace"]`` holds the trace's own fields and its ``[OutOfMemory]`` events;
        ``meta["rank"]`` comes from its distributed info, else a ``rank<N>`` in its name.

    Raises
    ------
    ProfileFileError
        The file is not such a trace, is damaged or crafted, or holds no memory events:
        one line naming the file and what is wrong.
    FileNotFoundError
        ``path`` does not exist.

    Examples
    --------
    >>> p.export_chrome_trace("step.pt.trace.json")  # doctest: +SKIP
    >>> jupyter_memprof.load_trace("step.pt.trace.json").peak_by("category")  # doctest: +SKIP
    """
    # here, not at the top: `load` of a saved file (the command line's summary) stays
    # free of torch, which finish and the producer import
    from .._producers.kineto import read_trace
    from . import finish

    path = fs_path(path)
    prof = Profile.empty()
    extra: dict = {}

    def produce(reading):
        capture, meta = read_trace(path)
        extra.update(meta)
        return capture

    finish.fill(prof, produce)
    prof.meta.update(extra)
    prof.meta["tensor_ids"] = False
    prof.meta["label"] = label or _label(path)
    if "rank" not in prof.meta:
        m = _RANK_IN_NAME.search(os.path.basename(path))
        if m:
            prof.meta["rank"] = int(m.group(1))
    return prof


def _label(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name or "trace"


def load_any(path: str | os.PathLike) -> Profile:
    """Load a profile written by :meth:`Profile.save`, or a trace torch's profiler wrote.

    Which one is told by the content, not the name: a zip file or a Parquet folder is a
    saved profile (read as :func:`jupyter_memprof._results.profile.load` reads it: no code
    from the file runs, sizes are checked before anything is decompressed, then every table
    and metadata field); a JSON trace (plain or gzip) goes to :func:`load_trace`; a torch
    memory snapshot (a pickle, or JSON naming ``segments`` or ``device_traces``) to
    :func:`jupyter_memprof.load_snapshot`.

    Parameters
    ----------
    path : str or os.PathLike
        The zip file, the Parquet folder, the trace or the memory snapshot.

    Returns
    -------
    Profile
        With its kept windows (``.kept``) when it was a long run.

    Raises
    ------
    ProfileFileError
        The file is damaged, truncated, crafted or neither a saved profile nor a trace: one
        line naming the file and what is wrong.
    FileNotFoundError
        ``path`` does not exist.

    Examples
    --------
    >>> prof.save("step.memprof")  # doctest: +SKIP
    >>> jupyter_memprof.load("step.memprof").peak_by("category")  # doctest: +SKIP
    """
    from .._producers.kineto import looks_like_trace
    from .._producers.snapshot.unpickle import is_snapshot_file

    p = fs_path(path)
    if os.path.isfile(p) and is_snapshot_file(p):
        from .snapshot import open_snapshot

        return open_snapshot(p, remember=False)  # as a saved profile: not in the panel
    if os.path.isfile(p) and looks_like_trace(p):
        return load_trace(p)
    if os.path.isfile(p) and not zipfile.is_zipfile(p):
        raise ProfileFileError(
            f"{p} is none of the files jupyter_memprof opens: a saved profile (a zip or a "
            "Parquet folder), a torch memory snapshot or a trace of torch's profiler"
        )
    return load_saved(p)


def trace_files(path) -> list[str] | None:
    """The trace files in the folder ``path`` (``*.json``, ``*.json.gz``; sorted), or None
    when ``path`` is not such a folder (a Parquet profile's folder holds ``meta.json``)."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    from .._producers.kineto import looks_like_trace

    folder = os.path.expanduser(os.fspath(path))
    if not os.path.isdir(folder) or os.path.exists(os.path.join(folder, "meta.json")):
        return None
    names = sorted(n for n in os.listdir(folder) if n.endswith((".json", ".json.gz")))
    found = [os.path.join(folder, n) for n in names]
    found = [p for p in found if os.path.isfile(p) and looks_like_trace(p)]
    return found or None
