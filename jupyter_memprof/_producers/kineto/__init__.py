"""The Kineto producer: a trace torch's profiler wrote -> Capture.

The trace is one torch's profiler wrote (``export_chrome_trace``,
``tensorboard_trace_handler``; ``*.pt.trace.json[.gz]``) with ``profile_memory=True``, read into
the records every producer hands over, so the one analysis builds every table from it.

:mod:`.source` reads the file safely (plain or gzip, sizes capped, fields checked);
:mod:`.build` makes the records (ops nested by time, blocks paired by address, phases from
autograd and optimizer events). A trace has no tensor ids: the analysis sees raw blocks only.
"""

from __future__ import annotations

from ..._records import Capture
from .build import build_capture
from .source import MAX_JSON_BYTES, looks_like_trace, read_file

__all__ = ["MAX_JSON_BYTES", "looks_like_trace", "read_trace"]


def read_trace(path: str) -> tuple[Capture, dict]:
    """The records of the trace at ``path`` and what only a trace says, as meta: ``trace``
    (the file's name, its own fields, out-of-memory events, counts of what was left out),
    ``rank`` and ``world_size`` when its distributed info gives them."""
    tf = read_file(path)
    capture, extra = build_capture(tf)
    meta: dict = {"trace": {**tf.info, **extra}}
    if tf.rank is not None:
        meta["rank"] = tf.rank
    if tf.world_size is not None:
        meta["world_size"] = tf.world_size
    return capture, meta
