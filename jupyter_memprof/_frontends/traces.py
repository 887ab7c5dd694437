"""``jupyter_memprof.load_trace``: a trace torch's profiler wrote, as a :class:`Profile`.

The Kineto producer (:mod:`jupyter_memprof._producers.kineto`) reads the file into records,
and the run ends as every run does (:func:`.finish.fill`): the same analysis, tables and
views as a capture. ``load`` and ``load_many`` recognise traces by their content
(:func:`load_any`).
"""

from __future__ import annotations

import os
import re

from .._results.profile import Profile, _path
from .._results.profile import load as load_saved
from . import finish

__all__ = ["load_any", "load_trace", "trace_files"]

#: a rank in a file name: ``rank1``, ``rank_1``, ``run_r1``
_RANK_IN_NAME = re.compile(r"(?:rank|_r)[_-]?(\d+)", re.IGNORECASE)


def load_trace(path: str | os.PathLike, *, label: str | None = None) -> Profile:
    """Load a Chrome/Kineto trace written by torch's profiler with ``profile_memory=True``
    (``prof.export_chrome_trace(...)``, ``tensorboard_trace_handler``; plain JSON or
    ``.gz``) as a :class:`Profile`: blocks paired from the ``[memory]`` events, each with the
    op and callsite around it, phases from the autograd and optimizer events, steps from
    ``ProfilerStep#N``. A trace has no tensor ids, so categories come from when blocks were
    made and freed (``meta["tensor_ids"]`` is False). A damaged or crafted file raises
    :class:`~jupyter_memprof.ProfileFileError` (one line)."""
    from .._producers.kineto import read_trace

    path = _path(path)
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
    """:func:`jupyter_memprof.load`: a saved profile (zip or Parquet folder), or a trace
    torch's profiler wrote, told apart by content."""
    from .._producers.kineto import looks_like_trace

    p = _path(path)
    if os.path.isfile(p) and looks_like_trace(p):
        return load_trace(p)
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
